//! The GPU half of sampling, in one place: for each sampled logit row of a step it records
//! penalties (`shaders/penalize.wgsl`), then the token-mask slot, then the sampler
//! (`shaders/sample.wgsl`), and it decodes the sampler's output rows. The host half (parameters,
//! draws, penalty entries) is `crate::sampling`.
//!
//! ```text
//!   logits (rows, vocab) ──penalize──> [token masks: structured output's slot] ──sample──> out (rows, 42)
//!                                                                    [draft rows: spec_sample] ─┘
//! ```
//!
//! **Invariant:** every row is sampled from its own logits, settings and draw only, so a row's
//! token does not depend on the rest of the batch.

use crate::error::{Result, WeftError};
use crate::gpu::kernels::penalize::penalize;
use crate::gpu::kernels::sample::{OUT_PER_ROW, SETTINGS_PER_ROW, sample};
use crate::gpu::kernels::spec_sample::{MODE_KEEP, MODE_VERIFY, SPEC_PER_ROW, spec_sample};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::draft::DraftDistributions;
use crate::quant::DType;
use crate::sampling::{DraftRow, MAX_TOP_LOGPROBS, SamplingParams, Sampled};
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
    // Structured output's token masks go here: after penalties, before any filtering.
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

/// Speculative decoding with a draft model, after [`record`] (rows whose `RowDraw::draft` is
/// set; see `shaders/spec_sample.wgsl`): a draft's rows keep the distribution they drew their
/// token from in `store`, a target's verifying rows keep their drafted token with probability
/// min(1, p/q) or replace it (and its log-probability in `out`) with a draw from the residual
/// max(0, p − q). Records nothing when no row is speculative.
pub fn record_draft_rows(
    ctx: &GpuContext,
    factory: &dyn TensorFactory,
    rec: &mut Recording,
    logits: &GpuTensor,
    batch: &StepBatch,
    out: &GpuTensor,
    store: Option<&DraftDistributions>,
) -> Result<()> {
    let mut spec = Vec::new();
    let mut row = 0u32;
    for seq in batch.seqs.iter().filter(|s| s.num_logits > 0) {
        for i in 0..seq.num_logits {
            let speculative = seq.sampling.as_ref().and_then(|s| s.rows.get(i).and_then(|d| Some((s, d, d.draft?))));
            if let Some((s, draw, draft)) = speculative {
                let (mode, slot, token, accept_uniform) = match draft {
                    DraftRow::Keep { slot } => (MODE_KEEP, slot, 0, 0.0f32),
                    DraftRow::Verify { slot, token, accept_uniform } => (MODE_VERIFY, slot, token, accept_uniform),
                };
                let p = &s.params;
                spec.extend([
                    row,
                    mode,
                    slot,
                    token,
                    p.temperature.to_bits(),
                    p.top_k,
                    p.top_p.to_bits(),
                    p.min_p.to_bits(),
                    accept_uniform.to_bits(),
                    draw.uniform.to_bits(),
                    0,
                    0,
                ]);
            }
            row += 1;
        }
    }
    if spec.is_empty() {
        return Ok(());
    }
    let store = store.ok_or_else(|| {
        WeftError::Unsupported(
            "a step has speculative rows, but this executor shares no draft distributions with a draft model".into(),
        )
    })?;
    let slots = store.store().slots as u32;
    if let Some(bad) = spec.chunks(SPEC_PER_ROW).map(|r| r[2]).find(|&slot| slot >= slots) {
        return Err(WeftError::Unsupported(format!("draft distribution slot {bad} is past the store's {slots} slots")));
    }
    let spec = factory.upload_u32(&[spec.len() / SPEC_PER_ROW, SPEC_PER_ROW], &spec)?;
    spec_sample(ctx, rec, logits, &spec, store.probs(), out)
}
