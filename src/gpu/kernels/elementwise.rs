//! One-element-per-invocation kernels: the SwiGLU gate and the residual add.

use super::{shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::recording::flat_grid;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(Params { len: u32 });

const WORKGROUP: usize = 256;

fn same_f32(op: &'static str, tensors: &[(&str, &GpuTensor)]) -> Result<usize> {
    let (_, first) = tensors[0];
    for (name, t) in tensors {
        if t.dtype() != DType::F32 || t.shape() != first.shape() {
            return Err(WeftError::shape(
                op,
                format!("{name} must be F32 of shape {:?}, got {} of shape {:?}", first.shape(), t.dtype(), t.shape()),
            ));
        }
    }
    Ok(first.num_elems())
}

/// Record `out = silu(gate) * up` over F32 tensors of one shape.
pub fn silu_mul(ctx: &GpuContext, rec: &mut Recording, gate: &GpuTensor, up: &GpuTensor, out: &GpuTensor) -> Result<()> {
    const OP: &str = "silu_mul";
    let len = same_f32(OP, &[("gate", gate), ("up", up), ("out", out)])?;
    let params = Params { len: u32_of(OP, "len", len)? };
    let bindings = [
        gate.single_part(OP)?.binding(ctx, gate.row_bytes())?,
        up.single_part(OP)?.binding(ctx, up.row_bytes())?,
        out.single_part(OP)?.binding(ctx, out.row_bytes())?,
    ];
    let variant = ShaderVariant { kernel: "silu_mul", weight: None };
    rec.push(ctx.dispatch(variant, bytemuck::bytes_of(&params), &bindings, flat_grid(len, WORKGROUP))?);
    Ok(())
}

/// Record `acc += delta` over F32 tensors of one shape.
pub fn add(ctx: &GpuContext, rec: &mut Recording, acc: &GpuTensor, delta: &GpuTensor) -> Result<()> {
    const OP: &str = "add";
    let len = same_f32(OP, &[("acc", acc), ("delta", delta)])?;
    let params = Params { len: u32_of(OP, "len", len)? };
    let bindings = [
        acc.single_part(OP)?.binding(ctx, acc.row_bytes())?,
        delta.single_part(OP)?.binding(ctx, delta.row_bytes())?,
    ];
    let variant = ShaderVariant { kernel: "add", weight: None };
    rec.push(ctx.dispatch(variant, bytemuck::bytes_of(&params), &bindings, flat_grid(len, WORKGROUP))?);
    Ok(())
}
