//! One-element-per-invocation kernels: the SwiGLU and GeGLU gates (and Gemma 4's per-layer
//! input gate), the exact GELU, the sigmoid gates of Qwen3.5's attention and Qwen3.5-MoE's
//! shared expert, the residual add, bias add, scaling and logit soft-capping.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::recording::flat_grid;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(Params { len: u32, delta_len: u32 });
shader_params!(GateMulParams {
    len: u32,
    cols: u32,
    src_stride: u32,
    gate_col: u32,
    up_col: u32,
    act: u32,
    gate_in_out: u32,
});
shader_params!(ScaleParams { len: u32, factor: f32, mode: u32 });
shader_params!(GeluParams { len: u32 });
shader_params!(SigmoidMulParams { len: u32, group: u32 });

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
    gated(ctx, rec, "silu_mul", Activation::Silu, gate_up, out)
}

/// Record out[r, c] = gelu_tanh(gate_up[r, c]) · gate_up[r, cols + c] (Gemma's GeGLU, tanh
/// approximation), shaped as [`silu_mul`].
pub fn gelu_mul(ctx: &GpuContext, rec: &mut Recording, gate_up: &GpuTensor, out: &GpuTensor) -> Result<()> {
    gated(ctx, rec, "gelu_mul", Activation::GeluTanh, gate_up, out)
}

/// Record x[r, c] = gelu_tanh(x[r, c]) · up[r, up_col + c] in place: x (rows, cols) F32, up
/// (rows, up_cols) F32 with up_col + cols <= up_cols (Gemma 4's per-layer input gate, `up` a
/// row of every layer's inputs side by side).
pub fn gelu_mul_at(ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor, up: &GpuTensor, up_col: usize) -> Result<()> {
    const OP: &str = "gelu_mul_at";
    expect(OP, "x", x, DType::F32, &[None, None])?;
    let (rows, cols) = (x.shape()[0], x.shape()[1]);
    expect(OP, "up", up, DType::F32, &[Some(rows), None])?;
    let up_stride = up.shape()[1];
    if up_col + cols > up_stride {
        return Err(WeftError::shape(OP, format!("columns {up_col}..{} of up, which has {up_stride}", up_col + cols)));
    }
    let params = GateMulParams {
        len: u32_of(OP, "len", rows * cols)?,
        cols: u32_of(OP, "cols", cols)?,
        src_stride: u32_of(OP, "up columns", up_stride)?,
        gate_col: 0,
        up_col: u32_of(OP, "up_col", up_col)?,
        act: Activation::GeluTanh as u32,
        gate_in_out: 1,
    };
    record_gate_mul(ctx, rec, OP, &params, up, x)
}

/// Record `x = cap · tanh(x / cap)` in place over an F32 tensor (Gemma 4's final logit
/// soft-capping); `cap` must be positive.
pub fn softcap(ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor, cap: f32) -> Result<()> {
    const OP: &str = "softcap";
    if x.dtype() != DType::F32 {
        return Err(WeftError::shape(OP, format!("x must be F32, got {}", x.dtype())));
    }
    if cap.is_nan() || cap <= 0.0 {
        return Err(WeftError::shape(OP, format!("the cap must be positive, got {cap}")));
    }
    record_scale(ctx, rec, OP, x, ScaleMode::SoftCap, cap)
}

/// Record `x = gelu(x)` in place over an F32 tensor: the exact (erf) GELU of BERT's MLP
/// (transformers' "gelu"), not Gemma's tanh approximation.
pub fn gelu(ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor) -> Result<()> {
    const OP: &str = "gelu";
    if x.dtype() != DType::F32 {
        return Err(WeftError::shape(OP, format!("x must be F32, got {}", x.dtype())));
    }
    let len = x.num_elems();
    let params = GeluParams { len: u32_of(OP, "len", len)? };
    let bindings = [x.single_part(OP)?.resource(ctx)?];
    let variant = ShaderVariant::plain("gelu");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, flat_grid(len, WORKGROUP))?;
    Ok(())
}

/// Record `x *= sigmoid(gate)` in place, x F32 and gate F32 either of x's shape (element by
/// element: Qwen3.5's attention output gate) or (rows, 1) for x (rows, cols) (one gate a row:
/// Qwen3.5-MoE's shared-expert gate).
pub fn sigmoid_mul(ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor, gate: &GpuTensor) -> Result<()> {
    const OP: &str = "sigmoid_mul";
    let per_row = match x.shape() {
        &[rows, cols] if gate.shape() == [rows, 1] && x.dtype() == DType::F32 && gate.dtype() == DType::F32 => {
            Some(cols)
        }
        _ => None,
    };
    let (len, group) = match per_row {
        Some(cols) => (x.num_elems(), cols),
        None => (same_f32(OP, &[("x", x), ("gate", gate)])?, 1),
    };
    let params = SigmoidMulParams { len: u32_of(OP, "len", len)?, group: u32_of(OP, "group", group.max(1))? };
    let bindings = [x.single_part(OP)?.resource(ctx)?, gate.single_part(OP)?.resource(ctx)?];
    let variant = ShaderVariant::plain("sigmoid_mul");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, flat_grid(len, WORKGROUP))?;
    Ok(())
}

/// Record `x *= factor` over an F32 tensor.
pub fn scale(ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor, factor: f32) -> Result<()> {
    const OP: &str = "scale";
    if x.dtype() != DType::F32 {
        return Err(WeftError::shape(OP, format!("x must be F32, got {}", x.dtype())));
    }
    record_scale(ctx, rec, OP, x, ScaleMode::Multiply, factor)
}

/// What `scale.wgsl` does with its factor.
#[derive(Clone, Copy)]
enum ScaleMode {
    Multiply = 0,
    SoftCap = 1,
}

fn record_scale(
    ctx: &GpuContext,
    rec: &mut Recording,
    op: &'static str,
    x: &GpuTensor,
    mode: ScaleMode,
    factor: f32,
) -> Result<()> {
    let len = x.num_elems();
    let params = ScaleParams { len: u32_of(op, "len", len)?, factor, mode: mode as u32 };
    let bindings = [x.single_part(op)?.resource(ctx)?];
    let variant = ShaderVariant::plain("scale");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, flat_grid(len, WORKGROUP))?;
    Ok(())
}

/// The activation of `gate_mul.wgsl`'s gate.
#[derive(Clone, Copy)]
enum Activation {
    Silu = 0,
    GeluTanh = 1,
}

/// A gated activation over gate and up side by side: `silu_mul` or `gelu_mul`.
fn gated(
    ctx: &GpuContext,
    rec: &mut Recording,
    op: &'static str,
    act: Activation,
    gate_up: &GpuTensor,
    out: &GpuTensor,
) -> Result<()> {
    expect(op, "out", out, DType::F32, &[None, None])?;
    let (rows, cols) = (out.shape()[0], out.shape()[1]);
    expect(op, "gate_up", gate_up, DType::F32, &[Some(rows), Some(2 * cols)])?;
    let cols32 = u32_of(op, "cols", cols)?;
    let params = GateMulParams {
        len: u32_of(op, "len", rows * cols)?,
        cols: cols32,
        src_stride: u32_of(op, "gate_up columns", 2 * cols)?,
        gate_col: 0,
        // The up projection sits right after the gate's columns.
        up_col: cols32,
        act: act as u32,
        gate_in_out: 0,
    };
    record_gate_mul(ctx, rec, op, &params, gate_up, out)
}

fn record_gate_mul(
    ctx: &GpuContext,
    rec: &mut Recording,
    op: &'static str,
    params: &GateMulParams,
    src: &GpuTensor,
    out: &GpuTensor,
) -> Result<()> {
    let bindings = [src.single_part(op)?.resource(ctx)?, out.single_part(op)?.resource(ctx)?];
    let variant = ShaderVariant::plain("gate_mul");
    let grid = flat_grid(params.len as usize, WORKGROUP);
    ctx.dispatch(rec, variant, bytemuck::bytes_of(params), bindings.into(), None, grid)?;
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
