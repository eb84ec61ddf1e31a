//! Gemma 3n's own kernels: AltUp's predict and correct steps over its parallel copies of the
//! hidden state ("streams"), the magnitude match that makes and unmakes the streams, and the
//! activation sparsity of its first layers' MLP gates (`model::arch::gemma3n`).
//!
//! The streams live in one (n · stream_rows, hidden) tensor, stream j's token t at row
//! j · stream_rows + t, so each stream is a plain (tokens, hidden) slice for the matmuls and
//! norms, and a step of fewer tokens than stream_rows uses the first rows of each.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::recording::flat_grid;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(PredictParams { tokens: u32, hidden: u32, stream_rows: u32, n: u32 });
shader_params!(CorrectParams { tokens: u32, hidden: u32, stream_rows: u32, n: u32, active_stream: u32 });
shader_params!(MagnitudeParams { rows: u32, n: u32, min_square: f32 });
shader_params!(TopkParams { rows: u32, n: u32, stride: u32, multiplier: f32 });

/// The most streams the AltUp kernels take (Gemma 3n has 4).
pub const MAX_STREAMS: usize = 8;

/// What transformers clamps a stream's mean square at before dividing by its root.
pub const MAGNITUDE_MIN_SQUARE: f32 = 1e-5;

const WORKGROUP: usize = 256;

/// (n, stream_rows, hidden, tokens) of streams (n · stream_rows, hidden) read by `tokens`
/// tokens of `modal` (tokens, n).
fn stream_shape(op: &'static str, streams: &GpuTensor, modal: &GpuTensor) -> Result<(usize, usize, usize, usize)> {
    expect(op, "modal", modal, DType::F32, &[None, None])?;
    let (tokens, n) = (modal.shape()[0], modal.shape()[1]);
    if !(1..=MAX_STREAMS).contains(&n) {
        return Err(WeftError::shape(op, format!("{n} streams; the kernel takes 1 to {MAX_STREAMS}")));
    }
    expect(op, "streams", streams, DType::F32, &[None, None])?;
    let (rows, hidden) = (streams.shape()[0], streams.shape()[1]);
    if !rows.is_multiple_of(n) || rows / n < tokens {
        return Err(WeftError::shape(
            op,
            format!("streams has {rows} rows: it must hold {n} streams of at least {tokens} tokens each"),
        ));
    }
    Ok((n, rows / n, hidden, tokens))
}

/// Record AltUp's prediction, out[j][t] = Σ_k c_t[j, k] · streams[k][t] + streams[j][t] with
/// c_t[j, k] = Σ_m coefs[j · n + k, m] · modal[t, m]: streams and out (n · stream_rows, hidden)
/// F32, modal (tokens, n) F32 (the router's tanh outputs), coefs (n · n, n) F32.
pub fn altup_predict(
    ctx: &GpuContext,
    rec: &mut Recording,
    streams: &GpuTensor,
    modal: &GpuTensor,
    coefs: &GpuTensor,
    out: &GpuTensor,
) -> Result<()> {
    const OP: &str = "altup_predict";
    let (n, stream_rows, hidden, tokens) = stream_shape(OP, streams, modal)?;
    expect(OP, "coefs", coefs, DType::F32, &[Some(n * n), Some(n)])?;
    expect(OP, "out", out, DType::F32, &[Some(n * stream_rows), Some(hidden)])?;
    let params = PredictParams {
        tokens: u32_of(OP, "tokens", tokens)?,
        hidden: u32_of(OP, "hidden", hidden)?,
        stream_rows: u32_of(OP, "stream rows", stream_rows)?,
        n: n as u32,
    };
    let bindings = [
        streams.single_part(OP)?.resource(ctx)?,
        modal.single_part(OP)?.resource(ctx)?,
        coefs.single_part(OP)?.resource(ctx)?,
        out.single_part(OP)?.resource(ctx)?,
    ];
    let grid = flat_grid(tokens * hidden, WORKGROUP);
    ctx.dispatch(rec, ShaderVariant::plain(OP), bytemuck::bytes_of(&params), bindings.into(), None, grid)?;
    Ok(())
}

/// Record AltUp's correction, out[j][t] = (1 + Σ_m coefs[j, m] · modal[t, m]) ·
/// (activated[t] - pred[active][t]) + pred[j][t], and scaled[t] = out[active][t] · out_scale:
/// pred and out (n · stream_rows, hidden) F32, activated and scaled (tokens, hidden) F32, modal
/// (tokens, n) F32, coefs (n, n) F32, out_scale (hidden) F32.
#[allow(clippy::too_many_arguments)]
pub fn altup_correct(
    ctx: &GpuContext,
    rec: &mut Recording,
    pred: &GpuTensor,
    activated: &GpuTensor,
    modal: &GpuTensor,
    coefs: &GpuTensor,
    out_scale: &GpuTensor,
    active: usize,
    out: &GpuTensor,
    scaled: &GpuTensor,
) -> Result<()> {
    const OP: &str = "altup_correct";
    let (n, stream_rows, hidden, tokens) = stream_shape(OP, pred, modal)?;
    if active >= n {
        return Err(WeftError::shape(OP, format!("active stream {active} of {n}")));
    }
    expect(OP, "activated", activated, DType::F32, &[Some(tokens), Some(hidden)])?;
    expect(OP, "coefs", coefs, DType::F32, &[Some(n), Some(n)])?;
    expect(OP, "out_scale", out_scale, DType::F32, &[Some(hidden)])?;
    expect(OP, "out", out, DType::F32, &[Some(n * stream_rows), Some(hidden)])?;
    expect(OP, "scaled", scaled, DType::F32, &[Some(tokens), Some(hidden)])?;
    let params = CorrectParams {
        tokens: u32_of(OP, "tokens", tokens)?,
        hidden: u32_of(OP, "hidden", hidden)?,
        stream_rows: u32_of(OP, "stream rows", stream_rows)?,
        n: n as u32,
        active_stream: active as u32,
    };
    let bindings = [
        pred.single_part(OP)?.resource(ctx)?,
        activated.single_part(OP)?.resource(ctx)?,
        modal.single_part(OP)?.resource(ctx)?,
        coefs.single_part(OP)?.resource(ctx)?,
        out_scale.single_part(OP)?.resource(ctx)?,
        out.single_part(OP)?.resource(ctx)?,
        scaled.single_part(OP)?.resource(ctx)?,
    ];
    let grid = flat_grid(tokens * hidden, WORKGROUP);
    ctx.dispatch(rec, ShaderVariant::plain(OP), bytemuck::bytes_of(&params), bindings.into(), None, grid)?;
    Ok(())
}

/// Record x[r] *= rms(target[r]) / sqrt(max(mean(x[r]²), [`MAGNITUDE_MIN_SQUARE`])) for every
/// row: x and target (rows, n) F32.
pub fn magnitude_match(ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor, target: &GpuTensor) -> Result<()> {
    const OP: &str = "magnitude_match";
    expect(OP, "x", x, DType::F32, &[None, None])?;
    let (rows, n) = (x.shape()[0], x.shape()[1]);
    expect(OP, "target", target, DType::F32, &[Some(rows), Some(n)])?;
    let params =
        MagnitudeParams { rows: u32_of(OP, "rows", rows)?, n: u32_of(OP, "n", n)?, min_square: MAGNITUDE_MIN_SQUARE };
    let bindings = [x.single_part(OP)?.resource(ctx)?, target.single_part(OP)?.resource(ctx)?];
    ctx.dispatch(
        rec,
        ShaderVariant::plain(OP),
        bytemuck::bytes_of(&params),
        bindings.into(),
        None,
        [params.rows, 1, 1],
    )?;
    Ok(())
}

/// Record Gemma 3n's activation sparsity in place over the first `cols` columns of each row of
/// x (rows, stride) F32: x = max(x - (mean + std · multiplier), 0), the row's mean and population
/// standard deviation over those columns.
pub fn gaussian_topk(ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor, cols: usize, multiplier: f32) -> Result<()> {
    const OP: &str = "gaussian_topk";
    expect(OP, "x", x, DType::F32, &[None, None])?;
    let (rows, stride) = (x.shape()[0], x.shape()[1]);
    if cols == 0 || cols > stride || !multiplier.is_finite() {
        return Err(WeftError::shape(
            OP,
            format!("{cols} columns of rows {stride} wide at multiplier {multiplier} (needs 1..={stride}, finite)"),
        ));
    }
    let params = TopkParams {
        rows: u32_of(OP, "rows", rows)?,
        n: u32_of(OP, "cols", cols)?,
        stride: u32_of(OP, "stride", stride)?,
        multiplier,
    };
    let bindings = [x.single_part(OP)?.resource(ctx)?];
    ctx.dispatch(
        rec,
        ShaderVariant::plain(OP),
        bytemuck::bytes_of(&params),
        bindings.into(),
        None,
        [params.rows, 1, 1],
    )?;
    Ok(())
}
