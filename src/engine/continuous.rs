//! `ContinuousBatchEngine`: many concurrent requests served by one model in shared steps.
//!
//! Every pending request joins the next step's batch. A step is: the scheduler picks the batch
//! (decodes first, then prefill chunks within the token budget and the free KV blocks); the
//! executor runs it as one GPU submission and returns the sampled tokens; each sequence appends
//! its token, detokenizes, checks its stops and streams a chunk; finished sequences free their
//! blocks. An iteration lock serializes steps; whoever holds it (the background loop, or a
//! caller awaiting its own request when no loop runs) steps for everyone.
//!
//! **Invariant:** a request's tokens depend only on the request (prompt, parameters, seed), not
//! on what shares its batch or whether it was preempted: kernels are batch invariant and each
//! request draws from its own random stream, once per generated token.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use web_time::Instant;

use crate::engine::metrics::EngineMetrics;
use crate::engine::request::{
    FinishReason, InferenceRequest, InferenceResponse, Prompt, StreamChunk, TokenLogprob, Usage,
};
use crate::engine::scheduler::{
    ContinuousBatchScheduler, RunnerOutput, SchedRequest, SchedulerConfig, SchedulerOutput,
};
use crate::engine::stop::StopMatcher;
use crate::error::{Result, WeftError};
use crate::gpu::TensorFactory;
use crate::kv::{KvCacheManager, SeqId};
use crate::model::executor::{ModelExecutor, SeqInput};
use crate::sampling::{Sampled, Sampler, SamplerRng};
use crate::tokenizer::{DecodeStream, Tokenizer};

/// Speculative decoding settings (the draft model proposes, the target verifies).
#[derive(Clone, Debug, PartialEq)]
pub struct SpeculationConfig {
    /// Tokens the draft proposes per step.
    pub num_speculative_tokens: usize,
}

/// Per-sequence recurrent state of state-space and hybrid models (Mamba-style layers), the
/// counterpart of the KV cache. No executor runs such models yet.
pub trait RecurrentStateManager: Send + Sync {
    /// Bytes of state one sequence needs.
    fn state_bytes_per_sequence(&self) -> usize;
}

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

/// A live request's host-side state.
struct Live {
    request: InferenceRequest,
    rng: SamplerRng,
    decoder: DecodeStream,
    stops: StopMatcher,
    sender: mpsc::UnboundedSender<Result<StreamChunk>>,
    usage: Usage,
    submitted_at: Instant,
    scheduled_at: Option<Instant>,
    last_token_at: Option<Instant>,
}

impl Live {
    /// Take one sampled token: decode it, match stops, and say whether the request is done.
    fn accept(&mut self, x: &Sampled, eos: &[u32]) -> (StreamChunk, Option<FinishReason>) {
        let params = &self.request.params;
        self.usage.completion_tokens += 1;
        let logprobs = if params.sampling.top_logprobs > 0 {
            vec![TokenLogprob { token: x.token, logprob: x.logprob, top: x.top_logprobs.clone() }]
        } else {
            Vec::new()
        };
        let mut text = String::new();
        let mut finish = None;
        if !params.ignore_eos && eos.contains(&x.token) {
            finish = Some(FinishReason::Eos);
        } else if params.stop_token_ids.contains(&x.token) {
            finish = Some(FinishReason::Stop);
        } else {
            match self.decoder.step(x.token) {
                Ok(delta) => {
                    let (released, stopped) = self.stops.push(delta.as_deref().unwrap_or(""));
                    text = released;
                    if stopped {
                        finish = Some(FinishReason::Stop);
                    }
                }
                Err(e) => {
                    let _ = self.sender.unbounded_send(Err(e));
                    finish = Some(FinishReason::Error);
                }
            }
            if finish.is_none() && self.usage.completion_tokens >= params.max_tokens {
                finish = Some(FinishReason::Length);
            }
        }
        if matches!(finish, Some(FinishReason::Length | FinishReason::Eos)) {
            // The end of the text: release what the decoder and the stop matcher still hold.
            let rest = self.decoder.finish().ok().flatten().unwrap_or_default();
            let (released, stopped) = self.stops.push(&rest);
            text.push_str(&released);
            if stopped {
                finish = Some(FinishReason::Stop);
            } else {
                text.push_str(&self.stops.finish());
            }
        }
        let usage = finish.map(|_| self.usage);
        (StreamChunk { text, token_ids: vec![x.token], logprobs, finish_reason: finish, usage }, finish)
    }
}

struct State {
    scheduler: ContinuousBatchScheduler,
    live: HashMap<SeqId, Live>,
    metrics: EngineMetrics,
    last_step_error: Option<String>,
}

struct Inner {
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
    loop_running: AtomicBool,
    /// Wakes the background loop when work arrives, a stream is dropped, or on shutdown.
    wakeup: Wakeup,
}

/// An async wake-up signal for the background loop. It is a future rather than a condition
/// variable so the same loop runs on a thread natively and as a task on the browser's event
/// loop, where nothing may block.
#[derive(Default)]
struct Wakeup {
    pending: AtomicBool,
    waker: futures::task::AtomicWaker,
}

impl Wakeup {
    fn wake(&self) {
        self.pending.store(true, Ordering::SeqCst);
        self.waker.wake();
    }

    /// Resolves at the next `wake` (at once if one came since the last wait).
    async fn wait(&self) {
        futures::future::poll_fn(|cx| {
            self.waker.register(cx.waker());
            if self.pending.swap(false, Ordering::SeqCst) { Poll::Ready(()) } else { Poll::Pending }
        })
        .await
    }
}

/// A stream's end of its request. Dropping it closes the channel, which cancels the request at
/// the next step, and wakes the loop so that step comes even when nothing else is running.
struct Subscription {
    engine: ContinuousBatchEngine,
    receiver: mpsc::UnboundedReceiver<Result<StreamChunk>>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.receiver.close();
        self.engine.wake();
    }
}

/// The engine: a cheap handle (`Clone` shares it).
#[derive(Clone)]
pub struct ContinuousBatchEngine {
    inner: Arc<Inner>,
}

impl ContinuousBatchEngine {
    /// An engine over `model_executor` with the KV manager `kv_cache`, which must describe the
    /// executor's block pool. (The seed API's scheduler argument is `config`: its limits are
    /// the scheduler's.) `tensor_factory` serves the health check's device round trip.
    pub fn new(
        config: EngineConfig,
        tokenizer: Arc<dyn Tokenizer>,
        sampler: Arc<dyn Sampler>,
        kv_cache: KvCacheManager,
        model_executor: Arc<dyn ModelExecutor>,
        tensor_factory: Arc<dyn TensorFactory>,
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
        let max_model_len = config.max_model_len.min(model_executor.max_context());
        let scheduler = ContinuousBatchScheduler::new(
            SchedulerConfig {
                max_num_seqs: config.max_num_seqs,
                max_num_batched_tokens: config.max_num_batched_tokens,
                max_model_len,
            },
            kv_cache,
        );
        let config = EngineConfig { max_model_len, ..config };
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
    /// neither. No executor supports speculation yet, so giving them is a clear error.
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
            (Some(_), Some(_)) => {
                Err(WeftError::Unsupported("speculative decoding is not supported by this executor yet".into()))
            }
            _ => Err(WeftError::Unsupported(
                "speculation needs both a draft executor and a speculation config, or neither".into(),
            )),
        }
    }

    /// [`new_with_speculation`](Self::new_with_speculation) plus a recurrent-state manager (for
    /// state-space / hybrid models). No executor runs such models yet: giving one is an error.
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
        recurrent_state_manager: Option<Arc<dyn RecurrentStateManager>>,
    ) -> Result<Self> {
        if recurrent_state_manager.is_some() {
            return Err(WeftError::Unsupported(
                "recurrent state (state-space models) is not supported by this executor yet".into(),
            ));
        }
        Self::new_with_speculation(
            config,
            tokenizer,
            sampler,
            kv_cache,
            model_executor,
            tensor_factory,
            draft_executor,
            spec_config,
        )
    }

    /// An engine whose KV manager is created and owned inside, sized to the executor's block
    /// pool: the common case.
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

    /// Upload and read back a small tensor: proof the device still answers.
    pub async fn device_round_trip(&self) -> Result<()> {
        let probe = [1.0f32, -2.0, 3.5, 0.25];
        let t = self.inner.tensor_factory.upload_f32(&[4], &probe)?;
        let back = self.inner.tensor_factory.download_f32(&t).await?;
        if back != probe {
            return Err(WeftError::Readback(format!("the device returned {back:?} for {probe:?}")));
        }
        Ok(())
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    pub fn tokenizer(&self) -> &Arc<dyn Tokenizer> {
        &self.inner.tokenizer
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
                    Some(t) => Err(WeftError::Unsupported(format!(
                        "invalid prompt: token id {t} is outside the vocabulary of {vocab}"
                    ))),
                    None => Ok(ids.clone()),
                }
            }
            Prompt::Chat(messages) => {
                let template = tok.chat_template().ok_or_else(|| {
                    WeftError::Unsupported(
                        "invalid messages: this model has no chat template; send a text prompt".into(),
                    )
                })?;
                tok.encode(&template.render(messages, true)?, false)
            }
        }
    }

    /// Queue a request; its chunks arrive on the returned receiver as steps run.
    pub fn submit(&self, request: InferenceRequest) -> Result<(SeqId, mpsc::UnboundedReceiver<Result<StreamChunk>>)> {
        let reject = |e: WeftError| {
            self.state().metrics.requests_rejected += 1;
            Err(e)
        };
        if self.inner.shut_down.load(Ordering::SeqCst) {
            return Err(WeftError::Unsupported("the engine is shut down".into()));
        }
        if let Err(e) = request.validate() {
            return reject(e);
        }
        let prompt = match self.tokenize(&request.prompt) {
            Ok(p) => p,
            Err(e) => return reject(e),
        };
        let max_len = self.inner.config.max_model_len;
        if prompt.len() >= max_len {
            return reject(WeftError::Unsupported(format!(
                "invalid prompt: {} tokens, but the context holds {max_len}",
                prompt.len()
            )));
        }
        let max_tokens = request.params.max_tokens;
        if prompt.len() + max_tokens > max_len {
            return reject(WeftError::Unsupported(format!(
                "invalid max_tokens: {max_tokens}; the prompt takes {} of the context's {max_len} tokens, so at most {} can be generated",
                prompt.len(),
                max_len - prompt.len()
            )));
        }
        // Decoding continues the prompt, so a SentencePiece vocabulary keeps the first word's space.
        let decoder = match DecodeStream::with_context(self.inner.tokenizer.clone(), true, &prompt) {
            Ok(d) => d,
            Err(e) => return reject(e),
        };
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let seed = request.params.sampling.seed.unwrap_or_else(|| {
            web_time::SystemTime::now().duration_since(web_time::UNIX_EPOCH).map_or(id, |d| d.as_nanos() as u64 ^ id)
        });
        let (sender, receiver) = mpsc::unbounded();
        {
            let mut state = self.state();
            let sched = SchedRequest { id, prompt: prompt.clone(), max_tokens, priority: request.params.priority };
            if let Err(e) = state.scheduler.add_request(sched) {
                state.metrics.requests_rejected += 1;
                return Err(WeftError::Unsupported(format!("invalid request: {e}")));
            }
            state.metrics.requests_submitted += 1;
            state.metrics.prompt_tokens += prompt.len() as u64;
            let live = Live {
                rng: SamplerRng::new(seed),
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
        }
        self.wake();
        Ok((id, receiver))
    }

    fn wake(&self) {
        self.inner.wakeup.wake();
    }

    /// Run one step for every pending request. Returns false when there was nothing to do.
    pub async fn step(&self) -> Result<bool> {
        let _turn = self.inner.step_lock.lock().await;
        let (out, batch) = {
            let mut state = self.state();
            self.drop_cancelled(&mut state);
            let out = state.scheduler.schedule();
            if out.scheduled.is_empty() {
                return Ok(false);
            }
            let now = Instant::now();
            let mut batch = Vec::with_capacity(out.scheduled.len());
            let State { scheduler, live, metrics, .. } = &mut *state;
            for s in &out.scheduled {
                let live = live.get_mut(&s.id).expect("every scheduled sequence is live");
                if live.scheduled_at.is_none() {
                    // First time on the GPU: tokens before start_pos came from the prefix cache.
                    live.scheduled_at = Some(now);
                    live.usage.cached_prompt_tokens = s.start_pos;
                    metrics.queue_time.observe((now - live.submitted_at).as_secs_f64());
                }
                let sample = s.sample.then(|| {
                    let tokens = scheduler.tokens(s.id).unwrap_or(&[]);
                    let (prompt, output) = tokens.split_at(live.usage.prompt_tokens.min(tokens.len()));
                    self.inner.sampler.prepare(&live.request.params.sampling, &mut live.rng, prompt, output)
                });
                batch.push(SeqInput {
                    tokens: s.tokens.clone(),
                    start_pos: s.start_pos,
                    block_table: s.block_table.clone(),
                    sample,
                });
            }
            (out, batch)
        };
        let result = self.inner.executor.execute(&batch).await;
        let mut state = self.state();
        state.metrics.steps += 1;
        match result {
            Ok(sampled) => {
                state.last_step_error = None;
                self.apply(&mut state, &out, sampled);
                Ok(true)
            }
            Err(e) => {
                // The step failed as a whole: its requests end with the error; the engine lives on.
                let message = e.to_string();
                state.last_step_error = Some(message.clone());
                for s in &out.scheduled {
                    self.end(
                        &mut state,
                        s.id,
                        FinishReason::Error,
                        Some(WeftError::Gpu { context: "an engine step".into(), reason: message.clone() }),
                    );
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

    fn apply(&self, state: &mut State, out: &SchedulerOutput, sampled: Vec<Option<Sampled>>) {
        let runner = RunnerOutput {
            sampled: out
                .scheduled
                .iter()
                .zip(&sampled)
                .filter_map(|(s, x)| x.as_ref().map(|x| (s.id, x.token)))
                .collect(),
        };
        state.scheduler.update_from_output(out, &runner);
        let now = Instant::now();
        let eos = self.inner.tokenizer.eos_token_ids();
        for (s, x) in out.scheduled.iter().zip(sampled) {
            let Some(x) = x else { continue };
            // A request cancelled (or the engine shut down) while the step ran is gone already.
            let Some(live) = state.live.get_mut(&s.id) else { continue };
            let latency = (now - live.last_token_at.unwrap_or(live.submitted_at)).as_secs_f64();
            let first = live.last_token_at.is_none();
            live.last_token_at = Some(now);
            let (chunk, finish) = live.accept(&x, eos);
            let _ = live.sender.unbounded_send(Ok(chunk));
            let m = &mut state.metrics;
            m.generation_tokens += 1;
            if first {
                m.time_to_first_token.observe(latency)
            } else {
                m.inter_token_latency.observe(latency)
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
        if let Some(e) = error {
            let _ = live.sender.unbounded_send(Err(e));
        }
        if matches!(reason, FinishReason::Cancelled | FinishReason::Error) {
            let _ = live.sender.unbounded_send(Ok(StreamChunk {
                text: String::new(),
                token_ids: Vec::new(),
                logprobs: Vec::new(),
                finish_reason: Some(reason),
                usage: Some(live.usage),
            }));
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

    /// Stream a request's chunks. Without a background loop, polling the stream runs steps
    /// (for every request, not only this one). Dropping the stream cancels the request.
    pub fn infer_stream(&self, request: InferenceRequest) -> Result<impl Stream<Item = Result<StreamChunk>> + use<>> {
        Ok(self.infer_stream_with_id(request)?.1)
    }

    /// [`infer_stream`](Self::infer_stream), also giving the request's id (for [`cancel`](Self::cancel)).
    pub fn infer_stream_with_id(
        &self,
        request: InferenceRequest,
    ) -> Result<(SeqId, impl Stream<Item = Result<StreamChunk>> + use<>)> {
        let (id, receiver) = self.submit(request)?;
        let sub = Subscription { engine: self.clone(), receiver };
        let stream = futures::stream::unfold((sub, false), |(mut sub, done)| async move {
            if done {
                return None;
            }
            loop {
                match sub.receiver.try_recv() {
                    Ok(item) => {
                        let last = matches!(&item, Ok(c) if c.finish_reason.is_some());
                        return Some((item, (sub, last)));
                    }
                    Err(mpsc::TryRecvError::Closed) => return None,
                    Err(mpsc::TryRecvError::Empty) if sub.engine.inner.loop_running.load(Ordering::SeqCst) => {
                        let item = sub.receiver.next().await?;
                        let last = matches!(&item, Ok(c) if c.finish_reason.is_some());
                        return Some((item, (sub, last)));
                    }
                    Err(mpsc::TryRecvError::Empty) => {
                        // Step errors reach each affected request through its channel.
                        let _ = sub.engine.step().await;
                    }
                }
            }
        });
        Ok((id, stream))
    }

    /// Run a request to completion.
    pub async fn infer(&self, request: InferenceRequest) -> Result<InferenceResponse> {
        collect_response(&mut Box::pin(self.infer_stream(request)?)).await
    }

    /// Start the background loop: from now on steps run by themselves and `infer` only waits.
    pub fn start_loop(&self) -> Result<()> {
        if self.inner.loop_running.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let engine = self.clone();
        crate::rt::spawn_background("weft-engine", async move {
            while !engine.inner.shut_down.load(Ordering::SeqCst) {
                let worked = engine.step().await.unwrap_or(true);
                if !worked {
                    engine.inner.wakeup.wait().await;
                }
            }
            engine.inner.loop_running.store(false, Ordering::SeqCst);
        })
        .inspect_err(|_| self.inner.loop_running.store(false, Ordering::SeqCst))
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

    /// The executor the engine steps (vocabulary size, context, KV shape).
    pub fn executor(&self) -> &Arc<dyn ModelExecutor> {
        &self.inner.executor
    }
}

/// Gather a request's stream into one response (what [`ContinuousBatchEngine::infer`] returns).
pub async fn collect_response(
    stream: &mut (impl Stream<Item = Result<StreamChunk>> + Unpin),
) -> Result<InferenceResponse> {
    let mut response = InferenceResponse {
        text: String::new(),
        token_ids: Vec::new(),
        logprobs: Vec::new(),
        finish_reason: FinishReason::Cancelled,
        usage: Usage::default(),
    };
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        response.text.push_str(&chunk.text);
        response.token_ids.extend(&chunk.token_ids);
        response.logprobs.extend(chunk.logprobs);
        if let (Some(reason), Some(usage)) = (chunk.finish_reason, chunk.usage) {
            response.finish_reason = reason;
            response.usage = usage;
        }
    }
    Ok(response)
}
