//! Where weights come from and what they are called: the [`WeightSource`] seam over a GGUF file
//! or a safetensors directory, the checkpoint's tensor names, and the checked upload every
//! architecture uses.
//!
//! GGUF names (`blk.N.attn_q.weight`) are llama.cpp's and shared by its architectures; Hugging
//! Face names (`model.layers.N.self_attn.q_proj.weight`) are the transformers ones of the Llama
//! family, which Qwen2 and Mistral keep.

use std::borrow::Cow;

use crate::error::{Result, WeftError};
use crate::gpu::GpuTensor;
use crate::quant::DType;
use crate::tensor::TensorFactory;

/// Which naming and RoPE convention a checkpoint follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpoint {
    /// llama.cpp's GGUF conversion.
    Gguf,
    /// A Hugging Face model directory (safetensors).
    HuggingFace,
}

/// The weights of one transformer block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    AttnNorm,
    Q,
    K,
    V,
    QBias,
    KBias,
    VBias,
    O,
    FfnNorm,
    Gate,
    Up,
    Down,
}

/// The checkpoint's name of a tensor: `layer = None` for the embedding (`Part::Q` stands in),
/// the final norm (`AttnNorm`) and the LM head (`O`).
pub fn tensor_name(checkpoint: Checkpoint, layer: Option<usize>, part: Part) -> String {
    use Checkpoint::*;
    use Part::*;
    let Some(i) = layer else {
        return match (checkpoint, part) {
            (Gguf, Q) => "token_embd.weight",
            (Gguf, AttnNorm) => "output_norm.weight",
            (Gguf, _) => "output.weight",
            (HuggingFace, Q) => "model.embed_tokens.weight",
            (HuggingFace, AttnNorm) => "model.norm.weight",
            (HuggingFace, _) => "lm_head.weight",
        }
        .to_string();
    };
    match checkpoint {
        Gguf => {
            let name = match part {
                AttnNorm => "attn_norm.weight",
                Q => "attn_q.weight",
                K => "attn_k.weight",
                V => "attn_v.weight",
                QBias => "attn_q.bias",
                KBias => "attn_k.bias",
                VBias => "attn_v.bias",
                O => "attn_output.weight",
                FfnNorm => "ffn_norm.weight",
                Gate => "ffn_gate.weight",
                Up => "ffn_up.weight",
                Down => "ffn_down.weight",
            };
            format!("blk.{i}.{name}")
        }
        HuggingFace => {
            let name = match part {
                AttnNorm => "input_layernorm.weight",
                Q => "self_attn.q_proj.weight",
                K => "self_attn.k_proj.weight",
                V => "self_attn.v_proj.weight",
                QBias => "self_attn.q_proj.bias",
                KBias => "self_attn.k_proj.bias",
                VBias => "self_attn.v_proj.bias",
                O => "self_attn.o_proj.weight",
                FfnNorm => "post_attention_layernorm.weight",
                Gate => "mlp.gate_proj.weight",
                Up => "mlp.up_proj.weight",
                Down => "mlp.down_proj.weight",
            };
            format!("model.layers.{i}.{name}")
        }
    }
}

/// A tensor as a checkpoint holds it on the host, shape outermost first.
pub struct HostTensor<'a> {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub bytes: Cow<'a, [u8]>,
}

/// Where weights come from: a GGUF file or a safetensors directory.
pub trait WeightSource {
    fn checkpoint(&self) -> Checkpoint;
    /// The file or directory, for error messages.
    fn file(&self) -> &str;
    /// The tensor called `name`, `None` if absent; BF16 arrives widened to F32.
    fn get(&self, name: &str) -> Result<Option<HostTensor<'_>>>;
}

/// Loads a checkpoint's tensors by (layer, part) onto the GPU, checking each one's shape.
pub struct Loader<'a> {
    pub source: &'a dyn WeightSource,
    pub factory: &'a dyn TensorFactory,
}

impl Loader<'_> {
    fn get(&self, layer: Option<usize>, part: Part, shape: &[usize], float_only: bool) -> Result<Option<GpuTensor>> {
        let name = tensor_name(self.source.checkpoint(), layer, part);
        let Some(t) = self.source.get(&name)? else { return Ok(None) };
        upload(self.source.file(), &name, t, shape, float_only, self.factory).map(Some)
    }

    fn required(&self, layer: Option<usize>, part: Part, shape: &[usize], float_only: bool) -> Result<GpuTensor> {
        self.get(layer, part, shape, float_only)?.ok_or_else(|| {
            let name = tensor_name(self.source.checkpoint(), layer, part);
            WeftError::model(self.source.file(), format!("tensor {name} is missing"))
        })
    }

    /// A weight matrix or embedding table, kept in the checkpoint's format.
    pub fn matrix(&self, layer: Option<usize>, part: Part, shape: &[usize]) -> Result<GpuTensor> {
        self.required(layer, part, shape, false)
    }

    /// A norm weight or bias, as F32.
    pub fn vector(&self, layer: Option<usize>, part: Part, len: usize) -> Result<GpuTensor> {
        self.required(layer, part, &[len], true)
    }

    /// A matrix that may be absent (an untied LM head).
    pub fn optional_matrix(&self, layer: Option<usize>, part: Part, shape: &[usize]) -> Result<Option<GpuTensor>> {
        self.get(layer, part, shape, false)
    }
}

/// Check a checkpoint tensor's shape and upload it; norm weights and biases become F32.
fn upload(
    file: &str,
    name: &str,
    t: HostTensor<'_>,
    shape: &[usize],
    float_only: bool,
    factory: &dyn TensorFactory,
) -> Result<GpuTensor> {
    if t.shape != shape {
        return Err(WeftError::model(file, format!("tensor {name} has shape {:?}, expected {shape:?}", t.shape)));
    }
    if float_only && t.dtype != DType::F32 {
        if t.dtype.is_quantized() {
            return Err(WeftError::model(
                file,
                format!("tensor {name} is {}; weft needs norms and biases in F32, F16 or BF16", t.dtype),
            ));
        }
        let values = crate::quant::dequantize(t.dtype, &t.bytes)?;
        return factory.upload_f32(shape, &values);
    }
    if t.dtype.is_quantized() && !shape[shape.len() - 1].is_multiple_of(crate::quant::QK) {
        return Err(WeftError::model(
            file,
            format!("tensor {name} is {} but its rows of {} are not whole blocks", t.dtype, shape[shape.len() - 1]),
        ));
    }
    factory.upload(shape, t.dtype, &t.bytes)
}
