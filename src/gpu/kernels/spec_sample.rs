//! The rejection-sampling rule of speculative decoding (shaders/spec_sample.wgsl): a draft's
//! rows keep the distribution they drew from, a target's verifying rows accept or replace the
//! drafted token. The per-row settings are built by `model::sampler::SamplerInputs`.

use super::{expect, shader_params, u32_of};
use crate::error::Result;
use crate::gpu::kernels::sample::OUT_PER_ROW;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(Params { rows: u32, vocab: u32 });

/// u32 settings per speculative row (`SPEC` in the shader): logit row, mode, slot, drafted
/// token, temperature, top_k, top_p, min_p, accept draw, residual draw, 1 when the row reports
/// log-probabilities (else 0), a zero.
pub const SPEC_PER_ROW: usize = 12;
/// Mode of a draft's row: keep its distribution.
pub const MODE_KEEP: u32 = 1;
/// Mode of a target's row: verify the drafted token.
pub const MODE_VERIFY: u32 = 2;

/// Record the rule: logits (logit_rows, vocab) F32, spec (rows, SPEC_PER_ROW) U32, probs (slots,
/// vocab) F32 (written by keep rows, read by verify rows), out (logit_rows, OUT_PER_ROW) U32
/// (verify rows overwrite their token and log-probability).
pub fn spec_sample(
    ctx: &GpuContext,
    rec: &mut Recording,
    logits: &GpuTensor,
    spec: &GpuTensor,
    probs: &GpuTensor,
    out: &GpuTensor,
) -> Result<()> {
    const OP: &str = "spec_sample";
    expect(OP, "logits", logits, DType::F32, &[None, None])?;
    let (logit_rows, vocab) = (logits.shape()[0], logits.shape()[1]);
    expect(OP, "spec", spec, DType::U32, &[None, Some(SPEC_PER_ROW)])?;
    expect(OP, "probs", probs, DType::F32, &[None, Some(vocab)])?;
    expect(OP, "out", out, DType::U32, &[Some(logit_rows), Some(OUT_PER_ROW)])?;
    let rows = spec.shape()[0];
    let params = Params { rows: u32_of(OP, "rows", rows)?, vocab: u32_of(OP, "vocab", vocab)? };
    let bindings = [
        logits.single_part(OP)?.resource(ctx)?,
        spec.single_part(OP)?.resource(ctx)?,
        probs.single_part(OP)?.resource(ctx)?,
        out.single_part(OP)?.resource(ctx)?,
    ];
    let variant = ShaderVariant::plain("spec_sample");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, [params.rows, 1, 1])?;
    Ok(())
}
