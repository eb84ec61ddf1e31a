//! The engine's public traits (`InferenceEngine`, `LlmInferenceEngine`), their snapshot types,
//! and the one-line builder from a model path.

use crate::engine::metrics::EngineMetrics;
use crate::engine::request::{InferenceRequest, InferenceResponse, StreamChunk};
use crate::engine::{ContinuousBatchEngine, EngineConfig};
use crate::error::Result;
use crate::kv::{KvUsage, PrefixCacheStats};
use crate::rt::{BoxFuture, BoxStream};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineStatus {
    /// Accepting requests; `background_loop` says whether a loop steps them.
    Running { background_loop: bool },
    /// `shutdown` was called: new requests are refused.
    ShutDown,
}

/// The KV pool and the prefix cache right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheMetrics {
    pub kv: KvUsage,
    pub prefix: PrefixCacheStats,
}

/// What admission control sees: limits and current occupancy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionSnapshot {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    pub waiting: usize,
    pub running: usize,
    pub prefilling: usize,
    pub decoding: usize,
    /// Blocks a new sequence could get now (free plus evictable cached).
    pub available_blocks: usize,
}

/// LoRA adapter counters; no executor serves adapters yet, so engines report `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoraMetrics {
    pub adapters_loaded: usize,
    pub requests_with_adapter: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthReport {
    pub healthy: bool,
    pub detail: String,
}

/// Lifecycle and observability of an engine.
pub trait InferenceEngine: Send + Sync {
    fn status(&self) -> EngineStatus;
    fn shutdown(&self);
    fn config(&self) -> &EngineConfig;
    fn metrics(&self) -> EngineMetrics;
    fn cache_metrics_snapshot(&self) -> CacheMetrics;
    fn admission_snapshot(&self) -> AdmissionSnapshot;
    fn lora_metrics_snapshot(&self) -> Option<LoraMetrics>;
    /// Unhealthy when shut down, when the last engine step failed, or when the device does not
    /// return a small tensor intact.
    fn health_check(&self) -> BoxFuture<'_, HealthReport>;
}

/// Text generation.
pub trait LlmInferenceEngine: InferenceEngine {
    fn infer(&self, request: InferenceRequest) -> BoxFuture<'_, Result<InferenceResponse>>;
    fn infer_stream(&self, request: InferenceRequest) -> Result<BoxStream<'static, Result<StreamChunk>>>;
}

impl InferenceEngine for ContinuousBatchEngine {
    fn status(&self) -> EngineStatus {
        if self.is_shut_down() {
            EngineStatus::ShutDown
        } else {
            EngineStatus::Running { background_loop: self.loop_running() }
        }
    }

    fn shutdown(&self) {
        ContinuousBatchEngine::shutdown(self)
    }

    fn config(&self) -> &EngineConfig {
        ContinuousBatchEngine::config(self)
    }

    fn metrics(&self) -> EngineMetrics {
        ContinuousBatchEngine::metrics(self)
    }

    fn cache_metrics_snapshot(&self) -> CacheMetrics {
        CacheMetrics { kv: self.kv_usage(), prefix: self.prefix_cache_stats() }
    }

    fn admission_snapshot(&self) -> AdmissionSnapshot {
        let c = ContinuousBatchEngine::config(self);
        let s = self.scheduler_stats();
        let kv = self.kv_usage();
        AdmissionSnapshot {
            max_num_seqs: c.max_num_seqs,
            max_num_batched_tokens: c.max_num_batched_tokens,
            max_model_len: c.max_model_len,
            waiting: s.waiting,
            running: s.running,
            prefilling: s.prefilling,
            decoding: s.decoding,
            available_blocks: kv.free_blocks + kv.cached_blocks,
        }
    }

    fn lora_metrics_snapshot(&self) -> Option<LoraMetrics> {
        None
    }

    fn health_check(&self) -> BoxFuture<'_, HealthReport> {
        Box::pin(async move {
            let unhealthy = |detail: String| HealthReport { healthy: false, detail };
            if self.is_shut_down() {
                return unhealthy("the engine is shut down".into());
            }
            if let Some(e) = self.last_step_error() {
                return unhealthy(format!("the last step failed: {e}"));
            }
            if let Err(e) = self.device_round_trip().await {
                return unhealthy(format!("the GPU does not answer: {e}"));
            }
            HealthReport { healthy: true, detail: format!("{} steps run", ContinuousBatchEngine::metrics(self).steps) }
        })
    }
}

impl LlmInferenceEngine for ContinuousBatchEngine {
    fn infer(&self, request: InferenceRequest) -> BoxFuture<'_, Result<InferenceResponse>> {
        Box::pin(ContinuousBatchEngine::infer(self, request))
    }

    fn infer_stream(&self, request: InferenceRequest) -> Result<BoxStream<'static, Result<StreamChunk>>> {
        Ok(Box::pin(ContinuousBatchEngine::infer_stream(self, request)?))
    }
}

/// The common case in one line: `EngineBuilder::from_model(path)?.build().await?`.
pub struct EngineBuilder {
    files: crate::model::load::ModelFiles,
    config: EngineConfig,
    kv_memory_bytes: usize,
    block_size: usize,
    gpu: crate::gpu::GpuOptions,
    progress: Option<crate::rt::BoxProgress>,
}

impl EngineBuilder {
    /// A GGUF file or a Hugging Face directory.
    pub fn from_model(path: impl AsRef<std::path::Path>) -> Result<Self> {
        Ok(Self::from_files(crate::model::load::ModelFiles::open(path.as_ref())?))
    }

    /// A GGUF file's bytes (the browser's way: a download or a picked file); `name` appears in
    /// errors.
    pub fn from_gguf_bytes(name: &str, bytes: Vec<u8>) -> Result<Self> {
        Ok(Self::from_files(crate::model::load::ModelFiles::from_gguf_bytes(name, bytes)?))
    }

    fn from_files(files: crate::model::load::ModelFiles) -> Self {
        EngineBuilder {
            files,
            config: EngineConfig::default(),
            kv_memory_bytes: 256 << 20,
            block_size: 16,
            gpu: crate::gpu::GpuOptions::default(),
            progress: None,
        }
    }

    /// The model's shape (layers, vocabulary, context …).
    pub fn model_config(&self) -> &crate::model::config::LlamaConfig {
        &self.files.config
    }

    /// Call `progress(layers uploaded, layers in all)` while the weights go to the GPU.
    pub fn on_progress(mut self, progress: impl FnMut(usize, usize) + crate::rt::MaybeSend + 'static) -> Self {
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

    pub fn gpu_options(mut self, options: crate::gpu::GpuOptions) -> Self {
        self.gpu = options;
        self
    }

    pub async fn build(self) -> Result<ContinuousBatchEngine> {
        let ctx = crate::gpu::GpuContext::new(self.gpu.clone()).await?;
        self.build_on(ctx)
    }

    /// [`build`](Self::build) on a device the caller opened (and may want to describe); the
    /// builder's GPU options are not used.
    pub fn build_on(self, ctx: std::sync::Arc<crate::gpu::GpuContext>) -> Result<ContinuousBatchEngine> {
        let factory = crate::gpu::GpuTensorFactory::new(ctx);
        let c = &self.files.config;
        let kv = crate::kv::KvCacheConfig::for_memory(
            self.kv_memory_bytes,
            self.block_size,
            c.num_layers,
            c.num_kv_heads,
            c.head_dim,
        )?;
        // One layer's K (or V) must fit one binding.
        let per_layer = kv.num_blocks * self.block_size * c.num_kv_heads * c.head_dim * 4;
        if per_layer as u64 > factory.context().max_binding_bytes() {
            return Err(crate::WeftError::Unsupported(format!(
                "{} bytes of KV memory need {per_layer}-byte layers, more than this device binds at once ({}); use less KV memory",
                self.kv_memory_bytes,
                factory.context().max_binding_bytes()
            )));
        }
        let mut progress = self.progress.unwrap_or_else(|| Box::new(|_, _| {}));
        let exec = self.files.executor_with_progress(&factory, kv, &mut *progress)?;
        let sampler = std::sync::Arc::new(crate::sampling::GpuSampler);
        ContinuousBatchEngine::new_plan_runtime(
            self.config,
            self.files.tokenizer.clone(),
            sampler,
            std::sync::Arc::new(exec),
            std::sync::Arc::new(factory),
        )
    }
}
