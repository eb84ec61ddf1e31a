//! The step contract: what the scheduler asks of the model executor for one forward pass, and
//! what comes back. Everything here is plain data; the engine and the scheduler see a
//! [`ModelExecutor`], never a GPU.
//!
//! ```text
//!   scheduler.schedule() ──> StepBatch ──(engine adds each row's SampleSpec)──> executor.execute()
//!                                                                                   │
//!   scheduler.update_from_output(batch, accepted) <── accepted_len() <── StepOutput ┘
//! ```
//!
//! A sequence's share of a step ([`SeqStep`]) runs `tokens` at positions `start_pos..` and
//! samples from the logits of its last `num_logits` tokens: none for a prefill chunk that does
//! not reach the end of the prompt, one for a decode or a prompt's last chunk, and `k + 1` when
//! the last `k` tokens are drafted (speculative) tokens to verify. Row `i`'s sample is the
//! model's choice after `tokens[..len - num_logits + i + 1]`, so drafted token `i` is accepted
//! when the sample of the row before it equals it; the run of samples up to and including the
//! first disagreement is what the sequence gains ([`accepted_len`]). Rejected positions are
//! rolled back by the scheduler (their KV is simply never marked computed). A draft model's
//! verifying rows for sampled requests carry the rejection-sampling rule
//! (`sampling::DraftRow`): such a row's sample is the drafted token exactly when the rule
//! accepts it, so `accepted_len` serves every kind of speculation.
//!
//! **Invariant:** a [`StepOutput`] has exactly one entry per [`SeqStep`], in order, holding
//! exactly `num_logits` samples.

use std::sync::Arc;

use crate::error::Result;
use crate::kv::{KvCacheConfig, RecurrentStateConfig, SeqId};
use crate::lora::{LoraAdapter, LoraConfig};
use crate::rt::BoxFuture;
use crate::sampling::{SampleSpec, Sampled};

/// One sequence's share of a step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SeqStep {
    pub id: SeqId,
    /// The tokens to run, at positions `start_pos..start_pos + tokens.len()`: known tokens whose
    /// KV is not computed yet, then (when `num_logits > 1`) the drafted tokens to verify.
    pub tokens: Vec<u32>,
    /// How many tokens of this sequence are already in the KV cache.
    pub start_pos: usize,
    /// Physical KV block of each logical block, covering at least `start_pos + tokens.len()`.
    pub block_table: Vec<u32>,
    /// Logit rows to sample, taken from the last `num_logits` tokens (0, 1, or drafted + 1).
    pub num_logits: usize,
    /// How to sample each row; set by the engine for every sequence with `num_logits > 0`.
    pub sampling: Option<SampleSpec>,
    /// The recurrent-state slot the sequence holds (models with state-space layers only). The
    /// state is read from it and the state after `tokens` written back; at `start_pos == 0`
    /// it starts from zero, whatever the slot held before.
    pub state_slot: Option<u32>,
    /// A prefix-state snapshot slot to start from instead of `state_slot` (the state at
    /// `start_pos`, restored on a prefix-cache hit).
    pub state_restore: Option<u32>,
    /// A snapshot slot that also receives the state after `tokens` (the end of a prompt's full
    /// blocks, for the prefix cache).
    pub state_save: Option<u32>,
    /// The LoRA adapter slot the sequence runs with; `None`: the base model.
    pub lora_slot: Option<u32>,
    /// An embedding request's last chunk: the executor also returns the final hidden state of
    /// its last logit row (the prompt's last token, which last-token pooling takes).
    pub embed: bool,
}

impl SeqStep {
    /// The drafted tokens this step verifies (the last `num_logits - 1` tokens).
    pub fn drafted(&self) -> &[u32] {
        let num_drafted = self.num_logits.saturating_sub(1).min(self.tokens.len());
        &self.tokens[self.tokens.len() - num_drafted..]
    }

    /// Position just past the last token run this step.
    pub fn end_pos(&self) -> usize {
        self.start_pos + self.tokens.len()
    }
}

/// One forward pass: what the scheduler picked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepBatch {
    /// Running sequences first (decodes and unfinished prefills), then newly admitted ones.
    pub seqs: Vec<SeqStep>,
    /// Sequences preempted while scheduling this step (blocks freed; back in the waiting queue).
    pub preempted: Vec<SeqId>,
    /// Sum of `seqs[i].tokens.len()`.
    pub num_batched_tokens: usize,
    /// Adapters to write into their slots before this step runs (each slot idle until then).
    pub lora_loads: Vec<LoraLoad>,
}

/// An adapter to put into a slot of the executor's pool.
#[derive(Clone, Debug)]
pub struct LoraLoad {
    pub slot: u32,
    pub adapter: Arc<LoraAdapter>,
}

impl PartialEq for LoraLoad {
    fn eq(&self, other: &Self) -> bool {
        self.slot == other.slot && self.adapter.id == other.adapter.id
    }
}

impl StepBatch {
    /// Tokens run in this step, over all sequences.
    pub fn num_batched_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }

    /// Logit rows sampled in this step, over all sequences.
    pub fn num_logits(&self) -> usize {
        self.seqs.iter().map(|s| s.num_logits).sum()
    }
}

/// What one step produced: per sequence of the batch, in order, one sample per logit row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOutput {
    pub samples: Vec<Vec<Sampled>>,
    /// Per sequence of the batch, in order: the final hidden state (hidden_size values) of its
    /// last logit row when it asked for it (`SeqStep::embed`), else empty.
    pub hidden: Vec<Vec<f32>>,
    /// Where the step's time went.
    pub timings: StepTimings,
}

/// Where one step's time went, in seconds. Host phases are wall time on the calling thread;
/// the GPU's own time is known where the adapter has timestamps and profiling is on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTimings {
    /// Choosing the batch and preparing its sampling (the engine's part).
    pub schedule_s: f64,
    /// Writing the step's inputs and recording its dispatches.
    pub record_s: f64,
    /// Encoding the command buffer (bind groups, passes).
    pub encode_s: f64,
    /// Handing it to the queue.
    pub submit_s: f64,
    /// Waiting for the GPU and the readback, `ahead_s` included.
    pub wait_s: f64,
    /// Encoding the next step's commands while the GPU runs this one (overlapped with the GPU,
    /// so not part of [`host_s`](Self::host_s)).
    pub ahead_s: f64,
    /// Applying the step's samples: appending them, detokenizing, matching stops, sending
    /// stream chunks, retiring finished requests (the engine's part after the GPU).
    pub output_s: f64,
    /// Dispatches recorded.
    pub dispatches: usize,
    /// The GPU's time for the step's pass, where the adapter has timestamps.
    pub gpu_s: Option<f64>,
    /// GPU time of each kernel variant, summed over its dispatches (profiling only).
    pub kernels: Vec<(String, f64)>,
}

impl StepTimings {
    /// Host time spent on the step, the GPU wait excluded.
    pub fn host_s(&self) -> f64 {
        self.schedule_s + self.record_s + self.encode_s + self.submit_s + self.output_s
    }
}

/// How many of `samples` (one per logit row of `seq`) the sequence keeps: each row whose
/// sample equals the next drafted token accepts it and lets the next row count; the first row
/// that disagrees (or the last row) ends the run with its own sample. 0 when nothing was
/// sampled.
pub fn accepted_len(seq: &SeqStep, samples: &[Sampled]) -> usize {
    let drafted = seq.drafted();
    let agreeing = samples.iter().zip(drafted).take_while(|&(s, &d)| s.token == d).count();
    (agreeing + 1).min(samples.len())
}

/// The store of drafted rows' distributions a draft executor shares with its target: the draft
/// keeps there the distribution it drew each drafted token from (`sampling::DraftRow::Keep`),
/// and the target's verifying rows read it back (`sampling::DraftRow::Verify`) for the
/// rejection-sampling rule. Two executors share a store when they report the same `id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftStore {
    /// Identifies the store (the same for the draft and the target that share it).
    pub id: u64,
    /// Drafted rows it holds per step (slots `0..slots`).
    pub slots: usize,
}

/// Runs forward steps of a model. The engine holds one as `Arc<dyn ModelExecutor>`; the
/// executor owns the GPU memory behind the KV blocks the tables name.
pub trait ModelExecutor: Send + Sync {
    /// Run one step. The executor trusts its input: the engine validated every request at
    /// submission and the scheduler's tables fit the pool (checked by debug assertions only).
    fn execute<'a>(&'a self, batch: &'a StepBatch) -> BoxFuture<'a, Result<StepOutput>>;
    fn vocab_size(&self) -> usize;
    /// Positions a sequence may reach.
    fn max_context(&self) -> usize;
    fn kv_config(&self) -> KvCacheConfig;
    /// Whether the model is an encoder, whose attention sees each sequence whole: it embeds
    /// only, and every prompt must run whole in one step, without the prefix cache.
    fn bidirectional(&self) -> bool {
        false
    }

    /// The length of the hidden states `SeqStep::embed` returns, for a model that serves
    /// embeddings (`model::config::Pooling`); `None`: it serves none.
    fn embedding_size(&self) -> Option<usize> {
        None
    }
    /// The state-slot pool behind `SeqStep::state_slot`; `None` for a model without
    /// recurrent layers.
    fn state_config(&self) -> Option<RecurrentStateConfig> {
        None
    }
    /// Prove the device still answers (a small round trip); for health checks.
    fn health_check(&self) -> BoxFuture<'_, Result<()>>;
    /// Time every kernel of the next steps on the GPU (slower: one pass per dispatch), or stop.
    fn set_profiling(&self, _on: bool) {}
    /// Prefill tokens per second of GPU time this device surely manages, to size the first
    /// step before one is measured (`engine::step_budget`); `None`: the device needs no time
    /// budget (a CPU driver), unless the engine's config asks for one.
    fn cautious_tokens_per_second(&self) -> Option<f64> {
        None
    }

    /// The LoRA adapter pool behind `SeqStep::lora_slot`; `None`: adapters are not served.
    fn lora_config(&self) -> Option<LoraConfig> {
        None
    }

    /// The drafted rows' distribution store this executor shares with its draft (or target),
    /// if any. Without one, sampled requests are not speculated with a draft model.
    fn draft_store(&self) -> Option<DraftStore> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(tokens: Vec<u32>, num_logits: usize) -> SeqStep {
        SeqStep {
            id: 1,
            tokens,
            start_pos: 10,
            block_table: vec![0],
            num_logits,
            sampling: None,
            state_slot: None,
            state_restore: None,
            state_save: None,
            lora_slot: None,
            embed: false,
        }
    }

    fn samples(tokens: &[u32]) -> Vec<Sampled> {
        tokens.iter().map(|&token| Sampled { token, logprob: 0.0, top_logprobs: Vec::new() }).collect()
    }

    #[test]
    fn drafted_tokens_are_the_tail() {
        assert_eq!(seq(vec![5, 6, 7, 8], 3).drafted(), &[7, 8]);
        assert!(seq(vec![5], 1).drafted().is_empty());
        assert!(seq(vec![5, 6], 0).drafted().is_empty());
        assert_eq!(seq(vec![5, 6], 0).end_pos(), 12);
    }

    #[test]
    fn the_accepted_run_ends_at_the_first_disagreement() {
        // Last known token 5, drafts 6 7 8: rows sample after 5, 6, 7, 8.
        let s = seq(vec![5, 6, 7, 8], 4);
        assert_eq!(accepted_len(&s, &samples(&[6, 7, 8, 9])), 4, "all drafts and the bonus token");
        assert_eq!(accepted_len(&s, &samples(&[6, 3, 8, 9])), 2, "draft 6, then the correction 3");
        assert_eq!(accepted_len(&s, &samples(&[1, 7, 8, 9])), 1, "only the correction");
        assert_eq!(accepted_len(&seq(vec![5], 1), &samples(&[2])), 1);
        assert_eq!(accepted_len(&seq(vec![5, 6], 0), &[]), 0);
    }
}
