//! `ContinuousBatchEngine`: many concurrent requests served by one model in shared steps.
//!
//! Every pending request joins the next step's batch. A step is: the scheduler picks the batch
//! (decodes first, then prefill chunks within the token budget and the free KV blocks); the
//! engine adds each sampled row's draw; the executor runs it as one GPU submission and returns
//! the samples; each sequence keeps its accepted run (`step::accepted_len`), which goes back to
//! the scheduler and, through output processing (`output`), to the request's stream; finished
//! sequences free their blocks. An iteration lock serializes steps; whoever holds it (the
//! background loop, or a caller awaiting its own request when no loop runs) steps for everyone.
//!
//! Requests are validated once, here at the door (`submit`): field values by
//! `InferenceRequest::validate`, lengths against the context and the KV pool by the scheduler.
//! Nothing after the door validates again.
//!
//! **Invariant:** a request's tokens depend only on the request (prompt, parameters, seed), not
//! on what shares its batch or whether it was preempted: kernels are batch invariant and a
//! request's `n`-th generated token is drawn with the `n`-th value of its own random stream.
//! **Invariant:** the engine never sees the GPU: it holds a `ModelExecutor` and plain data.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use web_time::Instant;

use crate::engine::metrics::{EngineMetrics, MAX_STEP_RECORDS, StepRecord};
use crate::engine::output::Live;
use crate::engine::request::{DEFAULT_MAX_TOKENS, FinishReason, InferenceRequest, Prompt, StreamChunk, Usage};
use crate::engine::scheduler::{ContinuousBatchScheduler, SchedRequest, SchedulerConfig};
use crate::engine::stop::StopMatcher;
use crate::engine::stream::Wakeup;
use crate::error::{Result, WeftError};
use crate::kv::{KvCacheManager, RecurrentStateManager, SeqId};
use crate::sampling::{Sampled, Sampler};
use crate::step::{ModelExecutor, StepBatch, accepted_len};
use crate::tensor::TensorFactory;
use crate::tokenizer::{DecodeStream, Tokenizer};

/// Speculative decoding settings (the draft model proposes, the target verifies).
#[derive(Clone, Debug, PartialEq)]
pub struct SpeculationConfig {
    /// Tokens the draft proposes per step.
    pub num_speculative_tokens: usize,
}

/// Why speculation and recurrent layers do not mix yet: a rejected drafted token would stay in
/// the state, and rolling it back needs per-position state checkpoints, which are not kept.
const RECURRENT_SPECULATION: &str = "speculative decoding is not supported for recurrent models yet \
     (a rejected draft cannot be rolled out of a state-space layer's state)";

/// Limits of the engine: the scheduler's limits and whether the prefix cache is on.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Sequences in one step at most.
    pub max_num_seqs: usize,
    /// Tokens (prefill chunks plus decodes) in one step at most.
    pub max_num_batched_tokens: usize,
    /// Longest prompt plus generation; at most the model's context.
    pub max_model_len: usize,
    pub enable_prefix_cache: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { max_num_seqs: 64, max_num_batched_tokens: 512, max_model_len: 4096, enable_prefix_cache: true }
    }
}

pub(crate) struct State {
    scheduler: ContinuousBatchScheduler,
    live: HashMap<SeqId, Live>,
    metrics: EngineMetrics,
    last_step_error: Option<String>,
    /// The latest steps, oldest first (at most `MAX_STEP_RECORDS`).
    step_records: VecDeque<StepRecord>,
}

pub(crate) struct Inner {
    config: EngineConfig,
    tokenizer: Arc<dyn Tokenizer>,
    sampler: Arc<dyn Sampler>,
    executor: Arc<dyn ModelExecutor>,
    tensor_factory: Arc<dyn TensorFactory>,
    state: Mutex<State>,
    /// The iteration lock: one step at a time.
    step_lock: futures::lock::Mutex<()>,
    next_id: AtomicU64,
    shut_down: AtomicBool,
    pub(crate) loop_running: AtomicBool,
    /// Wakes the background loop when work arrives, a stream is dropped, or on shutdown.
    pub(crate) wakeup: Wakeup,
}

/// The engine: a cheap handle (`Clone` shares it).
#[derive(Clone)]
pub struct ContinuousBatchEngine {
    pub(crate) inner: Arc<Inner>,
}

impl ContinuousBatchEngine {
    /// An engine over `model_executor` with the KV manager `kv_cache`, which must describe the
    /// executor's block pool. (The seed API's scheduler argument is `config`: its limits are
    /// the scheduler's.) `tensor_factory` is the factory the executor's device was opened with,
    /// kept for callers that want tensors on the same device ([`tensor_factory`](Self::tensor_factory)).
    /// A model with recurrent layers gets a state manager sized to the executor's slot pool.
    pub fn new(
        config: EngineConfig,
        tokenizer: Arc<dyn Tokenizer>,
        sampler: Arc<dyn Sampler>,
        kv_cache: KvCacheManager,
        model_executor: Arc<dyn ModelExecutor>,
        tensor_factory: Arc<dyn TensorFactory>,
    ) -> Result<Self> {
        Self::assemble(config, tokenizer, sampler, kv_cache, model_executor, tensor_factory, None)
    }

    /// The one place parts are checked against the executor and put together.
    fn assemble(
        config: EngineConfig,
        tokenizer: Arc<dyn Tokenizer>,
        sampler: Arc<dyn Sampler>,
        kv_cache: KvCacheManager,
        model_executor: Arc<dyn ModelExecutor>,
        tensor_factory: Arc<dyn TensorFactory>,
        recurrent_state_manager: Option<RecurrentStateManager>,
    ) -> Result<Self> {
        let pool = model_executor.kv_config();
        let usage = kv_cache.usage();
        if kv_cache.block_size() != pool.block_size || usage.total_blocks != pool.num_blocks {
            return Err(WeftError::Unsupported(format!(
                "the KV manager has {} blocks of {} tokens but the executor's pool has {} blocks of {}",
                usage.total_blocks,
                kv_cache.block_size(),
                pool.num_blocks,
                pool.block_size
            )));
        }
        if config.max_num_seqs == 0 || config.max_num_batched_tokens == 0 {
            return Err(WeftError::Unsupported("max_num_seqs and max_num_batched_tokens must be at least 1".into()));
        }
        let state = match (recurrent_state_manager, model_executor.state_config()) {
            (None, None) => None,
            (None, Some(pool)) => Some(RecurrentStateManager::new(pool)),
            (Some(_), None) => {
                return Err(WeftError::Unsupported(
                    "a recurrent-state manager was given, but the executor's model has no recurrent layers".into(),
                ));
            }
            (Some(manager), Some(pool)) if manager.config() != pool => {
                let ours = manager.config();
                return Err(WeftError::Unsupported(format!(
                    "the recurrent-state manager has {} slots (and {} snapshots) of {} bytes but the executor's pool has {} slots (and {} snapshots) of {}",
                    ours.num_slots,
                    ours.num_snapshot_slots,
                    ours.slot_size_bytes,
                    pool.num_slots,
                    pool.num_snapshot_slots,
                    pool.slot_size_bytes
                )));
            }
            (Some(manager), Some(_)) => Some(manager),
        };
        let max_model_len = config.max_model_len.min(model_executor.max_context());
        let mut scheduler = ContinuousBatchScheduler::new(
            SchedulerConfig {
                max_num_seqs: config.max_num_seqs,
                max_num_batched_tokens: config.max_num_batched_tokens,
                max_model_len,
            },
            kv_cache,
        );
        // The scheduler turns the prefix cache off for recurrent models without state
        // snapshots; say so in the config.
        let enable_prefix_cache =
            config.enable_prefix_cache && state.as_ref().is_none_or(|s| s.config().num_snapshot_slots > 0);
        if let Some(state) = state {
            scheduler = scheduler.with_recurrent_state(state);
        }
        let config = EngineConfig { max_model_len, enable_prefix_cache, ..config };
        Ok(ContinuousBatchEngine {
            inner: Arc::new(Inner {
                config,
                tokenizer,
                sampler,
                executor: model_executor,
                tensor_factory,
                state: Mutex::new(State {
                    scheduler,
                    live: HashMap::new(),
                    metrics: EngineMetrics::default(),
                    last_step_error: None,
                    step_records: VecDeque::new(),
                }),
                step_lock: futures::lock::Mutex::new(()),
                next_id: AtomicU64::new(1),
                shut_down: AtomicBool::new(false),
                loop_running: AtomicBool::new(false),
                wakeup: Wakeup::default(),
            }),
        })
    }

    /// [`new`](Self::new) with speculative decoding: a draft executor and its config, both or
    /// neither. No executor supports speculation yet, so giving them is a clear error (naming
    /// the reason for a model with recurrent layers).
    #[allow(clippy::too_many_arguments)]
    pub fn new_with_speculation(
        config: EngineConfig,
        tokenizer: Arc<dyn Tokenizer>,
        sampler: Arc<dyn Sampler>,
        kv_cache: KvCacheManager,
        model_executor: Arc<dyn ModelExecutor>,
        tensor_factory: Arc<dyn TensorFactory>,
        draft_executor: Option<Arc<dyn ModelExecutor>>,
        spec_config: Option<SpeculationConfig>,
    ) -> Result<Self> {
        match (draft_executor, spec_config) {
            (None, None) => Self::new(config, tokenizer, sampler, kv_cache, model_executor, tensor_factory),
            (Some(_), Some(_)) if model_executor.state_config().is_some() => {
                Err(WeftError::Unsupported(RECURRENT_SPECULATION.into()))
            }
            (Some(_), Some(_)) => {
                Err(WeftError::Unsupported("speculative decoding is not supported by this executor yet".into()))
            }
            _ => Err(WeftError::Unsupported(
                "speculation needs both a draft executor and a speculation config, or neither".into(),
            )),
        }
    }

    /// [`new_with_speculation`](Self::new_with_speculation) plus a recurrent-state manager (for
    /// state-space / hybrid models), which must describe the executor's slot pool; `None` makes
    /// one sized to the pool when the model has recurrent layers. Speculation with recurrent
    /// state is refused.
    #[allow(clippy::too_many_arguments)]
    pub fn new_with_speculation_and_recurrent_state_manager(
        config: EngineConfig,
        tokenizer: Arc<dyn Tokenizer>,
        sampler: Arc<dyn Sampler>,
        kv_cache: KvCacheManager,
        model_executor: Arc<dyn ModelExecutor>,
        tensor_factory: Arc<dyn TensorFactory>,
        draft_executor: Option<Arc<dyn ModelExecutor>>,
        spec_config: Option<SpeculationConfig>,
        recurrent_state_manager: Option<RecurrentStateManager>,
    ) -> Result<Self> {
        let Some(manager) = recurrent_state_manager else {
            return Self::new_with_speculation(
                config,
                tokenizer,
                sampler,
                kv_cache,
                model_executor,
                tensor_factory,
                draft_executor,
                spec_config,
            );
        };
        if draft_executor.is_some() || spec_config.is_some() {
            return Err(WeftError::Unsupported(RECURRENT_SPECULATION.into()));
        }
        Self::assemble(config, tokenizer, sampler, kv_cache, model_executor, tensor_factory, Some(manager))
    }

    /// An engine whose KV manager (and, for recurrent layers, state manager) is created and
    /// owned inside, sized to the executor's pools: the common case.
    pub fn new_plan_runtime(
        config: EngineConfig,
        tokenizer: Arc<dyn Tokenizer>,
        sampler: Arc<dyn Sampler>,
        model_executor: Arc<dyn ModelExecutor>,
        tensor_factory: Arc<dyn TensorFactory>,
    ) -> Result<Self> {
        let pool = model_executor.kv_config();
        let kv = KvCacheManager::new(pool.num_blocks, pool.block_size, config.enable_prefix_cache);
        Self::new(config, tokenizer, sampler, kv, model_executor, tensor_factory)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    pub fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        &self.inner.tokenizer
    }

    /// The factory the engine was built with (tensors on the executor's device).
    pub fn tensor_factory(&self) -> &Arc<dyn TensorFactory> {
        &self.inner.tensor_factory
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tokenize(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        let tok = &self.inner.tokenizer;
        match prompt {
            Prompt::Text(text) => tok.encode(text, true),
            Prompt::Tokens(ids) => {
                let vocab = self.inner.executor.vocab_size();
                match ids.iter().find(|&&t| t as usize >= vocab) {
                    Some(t) => {
                        Err(WeftError::invalid("prompt", format!("token id {t} is outside the vocabulary of {vocab}")))
                    }
                    None => Ok(ids.clone()),
                }
            }
            Prompt::Chat(messages) => {
                let template = tok.chat_template().ok_or_else(|| {
                    WeftError::invalid("messages", "this model has no chat template; send a text prompt")
                })?;
                tok.encode(&template.render(messages, true)?, false)
            }
        }
    }

    /// Queue a request; its chunks arrive on the returned receiver as steps run. This is the
    /// one place requests are validated: a refused request gets [`WeftError::InvalidRequest`]
    /// naming the field, and nothing of it is queued.
    pub fn submit(&self, request: InferenceRequest) -> Result<(SeqId, mpsc::UnboundedReceiver<Result<StreamChunk>>)> {
        if self.is_shut_down() {
            return Err(WeftError::Unavailable("the engine is shut down".into()));
        }
        let admitted = request.validate().and_then(|()| {
            let prompt = self.tokenize(&request.prompt)?;
            // Decoding continues the prompt, so a SentencePiece vocabulary keeps the first word's space.
            let decoder = DecodeStream::with_context(self.inner.tokenizer.clone(), true, &prompt)?;
            Ok((prompt, decoder))
        });
        let mut state = self.state();
        let (prompt, decoder) = match admitted {
            Ok(x) => x,
            Err(e) => {
                state.metrics.requests_rejected += 1;
                return Err(e);
            }
        };
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let room = self.inner.config.max_model_len.saturating_sub(prompt.len()).clamp(1, DEFAULT_MAX_TOKENS);
        let max_tokens = request.params.max_tokens.unwrap_or(room);
        let sched = SchedRequest { id, prompt: prompt.clone(), max_tokens, priority: request.params.priority };
        if let Err(e) = state.scheduler.add_request(sched) {
            state.metrics.requests_rejected += 1;
            return Err(e);
        }
        let seed = request.params.sampling.seed.unwrap_or_else(|| {
            web_time::SystemTime::now().duration_since(web_time::UNIX_EPOCH).map_or(id, |d| d.as_nanos() as u64 ^ id)
        });
        let (sender, receiver) = mpsc::unbounded();
        state.metrics.requests_submitted += 1;
        state.metrics.prompt_tokens += prompt.len() as u64;
        let live = Live {
            seed,
            max_tokens,
            decoder,
            stops: StopMatcher::new(&request.params.stop),
            sender,
            usage: Usage { prompt_tokens: prompt.len(), ..Default::default() },
            submitted_at: Instant::now(),
            scheduled_at: None,
            last_token_at: None,
            request,
        };
        state.live.insert(id, live);
        drop(state);
        self.wake();
        Ok((id, receiver))
    }

    /// Run one step for every pending request. Returns false when there was nothing to do.
    pub async fn step(&self) -> Result<bool> {
        let _turn = self.inner.step_lock.lock().await;
        let started = Instant::now();
        let batch = {
            let mut state = self.state();
            self.drop_cancelled(&mut state);
            let mut batch = state.scheduler.schedule();
            if batch.seqs.is_empty() {
                return Ok(false);
            }
            let now = Instant::now();
            let State { scheduler, live, metrics, .. } = &mut *state;
            for s in &mut batch.seqs {
                let Some(live) = live.get_mut(&s.id) else { continue };
                if live.scheduled_at.is_none() {
                    // First time on the GPU: tokens before start_pos came from the prefix cache.
                    live.scheduled_at = Some(now);
                    live.usage.cached_prompt_tokens = s.start_pos;
                    metrics.queue_time.observe((now - live.submitted_at).as_secs_f64());
                }
                if s.num_logits > 0 {
                    let tokens = scheduler.tokens(s.id).unwrap_or(&[]);
                    let (prompt, output) = tokens.split_at(live.usage.prompt_tokens.min(tokens.len()));
                    let params = &live.request.params.sampling;
                    s.sampling = Some(self.inner.sampler.prepare(params, live.seed, prompt, output, s.drafted()));
                }
            }
            batch
        };
        let schedule_s = started.elapsed().as_secs_f64();
        let result = self.inner.executor.execute(&batch).await;
        let mut state = self.state();
        state.metrics.steps += 1;
        match result {
            Ok(output) => {
                state.last_step_error = None;
                if state.step_records.len() == MAX_STEP_RECORDS {
                    state.step_records.pop_front();
                }
                let timings = crate::step::StepTimings { schedule_s, ..output.timings };
                let record = StepRecord {
                    num_seqs: batch.seqs.len(),
                    num_tokens: batch.num_batched_tokens,
                    num_logits: batch.num_logits(),
                    timings,
                };
                state.step_records.push_back(record);
                self.apply(&mut state, &batch, output.samples);
                Ok(true)
            }
            Err(e) => {
                // The step failed as a whole: its requests end with the error; the engine lives on.
                let message = e.to_string();
                state.last_step_error = Some(message.clone());
                for s in &batch.seqs {
                    let error = WeftError::Gpu { context: "an engine step".into(), reason: message.clone() };
                    self.end(&mut state, s.id, FinishReason::Error, Some(error));
                }
                Err(e)
            }
        }
    }

    fn drop_cancelled(&self, state: &mut State) {
        let gone: Vec<SeqId> = state.live.iter().filter(|(_, l)| l.sender.is_closed()).map(|(id, _)| *id).collect();
        for id in gone {
            self.end(state, id, FinishReason::Cancelled, None);
        }
    }

    /// Each sequence keeps its accepted run of samples: the scheduler appends it (rolling back
    /// rejected drafts), output processing streams it, and requests it ends are retired.
    fn apply(&self, state: &mut State, batch: &StepBatch, samples: Vec<Vec<Sampled>>) {
        let runs: Vec<&[Sampled]> = batch
            .seqs
            .iter()
            .zip(samples.iter().map(Vec::as_slice).chain(std::iter::repeat(&[][..])))
            .map(|(s, rows)| &rows[..accepted_len(s, rows)])
            .collect();
        let accepted: Vec<Vec<u32>> = runs.iter().map(|run| run.iter().map(|x| x.token).collect()).collect();
        state.scheduler.update_from_output(batch, &accepted);
        let now = Instant::now();
        let eos = self.inner.tokenizer.eos_token_ids();
        for (s, run) in batch.seqs.iter().zip(runs) {
            if run.is_empty() {
                continue;
            }
            // A request cancelled (or the engine shut down) while the step ran is gone already.
            let Some(live) = state.live.get_mut(&s.id) else { continue };
            let since = live.last_token_at.unwrap_or(live.submitted_at);
            let first = live.last_token_at.is_none();
            live.last_token_at = Some(now);
            let (chunk, taken, finish) = live.accept(run, eos);
            let _ = live.sender.unbounded_send(Ok(chunk));
            let m = &mut state.metrics;
            m.generation_tokens += taken as u64;
            // Tokens that arrive together share the wait: each counts an equal part of it.
            let latency = (now - since).as_secs_f64();
            if first {
                m.time_to_first_token.observe(latency);
            }
            for _ in usize::from(first)..taken {
                m.inter_token_latency.observe(latency / taken as f64);
            }
            if let Some(reason) = finish {
                self.end(state, s.id, reason, None);
            }
        }
        self.refresh_gauges(state);
    }

    fn refresh_gauges(&self, state: &mut State) {
        let stats = state.scheduler.stats();
        state.metrics.running = stats.running;
        state.metrics.waiting = stats.waiting;
        state.metrics.preemptions = stats.preemptions;
        state.metrics.kv = state.scheduler.kv().usage();
        state.metrics.prefix_cache = state.scheduler.kv().prefix_cache_stats();
    }

    /// Retire a request: free its blocks, record it, and (unless its last chunk was sent) send
    /// a final chunk saying why.
    fn end(&self, state: &mut State, id: SeqId, reason: FinishReason, error: Option<WeftError>) {
        state.scheduler.finish(id);
        let Some(live) = state.live.remove(&id) else { return };
        state.metrics.finished(reason);
        state.metrics.end_to_end_latency.observe((Instant::now() - live.submitted_at).as_secs_f64());
        if matches!(reason, FinishReason::Cancelled | FinishReason::Error) {
            live.send_final(reason, error);
        }
        self.refresh_gauges(state);
    }

    /// Cancel request `id` now: it gets a final `Cancelled` chunk and its blocks are freed.
    /// Returns false when no such request is live (unknown, or already finished).
    pub fn cancel(&self, id: SeqId) -> bool {
        let mut state = self.state();
        if !state.live.contains_key(&id) {
            return false;
        }
        self.end(&mut state, id, FinishReason::Cancelled, None);
        true
    }

    /// Cancel every request (each gets a final `Cancelled` chunk), stop the loop, and refuse
    /// new requests with "the engine is shut down".
    pub fn shutdown(&self) {
        self.inner.shut_down.store(true, Ordering::SeqCst);
        let mut state = self.state();
        let ids: Vec<SeqId> = state.live.keys().copied().collect();
        for id in ids {
            self.end(&mut state, id, FinishReason::Cancelled, None);
        }
        drop(state);
        self.wake();
    }

    /// Counts of the scheduler right now: running, waiting, prefilling, decoding, preemptions.
    pub fn scheduler_stats(&self) -> crate::engine::scheduler::SchedulerStats {
        self.state().scheduler.stats()
    }

    pub fn loop_running(&self) -> bool {
        self.inner.loop_running.load(Ordering::SeqCst)
    }

    pub fn is_shut_down(&self) -> bool {
        self.inner.shut_down.load(Ordering::SeqCst)
    }

    pub fn metrics(&self) -> EngineMetrics {
        self.state().metrics.clone()
    }

    /// (hits, misses, evictions, cached blocks) of the prefix cache.
    pub fn prefix_cache_stats(&self) -> crate::kv::PrefixCacheStats {
        self.state().scheduler.kv().prefix_cache_stats()
    }

    pub fn prefix_cache_hits(&self) -> u64 {
        self.prefix_cache_stats().hits
    }

    /// The error of the last step, if it failed (cleared by the next good step).
    pub fn last_step_error(&self) -> Option<String> {
        self.state().last_step_error.clone()
    }

    /// Blocks in use, cached and free right now.
    pub fn kv_usage(&self) -> crate::kv::KvUsage {
        self.state().scheduler.kv().usage()
    }

    /// State slots in use and free right now; `None` for a model without recurrent layers.
    pub fn state_usage(&self) -> Option<crate::kv::StateUsage> {
        self.state().scheduler.recurrent_state().map(RecurrentStateManager::usage)
    }

    /// The steps run since the last call (at most the latest `MAX_STEP_RECORDS`), oldest first.
    pub fn take_step_records(&self) -> Vec<StepRecord> {
        self.state().step_records.drain(..).collect()
    }

    /// Time every kernel of the coming steps on the GPU (see `ModelExecutor::set_profiling`).
    pub fn set_profiling(&self, on: bool) {
        self.inner.executor.set_profiling(on);
    }

    /// The executor the engine steps (vocabulary size, context, KV shape, health probe).
    pub fn executor(&self) -> &Arc<dyn ModelExecutor> {
        &self.inner.executor
    }
}
