//! Gemma 3 (text) as one forward pass recorded on the GPU, from llama.cpp's GGUF layout or a
//! Hugging Face directory (`gemma3_text`).
//!
//! Reference: transformers' `models/gemma3/modeling_gemma3.py` (`Gemma3ForCausalLM`) and
//! llama.cpp's `gemma3` graph. Each layer is
//!
//! ```text
//! h = x + post_attn_norm(o_proj(attention(rope(q_norm(q_proj(norm(x)))), rope(k_norm(k_proj(…))), v_proj(…))))
//! x = h + post_ffw_norm(down_proj(gelu_tanh(gate_proj(ffn_norm(h))) * up_proj(ffn_norm(h))))
//! ```
//!
//! after token embeddings scaled by √hidden. Every RMSNorm multiplies by (1 + w); llama.cpp's
//! converter stores 1 + w, so the GGUF weights are used as they are, and 1 is added to a
//! Hugging Face checkpoint's at load. Five layers of six attend
//! within a sliding window with their own RoPE base (10000); every sixth attends globally with
//! `rope_theta` (ModelConfig::is_sliding). Queries are scaled by query_pre_attn_scalar^-1/2.
//! The LM head is the embedding matrix. RoPE pairs (i, i + head_dim/2): llama.cpp does not
//! permute Gemma's q/k rows.

use crate::error::Result;
use crate::gpu::kernels::elementwise::scale;
use crate::gpu::kernels::embedding::embedding;
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::paged::QkvLayout;
use crate::gpu::kernels::reduce::{add_rms_norm, rms_norm};
use crate::gpu::kernels::rope::{RopePairing, cos_sin_table};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::Architecture;
use crate::model::config::ModelConfig;
use crate::model::kv_pool::KvPool;
use crate::model::layers::{Activations, Attention, AttentionSetup, Gate, LayerLora, Mlp, QkNorm, StepInputs};
use crate::model::lora_pool::LoraLayout;
use crate::model::weights::{Checkpoint, Loader, Part, WeightSource, tensor_name};
use crate::tensor::TensorFactory;

struct Layer {
    attn_norm: GpuTensor, // (hidden)
    attention: Attention,
    post_attn_norm: GpuTensor, // (hidden)
    ffn_norm: GpuTensor,       // (hidden)
    mlp: Mlp,
    post_ffn_norm: GpuTensor, // (hidden)
}

pub struct Gemma3Model {
    config: ModelConfig,
    embed: GpuTensor, // (vocab, hidden), also the LM head
    layers: Vec<Layer>,
    norm: GpuTensor,          // (hidden)
    cos_sin: GpuTensor,       // (max_positions, head_dim / 2, 2): global layers
    local_cos_sin: GpuTensor, // (max_positions, head_dim / 2, 2): sliding-window layers
}

/// Positions the RoPE tables cover at most (two 32k × 128 × 2 f32 tables are 64 MiB).
const MAX_TABLE_POSITIONS: usize = 32768;

impl Gemma3Model {
    /// Upload every weight of `config`'s model from `source` (a GGUF file), calling
    /// `progress(layers done, layers in all)` as layers arrive.
    pub fn load(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Gemma3Model> {
        let c = &config;
        let (hidden, q_rows, kv_rows) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let w = Loader { source, factory };
        // Every Gemma norm multiplies by (1 + w): llama.cpp's converter stores 1 + w, a Hugging
        // Face checkpoint w itself, to which 1 is added here.
        let norm_of = |layer: Option<usize>, part: Part, len: usize| -> Result<GpuTensor> {
            if source.checkpoint() == Checkpoint::Gguf {
                return w.vector(layer, part, len);
            }
            let name = tensor_name(Checkpoint::HuggingFace, layer, part);
            let values: Vec<f32> = w.named_values(&name, len)?.iter().map(|v| 1.0 + v).collect();
            factory.upload_f32(&[len], &values)
        };
        let qkv = [(Part::Q, q_rows), (Part::K, kv_rows), (Part::V, kv_rows)];
        let inter = c.intermediate_size;
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            let norm = |part| norm_of(Some(i), part, hidden);
            layers.push(Layer {
                attn_norm: norm(Part::AttnNorm)?,
                attention: Attention {
                    qkv: w.linear(i, &qkv, None, hidden)?,
                    o: w.linear(i, &[(Part::O, hidden)], None, q_rows)?,
                    qk_norm: Some(QkNorm {
                        q: norm_of(Some(i), Part::QNorm, c.head_dim)?,
                        k: norm_of(Some(i), Part::KNorm, c.head_dim)?,
                        eps: c.rms_norm_eps,
                    }),
                    sinks: None,
                },
                post_attn_norm: norm(Part::PostAttnNorm)?,
                ffn_norm: norm(Part::PreFfnNorm)?,
                mlp: Mlp {
                    gate_up: w.linear(i, &[(Part::Gate, inter), (Part::Up, inter)], None, hidden)?,
                    down: w.linear(i, &[(Part::Down, hidden)], None, inter)?,
                    gate: Gate::GeluTanh,
                },
                post_ffn_norm: norm(Part::PostFfnNorm)?,
            });
            progress(i + 1, c.num_layers);
        }
        let embed = w.matrix(None, Part::Q, &[c.vocab_size, hidden])?;
        let norm = norm_of(None, Part::AttnNorm, hidden)?;
        let positions = c.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let shape = [positions, c.rope_dim() / 2, 2];
        let cos_sin = factory.upload_f32(&shape, &c.rope_table(c.max_position_embeddings, positions))?;
        let local_cos_sin = factory.upload_f32(&shape, &cos_sin_table(&c.local_inv_freq(), positions))?;
        Ok(Gemma3Model { config, embed, layers, norm, cos_sin, local_cos_sin })
    }
}

impl Architecture for Gemma3Model {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn max_context(&self) -> usize {
        self.cos_sin.shape()[0]
    }

    fn record_forward(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        inputs: &StepInputs<'_>,
        a: &Activations,
        kv: &KvPool,
        logits: &GpuTensor,
    ) -> Result<()> {
        let c = &self.config;
        let layout = QkvLayout { num_heads: c.num_heads, num_kv_heads: c.num_kv_heads, head_dim: c.head_dim };
        let query_scale = 1.0 / c.query_pre_attn_scalar.unwrap_or(c.head_dim as f32).sqrt();
        let eps = c.rms_norm_eps;
        embedding(ctx, rec, &self.embed, inputs.token_ids, &a.x)?;
        // transformers multiplies by √hidden rounded to the activations' dtype (f32 here).
        scale(ctx, rec, &a.x, (c.hidden_size as f32).sqrt())?;
        for (i, layer) in self.layers.iter().enumerate() {
            if i == 0 {
                rms_norm(ctx, rec, &a.x, &layer.attn_norm, &a.xn, eps)?;
            } else {
                // The previous layer's residual connection, then this layer's first norm.
                add_rms_norm(ctx, rec, &a.x, &a.normed, &layer.attn_norm, &a.xn, eps)?;
            }
            let sliding = c.is_sliding(i);
            let setup = AttentionSetup {
                layout,
                cos_sin: if sliding { &self.local_cos_sin } else { &self.cos_sin },
                pairing: RopePairing::Neox,
                sliding_window: if sliding { c.sliding_window } else { None },
                scale: query_scale,
            };
            let lora = inputs.lora.map(|step| LayerLora { step, layer: i });
            layer.attention.forward(ctx, rec, a, inputs, &kv.layer(i)?, &setup, lora)?;
            rms_norm(ctx, rec, &a.proj, &layer.post_attn_norm, &a.normed, eps)?;
            add_rms_norm(ctx, rec, &a.x, &a.normed, &layer.ffn_norm, &a.xn, eps)?;
            layer.mlp.forward(ctx, rec, a, lora)?;
            rms_norm(ctx, rec, &a.proj, &layer.post_ffn_norm, &a.normed, eps)?;
        }
        add_rms_norm(ctx, rec, &a.x, &a.normed, &self.norm, &a.xn, eps)?;
        // Only the sampled rows need logits: gather those rows, then the LM head.
        embedding(ctx, rec, &a.xn, inputs.logit_rows, &a.rows)?;
        matmul(ctx, rec, &a.rows, &self.embed, logits)
    }

    /// q, k, v, o, gate, up and down as Llama's; Gemma's GGUFs keep Hugging Face's q/k order.
    fn lora_layout(&self) -> Option<LoraLayout> {
        Some(LoraLayout::llama(&self.config, false))
    }
}
