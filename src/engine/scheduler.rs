//! `ContinuousBatchScheduler`: which sequences, and which of their tokens, go into each forward
//! pass. Modelled on vLLM v1's `scheduler.py`.
//!
//! One idea carries it: each sequence's computed tokens catch up to its known tokens (prompt plus
//! generated so far). A prefill, a chunk of a long prefill, a decode, a prefix-cache hit and the
//! recompute after a preemption are all the same operation: compute tokens
//! `num_computed_tokens..` of the sequence, as many as the token budget allows.
//!
//! ```text
//!   tokens:  [ p0 p1 p2 p3 p4 p5 p6 p7 | g0 g1 g2 ]      prompt | generated
//!            [ ---- computed ----- )[- to compute -]       g2 was sampled last step
//!                               ^ num_computed_tokens
//! ```
//!
//! The contract is two calls per step (the types are `crate::step`'s): `schedule()` returns a
//! [`StepBatch`] (what to run), and `update_from_output(&batch, &accepted)` applies the tokens
//! each sequence kept. A decode may carry drafted tokens ([`propose_drafts`]); the step then
//! verifies them and the sequence keeps a run of one or more tokens. Drafts the model rejected
//! are rolled back: the computed count stops before them and blocks that only they used return
//! to the pool.
//!
//! [`propose_drafts`]: ContinuousBatchScheduler::propose_drafts
//!
//! **Invariant:** this module imports no wgpu, async runtime or web-sys: it is pure logic, and
//! its tests run fake model outputs (a tidy test below checks the imports of this file and of
//! `kv::manager`).
//! **Invariant:** one step is one forward pass; no sequence appears twice in it, and it never
//! holds more than `max_num_batched_tokens` tokens or `max_num_seqs` sequences.
//! **Invariant:** the scheduler never finishes a sequence: the engine calls `finish`. It only
//! stops scheduling a sequence that has generated `max_tokens` tokens.
//! **Invariant:** preemption is explicit and logged: a preempted sequence loses its blocks (and
//! its recurrent-state slot) and its computed count but keeps its tokens, and is recomputed when
//! readmitted.
//! **Invariant:** for a model with recurrent layers, every running sequence holds exactly one
//! state slot: admission takes KV blocks and a slot together or neither, and finish and
//! preemption return both. With the prefix cache and snapshot slots, a prefill chunk stops at
//! the end of the prompt's full blocks, where the state is snapshotted beside those blocks; a
//! later sequence with the same prefix restores it and starts there. Where the executor scans
//! whole chunks of Q positions in one go (`RecurrentStateConfig::scan_chunk_tokens`), a
//! recurrent prefill that the token budget cuts short is cut back to a multiple of Q (or
//! inside the rows before its first multiple), a recompute stops at the end of the prompt, and
//! generated tokens are recomputed fewer than Q at a time (as decodes, never as a chunk), so a
//! sequence's chunks, hence its numbers, depend neither on its batch nor on a preemption
//! (`model::scan_plan` has the executor's side).
//! **Invariant:** a sequence never receives more than `max_tokens` tokens: drafts are cut so
//! that a fully accepted run still fits.
//! **Invariant:** for an encoder (`with_whole_prompts`: attention sees each sequence whole), a
//! prompt runs whole in one step or waits, never in chunks, and never from the prefix cache; a
//! prompt longer than `max_num_batched_tokens` is refused at submission.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::error::{Result, WeftError};
use crate::kv::{KvCacheManager, LoraSlots, RecurrentStateManager, SeqId};
use crate::lora::LoraAdapter;
use crate::step::{SeqStep, StepBatch};

/// Recurrent states are snapshotted for the prefix cache every this many blocks of a prompt
/// (and at the end of its full blocks): often enough that a shared prefix finds one near its
/// end, rarely enough that prefill chunks stay long.
const SNAPSHOT_INTERVAL_BLOCKS: usize = 4;

/// The next position after `start` where a recurrent sequence's state is snapshotted (when
/// `snapshots` are kept): every `SNAPSHOT_INTERVAL_BLOCKS` blocks, so a shared system prompt
/// has one even when the prompts it begins differ, and at the end of the prompt's full blocks.
fn next_snapshot(snapshots: bool, block_size: usize, num_prompt_tokens: usize, start: usize) -> Option<usize> {
    let full_end = num_prompt_tokens / block_size * block_size;
    if !snapshots || start >= full_end {
        return None;
    }
    let interval = SNAPSHOT_INTERVAL_BLOCKS * block_size;
    Some(((start / interval + 1) * interval).min(full_end))
}

/// How many of the `num_known` tokens from `start` a recurrent sequence computes when
/// `budget` tokens are left and the executor scans whole chunks of `q` positions: all that fit,
/// but a cut the budget makes falls back to a multiple of `q`, unless it falls before the first
/// one (those rows are scanned token by token whatever their cuts). 0: none this step.
fn cut_for_scan(start: usize, num_known: usize, budget: usize, q: usize) -> usize {
    if num_known <= budget || q <= 1 {
        return num_known.min(budget);
    }
    let end = start + budget;
    if end <= start.div_ceil(q) * q { budget } else { end / q * q - start }
}

/// The most tokens from `start` a recurrent sequence with `num_prompt_tokens` computes in one
/// step, whatever the budget, with scan chunks of `q` positions: up to the end of the prompt,
/// and generated tokens (recomputed after a preemption) fewer than `q` at a time, which the
/// executor scans token by token as it did when they were decoded.
fn recurrent_run(num_prompt_tokens: usize, start: usize, q: usize) -> usize {
    if q <= 1 {
        usize::MAX
    } else if start < num_prompt_tokens {
        num_prompt_tokens - start
    } else {
        q - 1
    }
}

/// Where a sequence's next chunk may stop, whatever else is in the step: at the next state
/// snapshot, and for a recurrent model where the executor's scan chunks stay whole.
#[derive(Clone, Copy)]
struct ChunkRules {
    snapshots: bool,
    block_size: usize,
    recurrent: bool,
    scan_chunk: usize,
    /// All of a sequence's known tokens in one chunk, or none this step (an encoder).
    whole: bool,
}

impl ChunkRules {
    /// How many of `seq`'s known tokens from its computed ones the next step computes with
    /// `budget` tokens left (0: none this step).
    fn chunk_len(self, seq: &Sequence, budget: usize) -> usize {
        let start = seq.num_computed_tokens;
        let mut num_known = seq.tokens.len() - start;
        if let Some(end) = next_snapshot(self.snapshots, self.block_size, seq.num_prompt_tokens, start) {
            // The chunk stops where the state is snapshotted.
            num_known = num_known.min(end - start);
        }
        if self.recurrent {
            num_known = num_known.min(recurrent_run(seq.num_prompt_tokens, start, self.scan_chunk));
        }
        if self.whole {
            return if num_known <= budget { num_known } else { 0 };
        }
        cut_for_scan(start, num_known, budget, self.scan_chunk)
    }
}

/// The distinct adapters of `adapters`, in first-seen order.
fn distinct(adapters: impl Iterator<Item = Arc<LoraAdapter>>) -> Vec<Arc<LoraAdapter>> {
    let mut out: Vec<Arc<LoraAdapter>> = Vec::new();
    for a in adapters {
        if !out.iter().any(|o| o.id == a.id) {
            out.push(a);
        }
    }
    out
}

/// Limits of one step and of one sequence.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Sequences running (holding KV blocks) at most, hence in one step at most.
    pub max_num_seqs: usize,
    /// Tokens computed in one step at most (prefill chunks plus decodes): the token budget.
    pub max_num_batched_tokens: usize,
    /// Prompt plus generated tokens of one sequence at most.
    pub max_model_len: usize,
}

/// A request as the scheduler sees it.
#[derive(Clone, Debug)]
pub struct SchedRequest {
    pub id: SeqId,
    pub prompt: Vec<u32>,
    /// Generate at most this many tokens (at least 1).
    pub max_tokens: usize,
    /// Higher runs first, and is preempted last.
    pub priority: i32,
    /// The LoRA adapter it runs with; `None`: the base model.
    pub lora: Option<Arc<LoraAdapter>>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub running: usize,
    pub waiting: usize,
    /// Preemptions since the scheduler was made.
    pub preemptions: u64,
    /// Running sequences with more than their last sampled token left to compute (prefill,
    /// chunked prefill, or the recompute after a preemption).
    pub prefilling: usize,
    /// Running sequences whose next step is a single-token decode.
    pub decoding: usize,
}

/// A request's state while the scheduler knows it.
#[derive(Clone, Debug)]
struct Sequence {
    /// (num_prompt_tokens + num_generated,) prompt then generated tokens.
    tokens: Vec<u32>,
    num_prompt_tokens: usize,
    /// Tokens whose K/V are in this sequence's blocks.
    num_computed_tokens: usize,
    max_tokens: usize,
    priority: i32,
    /// Order of the latest admission to the running set; the most recent is preempted first
    /// among equal priorities.
    admitted_at: u64,
    /// Tokens proposed for the next step to verify (drafts); consumed by `schedule`.
    drafts: Vec<u32>,
    /// Position just past the last chunk scheduled: where the recurrent state stands once the
    /// executor ran it.
    scheduled_end: usize,
    /// A prefix-state snapshot to start the next chunk from (set at admission on a hit).
    restore_from: Option<u32>,
    lora: Option<Arc<LoraAdapter>>,
}

impl Sequence {
    /// Its adapter's id, 0 for the base model (the prefix cache's key).
    fn lora_id(&self) -> u64 {
        self.lora.as_ref().map_or(0, |a| a.id)
    }
}

impl Sequence {
    fn num_generated(&self) -> usize {
        self.tokens.len() - self.num_prompt_tokens
    }

    /// Generated `max_tokens`: waits for the engine to `finish` it, never scheduled again.
    fn is_done(&self) -> bool {
        self.num_generated() >= self.max_tokens
    }
}

/// Continuous batching over a paged KV cache: decodes and unfinished prefills first, then new
/// prefills, preempting by recompute when blocks run out. See the module docs.
pub struct ContinuousBatchScheduler {
    config: SchedulerConfig,
    kv: KvCacheManager,
    /// State slots, for models with recurrent layers.
    state: Option<RecurrentStateManager>,
    /// Recurrent states are snapshotted for the prefix cache.
    snapshots: bool,
    /// The executor's scan chunk that recurrent prefill cuts respect (1: none; also when the
    /// token budget cannot hold a chunk, since no step then holds a whole one).
    scan_chunk: usize,
    /// Tokens the next step may hold besides the configured budget: what the device does in
    /// its time budget (`engine::step_budget`); `usize::MAX`: no such limit.
    step_token_cap: usize,
    req_to_seq: HashMap<SeqId, Sequence>,
    /// Highest priority first; within a priority, preempted sequences before new ones, then
    /// arrival order.
    waiting: VecDeque<SeqId>,
    /// Admission order.
    running: Vec<SeqId>,
    num_preemptions: u64,
    admission_clock: u64,
    /// The executor's LoRA adapter slots; with none, requests for adapters are refused.
    lora_slots: LoraSlots,
    /// Prompts run whole in one step, uncached (an encoder's bidirectional attention).
    whole_prompts: bool,
}

impl ContinuousBatchScheduler {
    pub fn new(config: SchedulerConfig, kv: KvCacheManager) -> Self {
        ContinuousBatchScheduler {
            config,
            kv,
            state: None,
            snapshots: false,
            scan_chunk: 1,
            step_token_cap: usize::MAX,
            req_to_seq: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions: 0,
            admission_clock: 0,
            lora_slots: LoraSlots::new(0),
            whole_prompts: false,
        }
    }

    /// The same scheduler for an encoder, whose attention sees each sequence whole: a prompt
    /// runs in one step or waits for a step with room for all of it (never chunked), its blocks
    /// never come from or go to the prefix cache (a token's keys depend on the tokens after
    /// it), and a prompt that no step can hold is refused at submission.
    pub fn with_whole_prompts(mut self) -> Self {
        self.kv.disable_prefix_cache();
        self.whole_prompts = true;
        self
    }

    /// The same scheduler serving LoRA adapters from `num_slots` slots: no more distinct
    /// adapters run at once than that (a waiting request for another one is passed over until a
    /// running adapter's sequences finish), and each step names the adapters to load.
    pub fn with_lora_slots(mut self, num_slots: usize) -> Self {
        self.lora_slots = LoraSlots::new(num_slots);
        self
    }

    /// The adapter slots and their counters.
    pub fn lora_slots(&self) -> &LoraSlots {
        &self.lora_slots
    }

    /// Free the slot of an adapter no longer served (no sequence uses it).
    pub fn forget_lora(&mut self, adapter_id: u64) {
        self.lora_slots.remove(adapter_id);
    }

    /// The distinct adapters of the running sequences, in admission order.
    pub fn running_adapters(&self) -> Vec<Arc<LoraAdapter>> {
        distinct(self.running.iter().filter_map(|id| self.req_to_seq.get(id)?.lora.clone()))
    }

    /// The distinct adapters of the waiting sequences, in queue order.
    pub fn waiting_adapters(&self) -> Vec<Arc<LoraAdapter>> {
        distinct(self.waiting.iter().filter_map(|id| self.req_to_seq.get(id)?.lora.clone()))
    }

    /// Whether admitting `seq` keeps the running adapters within the slots.
    fn adapter_fits(&self, seq: &Sequence) -> bool {
        let Some(adapter) = &seq.lora else { return true };
        let running = self.running_adapters();
        running.iter().any(|a| a.id == adapter.id) || running.len() < self.lora_slots.num_slots()
    }

    /// The same scheduler admitting against `state`'s slots as well as KV blocks. With snapshot
    /// slots the prefix cache keeps states beside its blocks; without, it is switched off: a
    /// cached KV block says nothing about the recurrent state at its end, so a hit could not
    /// skip any computation.
    pub fn with_recurrent_state(mut self, state: RecurrentStateManager) -> Self {
        if state.config().num_snapshot_slots == 0 {
            self.kv.disable_prefix_cache();
        }
        self.snapshots = self.kv.prefix_cache_enabled();
        self.kv.set_state_snapshot_slots(state.snapshot_slots());
        let q = state.config().scan_chunk_tokens;
        self.scan_chunk = if q <= self.config.max_num_batched_tokens { q.max(1) } else { 1 };
        self.state = Some(state);
        self
    }

    fn chunk_rules(&self) -> ChunkRules {
        ChunkRules {
            snapshots: self.snapshots,
            block_size: self.kv.block_size(),
            recurrent: self.state.is_some(),
            scan_chunk: self.scan_chunk,
            whole: self.whole_prompts,
        }
    }

    /// The next position after `start` where a recurrent sequence's state is snapshotted, when
    /// snapshots are kept (see [`next_snapshot`]).
    fn next_snapshot(&self, num_prompt_tokens: usize, start: usize) -> Option<usize> {
        next_snapshot(self.snapshots, self.kv.block_size(), num_prompt_tokens, start)
    }

    /// Queue a request. Refused, naming the field at fault, when its id is already present, the
    /// prompt is empty or fills the context, `max_tokens` is 0 or does not fit the context after
    /// the prompt, or the sequence could not finish even holding the whole KV pool alone. These
    /// are the length checks of the engine's one validation at submission.
    pub fn add_request(&mut self, req: SchedRequest) -> Result<()> {
        let num_prompt_tokens = req.prompt.len();
        if self.req_to_seq.contains_key(&req.id) {
            return Err(WeftError::invalid_request(format!("request id {} is already queued or running", req.id)));
        }
        if num_prompt_tokens == 0 {
            return Err(WeftError::invalid("prompt", "the prompt is empty; at least one token is needed"));
        }
        if req.max_tokens == 0 {
            return Err(WeftError::invalid("max_tokens", "0 (must be at least 1)"));
        }
        if req.lora.is_some() && self.lora_slots.num_slots() == 0 {
            return Err(WeftError::invalid("model", "this engine serves no LoRA adapters"));
        }
        let max_model_len = self.config.max_model_len;
        if num_prompt_tokens >= max_model_len {
            return Err(WeftError::invalid(
                "prompt",
                format!(
                    "{num_prompt_tokens} tokens, but the context holds {max_model_len} (with room for one to generate)"
                ),
            ));
        }
        if num_prompt_tokens + req.max_tokens > max_model_len {
            return Err(WeftError::invalid(
                "max_tokens",
                format!(
                    "{}; the prompt takes {num_prompt_tokens} of the context's {max_model_len} tokens, so at most {} can be generated",
                    req.max_tokens,
                    max_model_len - num_prompt_tokens
                ),
            ));
        }
        let budget = self.config.max_num_batched_tokens;
        if self.whole_prompts && num_prompt_tokens > budget {
            return Err(WeftError::invalid(
                "prompt",
                format!(
                    "{num_prompt_tokens} tokens, but this encoder attends over its whole prompt in one step, and a step \
                     holds at most max_num_batched_tokens = {budget}; shorten the input or raise max_num_batched_tokens"
                ),
            ));
        }
        let usage = self.kv.usage();
        let block_size = self.kv.block_size();
        let pool_num_tokens = usage.total_blocks * block_size;
        if num_prompt_tokens > pool_num_tokens {
            return Err(WeftError::invalid(
                "prompt",
                format!(
                    "{num_prompt_tokens} tokens ({} KV blocks) can never fit the KV pool of {} blocks of {block_size} tokens",
                    num_prompt_tokens.div_ceil(block_size),
                    usage.total_blocks
                ),
            ));
        }
        // The last sampled token is never computed, so the KV holds at most this many. A
        // sequence that cannot hold them even alone would preempt itself forever.
        let max_kv_tokens = num_prompt_tokens + req.max_tokens - 1;
        if max_kv_tokens > pool_num_tokens {
            return Err(WeftError::invalid(
                "max_tokens",
                format!(
                    "{}; with the prompt's {num_prompt_tokens} tokens it can never fit the KV pool of {} blocks of {block_size} tokens, \
                     so it can be at most {}",
                    req.max_tokens,
                    usage.total_blocks,
                    pool_num_tokens + 1 - num_prompt_tokens
                ),
            ));
        }
        let priority = req.priority;
        let seq = Sequence {
            tokens: req.prompt,
            num_prompt_tokens,
            num_computed_tokens: 0,
            max_tokens: req.max_tokens,
            priority: req.priority,
            admitted_at: 0,
            drafts: Vec::new(),
            scheduled_end: 0,
            restore_from: None,
            lora: req.lora,
        };
        // Behind every waiting sequence of the same or higher priority.
        self.enqueue(req.id, |p| p < priority);
        self.req_to_seq.insert(req.id, seq);
        Ok(())
    }

    /// Limit the next steps to `cap` tokens below the configured budget (the GPU time
    /// budget's share; at least a recurrent model's scan chunk is always allowed).
    pub fn set_step_token_cap(&mut self, cap: usize) {
        self.step_token_cap = cap.max(1);
    }

    /// Pick the next forward pass.
    ///
    /// Running sequences first, in admission order: each gets up to its uncomputed tokens within
    /// the remaining token budget, growing its blocks; when blocks run out, the lowest-priority
    /// running sequence (the most recently admitted among equals, possibly the one asking) is
    /// preempted until the grow succeeds or the asker itself was preempted. Then, only if
    /// nobody was preempted, waiting sequences are admitted in queue order while sequences and
    /// budget remain, stopping at the first whose blocks (or state slot) are not available. A
    /// waiting sequence whose prompt begins with full blocks a running one is still computing
    /// is passed over (it keeps its place) until they are cached: a burst of requests with one
    /// new system prompt computes it once, not once per request in the same step.
    pub fn schedule(&mut self) -> StepBatch {
        // A recurrent sequence scans whole chunks, an encoder whole prompts: a cap below the
        // next one would stall it.
        let cap = self.step_token_cap.max(self.scan_chunk).max(self.next_whole_prompt());
        let mut token_budget = self.config.max_num_batched_tokens.min(cap);
        // (id, num_new_tokens, num_drafted) in scheduling order; drafted tokens are part of
        // num_new_tokens.
        let mut req_to_num_new_tokens: Vec<(SeqId, usize, usize)> = Vec::new();
        let mut preempted: Vec<SeqId> = Vec::new();

        let rules = self.chunk_rules();
        let mut req_index = 0;
        while req_index < self.running.len() && token_budget > 0 {
            let id = self.running[req_index];
            let Some(seq) = self.req_to_seq.get_mut(&id) else {
                // Unreachable: running ids are always known; drop it rather than loop.
                self.running.remove(req_index);
                continue;
            };
            if seq.is_done() {
                req_index += 1;
                continue;
            }
            // A step always computes at least one token. If the runner never returned the last
            // sample, recompute the last token (same token, same slot) to get its logit again.
            seq.num_computed_tokens = seq.num_computed_tokens.min(seq.tokens.len() - 1);
            if self.state.is_some() && seq.scheduled_end != seq.num_computed_tokens {
                // The last step's output was never applied, but the executor may have run it:
                // the state in the slot can be past the computed tokens, and a recurrent state
                // cannot be rolled back. Start over from position 0, where it starts from zero;
                // a snapshot that step was to save may hold anything.
                seq.num_computed_tokens = 0;
                self.kv.cancel_snapshot(id);
            }
            let num_known = rules.chunk_len(seq, token_budget);
            if num_known == 0 {
                // Too little budget left for a whole scan chunk: next step.
                req_index += 1;
                continue;
            }
            // Drafts ride along only on a decode, and only as many as the budget, max_tokens
            // (a fully accepted run must fit) and the context allow.
            // Not with recurrent state: a rejected draft would stay in the state.
            let mut num_drafted = 0;
            if num_known == 1 && seq.num_computed_tokens + 1 == seq.tokens.len() && self.state.is_none() {
                let room_in_output = seq.max_tokens - seq.num_generated() - 1;
                let room_in_context = self.config.max_model_len.saturating_sub(seq.tokens.len());
                num_drafted = seq.drafts.len().min(token_budget - num_known).min(room_in_output).min(room_in_context);
            }
            let num_computed = seq.num_computed_tokens;
            loop {
                if self.kv.grow(id, num_computed + num_known + num_drafted) {
                    req_to_num_new_tokens.push((id, num_known + num_drafted, num_drafted));
                    token_budget -= num_known + num_drafted;
                    req_index += 1;
                    break;
                }
                if num_drafted > 0 {
                    // Speculation is a bonus: give it up before preempting anyone for it.
                    num_drafted = 0;
                    continue;
                }
                let Some(victim_index) = self.preemption_victim() else { break };
                let victim = self.running.remove(victim_index);
                if victim_index < req_index {
                    req_index -= 1;
                }
                if let Some(i) = req_to_num_new_tokens.iter().position(|&(v, ..)| v == victim) {
                    // Scheduled earlier this step: its tokens go back to the budget.
                    token_budget += req_to_num_new_tokens.remove(i).1;
                }
                self.preempt(victim);
                preempted.push(victim);
                if victim == id {
                    break;
                }
            }
        }

        // Admitting after a preemption would only take back the blocks just freed.
        if preempted.is_empty() {
            // Waiting sequences passed over this step (they wait for a shared prefix) stay at
            // the front of the queue, in order.
            let mut next = 0;
            while token_budget > 0 && self.running.len() < self.config.max_num_seqs {
                let Some(&id) = self.waiting.get(next) else { break };
                if self.waits_for_shared_prefix(id) {
                    next += 1;
                    continue;
                }
                if self.req_to_seq.get(&id).is_some_and(|seq| !self.adapter_fits(seq)) {
                    // Its adapter would be one more than the slots hold: it keeps its place.
                    next += 1;
                    continue;
                }
                let Some(seq) = self.req_to_seq.get_mut(&id) else {
                    self.waiting.remove(next);
                    continue;
                };
                if self.state.as_ref().is_some_and(|state| state.num_free_slots() == 0) {
                    break;
                }
                // All known tokens at once (a recompute includes the generated ones), so a
                // chunked prefill never runs out of blocks halfway. A recurrent sequence reuses
                // cached blocks only up to a state snapshot, which it restores.
                let (num_cached_tokens, restore_from) = if self.state.is_some() {
                    let Some(hit) = self.kv.allocate_restoring(id, &seq.tokens) else { break };
                    hit
                } else {
                    let Some(num_cached_tokens) = self.kv.allocate_keyed(id, &seq.tokens, seq.lora_id()) else { break };
                    (num_cached_tokens, None)
                };
                if let Some(state) = &mut self.state {
                    // Cannot fail: a slot was free and the sequence held none (it was waiting).
                    state.take(id);
                }
                seq.num_computed_tokens = num_cached_tokens;
                seq.restore_from = restore_from;
                let num_new_tokens = rules.chunk_len(seq, token_budget);
                self.admission_clock += 1;
                seq.admitted_at = self.admission_clock;
                self.waiting.remove(next);
                self.running.push(id);
                if num_new_tokens == 0 {
                    // Admitted with its blocks and slot, but too little budget is left for a
                    // whole scan chunk: it starts next step, where its computed tokens stand.
                    seq.scheduled_end = num_cached_tokens;
                    break;
                }
                req_to_num_new_tokens.push((id, num_new_tokens, 0));
                token_budget -= num_new_tokens;
            }
        }

        let mut batch = StepBatch { preempted, ..Default::default() };
        // The step's adapters in their slots (never more than the slots: admission keeps the
        // running adapters within them).
        let adapters = distinct(
            req_to_num_new_tokens.iter().filter_map(|(id, ..)| self.req_to_seq.get(id).and_then(|s| s.lora.clone())),
        );
        let assigned = self.lora_slots.assign(&adapters);
        debug_assert!(
            assigned.is_some(),
            "{} adapters in a step of {} slots",
            adapters.len(),
            self.lora_slots.num_slots()
        );
        let (slots, loads) = assigned.unwrap_or_default();
        batch.lora_loads = loads;
        let slot_of = |seq: &Sequence| {
            let id = seq.lora.as_ref()?.id;
            adapters.iter().position(|a| a.id == id).and_then(|i| slots.get(i).copied())
        };
        for (id, num_new_tokens, num_drafted) in req_to_num_new_tokens {
            let next_snapshot =
                self.req_to_seq.get(&id).and_then(|s| self.next_snapshot(s.num_prompt_tokens, s.num_computed_tokens));
            let Some(seq) = self.req_to_seq.get_mut(&id) else { continue };
            let start_pos = seq.num_computed_tokens;
            let known_end = start_pos + num_new_tokens - num_drafted;
            seq.scheduled_end = known_end;
            // A restore is good for the chunk right after admission only.
            let state_restore = seq.restore_from.take().filter(|_| start_pos > 0);
            let state_save = match next_snapshot {
                Some(end) if known_end == end => self.kv.reserve_snapshot(id, end / self.kv.block_size() - 1),
                _ => None,
            };
            let Some(seq) = self.req_to_seq.get(&id) else { continue };
            let mut tokens = seq.tokens[start_pos..known_end].to_vec();
            tokens.extend_from_slice(&seq.drafts[..num_drafted]);
            let num_logits = if known_end == seq.tokens.len() { num_drafted + 1 } else { 0 };
            batch.seqs.push(SeqStep {
                id,
                tokens,
                start_pos,
                block_table: self.kv.block_table(id).to_vec(),
                num_logits,
                sampling: None,
                state_slot: self.state.as_ref().and_then(|state| state.slot(id)),
                state_restore,
                state_save,
                lora_slot: slot_of(seq),
                embed: false,
            });
            batch.num_batched_tokens += num_new_tokens;
        }
        // A proposal is good for one step, taken or not.
        for seq in self.req_to_seq.values_mut() {
            seq.drafts.clear();
        }
        batch
    }

    /// For an encoder, the tokens of the next prompt to run (the first running one not yet
    /// computed, else the first waiting one); 0 otherwise.
    fn next_whole_prompt(&self) -> usize {
        if !self.whole_prompts {
            return 0;
        }
        let pending = |id: &SeqId| self.req_to_seq.get(id).filter(|s| !s.is_done()).map(|s| s.tokens.len());
        self.running.iter().find_map(pending).or_else(|| self.waiting.iter().find_map(pending)).unwrap_or(0)
    }

    /// Offer `drafts` as tokens that may follow `id`'s known tokens, for the next step to
    /// verify (replacing any earlier proposal). The next `schedule` takes as many as fit when
    /// the sequence decodes, and none otherwise; either way a proposal is used once. Unknown
    /// ids are a no-op.
    pub fn propose_drafts(&mut self, id: SeqId, drafts: Vec<u32>) {
        if let Some(seq) = self.req_to_seq.get_mut(&id) {
            seq.drafts = drafts;
        }
    }

    /// Apply a step's results. `accepted[i]` holds the tokens `batch.seqs[i]` keeps (empty for
    /// a chunk that sampled nothing): for a sampled chunk, its accepted drafts, then the token
    /// the model chose after them. The computed count advances past the known tokens and the
    /// accepted drafts (the last kept token is the next step's input, not yet computed), the
    /// kept tokens are appended, blocks that only rejected drafts reached return to the pool,
    /// and newly full blocks enter the prefix cache. Sequences finished since, chunks that no
    /// longer match the sequence (an output applied twice), and runs that are longer than the
    /// chunk's logit rows, exceed `max_tokens` or do not start with the chunk's drafts are
    /// skipped.
    pub fn update_from_output(&mut self, batch: &StepBatch, accepted: &[Vec<u32>]) {
        let none = Vec::new();
        for (i, s) in batch.seqs.iter().enumerate() {
            let kept = accepted.get(i).unwrap_or(&none);
            let Some(seq) = self.req_to_seq.get_mut(&s.id) else { continue };
            let num_known = s.tokens.len() - s.drafted().len();
            if s.start_pos != seq.num_computed_tokens || s.start_pos + num_known > seq.tokens.len() {
                continue;
            }
            seq.num_computed_tokens += num_known;
            let reaches_end = s.num_logits > 0 && seq.num_computed_tokens == seq.tokens.len();
            let num_kept_drafts = kept.len().saturating_sub(1);
            let well_formed = kept.len() <= s.num_logits
                && seq.num_generated() + kept.len() <= seq.max_tokens
                && kept[..num_kept_drafts] == s.drafted()[..num_kept_drafts];
            if reaches_end && !kept.is_empty() && well_formed {
                seq.num_computed_tokens += num_kept_drafts;
                seq.tokens.extend_from_slice(kept);
            }
            // Blocks past the known tokens held only rejected drafts.
            self.kv.shrink(s.id, seq.tokens.len());
            self.kv.mark_computed(s.id, &seq.tokens, seq.num_computed_tokens);
        }
    }

    /// The engine is done with `id` (stop, EOS, max_tokens, cancelled): forget it and free its
    /// blocks and state slot. Unknown ids are a no-op.
    pub fn finish(&mut self, id: SeqId) {
        if self.req_to_seq.remove(&id).is_none() {
            return;
        }
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&w| w != id);
        self.kv.free(id);
        if let Some(state) = &mut self.state {
            state.free(id);
        }
    }

    /// Prompt plus generated tokens so far.
    pub fn tokens(&self, id: SeqId) -> Option<&[u32]> {
        self.req_to_seq.get(&id).map(|s| s.tokens.as_slice())
    }

    pub fn num_generated(&self, id: SeqId) -> Option<usize> {
        self.req_to_seq.get(&id).map(Sequence::num_generated)
    }

    /// Running sequences whose next step decodes their last sampled token, in admission
    /// order: the ones that may carry drafts.
    pub fn decoding(&self) -> Vec<SeqId> {
        let decodes =
            |s: &Sequence| !s.is_done() && s.num_generated() > 0 && s.num_computed_tokens + 1 == s.tokens.len();
        self.running.iter().copied().filter(|id| self.req_to_seq.get(id).is_some_and(decodes)).collect()
    }

    /// Whether any request is still queued or running (not yet `finish`ed).
    pub fn has_unfinished(&self) -> bool {
        !self.req_to_seq.is_empty()
    }

    pub fn stats(&self) -> SchedulerStats {
        let mut stats = SchedulerStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            preemptions: self.num_preemptions,
            ..Default::default()
        };
        for seq in self.running.iter().filter_map(|id| self.req_to_seq.get(id)) {
            if seq.num_generated() > 0 && seq.num_computed_tokens + 1 >= seq.tokens.len() {
                stats.decoding += 1;
            } else {
                stats.prefilling += 1;
            }
        }
        stats
    }

    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// The state slots, for a model with recurrent layers.
    pub fn recurrent_state(&self) -> Option<&RecurrentStateManager> {
        self.state.as_ref()
    }

    /// Whether waiting `id` should stay waiting this step because its prompt begins with full
    /// blocks that a running sequence is still computing and the prefix cache does not hold
    /// yet (requests sent together with one system prompt): admitted once they are computed, it
    /// takes them from the cache instead of computing them again in the same token budget.
    /// Never with recurrent state (its cache hits stop at snapshots) or the cache off; never
    /// for long, since running sequences are scheduled before any admission.
    fn waits_for_shared_prefix(&self, id: SeqId) -> bool {
        if self.state.is_some() || !self.kv.prefix_cache_enabled() {
            return false;
        }
        let Some(seq) = self.req_to_seq.get(&id) else { return false };
        let block_size = self.kv.block_size();
        let max_blocks = self.kv.max_cached_blocks(seq.tokens.len());
        if max_blocks == 0 {
            return false;
        }
        let reach = max_blocks * block_size;
        // The most full blocks it shares with a running sequence that has yet to compute them.
        // Only sequences still computing within reach can (decoding ones are skipped before any
        // comparison), and only that far is compared; the cache is asked last.
        let pending = self
            .running
            .iter()
            .filter_map(|r| self.req_to_seq.get(r))
            .filter(|other| other.num_computed_tokens < reach && other.lora_id() == seq.lora_id())
            .map(|other| {
                let common = seq.tokens[..reach].iter().zip(&other.tokens).take_while(|(a, b)| a == b).count();
                (common / block_size, other.num_computed_tokens)
            })
            .filter(|&(shared, computed)| computed < shared * block_size)
            .map(|(shared, _)| shared)
            .max();
        pending.is_some_and(|shared| shared > self.kv.num_cached_blocks_keyed(&seq.tokens, seq.lora_id()))
    }

    /// Index in `running` of the sequence to preempt: lowest priority, then most recently
    /// admitted. Sequences that are done are skipped: they free their blocks as soon as the
    /// engine finishes them, and recomputing one would sample past `max_tokens`.
    fn preemption_victim(&self) -> Option<usize> {
        self.running
            .iter()
            .enumerate()
            .filter_map(|(i, id)| self.req_to_seq.get(id).filter(|s| !s.is_done()).map(|s| (i, s)))
            .min_by_key(|(_, s)| (s.priority, std::cmp::Reverse(s.admitted_at)))
            .map(|(i, _)| i)
    }

    /// Free `id`'s blocks and state slot and send it back to the front of its priority in the waiting queue;
    /// its tokens stay, so the readmission recomputes prompt and generated tokens in one go.
    fn preempt(&mut self, id: SeqId) {
        self.kv.free(id);
        if let Some(state) = &mut self.state {
            state.free(id);
        }
        self.num_preemptions += 1;
        let Some(seq) = self.req_to_seq.get_mut(&id) else { return };
        seq.num_computed_tokens = 0;
        let priority = seq.priority;
        tracing::info!(
            seq = id,
            priority,
            num_tokens = seq.tokens.len(),
            num_generated = seq.num_generated(),
            num_free_blocks = self.kv.num_available_blocks(),
            "preempted: KV blocks ran out; the sequence will be recomputed when readmitted"
        );
        // Ahead of every waiting sequence of the same or lower priority.
        self.enqueue(id, |p| p <= priority);
    }

    /// Insert `id` into the waiting queue before the first sequence whose priority satisfies
    /// `goes_before`, or at the back.
    fn enqueue(&mut self, id: SeqId, goes_before: impl Fn(i32) -> bool) {
        let index = self.waiting.iter().position(|w| self.req_to_seq.get(w).is_some_and(|s| goes_before(s.priority)));
        self.waiting.insert(index.unwrap_or(self.waiting.len()), id);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::sampling::Sampled;

    fn config(max_num_seqs: usize, max_num_batched_tokens: usize) -> SchedulerConfig {
        SchedulerConfig { max_num_seqs, max_num_batched_tokens, max_model_len: 1024 }
    }

    fn request(id: SeqId, prompt: Vec<u32>, max_tokens: usize, priority: i32) -> SchedRequest {
        SchedRequest { id, prompt, max_tokens, priority, lora: None }
    }

    /// Apply `out` as a runner that samples `token` for every chunk that asks for one.
    fn run_step(sched: &mut ContinuousBatchScheduler, out: &StepBatch, token: u32) {
        let accepted: Vec<Vec<u32>> =
            out.seqs.iter().map(|s| if s.num_logits > 0 { vec![token] } else { vec![] }).collect();
        sched.update_from_output(out, &accepted);
        sched.kv.check_invariants();
    }

    fn ids(out: &StepBatch) -> Vec<SeqId> {
        out.seqs.iter().map(|s| s.id).collect()
    }

    /// An encoder's prompts: refused past the token budget (naming it), otherwise each in one
    /// step whole — one that does not fit the step's remaining budget waits for the next step
    /// instead of being chunked, also under a smaller GPU-time cap — and never from the prefix
    /// cache, even for a prompt of full blocks seen before.
    #[test]
    fn encoder_prompts_run_whole_and_uncached() {
        let kv = KvCacheManager::new(16, 4, true);
        let mut sched = ContinuousBatchScheduler::new(config(8, 10), kv).with_whole_prompts();
        let err = sched.add_request(request(9, vec![1; 11], 1, 0)).unwrap_err();
        assert!(matches!(err, WeftError::InvalidRequest { .. }), "{err}");
        assert!(err.to_string().contains("max_num_batched_tokens = 10") && err.to_string().contains("11 tokens"));
        sched.add_request(request(1, (0..8).collect(), 1, 0)).unwrap();
        sched.add_request(request(2, (0..8).collect(), 1, 0)).unwrap();
        sched.add_request(request(3, vec![7, 7], 1, 0)).unwrap();
        sched.set_step_token_cap(3);
        let out = sched.schedule();
        // The cap of 3 rises to 1's 8 tokens, and 1 runs whole; 2 and 3 wait for later steps.
        assert_eq!(ids(&out), vec![1]);
        assert_eq!((out.seqs[0].tokens.len(), out.seqs[0].start_pos, out.seqs[0].num_logits), (8, 0, 1));
        run_step(&mut sched, &out, 5);
        sched.finish(1);
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![2], "the same 8 tokens again: computed from position 0, not the cache");
        assert_eq!((out.seqs[0].tokens.len(), out.seqs[0].start_pos), (8, 0));
        run_step(&mut sched, &out, 5);
        sched.finish(2);
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![3]);
        run_step(&mut sched, &out, 5);
        sched.finish(3);
        assert_eq!(sched.kv().usage().used_blocks, 0);
        assert_eq!(sched.kv().prefix_cache_stats().hits, 0);
    }

    /// Two slots, three adapters: the third adapter's request waits (passed over, so the base
    /// model's request behind it still runs) until an adapter's last sequence finishes; each
    /// step names its adapters' slots and loads each adapter once.
    #[test]
    fn no_more_distinct_adapters_run_than_slots() {
        let mut sched =
            ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(64, 4, true)).with_lora_slots(2);
        let adapters: Vec<Arc<LoraAdapter>> =
            ["a", "b", "c"].map(|n| Arc::new(LoraAdapter::for_tests(n))).into_iter().collect();
        let with = |id: SeqId, a: Option<usize>| SchedRequest {
            lora: a.map(|a| adapters[a].clone()),
            ..request(id, vec![1, 2, 3], if id == 1 { 1 } else { 4 }, 0)
        };
        for (id, a) in [(1, Some(0)), (2, Some(1)), (3, Some(2)), (4, None), (5, Some(0))] {
            sched.add_request(with(id, a)).unwrap();
        }
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![1, 2, 4, 5], "c waits");
        let slots: Vec<Option<u32>> = out.seqs.iter().map(|s| s.lora_slot).collect();
        assert_eq!(slots, vec![Some(0), Some(1), None, Some(0)]);
        assert_eq!(out.lora_loads.len(), 2);
        run_step(&mut sched, &out, 100);
        // Sequence 1 is done, but a still runs in 5: c waits on.
        sched.finish(1);
        let out = sched.schedule();
        assert_eq!((ids(&out), out.lora_loads.len()), (vec![2, 4, 5], 0));
        run_step(&mut sched, &out, 100);
        for id in [2, 5] {
            while sched.num_generated(id).is_some_and(|n| n < 4) {
                let out = sched.schedule();
                run_step(&mut sched, &out, 100);
            }
            sched.finish(id);
        }
        let out = sched.schedule();
        assert!(ids(&out).contains(&3), "{:?}", ids(&out));
        assert_eq!(out.lora_loads.len(), 1, "c loaded into a freed slot");
        assert_eq!(sched.lora_slots().num_loads, 3);
    }

    /// The step cap (the GPU time budget's share) limits steps below the configured budget:
    /// a 20-token prompt beside a decode is prefilled 5 tokens a step, the decode included.
    #[test]
    fn the_step_cap_splits_prefill_below_the_token_budget() {
        let mut sched = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(64, 4, false));
        sched.add_request(request(1, vec![1, 2], 10, 0)).unwrap();
        let out = sched.schedule();
        run_step(&mut sched, &out, 100);
        sched.add_request(request(2, vec![7; 20], 10, 0)).unwrap();
        sched.set_step_token_cap(6);
        let mut chunks = Vec::new();
        while sched.tokens(2).map_or(0, <[u32]>::len) == 20 {
            let out = sched.schedule();
            assert_eq!(out.num_batched_tokens, 6);
            assert_eq!(out.seqs[0].tokens.len(), 1, "the decode comes first");
            chunks.push(out.seqs[1].tokens.len());
            run_step(&mut sched, &out, 100);
        }
        assert_eq!(chunks, vec![5, 5, 5, 5]);
        sched.set_step_token_cap(usize::MAX);
        assert_eq!(sched.schedule().num_batched_tokens, 2);
    }

    #[test]
    fn decodes_run_before_new_prefills() {
        let mut sched = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(64, 4, false));
        sched.add_request(request(1, vec![1, 2, 3, 4, 5], 10, 0)).unwrap();
        let out = sched.schedule();
        assert_eq!(out.seqs.len(), 1);
        assert_eq!((out.seqs[0].start_pos, out.seqs[0].tokens.len(), out.seqs[0].num_logits > 0), (0, 5, true));
        run_step(&mut sched, &out, 100);
        assert_eq!(sched.tokens(1), Some(&[1, 2, 3, 4, 5, 100][..]));

        sched.add_request(request(2, vec![7; 6], 10, 0)).unwrap();
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![1, 2]);
        assert_eq!(
            out.seqs[0],
            SeqStep {
                id: 1,
                tokens: vec![100],
                start_pos: 5,
                block_table: vec![0, 1],
                num_logits: 1,
                sampling: None,
                state_slot: None,
                state_restore: None,
                state_save: None,
                lora_slot: None,
                embed: false,
            }
        );
        assert_eq!((out.seqs[1].start_pos, out.seqs[1].tokens.len()), (0, 6));
        assert_eq!(out.num_batched_tokens, 7);
        assert_eq!(
            sched.stats(),
            SchedulerStats { running: 2, waiting: 0, preemptions: 0, prefilling: 1, decoding: 1 }
        );
        run_step(&mut sched, &out, 101);
        assert_eq!(sched.stats().decoding, 2);
        assert_eq!(sched.num_generated(2), Some(1));
    }

    #[test]
    fn only_decoding_sequences_may_draft() {
        let mut sched = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(64, 4, false));
        sched.add_request(request(1, vec![1, 2, 3], 2, 0)).unwrap();
        assert!(sched.decoding().is_empty(), "waiting");
        let out = sched.schedule();
        assert!(sched.decoding().is_empty(), "prefilling");
        run_step(&mut sched, &out, 9);
        sched.add_request(request(2, vec![4, 5], 4, 0)).unwrap();
        assert_eq!(sched.decoding(), vec![1]);
        let out = sched.schedule();
        run_step(&mut sched, &out, 9);
        assert_eq!(sched.decoding(), vec![2], "1 reached max_tokens; 2 decodes now");
    }

    #[test]
    fn a_long_prompt_is_prefilled_in_chunks() {
        let mut sched = ContinuousBatchScheduler::new(config(8, 8), KvCacheManager::new(64, 4, false));
        let prompt: Vec<u32> = (0..20).collect();
        sched.add_request(request(1, prompt.clone(), 4, 0)).unwrap();
        let mut table = Vec::new();
        for (start_pos, num_tokens, sample) in [(0, 8, false), (8, 8, false), (16, 4, true)] {
            let out = sched.schedule();
            let s = &out.seqs[0];
            assert_eq!(
                (s.start_pos, s.tokens.as_slice(), s.num_logits > 0),
                (start_pos, &prompt[start_pos..start_pos + num_tokens], sample)
            );
            // Blocks for the whole prompt from admission on; the table never changes.
            assert_eq!(s.block_table.len(), 5);
            if table.is_empty() {
                table = s.block_table.clone();
            }
            assert_eq!(s.block_table, table);
            assert_eq!(sched.stats().prefilling, 1);
            run_step(&mut sched, &out, 77);
        }
        // The chunks without `sample` produced no token.
        assert_eq!(sched.num_generated(1), Some(1));
        let out = sched.schedule();
        let s = &out.seqs[0];
        assert_eq!((s.start_pos, s.tokens.as_slice(), s.num_logits > 0), (20, &[77][..], true));
        assert_eq!(&s.block_table[..5], table.as_slice(), "append-only");
        assert_eq!(s.block_table.len(), 6);
    }

    #[test]
    fn a_prefill_chunk_shares_the_budget_with_decodes() {
        let mut sched = ContinuousBatchScheduler::new(config(8, 8), KvCacheManager::new(64, 4, false));
        sched.add_request(request(1, vec![1, 2], 10, 0)).unwrap();
        let out = sched.schedule();
        run_step(&mut sched, &out, 3);
        sched.add_request(request(2, (0..20).collect(), 4, 0)).unwrap();
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![1, 2]);
        assert_eq!(out.seqs[1].tokens.len(), 7);
        assert_eq!(out.num_batched_tokens, 8);
        run_step(&mut sched, &out, 4);
        let out = sched.schedule();
        assert_eq!((out.seqs[1].start_pos, out.seqs[1].tokens.len()), (7, 7));
    }

    #[test]
    fn max_num_seqs_is_respected() {
        let mut sched = ContinuousBatchScheduler::new(config(2, 64), KvCacheManager::new(64, 4, false));
        for id in 1..=3 {
            sched.add_request(request(id, vec![id as u32; 3], 5, 0)).unwrap();
        }
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![1, 2]);
        assert_eq!((sched.stats().running, sched.stats().waiting), (2, 1));
        run_step(&mut sched, &out, 9);
        assert_eq!(ids(&sched.schedule()), vec![1, 2], "no room while both run");
        sched.finish(1);
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![2, 3]);
    }

    #[test]
    fn admission_waits_for_kv_blocks_without_skipping_the_queue() {
        // 4 blocks of 4 tokens.
        let mut sched = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(4, 4, false));
        sched.add_request(request(1, vec![1; 12], 4, 0)).unwrap();
        let out = sched.schedule();
        run_step(&mut sched, &out, 5);
        // High priority needing 4 blocks is queued ahead of a low priority one needing 1.
        sched.add_request(request(2, vec![2; 2], 2, 0)).unwrap();
        sched.add_request(request(3, vec![3; 13], 1, 5)).unwrap();
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![1], "3 does not fit, and 2 may not jump ahead of it");
        assert_eq!(sched.stats().waiting, 2);
        sched.finish(1);
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![3]);
        assert_eq!(sched.kv().usage().free_blocks, 0);
        sched.finish(3);
        assert_eq!(ids(&sched.schedule()), vec![2]);
    }

    /// Three sequences of 3-token prompts filling a 6-block pool of 2-token blocks, admitted in
    /// the order 1, 2, 3 whatever their priorities, each with 2 tokens generated; the next
    /// decode of each needs a third block.
    fn full_pool(priorities: [i32; 3]) -> ContinuousBatchScheduler {
        let mut sched = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(6, 2, false));
        let mut admission = StepBatch::default();
        for (i, priority) in priorities.into_iter().enumerate() {
            let id = i as SeqId + 1;
            sched.add_request(request(id, vec![id as u32; 3], 8, priority)).unwrap();
            // Admitted one per step. Only the last output is applied: an output never applied
            // is simply scheduled again, so all three prefill together from position 0.
            admission = sched.schedule();
        }
        assert_eq!(ids(&admission), vec![1, 2, 3]);
        assert!(admission.seqs.iter().all(|s| s.start_pos == 0 && (s.num_logits > 0)));
        run_step(&mut sched, &admission, 10);
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![1, 2, 3]);
        assert!(out.preempted.is_empty());
        run_step(&mut sched, &out, 11);
        assert_eq!(sched.kv().usage().free_blocks, 0);
        sched
    }

    #[test]
    fn preemption_takes_the_lowest_priority_most_recent_sequence() {
        let mut sched = full_pool([1, 0, 0]);
        let out = sched.schedule();
        assert_eq!(out.preempted, vec![3], "priority 0, and admitted after 2");
        assert_eq!(ids(&out), vec![1, 2]);
        assert_eq!(
            sched.stats(),
            SchedulerStats { running: 2, waiting: 1, preemptions: 1, prefilling: 0, decoding: 2 }
        );
        // It keeps its tokens and will recompute them all.
        assert_eq!(sched.tokens(3), Some(&[3, 3, 3, 10, 11][..]));
        assert!(sched.kv().block_table(3).is_empty());
        run_step(&mut sched, &out, 12);
        // Once 1 is finished, 3 fits again.
        sched.finish(1);
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![2, 3]);
        let resumed = &out.seqs[1];
        assert_eq!(
            (resumed.start_pos, resumed.tokens.as_slice(), resumed.num_logits > 0),
            (0, &[3, 3, 3, 10, 11][..], true)
        );
        run_step(&mut sched, &out, 13);
        assert_eq!(sched.tokens(3), Some(&[3, 3, 3, 10, 11, 13][..]));
        assert_eq!(sched.num_generated(3), Some(3));
    }

    #[test]
    fn a_sequence_may_preempt_itself() {
        let mut sched = full_pool([0, 1, 1]);
        let out = sched.schedule();
        assert_eq!(out.preempted, vec![1]);
        assert_eq!(ids(&out), vec![2, 3]);
    }

    #[test]
    fn preempted_sequences_requeue_ahead_of_their_priority() {
        let mut sched = full_pool([0, 0, 0]);
        sched.add_request(request(4, vec![4], 1, 0)).unwrap();
        sched.add_request(request(5, vec![5], 1, 1)).unwrap();
        let out = sched.schedule();
        assert_eq!(out.preempted, vec![3]);
        run_step(&mut sched, &out, 12);
        // 1 and 2 fill the pool again; 5 waits for room (and nothing was preempted).
        let out = sched.schedule();
        assert_eq!((ids(&out), out.preempted.len()), (vec![1, 2], 0));
        run_step(&mut sched, &out, 13);
        let out = sched.schedule();
        assert_eq!(out.preempted, vec![2]);
        assert_eq!(ids(&out), vec![1]);
        // Priority first; within it the preempted, earliest admitted first, then new arrivals.
        assert_eq!(sched.waiting, [5, 2, 3, 4]);
    }

    #[test]
    fn a_victim_scheduled_earlier_in_the_step_gives_back_its_tokens() {
        // 4 blocks of 4 tokens: 1 (priority 0) holds 1, 2 (priority 1) holds 2, 3 (priority 1)
        // holds 1. Then 1 decodes inside its block, but 2 needs a third block: 1, already
        // scheduled this step, is preempted, and its token goes back to the budget, which 3
        // needs.
        let mut sched = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(4, 4, false));
        sched.add_request(request(1, vec![1; 2], 10, 0)).unwrap();
        let out = sched.schedule();
        run_step(&mut sched, &out, 5);
        sched.add_request(request(2, vec![2; 8], 4, 1)).unwrap();
        sched.add_request(request(3, vec![3; 2], 4, 1)).unwrap();
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![1, 2, 3]);
        run_step(&mut sched, &out, 6);
        assert_eq!(sched.kv().usage().free_blocks, 0);
        sched.config.max_num_batched_tokens = 2;
        let out = sched.schedule();
        assert_eq!(out.preempted, vec![1]);
        assert_eq!(ids(&out), vec![2, 3]);
        assert_eq!(out.num_batched_tokens, 2);
        assert_eq!(out.seqs[0].block_table.len(), 3);
    }

    #[test]
    fn prefix_cache_hits_skip_the_shared_prefix() {
        let mut sched = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(64, 4, true));
        let a: Vec<u32> = (0..20).collect();
        sched.add_request(request(1, a.clone(), 8, 0)).unwrap();
        let out = sched.schedule();
        run_step(&mut sched, &out, 50);
        let mut b = a[..16].to_vec();
        b.extend([90, 91, 92]);
        sched.add_request(request(2, b, 8, 0)).unwrap();
        let out = sched.schedule();
        let s = &out.seqs[1];
        assert_eq!((s.id, s.start_pos, s.tokens.as_slice()), (2, 16, &[90, 91, 92][..]));
        assert_eq!(s.block_table[..4], out.seqs[0].block_table[..4]);
        assert_eq!(sched.kv().prefix_cache_stats().hits, 4);
        run_step(&mut sched, &out, 51);
        sched.finish(1);
        sched.finish(2);
        let usage = sched.kv().usage();
        assert_eq!(usage.used_blocks, 0);
        assert!(usage.cached_blocks >= 5, "a's 5 full blocks stay cached: {usage:?}");
        assert!(!sched.has_unfinished());
    }

    /// Three prompts sent together, two of them beginning with the same 3 blocks (a system
    /// prompt), one unrelated.
    fn shared_prefix_requests(sched: &mut ContinuousBatchScheduler) {
        let system: Vec<u32> = (0..12).collect();
        sched.add_request(request(1, [system.clone(), vec![40, 41, 42]].concat(), 4, 0)).unwrap();
        sched.add_request(request(2, [system, vec![50, 51]].concat(), 4, 0)).unwrap();
        sched.add_request(request(3, vec![7; 6], 4, 0)).unwrap();
    }

    #[test]
    fn a_shared_prefix_sent_twice_at_once_is_computed_once() {
        let mut sched = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(64, 4, true));
        shared_prefix_requests(&mut sched);
        // Step 1: the first of the two and the unrelated prompt; the second waits.
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![1, 3]);
        assert_eq!(out.num_batched_tokens, 15 + 6);
        assert_eq!(sched.stats().waiting, 1);
        run_step(&mut sched, &out, 60);
        // Step 2: it finds the 3 blocks cached and computes only its own 2 tokens.
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![1, 3, 2]);
        let s = &out.seqs[2];
        assert_eq!((s.start_pos, s.tokens.as_slice()), (12, &[50, 51][..]));
        assert_eq!(s.block_table[..3], out.seqs[0].block_table[..3]);
        assert_eq!(sched.kv().prefix_cache_stats().hits, 3);
        run_step(&mut sched, &out, 61);
        for id in 1..=3 {
            sched.finish(id);
        }
        assert_eq!(sched.kv().usage().used_blocks, 0);
    }

    #[test]
    fn without_the_cache_a_shared_prefix_does_not_wait() {
        let mut sched = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(64, 4, false));
        shared_prefix_requests(&mut sched);
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![1, 2, 3]);
        assert_eq!(out.num_batched_tokens, 15 + 14 + 6);
    }

    #[test]
    fn a_shared_prefix_longer_than_a_step_is_waited_for_until_it_is_computed() {
        // Budget 8: the first prompt's 15 tokens take two steps; the second waits for both,
        // then computes only its own 2 tokens; the unrelated one is admitted as budget allows.
        let mut sched = ContinuousBatchScheduler::new(config(8, 8), KvCacheManager::new(64, 4, true));
        shared_prefix_requests(&mut sched);
        let out = sched.schedule();
        assert_eq!((ids(&out), out.seqs[0].tokens.len()), (vec![1], 8));
        run_step(&mut sched, &out, 60);
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![1, 3]);
        assert_eq!((out.seqs[0].start_pos, out.seqs[0].tokens.len()), (8, 7));
        run_step(&mut sched, &out, 60);
        let out = sched.schedule();
        assert_eq!(ids(&out), vec![1, 3, 2]);
        assert_eq!((out.seqs[2].start_pos, out.seqs[2].tokens.as_slice()), (12, &[50, 51][..]));
    }

    #[test]
    fn finish_frees_blocks_and_unknown_ids_are_harmless() {
        let mut sched = ContinuousBatchScheduler::new(config(1, 64), KvCacheManager::new(8, 4, false));
        sched.add_request(request(1, vec![1; 9], 3, 0)).unwrap();
        sched.add_request(request(2, vec![2; 2], 3, 0)).unwrap();
        let out = sched.schedule();
        assert_eq!(sched.kv().usage().used_blocks, 3);
        run_step(&mut sched, &out, 3);
        sched.finish(99);
        sched.finish(2); // still waiting
        sched.finish(1);
        sched.finish(1);
        assert_eq!(sched.kv().usage().free_blocks, 8);
        assert!(!sched.has_unfinished());
        assert_eq!(sched.schedule(), StepBatch::default());
        assert_eq!(sched.tokens(1), None);
        assert_eq!(sched.num_generated(2), None);
        sched.update_from_output(&out, &[vec![5]]);
    }

    #[test]
    fn a_sequence_at_max_tokens_is_no_longer_scheduled() {
        let mut sched = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(8, 4, false));
        sched.add_request(request(1, vec![1; 3], 2, 0)).unwrap();
        for _ in 0..2 {
            let out = sched.schedule();
            run_step(&mut sched, &out, 4);
        }
        assert_eq!(sched.num_generated(1), Some(2));
        assert!(sched.schedule().seqs.is_empty());
        assert!(sched.has_unfinished(), "only the engine finishes a sequence");
        sched.finish(1);
        assert!(!sched.has_unfinished());
    }

    #[test]
    fn a_missing_sample_is_recomputed_and_a_stale_output_ignored() {
        let mut sched = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(8, 4, false));
        sched.add_request(request(1, vec![1, 2, 3], 5, 0)).unwrap();
        let out = sched.schedule();
        sched.update_from_output(&out, &[]);
        // All 3 tokens computed, no new one: the last is computed again to get a logit.
        let again = sched.schedule();
        assert_eq!(
            (again.seqs[0].start_pos, again.seqs[0].tokens.as_slice(), again.seqs[0].num_logits > 0),
            (2, &[3][..], true)
        );
        run_step(&mut sched, &again, 8);
        run_step(&mut sched, &again, 9);
        assert_eq!(sched.tokens(1), Some(&[1, 2, 3, 8][..]), "an output applied twice counts once");
    }

    #[test]
    fn add_request_rejects_what_can_never_run() {
        let config = SchedulerConfig { max_num_seqs: 4, max_num_batched_tokens: 64, max_model_len: 100 };
        let mut sched = ContinuousBatchScheduler::new(config, KvCacheManager::new(4, 4, false));
        let err = |sched: &mut ContinuousBatchScheduler, req| sched.add_request(req).unwrap_err().to_string();
        assert!(err(&mut sched, request(1, vec![], 4, 0)).contains("invalid prompt: the prompt is empty"));
        assert!(err(&mut sched, request(1, vec![1], 0, 0)).contains("invalid max_tokens: 0"));
        assert!(
            err(&mut sched, request(1, vec![1; 100], 1, 0))
                .contains("invalid prompt: 100 tokens, but the context holds 100")
        );
        let message = err(&mut sched, request(1, vec![1; 90], 11, 0));
        assert!(
            message.contains("invalid max_tokens: 11; the prompt takes 90 of the context's 100 tokens, so at most 10"),
            "{message}"
        );
        assert!(err(&mut sched, request(1, vec![1; 17], 1, 0)).contains("17 tokens (5 KV blocks) can never fit"));
        let message = err(&mut sched, request(1, vec![1; 10], 8, 0));
        assert!(message.contains("invalid max_tokens: 8;") && message.contains("at most 7"), "{message}");
        sched.add_request(request(1, vec![1; 10], 7, 0)).unwrap();
        assert!(err(&mut sched, request(1, vec![1], 1, 0)).contains("invalid request: request id 1 is already"));
        assert_eq!(sched.stats().waiting, 1);
    }

    /// A deterministic stand-in for the model: it writes each scheduled token's K/V (here the
    /// token and its position) into the slot its block table names, and samples, for each logit
    /// row, a hash of the sequence's history up to that row read back through the block table. A
    /// wrong block table, a wrongly shared prefix block, a wrong start position or a rolled-back
    /// draft whose slot is read later changes the tokens.
    /// With recurrent state it also keeps, per state slot, the tokens the slot has absorbed
    /// (cleared at position 0) and samples from those instead, so a wrong slot, a slot shared by
    /// two live sequences or a state that ran ahead of the computed tokens changes the tokens.
    struct FakeModel {
        block_size: usize,
        /// The executor's scan chunk: a state remembers which of its tokens were scanned as part
        /// of a whole chunk (as `model::scan_plan` decides) and samples from that too, so a cut
        /// that changes a sequence's chunks changes its tokens.
        scan_chunk: usize,
        /// slot -> (token, position)
        slots: HashMap<usize, (u32, usize)>,
        /// state slot -> the tokens absorbed into it, each with whether it was chunked
        states: HashMap<u32, Vec<(u32, bool)>>,
    }

    const VOCAB: u64 = 50;
    const EOS: u32 = 0;

    /// The fake model's choice after `history`.
    fn next_token(history: impl IntoIterator<Item = u32>) -> u32 {
        let hash =
            history.into_iter().fold(0xcbf2_9ce4_8422_2325u64, |h, t| (h ^ t as u64).wrapping_mul(0x0100_0000_01b3));
        (hash % VOCAB) as u32
    }

    impl FakeModel {
        fn slot(&self, block_table: &[u32], pos: usize) -> usize {
            block_table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
        }

        /// One sample per logit row of each sequence.
        fn run(&mut self, out: &StepBatch) -> Vec<Vec<u32>> {
            let mut samples = Vec::new();
            for s in &out.seqs {
                for (i, &token) in s.tokens.iter().enumerate() {
                    let slot = self.slot(&s.block_table, s.start_pos + i);
                    self.slots.insert(slot, (token, s.start_pos + i));
                }
                if let Some(state_slot) = s.state_slot {
                    // A restore starts from the snapshot; a save copies the state after the chunk.
                    let mut state =
                        self.states.get(&s.state_restore.unwrap_or(state_slot)).cloned().unwrap_or_default();
                    if s.start_pos == 0 {
                        state.clear();
                    }
                    assert_eq!(state.len(), s.start_pos, "seq {}'s state is not at its start position", s.id);
                    assert_eq!(s.num_logits, usize::from(s.num_logits > 0), "drafts with recurrent state");
                    let (q, end) = (self.scan_chunk, s.end_pos());
                    state.extend(s.tokens.iter().enumerate().map(|(i, &token)| {
                        let chunk = (s.start_pos + i) / q * q;
                        (token, q > 1 && chunk >= s.start_pos && chunk + q <= end)
                    }));
                    if let Some(save) = s.state_save {
                        assert_eq!(state.len() % self.block_size, 0, "a snapshot off a block boundary");
                        self.states.insert(save, state.clone());
                    }
                    self.states.insert(state_slot, state.clone());
                    let history = state.iter().map(|&(token, chunked)| token + 1000 * u32::from(chunked));
                    let row = if s.num_logits > 0 { vec![next_token(history)] } else { vec![] };
                    samples.push(row);
                    continue;
                }
                let rows = (s.end_pos() - s.num_logits..s.end_pos()).map(|last| {
                    next_token((0..=last).map(|pos| {
                        let (token, written_pos) = self.slots[&self.slot(&s.block_table, pos)];
                        assert_eq!(written_pos, pos, "seq {} reads a slot written for another position", s.id);
                        token
                    }))
                });
                samples.push(rows.collect());
            }
            samples
        }
    }

    /// Proposes drafts for decoding sequences: the fake model's true continuation, corrupted
    /// at random, of random length (0 to 4), so steps accept everything, a prefix, or nothing.
    struct FakeDrafter {
        rng: crate::sampling::SamplerRng,
    }

    impl FakeDrafter {
        fn propose(&mut self, sched: &mut ContinuousBatchScheduler) {
            let ids: Vec<SeqId> = sched.running.clone();
            for id in ids {
                let mut history = sched.tokens(id).unwrap().to_vec();
                let mut drafts = Vec::new();
                for _ in 0..self.rng.below(5) {
                    let truth = next_token(history.iter().copied());
                    let draft = if self.rng.below(4) == 0 { (truth + 1) % VOCAB as u32 } else { truth };
                    history.push(draft);
                    drafts.push(draft);
                }
                sched.propose_drafts(id, drafts);
            }
        }
    }

    struct RunResult {
        req_to_tokens: HashMap<SeqId, Vec<u32>>,
        stats: SchedulerStats,
        num_prefix_hits: u64,
        /// Admissions that restored a recurrent-state snapshot.
        num_state_hits: u64,
        /// Drafted tokens scheduled, and accepted.
        num_drafted: usize,
        num_accepted: usize,
    }

    /// Drive the scheduler like the engine does until every request is finished (EOS or
    /// max_tokens), checking each step's output and the KV bookkeeping after it. With a drafter,
    /// decodes verify drafted tokens and keep the accepted run (cut at EOS, as the engine does).
    fn simulate(
        arrivals: &[(usize, SchedRequest)],
        config: SchedulerConfig,
        kv: KvCacheManager,
        state: Option<RecurrentStateManager>,
        mut drafter: Option<FakeDrafter>,
    ) -> RunResult {
        let scan_chunk = state.as_ref().map_or(1, |s| s.config().scan_chunk_tokens);
        let mut model =
            FakeModel { block_size: kv.block_size(), scan_chunk, slots: HashMap::new(), states: HashMap::new() };
        let mut sched = ContinuousBatchScheduler::new(config.clone(), kv);
        if let Some(state) = state {
            sched = sched.with_recurrent_state(state);
        }
        let last_arrival = arrivals.iter().map(|(step, _)| *step).max().unwrap_or(0);
        let max_tokens: HashMap<SeqId, usize> = arrivals.iter().map(|(_, r)| (r.id, r.max_tokens)).collect();
        let (mut req_to_tokens, mut num_drafted, mut num_accepted) = (HashMap::new(), 0, 0);
        for step in 0.. {
            assert!(step < 10_000, "the run does not finish");
            for (_, req) in arrivals.iter().filter(|(at, _)| *at == step) {
                sched.add_request(req.clone()).unwrap();
            }
            if step > last_arrival && !sched.has_unfinished() {
                break;
            }
            if let Some(drafter) = &mut drafter {
                drafter.propose(&mut sched);
            }
            let out = sched.schedule();
            // The step's own invariants.
            assert!(out.num_batched_tokens <= config.max_num_batched_tokens);
            assert_eq!(out.num_batched_tokens, out.seqs.iter().map(|s| s.tokens.len()).sum::<usize>());
            assert!(out.seqs.len() <= config.max_num_seqs);
            assert!(sched.stats().running <= config.max_num_seqs);
            let unique: HashSet<SeqId> = ids(&out).into_iter().collect();
            assert_eq!(unique.len(), out.seqs.len(), "a sequence scheduled twice");
            assert!(out.preempted.iter().all(|id| !unique.contains(id)));
            if sched.has_unfinished() {
                assert!(!out.seqs.is_empty(), "step {step} schedules nothing with requests pending");
            }
            for s in &out.seqs {
                let tokens = sched.tokens(s.id).unwrap();
                let num_known = s.tokens.len() - s.drafted().len();
                assert!(num_known > 0);
                assert_eq!(&tokens[s.start_pos..s.start_pos + num_known], &s.tokens[..num_known]);
                assert_eq!(s.num_logits > 0, s.start_pos + num_known == tokens.len());
                assert!(s.block_table.len() * model.block_size >= s.end_pos());
                let generated = sched.num_generated(s.id).unwrap();
                assert!(generated + s.num_logits <= max_tokens[&s.id], "a full accept would pass max_tokens");
                num_drafted += s.drafted().len();
            }
            let usage = sched.kv().usage();
            assert_eq!(usage.used_blocks + usage.cached_blocks + usage.free_blocks, usage.total_blocks);

            let samples = model.run(&out);
            let accepted: Vec<Vec<u32>> = out
                .seqs
                .iter()
                .zip(&samples)
                .map(|(s, rows)| {
                    let as_sampled: Vec<Sampled> =
                        rows.iter().map(|&token| Sampled { token, logprob: 0.0, top_logprobs: vec![] }).collect();
                    let mut kept = rows[..crate::step::accepted_len(s, &as_sampled)].to_vec();
                    if let Some(eos) = kept.iter().position(|&t| t == EOS) {
                        kept.truncate(eos + 1);
                    }
                    num_accepted += kept.len().saturating_sub(1);
                    kept
                })
                .collect();
            sched.update_from_output(&out, &accepted);
            sched.kv.check_invariants();
            sched.check_state_slots();
            for (s, kept) in out.seqs.iter().zip(&accepted) {
                let done = kept.last() == Some(&EOS) || sched.num_generated(s.id) == Some(max_tokens[&s.id]);
                if !kept.is_empty() && done {
                    req_to_tokens.insert(s.id, sched.tokens(s.id).unwrap().to_vec());
                    sched.finish(s.id);
                }
            }
            // Blocks cover the known tokens and nothing past them but the next step's needs.
            for &id in &sched.running {
                let tokens = sched.tokens(id).unwrap().len();
                assert!(sched.kv.block_table(id).len() <= tokens.div_ceil(model.block_size).max(1));
            }
        }
        sched.kv.check_invariants();
        assert_eq!(sched.kv().usage().used_blocks, 0);
        assert!(sched.recurrent_state().is_none_or(|state| state.usage().used_slots == 0));
        RunResult {
            req_to_tokens,
            stats: sched.stats(),
            num_prefix_hits: sched.kv().prefix_cache_stats().hits,
            num_state_hits: sched.kv().prefix_cache_stats().state_hits,
            num_drafted,
            num_accepted,
        }
    }

    /// 16 requests sharing 3 prefixes, arriving over 12 steps.
    fn arrivals() -> Vec<(usize, SchedRequest)> {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = |bound: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % bound
        };
        let prefixes: Vec<Vec<u32>> =
            (0..3).map(|_| (0..16 + next(16)).map(|_| 1 + next(VOCAB - 1) as u32).collect()).collect();
        (0..16)
            .map(|id| {
                let mut prompt = prefixes[next(3) as usize].clone();
                prompt.extend((0..1 + next(12)).map(|_| 1 + next(VOCAB - 1) as u32));
                (next(12) as usize, request(id, prompt, 5 + next(30) as usize, next(3) as i32))
            })
            .collect()
    }

    fn unconstrained() -> (SchedulerConfig, KvCacheManager) {
        let config = SchedulerConfig { max_num_seqs: 32, max_num_batched_tokens: 4096, max_model_len: 1024 };
        (config, KvCacheManager::new(4096, 4, false))
    }

    #[test]
    fn preempted_sequences_resume_and_match_an_unconstrained_run() {
        let arrivals = arrivals();
        let (config, kv) = unconstrained();
        let reference = simulate(&arrivals, config, kv, None, None);
        assert_eq!(reference.stats.preemptions, 0);
        assert_eq!(reference.req_to_tokens.len(), arrivals.len());

        for (num_blocks, max_num_batched_tokens, enable_prefix_cache) in
            [(20, 16, true), (24, 32, false), (40, 7, true)]
        {
            let constrained = simulate(
                &arrivals,
                SchedulerConfig { max_num_seqs: 6, max_num_batched_tokens, max_model_len: 1024 },
                KvCacheManager::new(num_blocks, 4, enable_prefix_cache),
                None,
                None,
            );
            assert!(constrained.stats.preemptions > 0, "{num_blocks} blocks: the pool was meant to run out");
            if enable_prefix_cache {
                assert!(constrained.num_prefix_hits > 0, "the shared prefixes were meant to hit the cache");
            }
            for (id, tokens) in &reference.req_to_tokens {
                assert_eq!(constrained.req_to_tokens.get(id), Some(tokens), "request {id} with {num_blocks} blocks");
            }
        }
    }

    /// Steps that return several tokens per sequence and steps that roll drafts back, alone and
    /// under preemption and the prefix cache, give exactly the tokens of a run without drafts,
    /// with the KV bookkeeping checked after every step (inside `simulate`).
    #[test]
    fn drafted_tokens_are_verified_kept_or_rolled_back() {
        let arrivals = arrivals();
        let (config, kv) = unconstrained();
        let reference = simulate(&arrivals, config, kv, None, None);
        for (num_blocks, max_num_batched_tokens, enable_prefix_cache) in
            [(4096, 4096, false), (20, 16, true), (24, 32, false), (40, 7, true)]
        {
            let drafter = FakeDrafter { rng: crate::sampling::SamplerRng::new(num_blocks as u64) };
            let run = simulate(
                &arrivals,
                SchedulerConfig { max_num_seqs: 6, max_num_batched_tokens, max_model_len: 1024 },
                KvCacheManager::new(num_blocks, 4, enable_prefix_cache),
                None,
                Some(drafter),
            );
            assert!(
                run.num_accepted > 0 && run.num_accepted < run.num_drafted,
                "{} of {}",
                run.num_accepted,
                run.num_drafted
            );
            for (id, tokens) in &reference.req_to_tokens {
                assert_eq!(run.req_to_tokens.get(id), Some(tokens), "request {id} with {num_blocks} blocks");
            }
        }
    }

    #[test]
    fn drafts_fit_max_tokens_and_the_budget_and_are_used_once() {
        let mut sched = ContinuousBatchScheduler::new(config(8, 4), KvCacheManager::new(64, 4, false));
        sched.add_request(request(1, vec![1, 2, 3], 6, 0)).unwrap();
        // A prefill never carries drafts.
        sched.propose_drafts(1, vec![5, 6]);
        let out = sched.schedule();
        assert_eq!((out.seqs[0].tokens.as_slice(), out.seqs[0].num_logits), (&[1, 2, 3][..], 1));
        run_step(&mut sched, &out, 9);
        // Not kept: the decode that follows has no drafts.
        let out = sched.schedule();
        assert_eq!((out.seqs[0].tokens.as_slice(), out.seqs[0].num_logits), (&[9][..], 1));
        sched.update_from_output(&out, &[]);
        // A decode takes what the budget (4 tokens) allows.
        sched.propose_drafts(1, vec![5, 6, 7, 8, 9]);
        let out = sched.schedule();
        assert_eq!((out.seqs[0].tokens.as_slice(), out.seqs[0].num_logits), (&[9, 5, 6, 7][..], 4));
        // Keep draft 5 and the correction 4: 6 and 7 were rejected.
        sched.update_from_output(&out, &[vec![5, 4]]);
        sched.kv.check_invariants();
        assert_eq!(sched.tokens(1), Some(&[1, 2, 3, 9, 5, 4][..]));
        assert_eq!(sched.req_to_seq[&1].num_computed_tokens, 5);
        assert_eq!(sched.kv().block_table(1).len(), 2, "the block only drafts reached is back in the pool");
        // Three tokens left before max_tokens: two drafts at most, so a full accept fits.
        sched.propose_drafts(1, vec![1, 1, 1]);
        let out = sched.schedule();
        assert_eq!((out.seqs[0].tokens.as_slice(), out.seqs[0].num_logits), (&[4, 1, 1][..], 3));
        sched.update_from_output(&out, &[vec![1, 1, 7]]);
        sched.kv.check_invariants();
        assert_eq!(sched.num_generated(1), Some(6));
        assert!(sched.schedule().seqs.is_empty(), "max_tokens reached");
        sched.finish(1);
        assert_eq!(sched.kv().usage().used_blocks, 0);
    }

    #[test]
    fn malformed_runs_are_ignored() {
        let mut sched = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(64, 4, false));
        sched.add_request(request(1, vec![1, 2, 3], 10, 0)).unwrap();
        let out = sched.schedule();
        run_step(&mut sched, &out, 9);
        sched.propose_drafts(1, vec![5, 6]);
        let out = sched.schedule();
        // Longer than the rows, or keeping a token that was not drafted: nothing appended.
        sched.update_from_output(&out, &[vec![5, 6, 7, 8]]);
        assert_eq!(sched.tokens(1), Some(&[1, 2, 3, 9][..]));
        let mut sched2 = ContinuousBatchScheduler::new(config(8, 64), KvCacheManager::new(64, 4, false));
        sched2.add_request(request(1, vec![1, 2, 3], 10, 0)).unwrap();
        let first = sched2.schedule();
        run_step(&mut sched2, &first, 9);
        sched2.propose_drafts(1, vec![5, 6]);
        let out = sched2.schedule();
        sched2.update_from_output(&out, &[vec![6, 6]]);
        assert_eq!(sched2.tokens(1), Some(&[1, 2, 3, 9][..]));
        sched2.kv.check_invariants();
    }

    impl ContinuousBatchScheduler {
        /// Every running sequence holds exactly one state slot, nobody else holds one, and the
        /// slot pool adds up.
        fn check_state_slots(&self) {
            let Some(state) = &self.state else { return };
            state.check_invariants();
            for &id in &self.running {
                assert!(state.slot(id).is_some(), "running seq {id} holds no state slot");
            }
            for &id in &self.waiting {
                assert!(state.slot(id).is_none(), "waiting seq {id} holds a state slot");
            }
            assert_eq!(state.usage().used_slots, self.running.len());
        }
    }

    fn with_snapshots(num_slots: usize, num_snapshot_slots: usize, scan_chunk_tokens: usize) -> RecurrentStateManager {
        RecurrentStateManager::new(crate::kv::RecurrentStateConfig {
            num_slots,
            num_snapshot_slots,
            slot_size_bytes: 1024,
            scan_chunk_tokens,
        })
    }

    /// The unconstrained run a recurrent run with scan chunks of `q` and a budget of
    /// `max_num_batched_tokens` must match: chunks of `q` where the budget holds one (else no
    /// step can hold a whole chunk, and the model scans token by token).
    fn unconstrained_reference(
        arrivals: &[(usize, SchedRequest)],
        q: usize,
        max_num_batched_tokens: usize,
    ) -> RunResult {
        let (config, kv) = unconstrained();
        let q = if q <= max_num_batched_tokens { q } else { 1 };
        simulate(arrivals, config, kv, Some(with_snapshots(32, 0, q)), None)
    }

    /// With snapshot slots (fewer than the prefixes' blocks, so they are taken back from the
    /// least recently used) the shared prefixes' states are restored instead of recomputed, and
    /// every request still gets the tokens of an unconstrained run without snapshots: the fake
    /// model checks each restored state is the sequence's own prefix, and that its chunks are
    /// those of the unconstrained run (scan chunks of 1, 4 and 8 positions; 8 does not fit a
    /// budget of 7, where cuts are free again).
    #[test]
    fn recurrent_prefix_states_are_restored_and_change_nothing() {
        let arrivals = arrivals();
        for q in [1, 4, 8] {
            for (num_slots, num_snapshots, num_blocks, max_num_batched_tokens) in
                [(8, 16, 4096, 64), (6, 2, 40, 16), (3, 1, 30, 7)]
            {
                let reference = unconstrained_reference(&arrivals, q, max_num_batched_tokens);
                let run = simulate(
                    &arrivals,
                    SchedulerConfig { max_num_seqs: 6, max_num_batched_tokens, max_model_len: 1024 },
                    KvCacheManager::new(num_blocks, 4, true),
                    Some(with_snapshots(num_slots, num_snapshots, q)),
                    None,
                );
                assert!(run.num_state_hits > 0, "{num_snapshots} snapshots: the shared prefixes were meant to hit");
                for (id, tokens) in &reference.req_to_tokens {
                    let what = format!("request {id} with {num_snapshots} snapshots, scan chunk {q}");
                    assert_eq!(run.req_to_tokens.get(id), Some(tokens), "{what}");
                }
            }
        }
    }

    /// A recurrent model under too few slots, too few blocks and a small budget (preemption,
    /// chunked prefill, the prefix cache asked for but switched off) gives the tokens of an
    /// unconstrained run; drafts proposed are never scheduled. The fake model checks that each
    /// state slot is at the chunk's start position and, with scan chunks of 4 and 8 positions,
    /// that budget cuts and recomputes after preemption leave every chunk as it was.
    #[test]
    fn recurrent_sequences_take_a_slot_each_and_match_an_unconstrained_run() {
        let arrivals = arrivals();
        for q in [1, 4, 8] {
            let mut num_preemptions = 0;
            for (num_slots, num_blocks, max_num_batched_tokens) in [(3, 4096, 64), (6, 24, 16), (2, 40, 7)] {
                let reference = unconstrained_reference(&arrivals, q, max_num_batched_tokens);
                let drafter = FakeDrafter { rng: crate::sampling::SamplerRng::new(num_slots as u64) };
                let run = simulate(
                    &arrivals,
                    SchedulerConfig { max_num_seqs: 6, max_num_batched_tokens, max_model_len: 1024 },
                    KvCacheManager::new(num_blocks, 4, true),
                    Some(with_snapshots(num_slots, 0, q)),
                    Some(drafter),
                );
                assert_eq!((run.num_prefix_hits, run.num_drafted), (0, 0));
                num_preemptions += run.stats.preemptions;
                for (id, tokens) in &reference.req_to_tokens {
                    let what = format!("request {id} with {num_slots} slots, scan chunk {q}");
                    assert_eq!(run.req_to_tokens.get(id), Some(tokens), "{what}");
                }
            }
            assert!(num_preemptions > 0, "scan chunk {q}: the small pools were meant to preempt");
        }
    }

    /// Random arrivals, steps, cancellations (of waiting and running sequences) and outputs
    /// that are never applied, over few blocks, fewer state slots than sequences and two
    /// snapshot slots: after every operation each running sequence holds one slot and every
    /// snapshot slot is free, pending or cached once (`check_invariants`), and at the end every
    /// slot and block is back.
    #[test]
    fn random_operations_return_every_state_slot_and_block() {
        for seed in 0..4u64 {
            let mut rng = crate::sampling::SamplerRng::new(seed);
            let mut sched = ContinuousBatchScheduler::new(config(5, 12), KvCacheManager::new(12, 2, true))
                .with_recurrent_state(with_snapshots(3, 2, 1 + seed as usize % 3));
            let mut next_id: SeqId = 0;
            let (mut num_admitted_blocked_by_slots, mut num_cancelled) = (0, 0);
            for _ in 0..3000 {
                match rng.below(8) {
                    0..=1 => {
                        let prompt: Vec<u32> = (0..1 + rng.below(6)).map(|_| rng.below(4) as u32).collect();
                        sched.add_request(request(next_id, prompt, 1 + rng.below(8), rng.below(2) as i32)).unwrap();
                        next_id += 1;
                    }
                    2 => {
                        let id = rng.below(next_id as usize + 1) as SeqId;
                        num_cancelled += u64::from(sched.req_to_seq.contains_key(&id));
                        sched.finish(id);
                    }
                    _ => {
                        let had_waiting = !sched.waiting.is_empty();
                        let out = sched.schedule();
                        let slots: Vec<u32> = out.seqs.iter().map(|s| s.state_slot.unwrap()).collect();
                        assert_eq!(slots.iter().collect::<HashSet<_>>().len(), slots.len(), "a slot shared");
                        if had_waiting && sched.state.as_ref().unwrap().num_free_slots() == 0 {
                            num_admitted_blocked_by_slots += 1;
                        }
                        // Now and then the runner's output is lost.
                        if rng.below(10) > 0 {
                            run_step(&mut sched, &out, 1 + rng.below(3) as u32);
                        }
                        let done: Vec<SeqId> = out
                            .seqs
                            .iter()
                            .filter(|s| sched.req_to_seq.get(&s.id).is_some_and(Sequence::is_done))
                            .map(|s| s.id)
                            .collect();
                        for id in done {
                            sched.finish(id);
                        }
                    }
                }
                sched.kv.check_invariants();
                sched.check_state_slots();
            }
            assert!(num_admitted_blocked_by_slots > 0 && num_cancelled > 0 && sched.stats().preemptions > 0);
            assert!(sched.kv().prefix_cache_stats().state_hits > 0, "snapshots were meant to be restored");
            for id in 0..next_id {
                sched.finish(id);
            }
            assert_eq!(sched.kv().usage().used_blocks, 0);
            assert_eq!(sched.recurrent_state().unwrap().usage().free_slots, 3);
        }
    }

    /// The scheduler and the KV manager are pure logic: no GPU, async runtime or browser API
    /// in their code (comments may name them).
    #[test]
    fn tidy_scheduler_and_kv_manager_import_no_platform_code() {
        let forbidden = [concat!("wg", "pu"), concat!("to", "kio"), concat!("web", "_sys"), concat!("fut", "ures")];
        let sources = [
            ("src/engine/scheduler.rs", include_str!("scheduler.rs")),
            ("src/kv/manager.rs", include_str!("../kv/manager.rs")),
            ("src/kv/state.rs", include_str!("../kv/state.rs")),
        ];
        for (path, source) in sources {
            for (number, line) in source.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for word in forbidden {
                    assert!(!code.contains(word), "{path}:{}: mentions {word}", number + 1);
                }
            }
        }
    }
}
