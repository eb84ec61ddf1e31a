//! The composition root: the one module that knows both the engine and the GPU. `EngineBuilder`
//! opens a model (GGUF file, bytes, or Hugging Face directory), opens or takes a device, sizes
//! the KV pool, uploads the weights and hands the engine its executor, in one line:
//! `EngineBuilder::from_model(path)?.build().await?`. With `speculation` (and `draft_model` for
//! a draft model) it builds the engine with speculative decoding: the draft gets its own KV
//! pool of the target's shape and shares the draft distributions with it.

use std::sync::Arc;

use crate::engine::{ContinuousBatchEngine, Drafter, EngineConfig, SpeculationConfig};
use crate::error::{Result, WeftError};
use crate::gpu::{GpuContext, GpuOptions, GpuTensorFactory};
use crate::kv::{KvCacheConfig, KvCacheManager};
use crate::model::config::ModelConfig;
use crate::model::draft::DraftDistributions;
use crate::model::load::ModelFiles;
use crate::quant::DType;
use crate::rt;
use crate::sampling::GpuSampler;
use crate::step::ModelExecutor;
use crate::tokenizer::Tokenizer;

/// The common case in one line: `EngineBuilder::from_model(path)?.build().await?`.
pub struct EngineBuilder {
    files: ModelFiles,
    config: EngineConfig,
    kv_memory_bytes: usize,
    kv_dtype: DType,
    state_memory_bytes: usize,
    block_size: usize,
    gpu: GpuOptions,
    progress: Option<rt::BoxProgress>,
    speculation: Option<SpeculationConfig>,
    draft: Option<ModelFiles>,
    /// Rows per chunk of recurrent layers' chunked scan; `None` here: the executor's default.
    scan_chunk: Option<Option<usize>>,
}

impl EngineBuilder {
    /// A GGUF file or a Hugging Face directory.
    pub fn from_model(path: impl AsRef<std::path::Path>) -> Result<Self> {
        Ok(Self::from_files(ModelFiles::open(path.as_ref())?))
    }

    /// A GGUF file's bytes (the browser's way: a download or a picked file); `name` appears in
    /// errors.
    pub fn from_gguf_bytes(name: &str, bytes: Vec<u8>) -> Result<Self> {
        Ok(Self::from_files(ModelFiles::from_gguf_bytes(name, bytes)?))
    }

    fn from_files(files: ModelFiles) -> Self {
        EngineBuilder {
            files,
            config: EngineConfig::default(),
            kv_memory_bytes: 256 << 20,
            kv_dtype: DType::F32,
            state_memory_bytes: 512 << 20,
            block_size: 16,
            gpu: GpuOptions::default(),
            progress: None,
            speculation: None,
            draft: None,
            scan_chunk: None,
        }
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

    /// GPU memory for the KV cache (default 256 MiB), in whole blocks of 16 tokens.
    pub fn kv_memory_bytes(mut self, bytes: usize) -> Self {
        self.kv_memory_bytes = bytes;
        self
    }

    /// What the KV cache holds: `DType::F32` (the default: the reference's values exactly) or
    /// `DType::F16` (half the memory per token, so twice the tokens in the same
    /// [`kv_memory_bytes`](Self::kv_memory_bytes); keys and values are rounded to halves as
    /// they are written, which moves logits by about 1e-3 and can flip a near-tie). Other
    /// types fail the build.
    pub fn kv_cache_dtype(mut self, dtype: DType) -> Self {
        self.kv_dtype = dtype;
        self
    }

    /// The KV memory that holds `num_seqs` sequences of `tokens` tokens each at once (whole
    /// blocks per sequence), for [`kv_memory_bytes`](Self::kv_memory_bytes): what a run of
    /// known shape needs and no more. Zero for a model without attention layers.
    pub fn kv_memory_for(&self, num_seqs: usize, tokens: usize) -> usize {
        let c = &self.files.config;
        let block = KvCacheConfig::block_bytes(
            self.block_size,
            c.num_attention_layers(),
            c.num_kv_heads,
            c.head_dim,
            self.kv_dtype,
        );
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

    pub async fn build(self) -> Result<ContinuousBatchEngine> {
        let ctx = GpuContext::new(self.gpu.clone()).await?;
        self.build_on(ctx)
    }

    /// [`build`](Self::build) on a device the caller opened (and may want to describe); the
    /// builder's GPU options are not used.
    pub fn build_on(self, ctx: Arc<GpuContext>) -> Result<ContinuousBatchEngine> {
        let factory = GpuTensorFactory::new(ctx);
        let c = &self.files.config;
        // Only attention layers hold KV (none in a pure state-space model).
        let num_kv_layers = c.num_attention_layers();
        let kv = KvCacheConfig::for_memory(
            self.kv_memory_bytes,
            self.block_size,
            num_kv_layers,
            c.num_kv_heads,
            c.head_dim,
            self.kv_dtype,
        )?;
        // One layer's K (or V) must fit one binding.
        let per_layer = kv.layer_bytes(c.num_kv_heads, c.head_dim);
        if per_layer as u64 > factory.context().max_binding_bytes() {
            return Err(WeftError::Unsupported(format!(
                "{} bytes of KV memory need {per_layer}-byte layers, more than this device binds at once ({}); use less KV memory",
                self.kv_memory_bytes,
                factory.context().max_binding_bytes()
            )));
        }
        let mut progress = self.progress.unwrap_or_else(|| Box::new(|_, _| {}));
        let (num_slots, num_snapshots) = match c.ssm {
            Some(ssm) => {
                let num_recurrent = (0..c.num_layers).filter(|&i| c.is_recurrent(i)).count();
                let slot_bytes = num_recurrent * ssm.layer_state_bytes();
                let num_fitting = self.state_memory_bytes / slot_bytes.max(1);
                if num_fitting == 0 {
                    return Err(WeftError::Unsupported(format!(
                        "{} bytes of state memory hold no recurrent-state slot; one takes {slot_bytes} bytes",
                        self.state_memory_bytes
                    )));
                }
                let num_slots = num_fitting.div_ceil(2).min(self.config.max_num_seqs.max(1));
                (num_slots, (num_fitting - num_slots).min(num_slots))
            }
            None => (0, 0),
        };
        let mut target_layers = 0;
        let mut exec =
            self.files.executor_with_state_slots(&factory, kv, num_slots, num_snapshots, &mut |done, total| {
                target_layers = total;
                progress(done, total)
            })?;
        if let Some(rows) = self.scan_chunk {
            exec = exec.with_scan_chunk(rows)?;
        }
        // Compile now what serving will dispatch, not during the first requests.
        let (max_tokens, max_seqs) = (self.config.max_num_batched_tokens, self.config.max_num_seqs);
        exec.warm_up(max_tokens, max_seqs)?;
        let sampler = Arc::new(GpuSampler);
        let Some(spec) = self.speculation else {
            return ContinuousBatchEngine::new_plan_runtime(
                self.config,
                self.files.tokenizer.clone(),
                sampler,
                Arc::new(exec),
                Arc::new(factory),
            );
        };
        let draft: Option<Arc<dyn ModelExecutor>> = match &self.draft {
            Some(files) if spec.drafter == Drafter::DraftModel => {
                same_vocabulary(self.files.tokenizer.as_ref(), files.tokenizer.as_ref())?;
                let d = &files.config;
                let per_layer = kv.layer_bytes(d.num_kv_heads, d.head_dim);
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
        ContinuousBatchEngine::new_with_speculation(
            self.config,
            self.files.tokenizer.clone(),
            sampler,
            kv_cache,
            Arc::new(exec),
            Arc::new(factory),
            draft,
            Some(spec),
        )
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
