//! The continuous-batching engine: requests, the pure-logic scheduler, stop strings, metrics,
//! and `ContinuousBatchEngine`, which steps the model for every pending request at once.
//!
//! **Invariant:** `scheduler` (like `kv`) imports no wgpu, async runtime or web-sys; only
//! `continuous` (the engine) talks to the executor.

pub mod api;
mod continuous;
pub mod metrics;
pub mod request;
pub mod scheduler;
pub mod stop;

pub use continuous::{ContinuousBatchEngine, EngineConfig, RecurrentStateManager, SpeculationConfig, collect_response};
