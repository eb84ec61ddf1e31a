//! Models on the GPU: GGUF and Hugging Face readers, configs, the architectures (one file each
//! under `arch/`, over the shared `layers`), the executor that runs a step and owns the KV
//! pool's memory, and the GPU half of sampling.
//!
//! **Invariant:** model code records dispatches; it never touches a `wgpu::Device`.

pub mod arch;
pub mod config;
pub mod draft;
pub mod executor;
pub mod gguf;
pub mod inspect;
pub mod kv_pool;
pub mod layers;
pub mod load;
pub mod lora_pool;
pub mod sampler;
pub mod scan_plan;
pub mod synthetic;
pub mod synthetic_ssm;
pub mod tiny;
pub mod weights;
