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
//!
//! With speculative decoding (`new_with_speculation`, see `spec`), a step also drafts: before
//! `schedule` the speculator proposes drafts (prompt lookup) or reserves room for them (a draft
//! model, whose passes run after `schedule` and fill the room in); the drafts are verified in
//! the same forward pass as everything else.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures::channel::mpsc;
use web_time::Instant;

use crate::constraint::{ConstraintCompiler, ConstraintState, tools};
use crate::engine::api::LoraMetrics;
use crate::engine::metrics::{EngineMetrics, MAX_STEP_RECORDS, StepRecord};
use crate::engine::output::Live;
use crate::engine::request::{
    DEFAULT_MAX_TOKENS, EmbeddingParams, FinishReason, InferenceRequest, Prompt, StreamChunk, Usage,
};
use crate::engine::scheduler::{ContinuousBatchScheduler, SchedRequest, SchedulerConfig};
use crate::engine::spec::{Drafter, SpeculationConfig, Speculator};
use crate::engine::step_budget::{DEFAULT_STEP_SECONDS, StepBudget};
use crate::engine::stop::StopMatcher;
use crate::engine::stream::Wakeup;
use crate::error::{Result, WeftError};
use crate::kv::{KvCacheManager, RecurrentStateManager, SeqId};
use crate::lora::{LoraAdapter, LoraConfig};
use crate::sampling::{Sampled, Sampler, SamplingParams, TokenMask};
use crate::step::{ModelExecutor, StepBatch, accepted_len};
use crate::tensor::TensorFactory;
use crate::tokenizer::{ChatMessage, DecodeStream, Tokenizer};

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
    /// Seconds of GPU work one step aims at: steps hold fewer tokens than
    /// `max_num_batched_tokens` where the device would take longer (a GPU watchdog resets a
    /// submission past about 2 s; see `engine::step_budget`). `None`: the device decides
    /// (half a second on GPUs, no limit on CPU drivers); `Some(0.0)`: no limit.
    pub max_step_seconds: Option<f64>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 512,
            max_model_len: 4096,
            enable_prefix_cache: true,
            max_step_seconds: None,
        }
    }
}

pub(crate) struct State {
    scheduler: ContinuousBatchScheduler,
    live: HashMap<SeqId, Live>,
    metrics: EngineMetrics,
    last_step_error: Option<String>,
    /// The latest steps, oldest first (at most `MAX_STEP_RECORDS`).
    step_records: VecDeque<StepRecord>,
    /// Speculative decoding, when the engine was built with it.
    speculator: Option<Speculator>,
    /// Tokens a step may hold for its GPU work to stay within the time budget.
    step_budget: StepBudget,
    /// LoRA adapters servable by name (requests name them in `lora`).
    loras: HashMap<String, Arc<LoraAdapter>>,
    requests_with_adapter: u64,
}

pub(crate) struct Inner {
    config: EngineConfig,
    tokenizer: Arc<dyn Tokenizer>,
    sampler: Arc<dyn Sampler>,
    executor: Arc<dyn ModelExecutor>,
    tensor_factory: Arc<dyn TensorFactory>,
    state: Mutex<State>,
    /// Structured output's compiler for this model's vocabulary, built by the first request
    /// that needs it (or why it could not be).
    constraints: OnceLock<std::result::Result<Arc<ConstraintCompiler>, String>>,
    /// The iteration lock: one step at a time.
    step_lock: futures::lock::Mutex<()>,
    next_id: AtomicU64,
    shut_down: AtomicBool,
    pub(crate) loop_running: AtomicBool,
    /// The background loop's thread, which `shutdown` waits for: a process that ends right
    /// after shutting an engine down must not tear the GPU driver down under a step (lavapipe
    /// crashed at exit that way, now and then).
    pub(crate) loop_thread: Mutex<Option<crate::rt::Background>>,
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
        if let Some(s) = config.max_step_seconds.filter(|s| !(s.is_finite() && *s >= 0.0)) {
            return Err(WeftError::Unsupported(format!(
                "max_step_seconds must be a number of seconds (0 for no limit), not {s}"
            )));
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
                    "the recurrent-state manager has {} slots (and {} snapshots) of {} bytes, scanned in chunks of {} \
                     positions, but the executor's pool has {} slots (and {} snapshots) of {}, scanned in chunks of {}; \
                     build the manager from the executor's state_config()",
                    ours.num_slots,
                    ours.num_snapshot_slots,
                    ours.slot_size_bytes,
                    ours.scan_chunk_tokens,
                    pool.num_slots,
                    pool.num_snapshot_slots,
                    pool.slot_size_bytes,
                    pool.scan_chunk_tokens,
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
        // snapshots and for encoders; say so in the config.
        let encoder = model_executor.bidirectional();
        let enable_prefix_cache =
            config.enable_prefix_cache && !encoder && state.as_ref().is_none_or(|s| s.config().num_snapshot_slots > 0);
        if encoder {
            scheduler = scheduler.with_whole_prompts();
        }
        if let Some(state) = state {
            scheduler = scheduler.with_recurrent_state(state);
        }
        if let Some(lora) = model_executor.lora_config() {
            scheduler = scheduler.with_lora_slots(lora.max_loras);
        }
        let config = EngineConfig { max_model_len, enable_prefix_cache, ..config };
        let guess = model_executor.cautious_tokens_per_second();
        let target = config.max_step_seconds.unwrap_or(if guess.is_some() { DEFAULT_STEP_SECONDS } else { 0.0 });
        let step_budget = StepBudget::new(target, guess);
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
                    speculator: None,
                    step_budget,
                    loras: HashMap::new(),
                    requests_with_adapter: 0,
                }),
                constraints: OnceLock::new(),
                step_lock: futures::lock::Mutex::new(()),
                next_id: AtomicU64::new(1),
                shut_down: AtomicBool::new(false),
                loop_running: AtomicBool::new(false),
                loop_thread: Mutex::new(None),
                wakeup: Wakeup::default(),
            }),
        })
    }

    /// [`new`](Self::new) with speculative decoding (see `engine::spec`). With a draft model
    /// (`Drafter::DraftModel`), a draft executor and the config come together, or neither: the
    /// draft must have the target's vocabulary and a KV pool of the target's shape (the same
    /// block tables address both), and sampled requests speculate only when the two share a
    /// draft-distribution store (`ModelExecutor::draft_store`). Prompt lookup
    /// (`Drafter::PromptLookup`) takes the config alone.
    /// A model with recurrent layers refuses speculation (see `RECURRENT_SPECULATION`).
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
        if (draft_executor.is_some() || spec_config.is_some()) && model_executor.state_config().is_some() {
            return Err(WeftError::Unsupported(RECURRENT_SPECULATION.into()));
        }
        let spec = match (draft_executor.is_some(), spec_config) {
            (false, None) => return Self::new(config, tokenizer, sampler, kv_cache, model_executor, tensor_factory),
            (true, None) => {
                return Err(WeftError::Unsupported(
                    "speculation needs both a draft executor and a speculation config, or neither".into(),
                ));
            }
            (_, Some(spec)) => spec,
        };
        spec.validate()?;
        let draft_slots = match (&spec.drafter, &draft_executor) {
            (Drafter::DraftModel, None) => {
                return Err(WeftError::Unsupported(
                    "speculation with a draft model needs both a draft executor and a speculation config, or neither \
                     (prompt lookup, Drafter::PromptLookup, needs no draft)"
                        .into(),
                ));
            }
            (Drafter::PromptLookup { .. }, Some(_)) => {
                return Err(WeftError::Unsupported(
                    "prompt lookup drafts from the sequence itself and takes no draft executor; give none, or use \
                     Drafter::DraftModel"
                        .into(),
                ));
            }
            (Drafter::PromptLookup { .. }, None) => 0,
            (Drafter::DraftModel, Some(draft)) => check_draft(draft.as_ref(), model_executor.as_ref())?,
        };
        let max_catch_up_tokens = config.max_num_batched_tokens;
        let engine = Self::new(config, tokenizer, sampler, kv_cache, model_executor, tensor_factory)?;
        engine.state().speculator = Some(Speculator::new(spec, draft_executor, draft_slots, max_catch_up_tokens));
        Ok(engine)
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

    /// The speculative decoding settings, when the engine speculates.
    pub fn speculation(&self) -> Option<SpeculationConfig> {
        self.state().speculator.as_ref().map(|s| s.config().clone())
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

    fn tokenize(&self, request: &InferenceRequest) -> Result<Vec<u32>> {
        let tok = &self.inner.tokenizer;
        match &request.prompt {
            Prompt::Text(text) => tok.encode(text, true),
            Prompt::Tokens(ids) => {
                let vocab = self.inner.executor.vocab_size();
                match ids.iter().find(|&&t| t as usize >= vocab) {
                    Some(t) => Err(WeftError::invalid(
                        "prompt",
                        format!("token id {t} is outside the vocabulary (ids 0 to {})", vocab - 1),
                    )),
                    None => Ok(ids.clone()),
                }
            }
            Prompt::Chat(messages) => {
                let text = render_chat(tok.as_ref(), messages, &request.tools, &request.chat_template_kwargs, true)?;
                tok.encode(&text, false)
            }
        }
    }

    /// Structured output's compiler for this model, built on first use (walking the vocabulary
    /// once). A model it cannot serve refuses the request's `field`.
    pub fn constraint_compiler(&self, field: &str) -> Result<Arc<ConstraintCompiler>> {
        let built = self.inner.constraints.get_or_init(|| {
            ConstraintCompiler::new(self.inner.tokenizer.clone(), self.inner.executor.vocab_size())
                .map(Arc::new)
                .map_err(|e| e.to_string())
        });
        built.clone().map_err(|e| WeftError::invalid(field, e))
    }

    fn compile_constraint(&self, request: &InferenceRequest) -> Result<Option<ConstraintState>> {
        let Some(c) = &request.params.constraint else { return Ok(None) };
        self.constraint_compiler(&c.field)?.compile(c).map(Some)
    }

    /// The executor's LoRA adapter pool; `None`: adapters are not served.
    pub fn lora_config(&self) -> Option<LoraConfig> {
        self.inner.executor.lora_config()
    }

    /// Serve `adapter` under its name (a request's `lora`). Refused when the executor has no
    /// adapter pool, the name is taken, or the adapter was read for another shape or rank.
    pub fn add_lora(&self, adapter: LoraAdapter) -> Result<()> {
        let Some(pool) = self.lora_config() else {
            return Err(WeftError::Unsupported("this engine was built without a LoRA pool (max_loras 0)".into()));
        };
        if adapter.rank > pool.max_rank || adapter.layers.len() != pool.shape.num_layers {
            return Err(WeftError::Unsupported(format!(
                "LoRA adapter {:?} (rank {}, {} layers) does not fit the pool (rank up to {}, {} layers)",
                adapter.name,
                adapter.rank,
                adapter.layers.len(),
                pool.max_rank,
                pool.shape.num_layers
            )));
        }
        let mut state = self.state();
        if state.loras.contains_key(&adapter.name) {
            return Err(WeftError::invalid(
                "lora_name",
                format!("an adapter named {:?} is already loaded", adapter.name),
            ));
        }
        state.loras.insert(adapter.name.clone(), Arc::new(adapter));
        Ok(())
    }

    /// Read the adapter at `path` (a PEFT directory or a GGUF LoRA file), check it against the
    /// model and serve it as `name`.
    pub fn add_lora_path(&self, name: &str, path: &std::path::Path) -> Result<()> {
        let pool = self
            .lora_config()
            .ok_or_else(|| WeftError::Unsupported("this engine was built without a LoRA pool (max_loras 0)".into()))?;
        self.add_lora(LoraAdapter::open(name, path, &pool.shape, pool.max_rank)?)
    }

    /// Stop serving the adapter `name`; refused while requests for it are queued or running.
    pub fn remove_lora(&self, name: &str) -> Result<()> {
        let mut state = self.state();
        let Some(adapter) = state.loras.get(name).cloned() else {
            return Err(WeftError::invalid("lora_name", format!("no adapter named {name:?} is loaded")));
        };
        let sched = &state.scheduler;
        let in_use = sched.running_adapters().into_iter().chain(sched.waiting_adapters()).any(|a| a.id == adapter.id);
        if in_use {
            return Err(WeftError::Unavailable(format!("adapter {name:?} is in use by queued or running requests")));
        }
        state.loras.remove(name);
        state.scheduler.forget_lora(adapter.id);
        Ok(())
    }

    /// The names of the adapters served, sorted.
    pub fn lora_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.state().loras.keys().cloned().collect();
        names.sort();
        names
    }

    pub(crate) fn lora_metrics(&self) -> Option<LoraMetrics> {
        let max_loras = self.lora_config()?.max_loras;
        let state = self.state();
        let sched = &state.scheduler;
        let names = |adapters: Vec<Arc<LoraAdapter>>| adapters.iter().map(|a| a.name.clone()).collect();
        let slots = sched.lora_slots();
        Some(LoraMetrics {
            max_loras,
            adapters_registered: state.loras.len(),
            adapters_loaded: slots.resident().count(),
            running: names(sched.running_adapters()),
            waiting: names(sched.waiting_adapters()),
            loads: slots.num_loads,
            evictions: slots.num_evictions,
            requests_with_adapter: state.requests_with_adapter,
        })
    }

    /// Queue a request; its chunks arrive on the returned receiver as steps run. This is the
    /// one place requests are validated: a refused request gets [`WeftError::InvalidRequest`]
    /// naming the field, and nothing of it is queued.
    pub fn submit(&self, request: InferenceRequest) -> Result<(SeqId, mpsc::UnboundedReceiver<Result<StreamChunk>>)> {
        if self.is_shut_down() {
            return Err(WeftError::Unavailable("the engine is shut down".into()));
        }
        let admitted = request.validate().and_then(|()| {
            if request.params.embedding.is_none() && self.inner.executor.bidirectional() {
                return Err(WeftError::invalid(
                    "model",
                    "this is an embedding model (an encoder, which generates no text); use /v1/embeddings",
                ));
            }
            let prompt = self.tokenize(&request)?;
            let vocab = self.inner.executor.vocab_size();
            if let Some(t) = request.params.stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(WeftError::invalid(
                    "stop_token_ids",
                    format!("token id {t} is outside the vocabulary (ids 0 to {})", vocab - 1),
                ));
            }
            if let Some(t) = request.params.sampling.logit_bias.first_outside(vocab) {
                return Err(WeftError::invalid(
                    "logit_bias",
                    format!("token id {t} is outside the vocabulary (ids 0 to {})", vocab - 1),
                ));
            }
            if let Some(t) = request.params.constraint_after.filter(|&t| t as usize >= vocab) {
                return Err(WeftError::invalid(
                    "constraint_after",
                    format!("token id {t} is outside the vocabulary (ids 0 to {})", vocab - 1),
                ));
            }
            // Decoding continues the prompt, so a SentencePiece vocabulary keeps the first word's space.
            let decoder = DecodeStream::with_context(self.inner.tokenizer.clone(), true, &prompt)?;
            if let Some(embedding) = &request.params.embedding {
                self.check_embedding(embedding)?;
            }
            // Compiled here, once: a constraint that cannot be compiled never reaches a step.
            let constraint = self.compile_constraint(&request)?;
            Ok((prompt, decoder, constraint))
        });
        let mut state = self.state();
        let (prompt, decoder, constraint) = match admitted {
            Ok(x) => x,
            Err(e) => {
                state.metrics.requests_rejected += 1;
                return Err(e);
            }
        };
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let room = self.inner.config.max_model_len.saturating_sub(prompt.len()).clamp(1, DEFAULT_MAX_TOKENS);
        // An embedding runs its prompt and samples one row it never keeps: the scheduler's
        // prefill with a single token to generate.
        let max_tokens = if request.params.embedding.is_some() { 1 } else { request.params.max_tokens.unwrap_or(room) };
        let lora = match &request.lora {
            Some(name) => match state.loras.get(name) {
                Some(adapter) => Some(adapter.clone()),
                None => {
                    state.metrics.requests_rejected += 1;
                    return Err(WeftError::invalid("model", format!("the model {name:?} does not exist")));
                }
            },
            None => None,
        };
        state.requests_with_adapter += u64::from(lora.is_some());
        let sched = SchedRequest { id, prompt: prompt.clone(), max_tokens, priority: request.params.priority, lora };
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
            constraint_after: request.params.constraint_after.filter(|_| constraint.is_some()),
            constraint: constraint.map(|c| Arc::new(Mutex::new(c))),
            request,
        };
        state.live.insert(id, live);
        drop(state);
        self.wake();
        Ok((id, receiver))
    }

    /// Refuse an embedding request this model cannot serve, naming the field.
    fn check_embedding(&self, embedding: &EmbeddingParams) -> Result<()> {
        let Some(size) = self.inner.executor.embedding_size() else {
            return Err(WeftError::invalid(
                "model",
                "this model serves no embeddings: its file names no pooling (GGUF `pooling_type`); an embedding \
                 model such as Qwen3-Embedding pools its last token, which `--pooling last` (EngineBuilder::pooling) \
                 turns on",
            ));
        };
        match embedding.dimensions {
            Some(d) if d == 0 || d > size => Err(WeftError::invalid(
                "dimensions",
                format!("{d}; this model's embeddings have {size} dimensions, so 1 to {size} may be kept"),
            )),
            _ => Ok(()),
        }
    }

    /// Run one step for every pending request. Returns false when there was nothing to do.
    pub async fn step(&self) -> Result<bool> {
        let _turn = self.inner.step_lock.lock().await;
        let started = Instant::now();
        let (mut batch, draft_job) = {
            let mut state = self.state();
            self.drop_cancelled(&mut state);
            let State { scheduler, live, metrics, speculator, step_budget, .. } = &mut *state;
            if let Some(speculator) = speculator.as_mut() {
                speculator.propose(scheduler, live);
            }
            scheduler.set_step_token_cap(step_budget.tokens());
            let mut batch = scheduler.schedule();
            if batch.seqs.is_empty() {
                return Ok(false);
            }
            let now = Instant::now();
            for s in &batch.seqs {
                let Some(live) = live.get_mut(&s.id) else { continue };
                if live.scheduled_at.is_none() {
                    // First time on the GPU: tokens before start_pos came from the prefix cache.
                    live.scheduled_at = Some(now);
                    live.usage.cached_prompt_tokens = s.start_pos;
                    metrics.queue_time.observe((now - live.submitted_at).as_secs_f64());
                }
            }
            let job = speculator.as_mut().and_then(|sp| sp.draft_job(&mut batch, scheduler, live));
            (batch, job)
        };
        if let Some(job) = draft_job {
            // The draft model's passes run without the state lock, like the target's.
            let drafted = job.run(self.inner.sampler.as_ref()).await;
            if let Some(speculator) = self.state().speculator.as_mut() {
                speculator.fill(&mut batch, &job, drafted);
            }
        }
        let mask_jobs = self.prepare_sampling(&mut batch);
        // Scheduling, drafting and the sampled rows' draws.
        let schedule_s = started.elapsed().as_secs_f64();
        // The masks are computed beside the executor, which waits for them only once it has
        // recorded the forward pass and gets to the sampler.
        let masks =
            (!mask_jobs.is_empty()).then(|| crate::rt::run_beside("weft-masks", move || compute_masks(mask_jobs)));
        let result = self.inner.executor.execute(&batch).await;
        let mask_result = masks.map(|m| m.join().unwrap_or_else(MaskReport::panicked));
        let mut state = self.state();
        state.metrics.steps += 1;
        if let Some(report) = mask_result {
            state.metrics.token_mask_time.observe(report.seconds);
            for (id, error) in report.failed {
                // The row was sampled under a placeholder mask; its token is not kept.
                self.end(&mut state, id, FinishReason::Error, Some(error));
            }
        }
        match result {
            Ok(output) => {
                state.last_step_error = None;
                if state.step_records.len() == MAX_STEP_RECORDS {
                    state.step_records.pop_front();
                }
                let applying = Instant::now();
                self.apply(&mut state, &batch, output.samples, &output.hidden);
                let output_s = applying.elapsed().as_secs_f64();
                let timings = crate::step::StepTimings { schedule_s, output_s, ..output.timings };
                // The GPU's own time where the adapter has timestamps, else the wait for it.
                state.step_budget.observe(batch.num_batched_tokens, timings.gpu_s.unwrap_or(timings.wait_s));
                let record = StepRecord {
                    num_seqs: batch.seqs.len(),
                    num_tokens: batch.num_batched_tokens,
                    num_logits: batch.num_logits(),
                    timings,
                };
                state.step_records.push_back(record);
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

    /// Add each sampled row's draw (and, for a draft model's sampled requests, the
    /// rejection-sampling rule's part) to the step. Constrained sequences get masks still
    /// empty, to be filled by the returned jobs.
    fn prepare_sampling(&self, batch: &mut StepBatch) -> Vec<MaskJob> {
        let state = self.state();
        let mut mask_jobs = Vec::new();
        for s in batch.seqs.iter_mut().filter(|s| s.num_logits > 0) {
            let Some(live) = state.live.get(&s.id) else {
                // Cancelled since it was scheduled: its rows still run, and are dropped.
                s.sampling = Some(self.inner.sampler.prepare(&SamplingParams::greedy(), 0, &[], &[], s.drafted()));
                continue;
            };
            let tokens = state.scheduler.tokens(s.id).unwrap_or(&[]);
            let (prompt, output) = tokens.split_at(live.usage.prompt_tokens.min(tokens.len()));
            let params = &live.request.params.sampling;
            let mut spec = self.inner.sampler.prepare(params, live.seed, prompt, output, s.drafted());
            if let Some(speculator) = &state.speculator {
                speculator.verify_rows(s, &mut spec, live.seed, output.len());
            }
            if let Some(constraint) = &live.constraint {
                // Rows before a thinking model's end-of-reasoning token are free; the constraint
                // starts at the row after it, which may be a drafted one.
                let first = match live.constraint_after {
                    None => Some(0),
                    Some(end) => s.drafted().iter().position(|&t| t == end).map(|i| i + 1),
                };
                if let Some(first) = first.filter(|&f| f < spec.rows.len()) {
                    let masks: Vec<TokenMask> = spec.rows[first..].iter().map(|_| TokenMask::pending()).collect();
                    for (row, mask) in spec.rows[first..].iter_mut().zip(&masks) {
                        row.allowed = Some(mask.clone());
                    }
                    let drafted = s.drafted()[first..].to_vec();
                    mask_jobs.push(MaskJob { id: s.id, constraint: constraint.clone(), drafted, masks });
                }
            }
            s.sampling = Some(spec);
            // The prompt's last chunk: its logit row is the last token.
            s.embed = live.request.params.embedding.is_some();
        }
        mask_jobs
    }

    fn drop_cancelled(&self, state: &mut State) {
        let gone: Vec<SeqId> = state.live.iter().filter(|(_, l)| l.sender.is_closed()).map(|(id, _)| *id).collect();
        for id in gone {
            self.end(state, id, FinishReason::Cancelled, None);
        }
    }

    /// Each sequence keeps its accepted run of samples: the scheduler appends it (rolling back
    /// rejected drafts), output processing streams it, and requests it ends are retired.
    fn apply(&self, state: &mut State, batch: &StepBatch, samples: Vec<Vec<Sampled>>, hidden: &[Vec<f32>]) {
        let runs: Vec<&[Sampled]> = batch
            .seqs
            .iter()
            .zip(samples.iter().map(Vec::as_slice).chain(std::iter::repeat(&[][..])))
            .map(|(s, rows)| &rows[..accepted_len(s, rows)])
            .collect();
        let accepted: Vec<Vec<u32>> = runs.iter().map(|run| run.iter().map(|x| x.token).collect()).collect();
        state.scheduler.update_from_output(batch, &accepted);
        if let Some(speculator) = state.speculator.as_mut() {
            speculator.observe(batch, &runs, &mut state.metrics);
        }
        let now = Instant::now();
        let eos = self.inner.tokenizer.eos_token_ids();
        for (i, (s, run)) in batch.seqs.iter().zip(runs).enumerate() {
            if run.is_empty() {
                continue;
            }
            // A request cancelled (or the engine shut down) while the step ran is gone already.
            let Some(live) = state.live.get_mut(&s.id) else { continue };
            if s.embed {
                // The sampled token is not kept: the embedding is the whole answer.
                live.send_embedding(hidden.get(i).map_or(&[][..], Vec::as_slice));
                self.end(state, s.id, FinishReason::Stop, None);
                continue;
            }
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
        if let Some(speculator) = state.speculator.as_mut() {
            speculator.forget(id);
        }
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
        // Natively, wait for the background loop to finish its step and let go of the engine.
        let thread = self.inner.loop_thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            thread.join();
        }
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

/// Whether `draft` can draft for `target`, and how many drafted rows of sampled requests a step
/// may hold in the draft distributions they share (0 when they share none).
fn check_draft(draft: &dyn ModelExecutor, target: &dyn ModelExecutor) -> Result<usize> {
    if draft.vocab_size() != target.vocab_size() {
        return Err(WeftError::Unsupported(format!(
            "the draft model's vocabulary has {} tokens but the target's has {}; a draft model must share the target's \
             tokenizer",
            draft.vocab_size(),
            target.vocab_size()
        )));
    }
    let (d, t) = (draft.kv_config(), target.kv_config());
    if d != t {
        return Err(WeftError::Unsupported(format!(
            "the draft executor's KV pool has {} blocks of {} tokens but the target's has {} blocks of {}; the same block \
             tables address both, so build the draft with the target's KV shape",
            d.num_blocks, d.block_size, t.num_blocks, t.block_size
        )));
    }
    match (draft.draft_store(), target.draft_store()) {
        (Some(a), Some(b)) if a == b => Ok(a.slots),
        _ => {
            tracing::info!(
                "the draft and the target share no draft distributions: sampled requests are not speculated"
            );
            Ok(0)
        }
    }
}

/// One constrained sequence's share of a step's mask computation.
struct MaskJob {
    id: SeqId,
    constraint: Arc<Mutex<ConstraintState>>,
    drafted: Vec<u32>,
    /// One per sampled row, handed to the executor still empty.
    masks: Vec<TokenMask>,
}

/// What a step's mask computation did: its time, and the sequences whose masks failed.
struct MaskReport {
    seconds: f64,
    failed: Vec<(SeqId, WeftError)>,
}

impl MaskReport {
    /// The computation panicked: every mask was filled by its guard, and which sequence was
    /// at fault is unknown, so none is failed here (a bad state fails again, cleanly, when it
    /// takes its next token).
    fn panicked() -> Self {
        MaskReport { seconds: 0.0, failed: Vec::new() }
    }
}

/// Fills every mask still empty when dropped (an error or a panic on the way), so the executor
/// waiting for them is never left waiting. An empty mask allows nothing; such rows' tokens are
/// never kept.
struct FillOnDrop(Vec<TokenMask>);

impl Drop for FillOnDrop {
    fn drop(&mut self) {
        for mask in &self.0 {
            mask.set(Vec::new());
        }
    }
}

fn compute_masks(jobs: Vec<MaskJob>) -> MaskReport {
    let started = Instant::now();
    let _guard = FillOnDrop(jobs.iter().flat_map(|j| j.masks.iter().cloned()).collect());
    let mut failed = Vec::new();
    for job in jobs {
        let computed = job.constraint.lock().unwrap_or_else(|p| p.into_inner()).masks(&job.drafted);
        match computed {
            Ok(words) => {
                for (mask, words) in job.masks.iter().zip(words) {
                    mask.set(words);
                }
            }
            Err(e) => failed.push((job.id, e)),
        }
    }
    MaskReport { seconds: started.elapsed().as_secs_f64(), failed }
}

/// The text a chat prompt becomes: `messages` through the model's chat template, with the tool
/// definitions (a template that cannot show tools gets them in a system message instead) and
/// the request's extra template variables (`chat_template_kwargs`);
/// `add_generation_prompt` ends it with the header of the assistant's turn. The engine encodes
/// this text without adding special tokens (the template writes its own).
pub fn render_chat(
    tok: &dyn Tokenizer,
    messages: &[ChatMessage],
    tool_defs: &[serde_json::Value],
    kwargs: &serde_json::Map<String, serde_json::Value>,
    add_generation_prompt: bool,
) -> Result<String> {
    let template = tok
        .chat_template()
        .ok_or_else(|| WeftError::invalid("messages", "this model has no chat template; send a text prompt"))?;
    let shows_tools = tools::template_shows_tools(template.source());
    let messages = tools::messages_for_template(template.source(), messages, tool_defs);
    let tool_defs = if shows_tools { tool_defs } else { &[] };
    template.render_with_kwargs(&messages, tool_defs, add_generation_prompt, kwargs)
}
