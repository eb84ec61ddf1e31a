//! The Llama family — Llama 2/3, Mistral, Qwen2, SmolLM — as one forward pass recorded on the GPU.
//!
//! Reference: transformers' `models/llama/modeling_llama.py` (`LlamaForCausalLM`), and
//! llama.cpp's `llama` graph for the GGUF layout. Each layer is
//!
//! ```text
//! h = x + o_proj(attention(rope(q_proj(rms_norm(x))), rope(k_proj(…)), v_proj(…)))
//! x = h + down_proj(silu(gate_proj(rms_norm(h))) * up_proj(rms_norm(h)))
//! ```
//!
//! with grouped-query attention over the paged KV cache, then a final RMSNorm and the LM head
//! (the embedding matrix itself when tied) on each sequence's last token only.
//!
//! Weight names are the checkpoint's own (see [`tensor_name`]). llama.cpp's converter permutes
//! the q/k rows of Llama checkpoints so that RoPE pairs dimensions (2i, 2i+1); Hugging Face keeps
//! the "rotate half" order (i, i + head_dim/2). Each checkpoint runs with its own pairing, which
//! gives the same numbers without un-permuting anything.

use std::borrow::Cow;

use crate::error::{Result, WeftError};
use crate::gpu::kernels::elementwise::{add, add_bias, silu_mul};
use crate::gpu::kernels::embedding::embedding;
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::paged::{kv_write, paged_attention};
use crate::gpu::kernels::reduce::rms_norm;
use crate::gpu::kernels::rope::{RopePairing, cos_sin_table, rope};
use crate::gpu::{GpuContext, GpuTensor, Recording, TensorFactory};
use crate::kv::KvPool;
use crate::model::config::LlamaConfig;
use crate::quant::DType;

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

struct Layer {
    attn_norm: GpuTensor,           // (hidden)
    wq: GpuTensor,                  // (num_heads · head_dim, hidden)
    wk: GpuTensor,                  // (num_kv_heads · head_dim, hidden)
    wv: GpuTensor,                  // (num_kv_heads · head_dim, hidden)
    biases: Option<[GpuTensor; 3]>, // q, k, v biases (Qwen2)
    wo: GpuTensor,                  // (hidden, num_heads · head_dim)
    ffn_norm: GpuTensor,            // (hidden)
    w_gate: GpuTensor,              // (intermediate, hidden)
    w_up: GpuTensor,                // (intermediate, hidden)
    w_down: GpuTensor,              // (hidden, intermediate)
}

/// The per-step inputs of a forward pass, already on the GPU.
pub struct StepInputs<'a> {
    pub token_ids: &'a GpuTensor,    // (num_tokens) U32
    pub positions: &'a GpuTensor,    // (num_tokens) U32
    pub token_info: &'a GpuTensor,   // (num_tokens, 2) U32: sequence index, position
    pub slots: &'a GpuTensor,        // (num_tokens) U32: KV slot of each token
    pub block_tables: &'a GpuTensor, // (num_seqs, max_blocks_per_seq) U32
    pub last_rows: &'a GpuTensor,    // (num_seqs) U32: each sequence's last token within the step
}

pub struct LlamaModel {
    pub config: LlamaConfig,
    embed: GpuTensor, // (vocab, hidden)
    layers: Vec<Layer>,
    norm: GpuTensor,            // (hidden)
    lm_head: Option<GpuTensor>, // (vocab, hidden); None when tied to `embed`
    cos_sin: GpuTensor,         // (max_positions, head_dim / 2, 2)
    pairing: RopePairing,
}

/// Positions the RoPE table covers at most (a 32k × 64 × 2 f32 table is 16 MiB).
const MAX_TABLE_POSITIONS: usize = 32768;

impl LlamaModel {
    /// Upload every weight of `config`'s model from `source`.
    pub fn load(config: LlamaConfig, source: &dyn WeightSource, factory: &dyn TensorFactory) -> Result<LlamaModel> {
        Self::load_with_progress(config, source, factory, &mut |_, _| {})
    }

    /// [`load`](Self::load), calling `progress(layers done, layers in all)` as layers arrive.
    pub fn load_with_progress(
        config: LlamaConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<LlamaModel> {
        let c = &config;
        let (q_rows, kv_rows) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let ck = source.checkpoint();
        let load = |layer: Option<usize>, part: Part, shape: &[usize], float_only: bool| -> Result<GpuTensor> {
            let name = tensor_name(ck, layer, part);
            let t = source
                .get(&name)?
                .ok_or_else(|| WeftError::model(source.file(), format!("tensor {name} is missing")))?;
            upload(source.file(), &name, t, shape, float_only, factory)
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            let l = Some(i);
            let biases = if c.attention_bias {
                Some([
                    load(l, Part::QBias, &[q_rows], true)?,
                    load(l, Part::KBias, &[kv_rows], true)?,
                    load(l, Part::VBias, &[kv_rows], true)?,
                ])
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: load(l, Part::AttnNorm, &[c.hidden_size], true)?,
                wq: load(l, Part::Q, &[q_rows, c.hidden_size], false)?,
                wk: load(l, Part::K, &[kv_rows, c.hidden_size], false)?,
                wv: load(l, Part::V, &[kv_rows, c.hidden_size], false)?,
                biases,
                wo: load(l, Part::O, &[c.hidden_size, q_rows], false)?,
                ffn_norm: load(l, Part::FfnNorm, &[c.hidden_size], true)?,
                w_gate: load(l, Part::Gate, &[c.intermediate_size, c.hidden_size], false)?,
                w_up: load(l, Part::Up, &[c.intermediate_size, c.hidden_size], false)?,
                w_down: load(l, Part::Down, &[c.hidden_size, c.intermediate_size], false)?,
            });
            progress(i + 1, c.num_layers);
        }
        let embed = load(None, Part::Q, &[c.vocab_size, c.hidden_size], false)?;
        let norm = load(None, Part::AttnNorm, &[c.hidden_size], true)?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(load(None, Part::O, &[c.vocab_size, c.hidden_size], false)?)
        };
        let positions = c.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let cos_sin =
            factory.upload_f32(&[positions, c.head_dim / 2, 2], &cos_sin_table(&config.inv_freq(), positions))?;
        let pairing = match (ck, config.architecture.as_str()) {
            // llama.cpp permutes q/k only for the llama architecture; Qwen2 GGUFs keep HF's order.
            (Checkpoint::Gguf, "llama" | "mistral") => RopePairing::Interleaved,
            _ => RopePairing::Neox,
        };
        Ok(LlamaModel { config, embed, layers, norm, lm_head, cos_sin, pairing })
    }

    /// The longest position + 1 a sequence may reach.
    pub fn max_context(&self) -> usize {
        self.cos_sin.shape()[0]
    }

    /// Record one forward pass of every token in `inputs` through the whole model; returns the
    /// logits (num_seqs, vocab) of each sequence's last token.
    pub fn record_forward(
        &self,
        ctx: &GpuContext,
        factory: &dyn TensorFactory,
        rec: &mut Recording,
        inputs: &StepInputs<'_>,
        kv: &KvPool,
    ) -> Result<GpuTensor> {
        let c = &self.config;
        let num_tokens = inputs.token_ids.shape()[0];
        let num_seqs = inputs.last_rows.shape()[0];
        let (hidden, heads, kv_heads, hd) = (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim);
        // Activations, reused by every layer (wgpu orders the dispatches that share them).
        let x = factory.zeros(&[num_tokens, hidden], DType::F32)?; // the residual stream
        let xn = factory.zeros(&[num_tokens, hidden], DType::F32)?; // normalised x
        let q = factory.zeros(&[num_tokens, heads * hd], DType::F32)?;
        let k = factory.zeros(&[num_tokens, kv_heads * hd], DType::F32)?;
        let v = factory.zeros(&[num_tokens, kv_heads * hd], DType::F32)?;
        let attn = factory.zeros(&[num_tokens, heads, hd], DType::F32)?;
        let proj = factory.zeros(&[num_tokens, hidden], DType::F32)?; // o_proj / down_proj output
        let gate = factory.zeros(&[num_tokens, c.intermediate_size], DType::F32)?;
        let up = factory.zeros(&[num_tokens, c.intermediate_size], DType::F32)?;
        let act = factory.zeros(&[num_tokens, c.intermediate_size], DType::F32)?;
        let (q3, k3, v3) = (
            q.reshape(&[num_tokens, heads, hd])?,
            k.reshape(&[num_tokens, kv_heads, hd])?,
            v.reshape(&[num_tokens, kv_heads, hd])?,
        );
        let attn2 = attn.reshape(&[num_tokens, heads * hd])?;
        let scale = 1.0 / (hd as f32).sqrt();

        embedding(ctx, rec, &self.embed, inputs.token_ids, &x)?;
        for (i, layer) in self.layers.iter().enumerate() {
            // Attention block.
            rms_norm(ctx, rec, &x, &layer.attn_norm, &xn, c.rms_norm_eps)?;
            matmul(ctx, rec, &xn, &layer.wq, &q)?;
            matmul(ctx, rec, &xn, &layer.wk, &k)?;
            matmul(ctx, rec, &xn, &layer.wv, &v)?;
            if let Some([bq, bk, bv]) = &layer.biases {
                add_bias(ctx, rec, &q, bq)?;
                add_bias(ctx, rec, &k, bk)?;
                add_bias(ctx, rec, &v, bv)?;
            }
            rope(ctx, rec, &q3, inputs.positions, &self.cos_sin, self.pairing)?;
            rope(ctx, rec, &k3, inputs.positions, &self.cos_sin, self.pairing)?;
            let cache = kv.layer(i);
            kv_write(ctx, rec, &k3, &v3, inputs.slots, &cache)?;
            paged_attention(
                ctx,
                rec,
                &q3,
                &cache,
                inputs.block_tables,
                inputs.token_info,
                &attn,
                c.sliding_window,
                scale,
            )?;
            matmul(ctx, rec, &attn2, &layer.wo, &proj)?;
            add(ctx, rec, &x, &proj)?; // residual connection
            // MLP block.
            rms_norm(ctx, rec, &x, &layer.ffn_norm, &xn, c.rms_norm_eps)?;
            matmul(ctx, rec, &xn, &layer.w_gate, &gate)?;
            matmul(ctx, rec, &xn, &layer.w_up, &up)?;
            silu_mul(ctx, rec, &gate, &up, &act)?;
            matmul(ctx, rec, &act, &layer.w_down, &proj)?;
            add(ctx, rec, &x, &proj)?; // residual connection
        }
        rms_norm(ctx, rec, &x, &self.norm, &xn, c.rms_norm_eps)?;
        // Only each sequence's last token needs logits: gather those rows, then the LM head.
        let last = factory.zeros(&[num_seqs, hidden], DType::F32)?;
        embedding(ctx, rec, &xn, inputs.last_rows, &last)?;
        let logits = factory.zeros(&[num_seqs, c.vocab_size], DType::F32)?;
        matmul(ctx, rec, &last, self.lm_head.as_ref().unwrap_or(&self.embed), &logits)?;
        Ok(logits)
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
    if t.dtype.is_quantized() && shape[shape.len() - 1] % crate::quant::QK != 0 {
        return Err(WeftError::model(
            file,
            format!("tensor {name} is {} but its rows of {} are not whole blocks", t.dtype, shape[shape.len() - 1]),
        ));
    }
    factory.upload(shape, t.dtype, &t.bytes)
}
