//! Model files and architectures: GGUF and Hugging Face readers, configs, the Llama family.

pub mod gguf;
