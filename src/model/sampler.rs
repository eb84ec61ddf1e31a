//! The GPU half of sampling, in one place: for each sampled logit row of a step it records
//! penalties (`shaders/penalize.wgsl`), then the token-mask slot, then the sampler
//! (`shaders/sample.wgsl`), and it decodes the sampler's output rows. The host half (parameters,
//! draws, penalty entries) is `crate::sampling`.
//!
//! ```text
//!   logits (rows, vocab) ──penalize──> token_mask (structured output) ──sample──> out (rows, 42)
//! ```
//!
//! **Invariant:** every row is sampled from its own logits, settings and draw only, so a row's
//! token does not depend on the rest of the batch.

use crate::error::Result;
use crate::gpu::kernels::penalize::penalize;
use crate::gpu::kernels::sample::{OUT_PER_ROW, SETTINGS_PER_ROW, sample};
use crate::gpu::kernels::token_mask::{MASKED_LOGIT, token_mask};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::quant::DType;
use crate::sampling::{MAX_TOP_LOGPROBS, Sampled, SamplingParams};
use crate::step::{StepBatch, StepOutput};
use crate::tensor::TensorFactory;

/// The sampler kernel's settings row for one logit row.
pub fn settings_row(params: &SamplingParams, uniform: f32) -> [u32; SETTINGS_PER_ROW] {
    [
        params.temperature.to_bits(),
        params.top_k,
        params.top_p.to_bits(),
        params.min_p.to_bits(),
        uniform.to_bits(),
        params.top_logprobs as u32,
        0,
        0,
    ]
}

/// Decode one row of the sampler's output.
pub fn read_sampled(row: &[u32], top_logprobs: usize) -> Sampled {
    debug_assert_eq!(row.len(), OUT_PER_ROW);
    Sampled {
        token: row[0],
        logprob: f32::from_bits(row[1]),
        top_logprobs: (0..top_logprobs.min(MAX_TOP_LOGPROBS))
            .map(|n| (row[2 + 2 * n], f32::from_bits(row[3 + 2 * n])))
            // Tokens a mask forbade are not alternatives (rows with fewer allowed tokens than
            // asked for list only those).
            .filter(|&(_, logprob)| logprob > MASKED_LOGIT / 2.0)
            .collect(),
    }
}

/// Record the sampling of every logit row of `batch` (`logits` holds them in batch order) and
/// return the output tensor (rows, OUT_PER_ROW) U32 to read back.
pub fn record(
    ctx: &GpuContext,
    factory: &dyn TensorFactory,
    rec: &mut Recording,
    logits: &GpuTensor,
    batch: &StepBatch,
) -> Result<GpuTensor> {
    let num_rows = batch.num_logits();
    let greedy = SamplingParams::greedy();
    let mut settings = Vec::with_capacity(num_rows * SETTINGS_PER_ROW);
    let mut penalties = Vec::with_capacity(num_rows * 3);
    let mut entries = Vec::new();
    for seq in batch.seqs.iter().filter(|s| s.num_logits > 0) {
        let spec = seq.sampling.as_ref();
        debug_assert!(spec.is_some_and(|s| s.rows.len() == seq.num_logits), "the engine prepares every sampled row");
        for i in 0..seq.num_logits {
            let row = (settings.len() / SETTINGS_PER_ROW) as u32;
            let (params, draw) = match spec {
                Some(s) => (&s.params, s.rows.get(i)),
                None => (&greedy, None),
            };
            settings.extend(settings_row(params, draw.map_or(0.0, |d| d.uniform)));
            penalties.extend([params.repetition_penalty, params.presence_penalty, params.frequency_penalty]);
            if let Some(draw) = draw.filter(|_| params.has_penalties()) {
                entries.extend(draw.penalty_entries.iter().flat_map(|&(token, count)| [row, token, count]));
            }
        }
    }
    if !entries.is_empty() {
        let entries = factory.upload_u32(&[entries.len() / 3, 3], &entries)?;
        let penalties = factory.upload_f32(&[num_rows, 3], &penalties)?;
        penalize(ctx, rec, logits, &entries, &penalties)?;
    }
    // Structured output's token masks go here: after penalties, before any filtering. A mask
    // may still be being computed on another thread: waiting for it here, after the forward
    // pass is recorded, is what lets the two overlap.
    let words = logits.shape()[1].div_ceil(32);
    let (mut mask_rows, mut masks) = (Vec::new(), Vec::new());
    let sampled_rows = batch.seqs.iter().filter(|s| s.num_logits > 0).flat_map(|s| {
        (0..s.num_logits).map(move |i| s.sampling.as_ref().and_then(|spec| spec.rows.get(i)?.allowed.as_ref()))
    });
    for (row, mask) in sampled_rows.enumerate() {
        if let Some(mask) = mask {
            let mut m = mask.wait().to_vec();
            m.resize(words, 0);
            mask_rows.push(row as u32);
            masks.extend(m);
        }
    }
    if !mask_rows.is_empty() {
        let masks = factory.upload_u32(&[mask_rows.len(), words], &masks)?;
        let mask_rows = factory.upload_u32(&[mask_rows.len()], &mask_rows)?;
        token_mask(ctx, rec, logits, &masks, &mask_rows)?;
    }
    let settings = factory.upload_u32(&[num_rows, SETTINGS_PER_ROW], &settings)?;
    let out = factory.zeros(&[num_rows, OUT_PER_ROW], DType::U32)?;
    sample(ctx, rec, logits, &settings, &out)?;
    Ok(out)
}

/// Split the sampler's output words (rows × OUT_PER_ROW, in batch order) into the step's output.
pub fn read(batch: &StepBatch, words: &[u32]) -> StepOutput {
    let mut rows = words.chunks(OUT_PER_ROW);
    let samples = batch
        .seqs
        .iter()
        .map(|seq| {
            let top = seq.sampling.as_ref().map_or(0, |s| s.params.top_logprobs);
            rows.by_ref().take(seq.num_logits).map(|row| read_sampled(row, top)).collect()
        })
        .collect();
    StepOutput { samples }
}
