//! weft: a continuous-batching LLM inference runtime whose compute is WGSL run through wgpu.
//!
//! The library compiles natively (Vulkan, Metal, DX12) and to `wasm32-unknown-unknown` (WebGPU):
//! the continuous-batching engine over a step contract (`step`), the models and their GPU
//! executor, the kernels, the OpenAI protocol, and [`EngineBuilder`], which puts them together.
//! See ARCHITECTURE.md for the map.

pub mod builder;
pub mod constraint;
pub mod cpu;
pub mod engine;
pub mod error;
pub mod gpu;
pub mod kv;
pub mod lora;
pub mod model;
/// The OpenAI protocol (requests, responses, streamed chunks) without a transport.
pub mod openai;
pub mod quant;
pub mod rt;
pub mod sampling;
pub mod step;
pub mod tensor;
pub mod tokenizer;

pub use builder::{EngineBuilder, KvPlan};
pub use error::{Result, WeftError};
pub use quant::DType;
