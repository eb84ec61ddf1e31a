//! The continuous-batching engine: requests, the pure-logic scheduler, output processing
//! (detokenizing, stops), streams and the engine loop, metrics, speculative decoding, and
//! `ContinuousBatchEngine`, which steps the model for every pending request at once.
//!
//! **Invariant:** nothing here uses the GPU (`crate::gpu`, wgpu): the engine talks to a
//! `step::ModelExecutor` in plain data (a tidy test checks the imports).

pub mod api;
mod continuous;
pub mod metrics;
mod output;
pub mod request;
pub mod scheduler;
pub mod spec;
pub mod step_budget;
pub mod stop;
mod stream;

pub use crate::kv::RecurrentStateManager;
pub use continuous::{ContinuousBatchEngine, EngineConfig, render_chat};
pub use spec::{Drafter, SpeculationConfig, SpeculativeDecodingConfig};
pub use stream::collect_response;
