//! Token sampling on the GPU (shaders/sample.wgsl): only token ids and log-probabilities leave
//! the device. The per-row settings and the output rows are built and read by
//! `model::sampler`.

use super::{expect, shader_params, u32_of};
use crate::error::Result;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;
use crate::sampling::MAX_TOP_LOGPROBS;

shader_params!(Params { rows: u32, vocab: u32 });

/// u32 settings per row (`SETTINGS` in the shader).
pub const SETTINGS_PER_ROW: usize = 8;
/// u32 outputs per row: token, its logprob, then (id, logprob) pairs (`OUT_STRIDE`; the
/// shader's `MAX_TOP` is `MAX_TOP_LOGPROBS`).
pub const OUT_PER_ROW: usize = 2 + 2 * MAX_TOP_LOGPROBS;

/// Record sampling: logits (rows, vocab) F32, settings (rows, SETTINGS_PER_ROW) U32, out (rows,
/// OUT_PER_ROW) U32.
pub fn sample(
    ctx: &GpuContext,
    rec: &mut Recording,
    logits: &GpuTensor,
    settings: &GpuTensor,
    out: &GpuTensor,
) -> Result<()> {
    const OP: &str = "sample";
    expect(OP, "logits", logits, DType::F32, &[None, None])?;
    let (rows, vocab) = (logits.shape()[0], logits.shape()[1]);
    expect(OP, "settings", settings, DType::U32, &[Some(rows), Some(SETTINGS_PER_ROW)])?;
    expect(OP, "out", out, DType::U32, &[Some(rows), Some(OUT_PER_ROW)])?;
    let params = Params { rows: u32_of(OP, "rows", rows)?, vocab: u32_of(OP, "vocab", vocab)? };
    let bindings = [
        logits.single_part(OP)?.resource(ctx)?,
        settings.single_part(OP)?.resource(ctx)?,
        out.single_part(OP)?.resource(ctx)?,
    ];
    let variant = ShaderVariant::plain("sample");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, [params.rows, 1, 1])?;
    Ok(())
}
