//! Model architectures, one file each over the shared layers (`model::layers`). An
//! architecture loads its weights and records one forward pass; the executor drives it without
//! knowing which one it is.
//!
//! Adding an architecture: a new file here with a type implementing [`Architecture`], and its
//! names in [`SUPPORTED`] and [`load`].

mod bert;
mod gemma3;
pub(crate) mod gemma3n;
mod gemma4;
mod gpt_oss;
mod granite_hybrid;
mod lfm2;
mod llama;
mod mamba2;
mod olmo2;
mod per_layer;
mod phi3;
mod qwen35;
mod qwen3moe;

pub use bert::BertModel;
pub use gemma3::Gemma3Model;
pub use gemma3n::Gemma3nModel;
pub use gemma4::Gemma4Model;
pub use gpt_oss::GptOssModel;
pub use granite_hybrid::GraniteHybridModel;
pub use lfm2::Lfm2Model;
pub use llama::LlamaModel;
pub use mamba2::Mamba2Model;
pub use olmo2::Olmo2Model;
pub use qwen3moe::Qwen3MoeModel;
pub use qwen35::Qwen35Model;

use crate::error::{Result, WeftError};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::config::ModelConfig;
use crate::model::kv_pool::KvPool;
use crate::model::layers::{Activations, StepInputs};
use crate::model::lora_pool::LoraLayout;
use crate::model::weights::WeightSource;
use crate::tensor::TensorFactory;

/// Architecture names weft runs (GGUF `general.architecture`, Hugging Face `model_type`).
pub const SUPPORTED: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3moe",
    "qwen3_moe",
    "gpt-oss",
    "gpt_oss",
    "smollm3",
    "granite",
    "granitemoe",
    "granitemoeshared",
    "olmo2",
    "gemma3",
    "gemma3n",
    "gemma3n_text",
    "gemma4",
    "gemma4_text",
    "phi3",
    "mamba2",
    "granitehybrid",
    "granitemoehybrid",
    "bert",
    "lfm2",
    "lfm2moe",
    "lfm2_moe",
    "qwen35",
    "qwen3_5",
    "qwen3_5_text",
    "qwen35moe",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
];

/// Whether llama.cpp's converter permutes q and k rows for interleaved RoPE in GGUF files of
/// `architecture` (its Llama-derived converters do; Qwen, Phi-3, Gemma and OLMo 2 keep Hugging
/// Face's order). A base model and a GGUF LoRA adapter of the same architecture agree.
pub fn gguf_qk_interleaved(architecture: &str) -> bool {
    matches!(architecture, "llama" | "mistral" | "granite" | "granitemoe" | "smollm3" | "granitehybrid")
}

/// A model on the GPU, ready to record forward passes.
pub trait Architecture: Send + Sync {
    fn config(&self) -> &ModelConfig;

    /// The longest position + 1 a sequence may reach.
    fn max_context(&self) -> usize;

    /// Record one forward pass of every token in `inputs` through the whole model, using `acts`
    /// (viewed at this step's size) and writing K/V into `kv`; `logits` (num_logits, vocab)
    /// receives the logits of the rows `inputs.logit_rows` names.
    fn record_forward(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        inputs: &StepInputs<'_>,
        acts: &Activations,
        kv: &KvPool,
        logits: &GpuTensor,
    ) -> Result<()>;

    /// Whether attention sees the whole sequence (an encoder, which only embeds): the executor
    /// masks bidirectionally, and the engine runs each prompt whole in one step, uncached.
    fn bidirectional(&self) -> bool {
        false
    }

    /// How this architecture's projections take LoRA deltas (`inputs.lora` in
    /// `record_forward`); `None`: it runs no adapters, and a pool for it is refused.
    fn lora_layout(&self) -> Option<LoraLayout> {
        None
    }
}

/// Upload `config`'s model from `source`, calling `progress(layers done, layers in all)`.
/// After each layer the source drops the host pages it read (`WeightSource::release_pages`),
/// so loading holds about one layer of the file in memory beside what is on the GPU.
pub fn load(
    config: ModelConfig,
    source: &dyn WeightSource,
    factory: &dyn TensorFactory,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn Architecture>> {
    let progress = &mut |done: usize, total: usize| {
        source.release_pages();
        progress(done, total)
    };
    let model = load_layers(config, source, factory, progress);
    source.release_pages();
    model
}

fn load_layers(
    config: ModelConfig,
    source: &dyn WeightSource,
    factory: &dyn TensorFactory,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Box<dyn Architecture>> {
    match config.architecture.as_str() {
        "llama" | "mistral" | "qwen2" | "qwen3" | "smollm3" | "granite" | "granitemoe" | "granitemoeshared" => {
            Ok(Box::new(LlamaModel::load(config, source, factory, progress)?))
        }
        "gemma3" => Ok(Box::new(Gemma3Model::load(config, source, factory, progress)?)),
        "gemma3n" | "gemma3n_text" => Ok(Box::new(Gemma3nModel::load(config, source, factory, progress)?)),
        "gemma4" => Ok(Box::new(Gemma4Model::load(config, source, factory, progress)?)),
        "bert" => Ok(Box::new(BertModel::load(config, source, factory, progress)?)),
        "olmo2" => Ok(Box::new(Olmo2Model::load(config, source, factory, progress)?)),
        "qwen3moe" | "qwen3_moe" => Ok(Box::new(Qwen3MoeModel::load(config, source, factory, progress)?)),
        "gpt-oss" | "gpt_oss" => Ok(Box::new(GptOssModel::load(config, source, factory, progress)?)),
        "phi3" => Ok(Box::new(phi3::load(config, source, factory, progress)?)),
        "mamba2" => Ok(Box::new(Mamba2Model::load(config, source, factory, progress)?)),
        "granitehybrid" | "granitemoehybrid" => {
            Ok(Box::new(GraniteHybridModel::load(config, source, factory, progress)?))
        }
        "lfm2" | "lfm2moe" => Ok(Box::new(Lfm2Model::load(config, source, factory, progress)?)),
        "qwen35" | "qwen3_5" | "qwen3_5_text" | "qwen35moe" | "qwen3_5_moe" | "qwen3_5_moe_text" => {
            Ok(Box::new(Qwen35Model::load(config, source, factory, progress)?))
        }
        other => Err(WeftError::model(source.file(), unsupported(other))),
    }
}

/// The message for an architecture weft does not run.
pub fn unsupported(architecture: &str) -> String {
    format!("architecture {architecture:?} is not supported; weft runs {}", SUPPORTED.join(", "))
}
