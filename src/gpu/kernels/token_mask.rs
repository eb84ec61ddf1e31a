//! Structured output's allowed-token masks on logits (shaders/token_mask.wgsl). The masks are
//! built by the engine (`crate::constraint`) and gathered per step by `model::sampler`.

use super::{expect, shader_params, u32_of};
use crate::error::Result;
use crate::gpu::recording::flat_grid;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(Params { num_masked: u32, vocab: u32, words: u32 });

/// The logit a forbidden token gets (`MASKED` in the shader, and in shaders/sample.wgsl).
pub const MASKED_LOGIT: f32 = -1e30;

/// Record the masks: logits (rows, vocab) F32 in place; masks (num_masked, ceil(vocab / 32))
/// U32, one bit per token, 1 = allowed; mask_rows (num_masked) U32, the logit row of each mask.
pub fn token_mask(
    ctx: &GpuContext,
    rec: &mut Recording,
    logits: &GpuTensor,
    masks: &GpuTensor,
    mask_rows: &GpuTensor,
) -> Result<()> {
    const OP: &str = "token_mask";
    expect(OP, "logits", logits, DType::F32, &[None, None])?;
    let vocab = logits.shape()[1];
    let words = vocab.div_ceil(32);
    expect(OP, "masks", masks, DType::U32, &[None, Some(words)])?;
    let num_masked = masks.shape()[0];
    expect(OP, "mask_rows", mask_rows, DType::U32, &[Some(num_masked)])?;
    let params = Params {
        num_masked: u32_of(OP, "masks", num_masked)?,
        vocab: u32_of(OP, "vocab", vocab)?,
        words: u32_of(OP, "words", words)?,
    };
    u32_of(OP, "masks × vocab", num_masked * vocab)?;
    let bindings = [
        logits.single_part(OP)?.resource(ctx)?,
        masks.single_part(OP)?.resource(ctx)?,
        mask_rows.single_part(OP)?.resource(ctx)?,
    ];
    let variant = ShaderVariant::plain("token_mask");
    let grid = flat_grid(num_masked * vocab, 256);
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, grid)?;
    Ok(())
}
