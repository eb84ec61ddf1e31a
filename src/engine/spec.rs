//! Speculative decoding inside continuous batching: a drafter proposes up to k tokens for each
//! decoding sequence, and the target verifies them in the same forward pass as every other
//! sequence's decode or prefill chunk (k + 1 logit rows for a speculating sequence; see
//! `step`). Nothing about batching changes: the scheduler trims drafts to the token budget,
//! `max_tokens` and the context, gives them up before preempting anyone, and rolls rejected
//! ones back (`ContinuousBatchScheduler::propose_drafts`, `update_from_output`).
//!
//! Two drafters ([`Drafter`]):
//! - **Prompt lookup**: the sequence's last n tokens (n from `max_ngram` down to `min_ngram`)
//!   are looked up earlier in its prompt and output; the tokens that followed the most recent
//!   match are the drafts. No second model; pays off when the output copies its input (edits,
//!   lists, code).
//! - **A draft model**: a second `ModelExecutor` with its own KV memory behind the same block
//!   ids, so the scheduler stays the one owner of KV capacity. Drafting happens after
//!   `schedule` has reserved room for the drafts (placeholder tokens that the drafts replace):
//!   one draft pass catches up the positions the draft has not computed yet for every
//!   speculating sequence and drafts their first token, then one single-token pass per further
//!   draft, each batched over all of them. Per sequence the speculator tracks how many
//!   positions the draft's KV holds; rejected drafts, preemption and the end of a request lower
//!   or drop it. A sequence never trusts KV it did not compute itself in the draft (prefix-cache
//!   blocks may hold another request's target KV only), so it catches up from position 0.
//!
//! Why the output is exactly the target's:
//! - **Greedy** requests keep drafts while the target's argmax agrees, so they produce the
//!   argmax sequence token for token (kernels are batch invariant, so a token verified among
//!   k + 1 has the logits it would have had alone).
//! - **Sampled requests with prompt lookup** (a point-mass proposal q = δ(d)): each verifying
//!   row simply samples the target with the draw it would have used without speculation (the
//!   n-th generated token takes the n-th draw of the request's stream) and keeps d when the
//!   sample equals it. That is the rejection-sampling rule for a point mass: d is accepted with
//!   probability p(d) = min(1, p(d)/q(d)), and a rejection draws from p without d, which is the
//!   normalised max(0, p − q). So the output is not only distributed as without speculation,
//!   it is the same tokens, seed for seed.
//! - **Sampled requests with a draft model**: the draft draws its token from its own filtered
//!   distribution q with its own stream (the request's seed with [`DRAFT_SALT`]) and keeps q on
//!   the GPU; the target's verifying row keeps d with probability min(1, p/q) (the test draw
//!   comes from a third stream, [`ACCEPT_SALT`]), else draws from the normalised max(0, p − q)
//!   with the row's usual draw (`shaders/spec_sample.wgsl`). The output is distributed exactly
//!   as the target's. Each draw depends only on the request and the position, but which
//!   positions are drafted depends on k, and k depends on the batch (the batch-size limit, the
//!   draft slots) and on the sequence's own acceptance, so **a seeded sampled request with a
//!   draft model repeats its tokens for the same batch composition only**. Greedy requests and
//!   prompt lookup have no such caveat.
//!
//! Penalties, stop tokens and strings, `max_tokens` and log-probabilities need nothing here:
//! every verifying row is sampled with the penalties of the history before it, and output
//! processing takes the accepted run token by token, ending the request at a stop inside it.
//!
//! **Invariant:** drafted tokens only ever occupy a decoding sequence's tail in a step; the
//! speculator holds no KV blocks (the scheduler does).

use std::collections::HashMap;
use std::sync::Arc;

use crate::engine::metrics::EngineMetrics;
use crate::engine::output::Live;
use crate::engine::scheduler::ContinuousBatchScheduler;
use crate::error::{Result, WeftError};
use crate::kv::SeqId;
use crate::sampling::{DraftRow, SampleSpec, Sampled, Sampler, SamplerRng, SamplingParams};
use crate::step::{ModelExecutor, SeqStep, StepBatch};

/// Mixed into a request's seed for the draft model's draws.
pub const DRAFT_SALT: u64 = 0xD4AF_7C0D_E5EE_D001;
/// Mixed into a request's seed for the draws of the accept test.
pub const ACCEPT_SALT: u64 = 0xACCE_97E5_7EE0_D002;
/// The most tokens one step may draft per sequence.
pub const MAX_SPECULATIVE_TOKENS: usize = 32;
/// Steps a sequence pauses speculating the first time its acceptance drops too low; each
/// further pause doubles, up to [`MAX_PAUSE_STEPS`].
const FIRST_PAUSE_STEPS: usize = 8;
const MAX_PAUSE_STEPS: usize = 128;
/// Weight of the latest step in a sequence's running acceptance rate.
const ACCEPTANCE_WEIGHT: f32 = 0.3;

/// Where drafted tokens come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Drafter {
    /// A draft model: the engine's draft executor (same vocabulary, its own KV memory).
    DraftModel,
    /// Prompt lookup: the tokens that followed the latest earlier match of the sequence's last
    /// n tokens, n from `max_ngram` down to `min_ngram`.
    PromptLookup { min_ngram: usize, max_ngram: usize },
}

impl Drafter {
    /// Prompt lookup with the default n-gram sizes (2 to 4 tokens).
    pub fn prompt_lookup() -> Self {
        Drafter::PromptLookup { min_ngram: 2, max_ngram: 4 }
    }
}

/// Speculative decoding settings: how many tokens to draft, by which drafter, and when
/// speculation is not worth it.
#[derive(Clone, Debug, PartialEq)]
pub struct SpeculationConfig {
    /// Tokens drafted per sequence and step at most (k).
    pub num_speculative_tokens: usize,
    pub drafter: Drafter,
    /// Adapt each sequence's k to its recent acceptance: two more after a step that kept every
    /// draft, one fewer after one that did not (at least 1, at most `num_speculative_tokens`).
    pub adaptive: bool,
    /// Speculate only in steps with at most this many running sequences: verifying drafts pays
    /// while a step is memory-bound, not when the batch already fills the device.
    pub max_batch_size: usize,
    /// A sequence whose running acceptance rate (accepted / drafted) drops below this pauses
    /// speculating for a while (8 steps, doubling on each further pause up to 128); 0 never
    /// pauses.
    pub min_acceptance_rate: f32,
}

/// The name for [`SpeculationConfig`].
pub type SpeculativeDecodingConfig = SpeculationConfig;

impl Default for SpeculationConfig {
    fn default() -> Self {
        SpeculationConfig {
            num_speculative_tokens: 4,
            drafter: Drafter::DraftModel,
            adaptive: true,
            max_batch_size: 8,
            min_acceptance_rate: 0.2,
        }
    }
}

impl SpeculationConfig {
    /// Prompt lookup with the defaults otherwise.
    pub fn prompt_lookup() -> Self {
        SpeculationConfig { drafter: Drafter::prompt_lookup(), ..Default::default() }
    }

    /// Refuse settings that cannot work, saying which.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(WeftError::Unsupported(format!("speculative decoding: {why}")));
        let k = self.num_speculative_tokens;
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&k) {
            return bad(format!("num_speculative_tokens is {k}; it must be between 1 and {MAX_SPECULATIVE_TOKENS}"));
        }
        if self.max_batch_size == 0 {
            return bad("max_batch_size is 0; it must be at least 1".into());
        }
        if !(0.0..1.0).contains(&self.min_acceptance_rate) {
            return bad(format!("min_acceptance_rate is {}; it must be in [0, 1)", self.min_acceptance_rate));
        }
        if let Drafter::PromptLookup { min_ngram, max_ngram } = self.drafter
            && !(1 <= min_ngram && min_ngram <= max_ngram)
        {
            return bad(format!("prompt lookup n-grams {min_ngram}..={max_ngram}; need 1 <= min_ngram <= max_ngram"));
        }
        Ok(())
    }
}

/// Prompt lookup: `max_drafts` tokens that followed the most recent earlier occurrence of the
/// last n tokens of `tokens`, trying n from `max_ngram` down to `min_ngram`; empty when none
/// matches. When the match is so recent that fewer tokens follow it, the copy runs on into the
/// drafts themselves (a loop of period p proposes its next `max_drafts` tokens).
pub fn prompt_lookup(tokens: &[u32], min_ngram: usize, max_ngram: usize, max_drafts: usize) -> Vec<u32> {
    let len = tokens.len();
    for n in (min_ngram.max(1)..=max_ngram).rev() {
        if len < n + 1 || max_drafts == 0 {
            continue;
        }
        let suffix = &tokens[len - n..];
        // Matches start at most at len - n - 1, so at least one token follows each.
        if let Some(start) = (0..len - n).rev().find(|&i| &tokens[i..i + n] == suffix) {
            let mut drafts = Vec::with_capacity(max_drafts);
            for i in start + n..start + n + max_drafts {
                drafts.push(if i < len { tokens[i] } else { drafts[i - len] });
            }
            return drafts;
        }
    }
    Vec::new()
}

/// One sequence's speculation state.
#[derive(Clone, Debug)]
struct SeqSpeculation {
    /// Its current k.
    num_drafts: usize,
    /// Running acceptance rate (accepted / drafted per step, exponentially weighted).
    acceptance: f32,
    /// Steps left before it speculates again.
    paused_steps: usize,
    /// Length of its next pause.
    next_pause_steps: usize,
    /// Draft model: positions 0.. of this sequence whose KV the draft holds.
    draft_computed: usize,
}

impl SeqSpeculation {
    fn new(num_drafts: usize) -> Self {
        SeqSpeculation {
            num_drafts,
            acceptance: 1.0,
            paused_steps: 0,
            next_pause_steps: FIRST_PAUSE_STEPS,
            draft_computed: 0,
        }
    }

    /// Learn from a step that kept `accepted` of `drafted` tokens.
    fn learn(&mut self, accepted: usize, drafted: usize, config: &SpeculationConfig) {
        let rate = accepted as f32 / drafted as f32;
        self.acceptance = (1.0 - ACCEPTANCE_WEIGHT) * self.acceptance + ACCEPTANCE_WEIGHT * rate;
        if config.adaptive {
            let k = config.num_speculative_tokens;
            self.num_drafts =
                if accepted == drafted { (self.num_drafts + 2).min(k) } else { (self.num_drafts - 1).max(1) };
        }
        if self.acceptance < config.min_acceptance_rate {
            self.paused_steps = self.next_pause_steps;
            self.next_pause_steps = (self.next_pause_steps * 2).min(MAX_PAUSE_STEPS);
            // Back from the pause on probation: one draft, and a rate halfway to 1.
            self.acceptance = (config.min_acceptance_rate + 1.0) / 2.0;
            self.num_drafts = 1;
        } else if self.acceptance >= 0.5 {
            self.next_pause_steps = FIRST_PAUSE_STEPS;
        }
    }
}

/// The engine's speculation: which sequences draft, how many tokens, the draft model's passes,
/// and what their acceptance teaches.
pub(crate) struct Speculator {
    config: SpeculationConfig,
    draft: Option<Arc<dyn ModelExecutor>>,
    /// Drafted rows of sampled requests a step may hold in the draft distributions the draft
    /// and the target share (0: sampled requests do not speculate with the draft model).
    draft_slots: usize,
    /// Tokens one draft catch-up pass computes at most (the engine's token budget).
    max_catch_up_tokens: usize,
    req_to_seq: HashMap<SeqId, SeqSpeculation>,
    /// This step's first draft-distribution slot of each verifying sampled sequence.
    req_to_first_slot: HashMap<SeqId, u32>,
}

/// The draft model's work for one step, run without the engine's state lock.
pub(crate) struct DraftJob {
    draft: Arc<dyn ModelExecutor>,
    seqs: Vec<DraftSeq>,
}

/// One sequence's part of a [`DraftJob`].
struct DraftSeq {
    /// Its index in the target's step.
    batch_index: usize,
    id: SeqId,
    block_table: Vec<u32>,
    /// First position the draft computes (its KV holds the ones before).
    start_pos: usize,
    /// Known tokens from `start_pos` on: the catch-up, ending with the last sampled token when
    /// the sequence drafts.
    catch_up: Vec<u32>,
    /// Tokens to draft; 0 when the catch-up did not fit this step (the sequence then verifies
    /// nothing this step).
    num_drafts: usize,
    /// The request's sampling, without log-probabilities (nobody reads the draft's).
    params: SamplingParams,
    seed: u64,
    prompt: Vec<u32>,
    output: Vec<u32>,
    /// Sampled requests: the draft-distribution slot of its first draft.
    first_slot: Option<u32>,
}

impl DraftSeq {
    /// The known length of the sequence (its drafts start at this position).
    fn known_len(&self) -> usize {
        self.start_pos + self.catch_up.len()
    }

    /// How the draft picks draft `drafted.len()`: the request's sampling (and penalties, with
    /// the drafts so far in the history) with the draft's own stream; sampled requests keep the
    /// distribution for the target's accept test.
    fn row_spec(&self, sampler: &dyn Sampler, drafted: &[u32]) -> SampleSpec {
        let seed = self.seed ^ DRAFT_SALT;
        let SampleSpec { params, mut rows } = sampler.prepare(&self.params, seed, &self.prompt, &self.output, drafted);
        let mut row = rows.pop().unwrap_or_default();
        row.draft = self.first_slot.map(|slot| DraftRow::Keep { slot: slot + drafted.len() as u32 });
        SampleSpec { params, rows: vec![row] }
    }
}

impl DraftJob {
    /// Run the draft: pass 0 catches every sequence up and drafts its first token, pass j
    /// drafts token j + 1 of the sequences that want that many. Returns the drafts of each
    /// sequence, in job order.
    pub async fn run(&self, sampler: &dyn Sampler) -> Result<Vec<Vec<u32>>> {
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); self.seqs.len()];
        let passes = self.seqs.iter().map(|d| d.num_drafts).max().unwrap_or(0).max(1);
        for pass in 0..passes {
            let mut batch = StepBatch::default();
            let mut members = Vec::new();
            for (i, d) in self.seqs.iter().enumerate() {
                let (tokens, start_pos) = if pass == 0 {
                    (d.catch_up.clone(), d.start_pos)
                } else if pass < d.num_drafts && drafts[i].len() == pass {
                    (vec![drafts[i][pass - 1]], d.known_len() + pass - 1)
                } else {
                    continue;
                };
                let num_logits = usize::from(d.num_drafts > 0);
                let sampling = (num_logits > 0).then(|| d.row_spec(sampler, &drafts[i]));
                let block_table = d.block_table.clone();
                batch.seqs.push(SeqStep {
                    id: d.id,
                    tokens,
                    start_pos,
                    block_table,
                    num_logits,
                    sampling,
                    state_slot: None,
                    state_restore: None,
                    state_save: None,
                    lora_slot: None,
                    embed: false,
                });
                members.push(i);
            }
            if batch.seqs.is_empty() {
                break;
            }
            batch.num_batched_tokens = batch.num_batched_tokens();
            let out = self.draft.execute(&batch).await?;
            for (&i, rows) in members.iter().zip(out.samples) {
                drafts[i].extend(rows.first().map(|x| x.token));
            }
        }
        Ok(drafts)
    }
}

/// Take drafted tokens of `batch.seqs[index]` back out of the step, keeping the first `keep`
/// (the scheduler returns the blocks that only they used after the step).
fn strip_drafts(batch: &mut StepBatch, index: usize, keep: usize) {
    let s = &mut batch.seqs[index];
    let num_dropped = s.drafted().len().saturating_sub(keep);
    s.tokens.truncate(s.tokens.len() - num_dropped);
    s.num_logits -= num_dropped;
    batch.num_batched_tokens -= num_dropped;
}

impl Speculator {
    pub fn new(
        config: SpeculationConfig,
        draft: Option<Arc<dyn ModelExecutor>>,
        draft_slots: usize,
        max_catch_up_tokens: usize,
    ) -> Self {
        Speculator {
            config,
            draft,
            draft_slots,
            max_catch_up_tokens,
            req_to_seq: HashMap::new(),
            req_to_first_slot: HashMap::new(),
        }
    }

    pub fn config(&self) -> &SpeculationConfig {
        &self.config
    }

    /// Before `schedule`: propose drafts (prompt lookup) or reserve room for them (a draft
    /// model) for each decoding sequence that speculates this step.
    pub fn propose(&mut self, scheduler: &mut ContinuousBatchScheduler, live: &HashMap<SeqId, Live>) {
        if scheduler.stats().running > self.config.max_batch_size {
            return;
        }
        let mut slots_left = self.draft_slots;
        for id in scheduler.decoding() {
            let Some(params) = live.get(&id).map(|l| &l.request.params.sampling) else { continue };
            let state =
                self.req_to_seq.entry(id).or_insert_with(|| SeqSpeculation::new(self.config.num_speculative_tokens));
            if state.paused_steps > 0 {
                state.paused_steps -= 1;
                continue;
            }
            let Some(tokens) = scheduler.tokens(id) else { continue };
            let mut k = if self.config.adaptive { state.num_drafts } else { self.config.num_speculative_tokens };
            let drafts = match (&self.config.drafter, &self.draft) {
                (Drafter::PromptLookup { min_ngram, max_ngram }, _) => prompt_lookup(tokens, *min_ngram, *max_ngram, k),
                (Drafter::DraftModel, Some(draft)) => {
                    // The draft computes positions up to len + k - 2.
                    k = k.min((draft.max_context() + 1).saturating_sub(tokens.len()));
                    if params.temperature > 0.0 {
                        k = k.min(slots_left);
                        slots_left -= k;
                    }
                    // Placeholders: the draft fills them in once `schedule` has made room.
                    vec![0; k]
                }
                (Drafter::DraftModel, None) => Vec::new(),
            };
            if !drafts.is_empty() {
                scheduler.propose_drafts(id, drafts);
            }
        }
    }

    /// After `schedule`: forget the draft KV of preempted sequences, and plan the draft
    /// model's passes for the sequences that got room for drafts (None without a draft model
    /// or without such sequences). Sequences whose catch-up does not fit this step catch up
    /// partly and give their drafts back.
    pub fn draft_job(
        &mut self,
        batch: &mut StepBatch,
        scheduler: &ContinuousBatchScheduler,
        live: &HashMap<SeqId, Live>,
    ) -> Option<DraftJob> {
        for id in &batch.preempted {
            if let Some(state) = self.req_to_seq.get_mut(id) {
                state.draft_computed = 0;
            }
        }
        self.req_to_first_slot.clear();
        let draft = self.draft.clone()?;
        let mut budget = self.max_catch_up_tokens;
        let mut next_slot = 0u32;
        let mut seqs = Vec::new();
        for index in 0..batch.seqs.len() {
            let s = &batch.seqs[index];
            let num_drafts = s.drafted().len();
            if num_drafts == 0 {
                continue;
            }
            let (id, block_table, known_len) = (s.id, s.block_table.clone(), s.end_pos() - num_drafts);
            let found = (scheduler.tokens(id), live.get(&id), self.req_to_seq.get(&id));
            let (Some(tokens), Some(live), Some(state)) = found else {
                strip_drafts(batch, index, 0);
                continue;
            };
            let start_pos = state.draft_computed.min(known_len - 1);
            let mut catch_up = tokens[start_pos..known_len].to_vec();
            let fits = catch_up.len() <= budget;
            if !fits {
                catch_up.truncate(budget);
                strip_drafts(batch, index, 0);
            }
            budget -= catch_up.len();
            if catch_up.is_empty() {
                continue;
            }
            let sampled = live.request.params.sampling.temperature > 0.0;
            let first_slot = (fits && sampled).then_some(next_slot);
            if let Some(slot) = first_slot {
                next_slot += num_drafts as u32;
                self.req_to_first_slot.insert(id, slot);
            }
            let (prompt, output) = tokens[..known_len].split_at(live.usage.prompt_tokens.min(known_len));
            seqs.push(DraftSeq {
                batch_index: index,
                id,
                block_table,
                start_pos,
                catch_up,
                num_drafts: if fits { num_drafts } else { 0 },
                params: SamplingParams { top_logprobs: 0, ..live.request.params.sampling.clone() },
                seed: live.seed,
                prompt: prompt.to_vec(),
                output: output.to_vec(),
                first_slot,
            });
        }
        (!seqs.is_empty()).then_some(DraftJob { draft, seqs })
    }

    /// Put the draft's tokens in place of the reserved ones and note how far the draft's KV
    /// got. If the draft failed, every reservation is given back (the step runs without
    /// speculation) and the draft's KV is trusted no further than before.
    pub fn fill(&mut self, batch: &mut StepBatch, job: &DraftJob, drafted: Result<Vec<Vec<u32>>>) {
        let drafted = match drafted {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "the draft model failed; this step verifies no drafts");
                for d in &job.seqs {
                    strip_drafts(batch, d.batch_index, 0);
                    self.req_to_first_slot.remove(&d.id);
                }
                return;
            }
        };
        for (d, tokens) in job.seqs.iter().zip(drafted) {
            let Some(state) = self.req_to_seq.get_mut(&d.id) else {
                // Cancelled while the draft ran: nothing to verify.
                strip_drafts(batch, d.batch_index, 0);
                continue;
            };
            state.draft_computed = d.known_len();
            let s = &mut batch.seqs[d.batch_index];
            let num_drafts = s.drafted().len().min(tokens.len());
            if num_drafts > 0 {
                let end = s.tokens.len() - s.drafted().len() + num_drafts;
                s.tokens[end - num_drafts..end].copy_from_slice(&tokens[..num_drafts]);
                // Drafts 1..k-1 were run through the draft; the last one was not.
                state.draft_computed += num_drafts - 1;
            }
            strip_drafts(batch, d.batch_index, num_drafts);
        }
    }

    /// A verifying sequence's rows under the rejection-sampling rule (a draft model and a
    /// sampled request); other sequences' rows stay plain samples. `num_generated` is the
    /// sequence's generated length before this step.
    pub fn verify_rows(&self, s: &SeqStep, spec: &mut SampleSpec, seed: u64, num_generated: usize) {
        let Some(&first_slot) = self.req_to_first_slot.get(&s.id) else { return };
        for (i, (&token, row)) in s.drafted().iter().zip(&mut spec.rows).enumerate() {
            let accept_uniform = SamplerRng::nth_uniform(seed ^ ACCEPT_SALT, (num_generated + i) as u64);
            row.draft = Some(DraftRow::Verify { slot: first_slot + i as u32, token, accept_uniform });
        }
    }

    /// After the step: count drafted and accepted tokens, adapt each sequence's k, pause the
    /// ones that keep too little, and trust the draft's KV only up to the accepted drafts.
    pub fn observe(&mut self, batch: &StepBatch, runs: &[&[Sampled]], metrics: &mut EngineMetrics) {
        for (s, run) in batch.seqs.iter().zip(runs) {
            let num_drafted = s.drafted().len();
            if num_drafted == 0 || run.is_empty() {
                continue;
            }
            let num_accepted = run.len() - 1;
            metrics.spec_drafted_tokens += num_drafted as u64;
            metrics.spec_accepted_tokens += num_accepted as u64;
            metrics.spec_verify_steps += 1;
            let Some(state) = self.req_to_seq.get_mut(&s.id) else { continue };
            state.learn(num_accepted, num_drafted, &self.config);
            let known_len = s.end_pos() - num_drafted;
            state.draft_computed = state.draft_computed.min(known_len + num_accepted.min(num_drafted - 1));
        }
        self.req_to_first_slot.clear();
    }

    /// The request ended: drop its state.
    pub fn forget(&mut self, id: SeqId) {
        self.req_to_seq.remove(&id);
        self.req_to_first_slot.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_lookup_continues_the_latest_match_of_the_longest_ngram() {
        // "1 2 3" appears twice before the tail; the later one is followed by 7 8.
        let tokens = [1, 2, 3, 4, 5, 1, 2, 3, 7, 8, 9, 1, 2, 3];
        assert_eq!(prompt_lookup(&tokens, 1, 3, 2), vec![7, 8]);
        // Past the end of the sequence the copy continues from its own drafts.
        assert_eq!(prompt_lookup(&tokens, 1, 3, 10), vec![7, 8, 9, 1, 2, 3, 7, 8, 9, 1]);
        // No 4-gram matches; with only 4-grams allowed there is nothing.
        assert!(prompt_lookup(&tokens, 4, 4, 3).is_empty());
        // A shorter n-gram is the fallback: "9 3" never occurs, "3" does (followed by 7).
        assert_eq!(prompt_lookup(&[3, 7, 9, 3], 1, 2, 3), vec![7, 9, 3]);
        // A loop proposes its own continuation, as many tokens as asked.
        assert_eq!(prompt_lookup(&[5, 6, 5, 6, 5, 6], 2, 2, 5), vec![5, 6, 5, 6, 5]);
        assert_eq!(prompt_lookup(&[1, 4, 4, 4], 2, 2, 3), vec![4, 4, 4]);
        assert!(prompt_lookup(&[1], 1, 3, 4).is_empty());
        assert!(prompt_lookup(&[1, 1], 1, 1, 0).is_empty());
    }

    #[test]
    fn k_adapts_to_acceptance_and_low_acceptance_pauses() {
        let config = SpeculationConfig { num_speculative_tokens: 6, ..SpeculationConfig::prompt_lookup() };
        let mut s = SeqSpeculation::new(6);
        s.learn(2, 6, &config);
        assert_eq!(s.num_drafts, 5);
        s.learn(5, 5, &config);
        assert_eq!(s.num_drafts, 6, "capped at k");
        for _ in 0..3 {
            s.learn(0, s.num_drafts, &config);
        }
        assert_eq!(s.num_drafts, 3);
        assert_eq!(s.paused_steps, 0);
        // Keep rejecting: the rate falls below 0.2 and the sequence pauses for 8 steps, then
        // for 16 after the next collapse.
        let mut steps = 0;
        while s.paused_steps == 0 {
            s.learn(0, s.num_drafts, &config);
            steps += 1;
        }
        assert!(steps <= 3, "{steps}");
        assert_eq!((s.paused_steps, s.num_drafts), (8, 1));
        s.paused_steps = 0;
        while s.paused_steps == 0 {
            s.learn(0, 1, &config);
        }
        assert_eq!(s.paused_steps, 16);
        // Without adaptation k stays put; with min_acceptance_rate 0 nothing pauses.
        let fixed = SpeculationConfig { adaptive: false, min_acceptance_rate: 0.0, ..config };
        let mut s = SeqSpeculation::new(6);
        for _ in 0..20 {
            s.learn(0, 6, &fixed);
        }
        assert_eq!((s.num_drafts, s.paused_steps), (6, 0));
    }

    #[test]
    fn bad_settings_are_refused_with_the_reason() {
        let check = |c: SpeculationConfig, what: &str| {
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(what), "{err}");
        };
        let c = SpeculationConfig::default;
        check(SpeculationConfig { num_speculative_tokens: 0, ..c() }, "num_speculative_tokens is 0");
        check(SpeculationConfig { num_speculative_tokens: 33, ..c() }, "between 1 and 32");
        check(SpeculationConfig { max_batch_size: 0, ..c() }, "max_batch_size");
        check(SpeculationConfig { min_acceptance_rate: 1.0, ..c() }, "min_acceptance_rate");
        check(SpeculationConfig { min_acceptance_rate: f32::NAN, ..c() }, "min_acceptance_rate");
        let lookup =
            |min_ngram, max_ngram| SpeculationConfig { drafter: Drafter::PromptLookup { min_ngram, max_ngram }, ..c() };
        check(lookup(0, 2), "n-grams");
        check(lookup(3, 2), "n-grams");
        assert!(lookup(1, 1).validate().is_ok());
        assert!(c().validate().is_ok());
    }

    #[test]
    fn stripping_drafts_keeps_the_step_consistent() {
        let mut batch = StepBatch {
            seqs: vec![SeqStep {
                id: 1,
                tokens: vec![9, 1, 2, 3],
                start_pos: 5,
                block_table: vec![0, 1],
                num_logits: 4,
                sampling: None,
                state_slot: None,
                state_restore: None,
                state_save: None,
                lora_slot: None,
                embed: false,
            }],
            preempted: vec![],
            num_batched_tokens: 4,
            ..Default::default()
        };
        strip_drafts(&mut batch, 0, 1);
        assert_eq!(
            (batch.seqs[0].tokens.as_slice(), batch.seqs[0].num_logits, batch.num_batched_tokens),
            (&[9, 1][..], 2, 2)
        );
        strip_drafts(&mut batch, 0, 0);
        assert_eq!(
            (batch.seqs[0].tokens.as_slice(), batch.seqs[0].num_logits, batch.num_batched_tokens),
            (&[9][..], 1, 1)
        );
    }
}
