//! The composition root: the one module that knows both the engine and the GPU. `EngineBuilder`
//! opens a model (GGUF file, bytes, or Hugging Face directory), opens or takes a device, sizes
//! the KV pool, uploads the weights and hands the engine its executor, in one line:
//! `EngineBuilder::from_model(path)?.build().await?`.

use std::sync::Arc;

use crate::engine::{ContinuousBatchEngine, EngineConfig};
use crate::error::{Result, WeftError};
use crate::gpu::{GpuContext, GpuOptions, GpuTensorFactory};
use crate::kv::KvCacheConfig;
use crate::model::config::ModelConfig;
use crate::model::load::ModelFiles;
use crate::rt;
use crate::sampling::GpuSampler;

/// The common case in one line: `EngineBuilder::from_model(path)?.build().await?`.
pub struct EngineBuilder {
    files: ModelFiles,
    config: EngineConfig,
    kv_memory_bytes: usize,
    state_memory_bytes: usize,
    block_size: usize,
    gpu: GpuOptions,
    progress: Option<rt::BoxProgress>,
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
            state_memory_bytes: 512 << 20,
            block_size: 16,
            gpu: GpuOptions::default(),
            progress: None,
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

    /// GPU memory for the KV cache (default 256 MiB), clamped to what the model's context needs.
    pub fn kv_memory_bytes(mut self, bytes: usize) -> Self {
        self.kv_memory_bytes = bytes;
        self
    }

    /// GPU memory for the recurrent-state slots of a state-space or hybrid model (default 512
    /// MiB): half for running sequences (at most `max_num_seqs`), half for the prefix cache's
    /// state snapshots. A Mamba2-370M sequence's state takes about 52 MiB, a small model's a
    /// few hundred KiB.
    pub fn state_memory_bytes(mut self, bytes: usize) -> Self {
        self.state_memory_bytes = bytes;
        self
    }

    pub fn gpu_options(mut self, options: GpuOptions) -> Self {
        self.gpu = options;
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
        )?;
        // One layer's K (or V) must fit one binding.
        let per_layer = kv.num_blocks * self.block_size * c.num_kv_heads * c.head_dim * 4;
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
        let exec = self.files.executor_with_state_slots(&factory, kv, num_slots, num_snapshots, &mut *progress)?;
        let sampler = Arc::new(GpuSampler);
        ContinuousBatchEngine::new_plan_runtime(
            self.config,
            self.files.tokenizer.clone(),
            sampler,
            Arc::new(exec),
            Arc::new(factory),
        )
    }
}
