//! Model files and architectures: GGUF and Hugging Face readers, configs, the Llama family.

pub mod config;
pub mod executor;
pub mod gguf;
pub mod llama;
pub mod load;
pub mod tiny;
