//! Row-wise kernels with a workgroup reduction: RMSNorm (of rows, or of each attention head),
//! LayerNorm, softmax, argmax; and the pooling of rows into embeddings.
//! One workgroup per row, so at most 65535 rows per dispatch.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::kernels::paged::QkvLayout;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(RmsNormParams { rows: u32, n: u32, eps: f32 });
shader_params!(AddRmsNormParams { rows: u32, n: u32, eps: f32, delta_scale: f32 });
shader_params!(RowParams { rows: u32, n: u32 });
shader_params!(LayerNormParams { rows: u32, n: u32, eps: f32 });
shader_params!(PoolParams { outputs: u32, cols: u32 });
shader_params!(HeadNormParams { q_groups: u32, n: u32, k_n: u32, row_stride: u32, col0: u32, eps: f32 });

fn rows_of(op: &'static str, x: &GpuTensor) -> Result<(usize, usize)> {
    expect(op, "x", x, DType::F32, &[None, None])?;
    Ok((x.shape()[0], x.shape()[1]))
}

/// Record RMSNorm of the query and key parts of the fused qkv rows, in place, before RoPE:
/// each query head (q_weight head_dim wide: Qwen3's and Gemma 3's q_norm) or all of them as one
/// (q_weight num_heads · head_dim wide: OLMo 2's), and likewise the keys by k_weight's width.
/// qkv (num_tokens, layout.row_stride()) F32, q_weight and k_weight F32. Value heads are left as
/// they are.
pub fn head_rms_norm(
    ctx: &GpuContext,
    rec: &mut Recording,
    qkv: &GpuTensor,
    layout: QkvLayout,
    q_weight: &GpuTensor,
    k_weight: &GpuTensor,
    eps: f32,
) -> Result<()> {
    const OP: &str = "head_rms_norm";
    let hd = layout.head_dim;
    expect(OP, "qkv", qkv, DType::F32, &[None, Some(layout.row_stride())])?;
    // (weight, heads it covers): one head, or all of them.
    let groups = |name: &'static str, weight: &GpuTensor, heads: usize| -> Result<usize> {
        expect(OP, name, weight, DType::F32, &[None])?;
        match weight.shape()[0] {
            n if n == hd => Ok(heads),
            n if n == heads * hd => Ok(1),
            n => Err(WeftError::shape(
                OP,
                format!("{name} has {n} values; it must cover one head ({hd}) or all {heads} heads ({})", heads * hd),
            )),
        }
    };
    let q_groups = groups("q_weight", q_weight, layout.num_heads)?;
    let k_groups = groups("k_weight", k_weight, layout.num_kv_heads)?;
    let params = HeadNormParams {
        q_groups: u32_of(OP, "q_groups", q_groups)?,
        n: u32_of(OP, "q_weight length", q_weight.shape()[0])?,
        k_n: u32_of(OP, "k_weight length", k_weight.shape()[0])?,
        row_stride: u32_of(OP, "row stride", layout.row_stride())?,
        col0: 0,
        eps,
    };
    record_head_norm(ctx, rec, OP, qkv, params, q_weight, k_weight, q_groups + k_groups)
}

/// Which heads of a fused qkv row: `QkvLayout`'s query, key or value heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkvPart {
    Query,
    Key,
    Value,
}

/// Record RMSNorm of each head of one part of the fused qkv rows, in place, times `weight`
/// (head_dim) F32: Gemma 4's q_norm in a layer that reads another layer's keys and values, and
/// its v_norm, which has no weight (a weight of ones multiplies by exactly 1). qkv (num_tokens,
/// layout.row_stride()) F32; the other parts are left as they are.
pub fn qkv_part_rms_norm(
    ctx: &GpuContext,
    rec: &mut Recording,
    qkv: &GpuTensor,
    layout: QkvLayout,
    part: QkvPart,
    weight: &GpuTensor,
    eps: f32,
) -> Result<()> {
    const OP: &str = "qkv_part_rms_norm";
    let hd = layout.head_dim;
    expect(OP, "qkv", qkv, DType::F32, &[None, Some(layout.row_stride())])?;
    expect(OP, "weight", weight, DType::F32, &[Some(hd)])?;
    let (col0, heads) = match part {
        QkvPart::Query => (0, layout.num_heads),
        QkvPart::Key => (layout.num_heads * hd, layout.num_kv_heads),
        QkvPart::Value => ((layout.num_heads + layout.num_kv_heads) * hd, layout.num_kv_heads),
    };
    let params = HeadNormParams {
        q_groups: u32_of(OP, "heads", heads)?,
        n: u32_of(OP, "head_dim", hd)?,
        k_n: u32_of(OP, "head_dim", hd)?,
        row_stride: u32_of(OP, "row stride", layout.row_stride())?,
        col0: u32_of(OP, "first column", col0)?,
        eps,
    };
    record_head_norm(ctx, rec, OP, qkv, params, weight, weight, heads)
}

/// One dispatch of shaders/head_rms_norm.wgsl over `groups` groups of every token.
#[allow(clippy::too_many_arguments)]
fn record_head_norm(
    ctx: &GpuContext,
    rec: &mut Recording,
    op: &'static str,
    qkv: &GpuTensor,
    params: HeadNormParams,
    q_weight: &GpuTensor,
    k_weight: &GpuTensor,
    groups: usize,
) -> Result<()> {
    let bindings = [
        q_weight.single_part(op)?.resource(ctx)?,
        k_weight.single_part(op)?.resource(ctx)?,
        qkv.single_part(op)?.resource(ctx)?,
    ];
    let grid = [u32_of(op, "groups", groups)?, u32_of(op, "num_tokens", qkv.shape()[0])?, 1];
    ctx.dispatch(rec, ShaderVariant::plain("head_rms_norm"), bytemuck::bytes_of(&params), bindings.into(), None, grid)?;
    Ok(())
}

/// Record `y = rms_norm(x) * weight`: x and y (rows, n) F32, weight (n) F32.
pub fn rms_norm(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    weight: &GpuTensor,
    y: &GpuTensor,
    eps: f32,
) -> Result<()> {
    const OP: &str = "rms_norm";
    let (rows, n) = rows_of(OP, x)?;
    expect(OP, "weight", weight, DType::F32, &[Some(n)])?;
    expect(OP, "y", y, DType::F32, &[Some(rows), Some(n)])?;
    let params = RmsNormParams { rows: u32_of(OP, "rows", rows)?, n: u32_of(OP, "n", n)?, eps };
    let bindings =
        [x.single_part(OP)?.resource(ctx)?, weight.single_part(OP)?.resource(ctx)?, y.single_part(OP)?.resource(ctx)?];
    let variant = ShaderVariant::plain("rms_norm");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, [params.rows, 1, 1])?;
    Ok(())
}

/// Record the residual connection and the next norm in one pass: `x += delta`, then
/// `y = rms_norm(x) · weight` (the same numbers as `add` then [`rms_norm`]). x, delta, y (rows, n)
/// F32; weight (n) F32.
pub fn add_rms_norm(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    delta: &GpuTensor,
    weight: &GpuTensor,
    y: &GpuTensor,
    eps: f32,
) -> Result<()> {
    add_scaled_rms_norm(ctx, rec, x, delta, 1.0, weight, y, eps)
}

/// [`add_rms_norm`] with the residual branch scaled: `x += delta · delta_scale` (Granite's
/// residual multiplier; a scale of 1 changes no bit).
#[allow(clippy::too_many_arguments)]
pub fn add_scaled_rms_norm(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    delta: &GpuTensor,
    delta_scale: f32,
    weight: &GpuTensor,
    y: &GpuTensor,
    eps: f32,
) -> Result<()> {
    const OP: &str = "add_rms_norm";
    let (rows, n) = rows_of(OP, x)?;
    expect(OP, "delta", delta, DType::F32, &[Some(rows), Some(n)])?;
    expect(OP, "weight", weight, DType::F32, &[Some(n)])?;
    expect(OP, "y", y, DType::F32, &[Some(rows), Some(n)])?;
    let params = AddRmsNormParams { rows: u32_of(OP, "rows", rows)?, n: u32_of(OP, "n", n)?, eps, delta_scale };
    let bindings = [
        x.single_part(OP)?.resource(ctx)?,
        delta.single_part(OP)?.resource(ctx)?,
        weight.single_part(OP)?.resource(ctx)?,
        y.single_part(OP)?.resource(ctx)?,
    ];
    let variant = ShaderVariant::plain("add_rms_norm");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, [params.rows, 1, 1])?;
    Ok(())
}

/// Record the residual connection and a LayerNorm in one pass: `x += delta`, then
/// `y = (x - mean(x)) / sqrt(var(x) + eps) · weight + bias` over each row (torch's LayerNorm:
/// the biased variance). x, delta, y (rows, n) F32, three different tensors; weight, bias (n) F32.
#[allow(clippy::too_many_arguments)]
pub fn add_layer_norm(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    delta: &GpuTensor,
    weight: &GpuTensor,
    bias: &GpuTensor,
    y: &GpuTensor,
    eps: f32,
) -> Result<()> {
    const OP: &str = "add_layer_norm";
    let (rows, n) = rows_of(OP, x)?;
    expect(OP, "delta", delta, DType::F32, &[Some(rows), Some(n)])?;
    expect(OP, "weight", weight, DType::F32, &[Some(n)])?;
    expect(OP, "bias", bias, DType::F32, &[Some(n)])?;
    expect(OP, "y", y, DType::F32, &[Some(rows), Some(n)])?;
    let params = LayerNormParams { rows: u32_of(OP, "rows", rows)?, n: u32_of(OP, "n", n)?, eps };
    let bindings = [
        x.single_part(OP)?.resource(ctx)?,
        delta.single_part(OP)?.resource(ctx)?,
        weight.single_part(OP)?.resource(ctx)?,
        bias.single_part(OP)?.resource(ctx)?,
        y.single_part(OP)?.resource(ctx)?,
    ];
    let variant = ShaderVariant::plain("add_layer_norm");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, [params.rows, 1, 1])?;
    Ok(())
}

/// Record `out[o] = mean(x[first_o .. first_o + count_o])` for each output row o, with
/// (first_o, count_o) the rows of spans (outputs, 2) U32 (count ≥ 1, the rows inside x):
/// an embedding's pooling — all of a sequence's rows (mean), or one (CLS, last token). x
/// (rows, cols) F32, out (outputs, cols) F32. The spans are trusted (the executor writes them).
pub fn pool_rows(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    spans: &GpuTensor,
    out: &GpuTensor,
) -> Result<()> {
    const OP: &str = "pool_rows";
    let (_, cols) = rows_of(OP, x)?;
    expect(OP, "out", out, DType::F32, &[None, Some(cols)])?;
    let outputs = out.shape()[0];
    expect(OP, "spans", spans, DType::U32, &[Some(outputs), Some(2)])?;
    let params = PoolParams { outputs: u32_of(OP, "outputs", outputs)?, cols: u32_of(OP, "cols", cols)? };
    let bindings =
        [x.single_part(OP)?.resource(ctx)?, spans.single_part(OP)?.resource(ctx)?, out.single_part(OP)?.resource(ctx)?];
    let grid = crate::gpu::recording::flat_grid(outputs * cols, 256);
    ctx.dispatch(rec, ShaderVariant::plain("pool_rows"), bytemuck::bytes_of(&params), bindings.into(), None, grid)?;
    Ok(())
}

/// Record an in-place softmax over each row of x (rows, n) F32.
pub fn softmax(ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor) -> Result<()> {
    const OP: &str = "softmax";
    let (rows, n) = rows_of(OP, x)?;
    let params = RowParams { rows: u32_of(OP, "rows", rows)?, n: u32_of(OP, "n", n)? };
    let bindings = [x.single_part(OP)?.resource(ctx)?];
    let variant = ShaderVariant::plain("softmax");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, [params.rows, 1, 1])?;
    Ok(())
}

/// Record `out[r] = argmax(x[r, :])`: x (rows, n) F32, out (rows) U32; ties to the lowest index.
pub fn argmax(ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor, out: &GpuTensor) -> Result<()> {
    const OP: &str = "argmax";
    let (rows, n) = rows_of(OP, x)?;
    expect(OP, "out", out, DType::U32, &[Some(rows)])?;
    let params = RowParams { rows: u32_of(OP, "rows", rows)?, n: u32_of(OP, "n", n)? };
    let bindings = [x.single_part(OP)?.resource(ctx)?, out.single_part(OP)?.resource(ctx)?];
    let variant = ShaderVariant::plain("argmax");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, [params.rows, 1, 1])?;
    Ok(())
}
