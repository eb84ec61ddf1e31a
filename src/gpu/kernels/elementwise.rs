//! One-element-per-invocation kernels: the SwiGLU gate, the residual add and bias add.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::recording::flat_grid;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(Params { len: u32, delta_len: u32 });
shader_params!(SiluMulParams { len: u32, cols: u32 });

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

/// Record out[r, c] = silu(gate_up[r, c]) · gate_up[r, cols + c]: gate_up (rows, 2 · cols) F32
/// holds the gate and up projections side by side, out is (rows, cols) F32.
pub fn silu_mul(ctx: &GpuContext, rec: &mut Recording, gate_up: &GpuTensor, out: &GpuTensor) -> Result<()> {
    const OP: &str = "silu_mul";
    expect(OP, "out", out, DType::F32, &[None, None])?;
    let (rows, cols) = (out.shape()[0], out.shape()[1]);
    expect(OP, "gate_up", gate_up, DType::F32, &[Some(rows), Some(2 * cols)])?;
    let params = SiluMulParams { len: u32_of(OP, "len", rows * cols)?, cols: u32_of(OP, "cols", cols)? };
    let bindings = [gate_up.single_part(OP)?.resource(ctx)?, out.single_part(OP)?.resource(ctx)?];
    let variant = ShaderVariant::plain("silu_mul");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, flat_grid(rows * cols, WORKGROUP))?;
    Ok(())
}

/// Record `acc += delta` over F32 tensors of one shape.
pub fn add(ctx: &GpuContext, rec: &mut Recording, acc: &GpuTensor, delta: &GpuTensor) -> Result<()> {
    const OP: &str = "add";
    let len = same_f32(OP, &[("acc", acc), ("delta", delta)])?;
    record_add(ctx, rec, OP, acc, delta, len)
}

/// Record `acc[r, :] += bias` for every row r: acc (rows, n) F32, bias (n) F32.
pub fn add_bias(ctx: &GpuContext, rec: &mut Recording, acc: &GpuTensor, bias: &GpuTensor) -> Result<()> {
    const OP: &str = "add_bias";
    let n = acc.row_elems();
    if acc.dtype() != DType::F32 || bias.dtype() != DType::F32 || bias.shape() != [n] {
        return Err(WeftError::shape(
            OP,
            format!(
                "bias must be F32 of shape [{n}] for acc of shape {:?}, got {} of shape {:?}",
                acc.shape(),
                bias.dtype(),
                bias.shape()
            ),
        ));
    }
    record_add(ctx, rec, OP, acc, bias, n)
}

fn record_add(
    ctx: &GpuContext,
    rec: &mut Recording,
    op: &'static str,
    acc: &GpuTensor,
    delta: &GpuTensor,
    delta_len: usize,
) -> Result<()> {
    let len = acc.num_elems();
    let params = Params { len: u32_of(op, "len", len)?, delta_len: u32_of(op, "delta_len", delta_len)? };
    let bindings = [acc.single_part(op)?.resource(ctx)?, delta.single_part(op)?.resource(ctx)?];
    let variant = ShaderVariant::plain("add");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, flat_grid(len, WORKGROUP))?;
    Ok(())
}
