//! The composition root: the one module that knows both the engine and the GPU. `EngineBuilder`
//! opens a model (GGUF file, bytes, or Hugging Face directory), opens or takes a device, sizes
//! the KV pool, uploads the weights and hands the engine its executor, in one line:
//! `EngineBuilder::from_model(path)?.build().await?`. With `speculation` (and `draft_model` for
//! a draft model) it builds the engine with speculative decoding: the draft gets its own KV
//! pool of the target's shape and shares the draft distributions with it.

use std::sync::Arc;

use crate::engine::{ContinuousBatchEngine, Drafter, EngineConfig, SpeculationConfig};
use crate::error::{Result, WeftError};
use crate::gpu::{
    CPU_DRIVER_KV_BYTES, DEFAULT_GPU_MEMORY_UTILIZATION, GpuContext, GpuOptions, GpuTensorFactory, KvBudget, KvDemand,
    KvLimit, gib,
};
use crate::kv::{KvCacheConfig, KvCacheManager};
use crate::model::config::{ModelConfig, Pooling};
use crate::model::draft::DraftDistributions;
use crate::model::executor::GpuExecutor;
use crate::model::load::ModelFiles;
use crate::model::lora_pool::LoraPool;
use crate::quant::DType;
use crate::rt;
use crate::sampling::GpuSampler;
use crate::step::ModelExecutor;
use crate::tokenizer::Tokenizer;

/// The common case in one line: `EngineBuilder::from_model(path)?.build().await?`.
pub struct EngineBuilder {
    files: ModelFiles,
    config: EngineConfig,
    /// `None`: sized to the device ([`gpu_memory_utilization`](Self::gpu_memory_utilization)).
    kv_memory_bytes: Option<usize>,
    /// `None`: f16 where the device has shader-f16, else f32.
    kv_dtype: Option<DType>,
    gpu_memory_utilization: f64,
    state_memory_bytes: usize,
    block_size: usize,
    gpu: GpuOptions,
    progress: Option<rt::BoxProgress>,
    speculation: Option<SpeculationConfig>,
    draft: Option<ModelFiles>,
    /// Rows per chunk of recurrent layers' chunked scan; `None` here: the executor's default.
    scan_chunk: Option<Option<usize>>,
    /// The LoRA pool's (slots, rank); `None`: no adapters.
    lora: Option<(usize, usize)>,
    /// PEFT adapter directories to serve, by name.
    lora_modules: Vec<(String, std::path::PathBuf)>,
}

/// vLLM's defaults: one adapter slot of rank up to 16.
pub const DEFAULT_MAX_LORAS: usize = 1;
pub const DEFAULT_MAX_LORA_RANK: usize = 16;

impl EngineBuilder {
    /// A GGUF file or a Hugging Face directory.
    pub fn from_model(path: impl AsRef<std::path::Path>) -> Result<Self> {
        Ok(Self::from_files(ModelFiles::open(path.as_ref())?))
    }

    /// A GGUF file's bytes; `name` appears in errors.
    pub fn from_gguf_bytes(name: &str, bytes: Vec<u8>) -> Result<Self> {
        Ok(Self::from_files(ModelFiles::from_gguf_bytes(name, bytes)?))
    }

    /// A GGUF file read in slices through `reader`, one tensor at a time as it is uploaded (the
    /// browser's way: a stored or downloaded model is never whole in WebAssembly memory);
    /// `name` appears in errors.
    pub fn from_gguf_reader(name: &str, reader: Box<dyn crate::model::gguf::ReadAt>) -> Result<Self> {
        Ok(Self::from_files(ModelFiles::from_gguf_reader(name, reader)?))
    }

    fn from_files(files: ModelFiles) -> Self {
        EngineBuilder {
            files,
            config: EngineConfig::default(),
            kv_memory_bytes: None,
            kv_dtype: None,
            gpu_memory_utilization: DEFAULT_GPU_MEMORY_UTILIZATION,
            state_memory_bytes: 512 << 20,
            block_size: 16,
            gpu: GpuOptions::default(),
            progress: None,
            speculation: None,
            draft: None,
            scan_chunk: None,
            lora: None,
            lora_modules: Vec::new(),
        }
    }

    /// Serve LoRA adapters from a pool of `max_loras` slots (distinct adapters in one step at
    /// most) of rank up to `max_lora_rank`, made with the engine.
    pub fn lora(mut self, max_loras: usize, max_lora_rank: usize) -> Self {
        self.lora = Some((max_loras, max_lora_rank));
        self
    }

    /// Serve the PEFT adapter in `dir` as `name` (a request's `lora`, the server's `model`);
    /// without [`lora`](Self::lora), the pool gets vLLM's defaults.
    pub fn lora_module(mut self, name: &str, dir: impl Into<std::path::PathBuf>) -> Self {
        self.lora_modules.push((name.to_string(), dir.into()));
        self
    }

    /// The model's shape (layers, vocabulary, context …).
    pub fn model_config(&self) -> &ModelConfig {
        &self.files.config
    }

    /// Call `progress(layers uploaded, layers in all)` while the weights go to the GPU.
    pub fn on_progress(mut self, progress: impl FnMut(usize, usize) + rt::MaybeSend + 'static) -> Self {
        self.progress = Some(Box::new(progress));
        self
    }

    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self
    }

    /// GPU memory for the KV cache, in whole blocks of 16 tokens, instead of the share of the
    /// device [`gpu_memory_utilization`](Self::gpu_memory_utilization) leaves it.
    pub fn kv_memory_bytes(mut self, bytes: usize) -> Self {
        self.kv_memory_bytes = Some(bytes);
        self
    }

    /// The fraction of the device's memory the engine plans to use in all (vLLM's
    /// `gpu_memory_utilization`, default 0.9): the KV pool gets it less the weights and a
    /// step's workspace (see [`KvPlan`] and `gpu::memory` for the rule, with its caps on CPU
    /// adapters and where the adapter reports no memory size). A fraction outside (0, 1] fails
    /// the build. [`kv_memory_bytes`](Self::kv_memory_bytes) wins over it.
    pub fn gpu_memory_utilization(mut self, fraction: f64) -> Self {
        self.gpu_memory_utilization = fraction;
        self
    }

    /// What the KV cache holds: `DType::F16` (the default where the device has shader-f16:
    /// half the memory per token, so twice the tokens; keys and values are rounded to halves
    /// as they are written, which moves logits by about 1e-3 and can flip a near-tie) or
    /// `DType::F32` (the default elsewhere: the reference's values exactly). Other types fail
    /// the build.
    pub fn kv_cache_dtype(mut self, dtype: DType) -> Self {
        self.kv_dtype = Some(dtype);
        self
    }

    /// What the KV cache holds on `ctx`: the dtype set, else f16 where the device has
    /// shader-f16 and f32 elsewhere.
    pub fn kv_dtype_on(&self, ctx: &GpuContext) -> DType {
        self.kv_dtype.unwrap_or(if ctx.features().shader_f16 { DType::F16 } else { DType::F32 })
    }

    /// The KV memory that holds `num_seqs` sequences of `tokens` tokens each at once (whole
    /// blocks per sequence), for [`kv_memory_bytes`](Self::kv_memory_bytes): what a run of
    /// known shape needs and no more, at the dtype set (f32 where none is: the larger). Zero
    /// for a model without attention layers.
    pub fn kv_memory_for(&self, num_seqs: usize, tokens: usize) -> usize {
        let c = &self.files.config;
        let block =
            KvCacheConfig::block_bytes(self.block_size, c.kv_token_values(), self.kv_dtype.unwrap_or(DType::F32));
        num_seqs * tokens.div_ceil(self.block_size) * block
    }

    /// GPU memory for the recurrent-state slots of a state-space or hybrid model (default 512
    /// MiB): half for running sequences (at most `max_num_seqs`), half for the prefix cache's
    /// state snapshots. A Mamba2-370M sequence's state takes about 52 MiB, a small model's a
    /// few hundred KiB.
    pub fn state_memory_bytes(mut self, bytes: usize) -> Self {
        self.state_memory_bytes = bytes;
        self
    }

    /// How recurrent layers scan a prefill: whole chunks of `rows` positions in the SSD form
    /// and the rest token by token, or (`None`) token by token only. The default is chunks of
    /// [`SCAN_CHUNK_ROWS`](crate::model::executor::SCAN_CHUNK_ROWS) on GPUs and token by token
    /// on CPU drivers, whichever measured faster there. Models without recurrent layers ignore it.
    pub fn scan_chunk_rows(mut self, rows: Option<usize>) -> Self {
        self.scan_chunk = Some(rows);
        self
    }

    pub fn gpu_options(mut self, options: GpuOptions) -> Self {
        self.gpu = options;
        self
    }

    /// Serve embeddings by `pooling` whatever the model's file says (`--pooling`): any decoder
    /// embeds with its last token's final hidden state, which is what Qwen3-Embedding is
    /// trained for, even when its GGUF names no pooling.
    pub fn pooling(mut self, pooling: Pooling) -> Self {
        self.files.config.pooling = Some(pooling);
        self
    }

    /// Render chat prompts with this Jinja chat template instead of the model's own (or give
    /// one to a model without); an error if it does not parse.
    pub fn chat_template(mut self, source: &str) -> Result<Self> {
        Arc::make_mut(&mut self.files.tokenizer).set_chat_template(source)?;
        Ok(self)
    }

    /// Speculative decoding with these settings. Prompt lookup (`Drafter::PromptLookup`) needs
    /// nothing else; a draft model (`Drafter::DraftModel`) needs [`draft_model`](Self::draft_model).
    pub fn speculation(mut self, config: SpeculationConfig) -> Self {
        self.speculation = Some(config);
        self
    }

    /// Draft with this model (a GGUF file or Hugging Face directory sharing the target's
    /// tokenizer); without [`speculation`](Self::speculation) settings, the defaults.
    pub fn draft_model(self, path: impl AsRef<std::path::Path>) -> Result<Self> {
        Ok(self.draft_files(ModelFiles::open(path.as_ref())?))
    }

    /// [`draft_model`](Self::draft_model) from a GGUF file's bytes.
    pub fn draft_gguf_bytes(self, name: &str, bytes: Vec<u8>) -> Result<Self> {
        Ok(self.draft_files(ModelFiles::from_gguf_bytes(name, bytes)?))
    }

    fn draft_files(mut self, files: ModelFiles) -> Self {
        self.draft = Some(files);
        if self.speculation.is_none() {
            self.speculation = Some(SpeculationConfig::default());
        }
        self
    }

    /// How [`build`](Self::build) would size the KV pool on `ctx`, with the weights' bytes
    /// estimated from the checkpoint's headers (the build counts them as they are uploaded):
    /// what `weft info` prints. Fails as the build would where max_model_len does not fit.
    pub fn plan_kv(&self, ctx: &GpuContext) -> Result<KvPlan> {
        let max_context = self.files.config.max_position_embeddings.min(MAX_CONTEXT_ESTIMATE);
        self.plan_kv_with(ctx, self.files.weight_bytes_estimate(), max_context)
    }

    /// The recurrent-state slots and snapshot slots `state_memory_bytes` holds (none for a
    /// model without recurrent layers).
    fn state_slots(&self) -> Result<(usize, usize)> {
        let c = &self.files.config;
        let Some(layer) = c.layer_state() else { return Ok((0, 0)) };
        let slot_bytes = c.num_recurrent_layers() * layer.bytes();
        let num_fitting = self.state_memory_bytes / slot_bytes.max(1);
        if num_fitting == 0 {
            return Err(WeftError::Unsupported(format!(
                "{} bytes of state memory hold no recurrent-state slot; one takes {slot_bytes} bytes",
                self.state_memory_bytes
            )));
        }
        let num_slots = num_fitting.div_ceil(2).min(self.config.max_num_seqs.max(1));
        Ok((num_slots, (num_fitting - num_slots).min(num_slots)))
    }

    /// The KV pool on `ctx` beside `weights_bytes` of weights, for a model whose context is
    /// `max_context` tokens; refused where one sequence of max_model_len does not fit.
    fn plan_kv_with(&self, ctx: &GpuContext, weights_bytes: u64, max_context: usize) -> Result<KvPlan> {
        let c = &self.files.config;
        let u = self.gpu_memory_utilization;
        if !(u > 0.0 && u <= 1.0) {
            return Err(WeftError::Unsupported(format!(
                "gpu_memory_utilization {u} is not a fraction of the device's memory; use a number above 0 and at most 1"
            )));
        }
        let dtype = self.kv_dtype_on(ctx);
        if dtype != DType::F32 && dtype != DType::F16 {
            return Err(WeftError::Unsupported(format!("a KV cache holds f32 or f16 values, not {dtype}")));
        }
        let block_size = self.block_size;
        let max_model_len = self.config.max_model_len.min(max_context);
        // The KV pools: the target's, and a draft model's of the same blocks.
        let draft =
            self.draft.as_ref().filter(|_| self.speculation.as_ref().is_some_and(|s| s.drafter == Drafter::DraftModel));
        let shapes: Vec<&ModelConfig> = std::iter::once(c).chain(draft.map(|d| &d.config)).collect();
        let block_bytes = |m: &ModelConfig| KvCacheConfig::block_bytes(block_size, m.kv_token_values(), dtype) as u64;
        let target_block = block_bytes(c);
        let all_blocks: u64 = shapes.iter().map(|m| block_bytes(m)).sum();
        let (max_tokens, max_seqs) = (self.config.max_num_batched_tokens, self.config.max_num_seqs);
        let split = ctx.kernel_family().splits_attention();
        let workspace: u64 =
            shapes.iter().map(|m| GpuExecutor::workspace_bytes_estimate(m, max_tokens, max_seqs, split)).sum();
        let (num_slots, num_snapshots) = self.state_slots()?;
        let state_bytes = c
            .layer_state()
            .map_or(0, |layer| ((num_slots + num_snapshots) * c.num_recurrent_layers() * layer.bytes()) as u64);
        let draft_weights = draft.map_or(0, |d| d.weight_bytes_estimate());
        let memory_bytes = match self.kv_memory_bytes {
            _ if target_block == 0 => None,
            Some(bytes) => Some(bytes as u64),
            None => {
                // Each model's K (or V) of a layer in one binding.
                let max_blocks = shapes
                    .iter()
                    .filter(|m| m.kv_layer_values_max() > 0)
                    .map(|m| {
                        let layer_block = KvCacheConfig::block_bytes(block_size, m.kv_layer_values_max(), dtype) / 2;
                        ctx.max_binding_bytes() / (layer_block as u64).max(1)
                    })
                    .min()
                    .unwrap_or(u64::MAX);
                let demand = KvDemand {
                    utilization: u,
                    weights_bytes: weights_bytes + draft_weights,
                    other_bytes: workspace + state_bytes,
                    token_bytes: all_blocks.div_ceil(block_size as u64),
                    max_model_len: max_model_len.div_ceil(block_size) * block_size,
                    max_num_seqs: max_seqs,
                    max_pool_bytes: max_blocks.saturating_mul(all_blocks),
                };
                let budget = ctx.plan().kv_budget(&demand);
                // The target's share of the blocks both pools hold.
                let blocks = budget.pool_bytes / all_blocks;
                return self.checked_plan(
                    KvPlan {
                        config: KvCacheConfig { block_size, num_blocks: blocks as usize, dtype },
                        budget: Some(budget),
                        utilization: u,
                        weights_bytes: demand.weights_bytes,
                        other_bytes: demand.other_bytes,
                        token_bytes: demand.token_bytes,
                        max_model_len,
                    },
                    target_block,
                );
            }
        };
        let config = match memory_bytes {
            Some(bytes) => KvCacheConfig::for_memory(bytes as usize, block_size, c.kv_token_values(), dtype)?,
            // No attention layers: blocks only count positions.
            None => KvCacheConfig::for_memory(0, block_size, 0, dtype)?,
        };
        let plan = KvPlan {
            config,
            budget: None,
            utilization: u,
            weights_bytes: weights_bytes + draft_weights,
            other_bytes: workspace + state_bytes,
            token_bytes: all_blocks.div_ceil(block_size as u64),
            max_model_len,
        };
        if target_block == 0 {
            return Ok(plan);
        }
        // One layer's K (or V) must fit one binding.
        let per_layer = config.layer_bytes(c.kv_layer_values_max());
        if per_layer as u64 > ctx.max_binding_bytes() {
            return Err(WeftError::Unsupported(format!(
                "{} bytes of KV memory need {per_layer}-byte layers, more than this device binds at once ({}); use less KV memory",
                memory_bytes.unwrap_or(0),
                ctx.max_binding_bytes()
            )));
        }
        self.checked_plan(plan, target_block)
    }

    /// `plan`, or the reason one sequence of max_model_len does not fit it (vLLM's check at
    /// start), with what to do.
    fn checked_plan(&self, plan: KvPlan, target_block: u64) -> Result<KvPlan> {
        let fit = plan.num_tokens();
        if fit >= plan.max_model_len {
            return Ok(plan);
        }
        let dtype = plan.config.dtype;
        let why = match plan.budget {
            Some(b) if b.pool_bytes == 0 => format!(
                "the weights ({}) and a step's workspace ({}) take all of {} of the device's {}",
                gib(plan.weights_bytes),
                gib(plan.other_bytes),
                plan.utilization,
                b.memory.describe()
            ),
            Some(_) => plan.describe(),
            None => format!(
                "{} KiB of KV memory were asked for (whole blocks), {} bytes a token of {dtype}",
                (plan.config.num_blocks as u64 * target_block) >> 10,
                plan.token_bytes
            ),
        };
        let mut fixes = vec![format!("lower max_model_len (--max-model-len) to {fit} or less")];
        fixes.push(match plan.budget {
            Some(_) => format!("raise gpu_memory_utilization (--gpu-memory-utilization, now {})", plan.utilization),
            None => "give the KV cache more memory (--kv-memory)".into(),
        });
        if dtype == DType::F32 {
            fixes.push("hold the KV cache in f16 (--kv-cache-dtype f16: twice the tokens)".into());
        }
        fixes.push("use a smaller model".into());
        Err(WeftError::Unsupported(format!(
            "max_model_len {} does not fit the KV cache, which holds {fit} tokens: {why}; {}",
            plan.max_model_len,
            fixes.join(", or ")
        )))
    }

    pub async fn build(self) -> Result<ContinuousBatchEngine> {
        let ctx = GpuContext::new(self.gpu.clone()).await?;
        self.build_on(ctx)
    }

    /// [`build`](Self::build) on a device the caller opened (and may want to describe); the
    /// builder's GPU options are not used.
    pub fn build_on(mut self, ctx: Arc<GpuContext>) -> Result<ContinuousBatchEngine> {
        let factory = GpuTensorFactory::new(ctx);
        let c = &self.files.config;
        let mut progress = self.progress.take().unwrap_or_else(|| Box::new(|_, _| {}));
        let (num_slots, num_snapshots) = self.state_slots()?;
        // An explicit pool that cannot hold max_model_len is refused before the upload.
        if self.kv_memory_bytes.is_some() {
            let max_context = c.max_position_embeddings.min(MAX_CONTEXT_ESTIMATE);
            self.plan_kv_with(factory.context(), self.files.weight_bytes_estimate(), max_context)?;
        }
        // The weights first, counted as they are created, then the KV pool in what is left.
        let mut target_layers = 0;
        let before = factory.context().creations().bytes;
        let model = self.files.architecture(&factory, &mut |done, total| {
            target_layers = total;
            progress(done, total)
        })?;
        let lora = self.lora.or((!self.lora_modules.is_empty()).then_some((DEFAULT_MAX_LORAS, DEFAULT_MAX_LORA_RANK)));
        // The adapter pool is made beside the weights: the KV pool gets what is left of both.
        let lora_bytes = match (lora, model.lora_layout()) {
            (Some((slots, rank)), Some(layout)) => LoraPool::bytes(&layout.shape, slots, rank),
            _ => 0,
        };
        let weights_bytes = factory.context().creations().bytes - before + lora_bytes;
        let plan = self.plan_kv_with(factory.context(), weights_bytes, model.max_context())?;
        tracing::info!("{}", plan.describe());
        let kv = plan.config;
        let mut exec = GpuExecutor::with_state_slots(factory.clone(), model, kv, num_slots, num_snapshots)?;
        if let Some(rows) = self.scan_chunk {
            exec = exec.with_scan_chunk(rows)?;
        }
        if let Some((slots, rank)) = lora {
            exec = exec.with_lora(slots, rank)?;
        }
        // Compile now what serving will dispatch, not during the first requests.
        let (max_tokens, max_seqs) = (self.config.max_num_batched_tokens, self.config.max_num_seqs);
        exec.warm_up(max_tokens, max_seqs)?;
        // The pools' and workspace's uploads are done too: free the staging they went through.
        factory.context().finish_uploads()?;
        let sampler = Arc::new(GpuSampler);
        let modules = std::mem::take(&mut self.lora_modules);
        let with_adapters = |engine: ContinuousBatchEngine| -> Result<ContinuousBatchEngine> {
            for (name, dir) in &modules {
                engine.add_lora_path(name, dir)?;
            }
            Ok(engine)
        };
        let Some(spec) = self.speculation else {
            return with_adapters(ContinuousBatchEngine::new_plan_runtime(
                self.config,
                self.files.tokenizer.clone(),
                sampler,
                Arc::new(exec),
                Arc::new(factory),
            )?);
        };
        let draft: Option<Arc<dyn ModelExecutor>> = match &self.draft {
            Some(files) if spec.drafter == Drafter::DraftModel => {
                same_vocabulary(self.files.tokenizer.as_ref(), files.tokenizer.as_ref())?;
                let d = &files.config;
                let per_layer = kv.layer_bytes(d.kv_layer_values_max());
                if per_layer as u64 > factory.context().max_binding_bytes() {
                    return Err(WeftError::Unsupported(format!(
                        "the draft model's KV pool (the target's {} blocks) needs {per_layer}-byte layers, more than this \
                         device binds at once ({}); use less KV memory",
                        kv.num_blocks,
                        factory.context().max_binding_bytes()
                    )));
                }
                // The same block tables address both pools: the draft's has the target's shape.
                let mut draft = files.executor_with_progress(&factory, kv, &mut |done, total| {
                    progress(target_layers + done, target_layers + total)
                })?;
                let slots = spec.max_batch_size.min(self.config.max_num_seqs) * spec.num_speculative_tokens;
                let store = DraftDistributions::new(&factory, slots, exec.vocab_size())?;
                exec.share_draft_distributions(store.clone())?;
                draft.share_draft_distributions(store)?;
                draft.warm_up(max_tokens, max_seqs)?;
                Some(Arc::new(draft) as Arc<dyn ModelExecutor>)
            }
            Some(_) => {
                return Err(WeftError::Unsupported(
                    "a draft model was given but the speculation settings use prompt lookup; give one or the other"
                        .into(),
                ));
            }
            None => None,
        };
        let kv_cache = KvCacheManager::new(kv.num_blocks, kv.block_size, self.config.enable_prefix_cache);
        with_adapters(ContinuousBatchEngine::new_with_speculation(
            self.config,
            self.files.tokenizer.clone(),
            sampler,
            kv_cache,
            Arc::new(exec),
            Arc::new(factory),
            draft,
            Some(spec),
        )?)
    }
}

/// The longest context an architecture's RoPE tables cover (`MAX_TABLE_POSITIONS` in
/// `model::arch`), for planning before the weights are uploaded.
const MAX_CONTEXT_ESTIMATE: usize = 32768;

/// How the builder sized the KV pool: its blocks and dtype, and where they came from (see
/// `gpu::memory` for the rule). Built engines log [`describe`](Self::describe); `weft info`
/// prints it.
#[derive(Clone, Debug)]
pub struct KvPlan {
    pub config: KvCacheConfig,
    /// How the device's share was split; `None` where the KV memory was given.
    pub budget: Option<KvBudget>,
    pub utilization: f64,
    /// The weights on the device (a draft model's included): counted as they were uploaded,
    /// or estimated from the checkpoint by [`EngineBuilder::plan_kv`].
    pub weights_bytes: u64,
    /// A step's workspace (estimated) and recurrent-state slots.
    pub other_bytes: u64,
    /// One token's K and V over every attention layer (of both models with a draft model).
    pub token_bytes: u64,
    /// The engine's max_model_len (the configured one, within the model's context).
    pub max_model_len: usize,
}

impl KvPlan {
    /// Tokens the pool holds.
    pub fn num_tokens(&self) -> usize {
        self.config.num_blocks * self.config.block_size
    }

    /// One line: tokens, dtype, bytes, and the rule's inputs.
    pub fn describe(&self) -> String {
        let pool = self.num_tokens() as u64 * self.token_bytes;
        let head = format!(
            "KV cache: {} tokens of {} ({} at {} KiB a token; max_model_len {})",
            self.num_tokens(),
            self.config.dtype.name().to_ascii_lowercase(),
            gib(pool),
            self.token_bytes >> 10,
            self.max_model_len
        );
        if self.token_bytes == 0 {
            return format!("KV cache: none (no attention layers); max_model_len {}", self.max_model_len);
        }
        let Some(b) = self.budget else { return format!("{head}, the KV memory asked for") };
        let share = format!(
            "{} of the device's {} less {} of weights and {} of workspace",
            self.utilization,
            b.memory.describe(),
            gib(self.weights_bytes),
            gib(self.other_bytes)
        );
        match b.limit {
            KvLimit::Utilization => format!("{head}: {share}"),
            KvLimit::CpuDriver => format!(
                "{head}: a CPU adapter's {} MiB, or one sequence of max_model_len where more (its memory, the \
                 host's, {}, is not shared out)",
                CPU_DRIVER_KV_BYTES >> 20,
                b.memory.describe()
            ),
            KvLimit::Sequences => format!("{head}: max_num_seqs sequences of max_model_len (of {share})"),
            KvLimit::Binding => format!("{head}: each layer's K and V in one binding (of {share})"),
        }
    }
}

/// A draft model must have the target's tokens, id for id: its drafts are the target's ids.
fn same_vocabulary(target: &dyn Tokenizer, draft: &dyn Tokenizer) -> Result<()> {
    let (n, m) = (target.vocab_size(), draft.vocab_size());
    if n != m {
        return Err(WeftError::Unsupported(format!(
            "the draft model's tokenizer has {m} tokens but the target's has {n}; a draft model must share the target's \
             tokenizer"
        )));
    }
    if let Some(id) = (0..n as u32).find(|&id| target.token_to_piece(id) != draft.token_to_piece(id)) {
        return Err(WeftError::Unsupported(format!(
            "the draft model's token {id} is {:?} but the target's is {:?}; a draft model must share the target's \
             tokenizer",
            draft.token_to_piece(id).unwrap_or_default(),
            target.token_to_piece(id).unwrap_or_default()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::{GgufFile, GgufWriter, MetaValue};
    use crate::model::tiny;
    use crate::tokenizer::HfTokenizer;

    /// The tiny tokenizer with `edit` applied to its token list (new tokens are normal ones).
    fn tokenizer(edit: impl Fn(&mut Vec<MetaValue>)) -> HfTokenizer {
        let mut w = GgufWriter::new();
        let mut num_tokens = 0;
        for (key, mut value) in tiny::tokenizer_metadata() {
            if let (true, MetaValue::Array(tokens)) = (key == "tokenizer.ggml.tokens", &mut value) {
                edit(tokens);
                num_tokens = tokens.len();
            }
            if let (true, MetaValue::Array(types)) = (key == "tokenizer.ggml.token_type", &mut value) {
                types.resize(num_tokens, MetaValue::I32(1));
            }
            w.metadata(key, value);
        }
        let file = GgufFile::from_bytes("tokenizer.gguf", w.to_bytes()).unwrap();
        HfTokenizer::from_gguf_metadata_of(&file.metadata, "tokenizer.gguf").unwrap()
    }

    #[test]
    fn a_draft_must_have_the_targets_tokens() {
        let target = tokenizer(|_| {});
        assert!(same_vocabulary(&target, &tokenizer(|_| {})).is_ok());
        let renamed = tokenizer(|t| t[258] = MetaValue::String("<|im_begin|>".into()));
        let err = same_vocabulary(&target, &renamed).unwrap_err().to_string();
        assert!(err.contains("token 258 is \"<|im_begin|>\" but the target's is \"<|im_start|>\""), "{err}");
        let longer = tokenizer(|t| t.push(MetaValue::String("<|extra|>".into())));
        let err = same_vocabulary(&target, &longer).unwrap_err().to_string();
        assert!(err.contains("the draft model's tokenizer has 261 tokens but the target's has 260"), "{err}");
    }
}
