//! The GPU half of sampling, in one place: for each sampled logit row of a step it records
//! logit biases and penalties (`shaders/penalize.wgsl`), then the token-mask slot, then the
//! sampler (`shaders/sample.wgsl`), and it decodes the sampler's output rows. The host half
//! (parameters, draws, penalty entries) is `crate::sampling`.
//!
//! ```text
//!   logits (rows, vocab) ──penalize──> token_mask (structured output) ──sample──> out (rows, 42)
//!                                                                      [draft rows: spec_sample] ─┘
//! ```
//!
//! A verifying row is biased like any other before `spec_sample` reads it, so drafted tokens
//! are accepted against the biased target distribution (and a draft model's rows, sampled with
//! the request's parameters, draft from its own biased one).
//!
//! **Invariant:** every row is sampled from its own logits, settings and draw only, so a row's
//! token does not depend on the rest of the batch.

use crate::error::{Result, WeftError};
use crate::gpu::kernels::penalize::{ENTRY_WORDS, UNSEEN, penalize};
use crate::gpu::kernels::sample::{OUT_PER_ROW, SETTINGS_PER_ROW, sample};
use crate::gpu::kernels::spec_sample::{MODE_KEEP, MODE_VERIFY, SPEC_PER_ROW, spec_sample};
use crate::gpu::kernels::token_mask::{MASKED_LOGIT, token_mask};
use crate::gpu::{GpuContext, GpuTensor, GpuTensorFactory, Recording};
use crate::model::draft::DraftDistributions;
use crate::quant::DType;
use crate::sampling::{DraftRow, MAX_TOP_LOGPROBS, Sampled, SamplingParams, TokenMask};
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
        // The sampler works out the log-sum-exp only for rows that asked for log-probabilities.
        logprob: if top_logprobs > 0 { f32::from_bits(row[1]) } else { 0.0 },
        top_logprobs: (0..top_logprobs.min(MAX_TOP_LOGPROBS))
            .map(|n| (row[2 + 2 * n], f32::from_bits(row[3 + 2 * n])))
            // Tokens a mask forbade are not alternatives (rows with fewer allowed tokens than
            // asked for list only those).
            .filter(|&(_, logprob)| logprob > MASKED_LOGIT / 2.0)
            .collect(),
    }
}

/// The sampler's buffers, made once for up to `rows` logit rows and `entries` penalty entries
/// (grown when a step needs more) and rewritten every step.
pub struct SamplerBuffers {
    settings: GpuTensor,  // (rows, SETTINGS_PER_ROW) U32
    penalties: GpuTensor, // (rows, 3) F32: repetition, presence, frequency
    entries: GpuTensor,   // (entries, ENTRY_WORDS) U32: row, token, times generated or UNSEEN, bias
    out: GpuTensor,       // (rows, OUT_PER_ROW) U32
    spec: GpuTensor,      // (rows, SPEC_PER_ROW) U32: the draft rows, see [`spec_row`]
    masks: GpuTensor,     // (rows, ceil(vocab / 32)) U32: structured output's allowed tokens
    mask_rows: GpuTensor, // (rows, 1) U32: the logit row of each mask
}

impl SamplerBuffers {
    pub fn new(factory: &dyn TensorFactory, rows: usize, entries: usize, vocab: usize) -> Result<Self> {
        Ok(SamplerBuffers {
            settings: factory.zeros(&[rows, SETTINGS_PER_ROW], DType::U32)?,
            penalties: factory.zeros(&[rows, 3], DType::F32)?,
            entries: factory.zeros(&[entries.max(1), ENTRY_WORDS], DType::U32)?,
            out: factory.zeros(&[rows, OUT_PER_ROW], DType::U32)?,
            spec: factory.zeros(&[rows, SPEC_PER_ROW], DType::U32)?,
            masks: factory.zeros(&[rows, vocab.div_ceil(32)], DType::U32)?,
            mask_rows: factory.zeros(&[rows, 1], DType::U32)?,
        })
    }

    /// (logit rows, bias and penalty entries) these buffers hold.
    pub fn capacity(&self) -> (usize, usize) {
        (self.settings.shape()[0], self.entries.shape()[0])
    }
}

/// What the sampler needs uploaded for one step: per logit row its settings and penalties, and
/// the bias and penalty entries of every row.
pub struct SamplerInputs {
    settings: Vec<u32>,
    penalties: Vec<f32>,
    entries: Vec<u32>,
    /// Rows speculating with a draft model, [`SPEC_PER_ROW`] words each.
    spec: Vec<u32>,
    /// Structured output: the logit rows with a mask, and their masks (maybe still being
    /// computed: [`write`] waits for them).
    masks: Vec<(u32, TokenMask)>,
}

impl SamplerInputs {
    /// The inputs of every logit row of `batch`, in batch order.
    pub fn of(batch: &StepBatch) -> Self {
        let num_rows = batch.num_logits();
        let greedy = SamplingParams::greedy();
        let mut settings = Vec::with_capacity(num_rows * SETTINGS_PER_ROW);
        let mut penalties = Vec::with_capacity(num_rows * 3);
        let mut entries = Vec::new();
        let mut draft_rows = Vec::new();
        let mut masks = Vec::new();
        for seq in batch.seqs.iter().filter(|s| s.num_logits > 0) {
            let spec = seq.sampling.as_ref();
            debug_assert!(
                spec.is_some_and(|s| s.rows.len() == seq.num_logits),
                "the engine prepares every sampled row"
            );
            for i in 0..seq.num_logits {
                let row = (settings.len() / SETTINGS_PER_ROW) as u32;
                let (params, draw) = match spec {
                    Some(s) => (&s.params, s.rows.get(i)),
                    None => (&greedy, None),
                };
                settings.extend(settings_row(params, draw.map_or(0.0, |d| d.uniform)));
                penalties.extend([params.repetition_penalty, params.presence_penalty, params.frequency_penalty]);
                let seen = draw.filter(|_| params.has_penalties()).map_or(&[][..], |d| &d.penalty_entries);
                push_entries(&mut entries, row, seen, params.logit_bias.pairs());
                if let Some((draw, draft)) = draw.and_then(|d| Some((d, d.draft?))) {
                    draft_rows.extend(spec_row(row, params, draw.uniform, draft));
                }
                if let Some(mask) = draw.and_then(|d| d.allowed.clone()) {
                    masks.push((row, mask));
                }
            }
        }
        SamplerInputs { settings, penalties, entries, spec: draft_rows, masks }
    }

    /// Bias and penalty entries these inputs hold.
    pub fn num_entries(&self) -> usize {
        self.entries.len() / ENTRY_WORDS
    }

    /// Rows these inputs speculate with a draft model.
    pub fn num_spec_rows(&self) -> usize {
        self.spec.len() / SPEC_PER_ROW
    }

    /// Rows these inputs mask (structured output).
    pub fn num_mask_rows(&self) -> usize {
        self.masks.len()
    }
}

/// Append `row`'s entries for the penalize kernel: one per token that is `seen` (penalty entries,
/// by token) or `biased` (by token), so that no two entries touch the same logit.
fn push_entries(entries: &mut Vec<u32>, row: u32, seen: &[(u32, u32)], biased: &[(u32, f32)]) {
    let (mut seen, mut biased) = (seen.iter().peekable(), biased.iter().peekable());
    loop {
        let (token, count, bias) = match (seen.peek(), biased.peek()) {
            (None, None) => return,
            (Some(&&(s, count)), Some(&&(b, bias))) if s == b => {
                seen.next();
                biased.next();
                (s, count, bias)
            }
            (Some(&&(s, count)), b) if b.is_none_or(|&&(b, _)| s < b) => {
                seen.next();
                (s, count, 0.0)
            }
            _ => {
                let &(b, bias) = biased.next().expect("one side is left");
                (b, UNSEEN, bias)
            }
        };
        entries.extend([row, token, count, bias.to_bits()]);
    }
}

/// The settings of logit row `row` for `spec_sample` (`SPEC` in shaders/spec_sample.wgsl).
pub fn spec_row(row: u32, params: &SamplingParams, uniform: f32, draft: DraftRow) -> [u32; SPEC_PER_ROW] {
    let (mode, slot, token, accept_uniform) = match draft {
        DraftRow::Keep { slot } => (MODE_KEEP, slot, 0, 0.0f32),
        DraftRow::Verify { slot, token, accept_uniform } => (MODE_VERIFY, slot, token, accept_uniform),
    };
    [
        row,
        mode,
        slot,
        token,
        params.temperature.to_bits(),
        params.top_k,
        params.top_p.to_bits(),
        params.min_p.to_bits(),
        accept_uniform.to_bits(),
        uniform.to_bits(),
        u32::from(params.top_logprobs > 0),
        0,
    ]
}

impl SamplerBuffers {
    /// The output rows of a step with `rows` logit rows.
    pub fn out(&self, rows: usize) -> Result<GpuTensor> {
        self.out.slice_rows(0..rows)
    }
}

/// Upload a step's sampler inputs into `bufs` (queued writes; nothing is created).
pub fn write(factory: &GpuTensorFactory, inputs: &SamplerInputs, bufs: &SamplerBuffers, rows: usize) -> Result<()> {
    factory.write(&bufs.settings.slice_rows(0..rows)?, bytemuck::cast_slice(&inputs.settings))?;
    if inputs.num_entries() > 0 {
        factory.write(&bufs.entries.slice_rows(0..inputs.num_entries())?, bytemuck::cast_slice(&inputs.entries))?;
        factory.write(&bufs.penalties.slice_rows(0..rows)?, bytemuck::cast_slice(&inputs.penalties))?;
    }
    if inputs.num_spec_rows() > 0 {
        factory.write(&bufs.spec.slice_rows(0..inputs.num_spec_rows())?, bytemuck::cast_slice(&inputs.spec))?;
    }
    if !inputs.masks.is_empty() {
        // A mask may still be being computed on another thread: the executor writes the
        // sampler's inputs after recording the forward pass, so the two overlap.
        let words = bufs.masks.shape()[1];
        let mut masks = Vec::with_capacity(inputs.masks.len() * words);
        for (_, mask) in &inputs.masks {
            let start = masks.len();
            masks.extend_from_slice(mask.wait());
            masks.resize(start + words, 0);
        }
        let rows: Vec<u32> = inputs.masks.iter().map(|(row, _)| *row).collect();
        let n = rows.len();
        factory.write(&bufs.masks.slice_rows(0..n)?, bytemuck::cast_slice(&masks))?;
        factory.write(&bufs.mask_rows.slice_rows(0..n)?, bytemuck::cast_slice(&rows))?;
    }
    Ok(())
}

/// Record the sampling of `logits` (rows, vocab), whose rows are the batch's logit rows in
/// order, from the inputs [`write`] put in `bufs`.
///
/// Speculative decoding with a draft model follows the sampler (rows whose `RowDraw::draft` is
/// set; see `shaders/spec_sample.wgsl`): a draft's rows keep the distribution they drew their
/// token from in `store`, a target's verifying rows keep their drafted token with probability
/// min(1, p/q) or replace it (and its log-probability) with a draw from the residual max(0, p − q).
pub fn record(
    ctx: &GpuContext,
    rec: &mut Recording,
    logits: &GpuTensor,
    inputs: &SamplerInputs,
    bufs: &SamplerBuffers,
    store: Option<&DraftDistributions>,
) -> Result<()> {
    let rows = logits.shape()[0];
    let settings = bufs.settings.slice_rows(0..rows)?;
    if inputs.num_entries() > 0 {
        let entries = bufs.entries.slice_rows(0..inputs.num_entries())?;
        penalize(ctx, rec, logits, &entries, &bufs.penalties.slice_rows(0..rows)?)?;
    }
    if inputs.num_mask_rows() > 0 {
        let n = inputs.num_mask_rows();
        token_mask(ctx, rec, logits, &bufs.masks.slice_rows(0..n)?, &bufs.mask_rows.slice_rows(0..n)?.reshape(&[n])?)?;
    }
    sample(ctx, rec, logits, &settings, &bufs.out(rows)?)?;
    if inputs.num_spec_rows() == 0 {
        return Ok(());
    }
    let store = store.ok_or_else(|| {
        WeftError::Unsupported(
            "a step has speculative rows, but this executor shares no draft distributions with a draft model".into(),
        )
    })?;
    let spec = bufs.spec.slice_rows(0..inputs.num_spec_rows())?;
    spec_sample(ctx, rec, logits, &spec, store.probs(), &bufs.out(rows)?)
}

/// Refuse draft rows whose slot lies past `store` (before anything is written or recorded).
pub fn check_draft_slots(inputs: &SamplerInputs, store: Option<&DraftDistributions>) -> Result<()> {
    let slots = store.map_or(0, |s| s.store().slots) as u32;
    match inputs.spec.chunks(SPEC_PER_ROW).map(|r| r[2]).find(|&slot| slot >= slots) {
        Some(bad) => {
            Err(WeftError::Unsupported(format!("draft distribution slot {bad} is past the store's {slots} slots")))
        }
        None => Ok(()),
    }
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
    StepOutput { samples, ..Default::default() }
}
