//! The engine's public traits (`InferenceEngine`, `LlmInferenceEngine`) and their snapshot
//! types. The one-line builder from a model path is `crate::builder`.

use crate::engine::metrics::EngineMetrics;
use crate::engine::request::{InferenceRequest, InferenceResponse, StreamChunk};
use crate::engine::{ContinuousBatchEngine, EngineConfig};
use crate::error::Result;
use crate::kv::{KvUsage, PrefixCacheStats, StateUsage};
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
    /// Recurrent-state slots; `None` for a model without recurrent layers.
    pub state: Option<StateUsage>,
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
    /// State slots a new sequence could get now; `None` for a model without recurrent layers.
    pub available_state_slots: Option<usize>,
}

/// LoRA adapters and their counters; `None` from an engine whose executor serves none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoraMetrics {
    /// Slots of the adapter pool: distinct adapters running at once at most.
    pub max_loras: usize,
    /// Adapters registered (servable by name).
    pub adapters_registered: usize,
    /// Adapters resident in a slot now.
    pub adapters_loaded: usize,
    /// Names of the adapters of running requests, and of waiting ones (vLLM's
    /// `running_lora_adapters` and `waiting_lora_adapters`).
    pub running: Vec<String>,
    pub waiting: Vec<String>,
    /// Adapters written into a slot, and resident adapters evicted for others, since the start.
    pub loads: u64,
    pub evictions: u64,
    /// Requests submitted for an adapter.
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
        CacheMetrics { kv: self.kv_usage(), prefix: self.prefix_cache_stats(), state: self.state_usage() }
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
            available_state_slots: self.state_usage().map(|u| u.free_slots),
        }
    }

    fn lora_metrics_snapshot(&self) -> Option<LoraMetrics> {
        self.lora_metrics()
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
            if let Err(e) = self.executor().health_check().await {
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
