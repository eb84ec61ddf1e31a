//! The Llama family — Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM, SmolLM3, IBM Granite 3.x
//! (dense) — as one forward pass recorded on the GPU.
//!
//! Reference: transformers' `models/llama/modeling_llama.py` (`LlamaForCausalLM`), and
//! llama.cpp's `llama` graph for the GGUF layout. Each layer is
//!
//! ```text
//! h = x + o_proj(attention(rope(q_proj(rms_norm(x))), rope(k_proj(…)), v_proj(…)))
//! x = h + down_proj(silu(gate_proj(rms_norm(h))) * up_proj(rms_norm(h)))
//! ```
//!
//! (each residual addition runs fused with the norm that follows it).
//!
//! with grouped-query attention over the paged KV cache, then a final RMSNorm and the LM head
//! (the embedding matrix itself when tied) on the sampled rows only. Qwen2 adds biases to q, k
//! and v; Qwen3 (transformers' `modeling_qwen3.py`) instead normalises each query and key head
//! (RMSNorm, `q_norm` / `k_norm`) before RoPE; Mistral attends within a sliding window. RoPE's
//! frequencies come from `ModelConfig::rope_table` (linear, Llama 3 and YaRN scaling — the
//! 128K Qwen3 files —, with YaRN's attention factor on cos and sin).
//!
//! SmolLM3 (transformers' `modeling_smollm3.py`, llama.cpp's `smollm3` graph) is Llama with
//! NoPE layers: every fourth layer (`no_rope_layers`) rotates nothing, which weft runs with a
//! one-row identity table (the RoPE kernel leaves positions past its table unrotated). Granite
//! (`modeling_granite.py`, llama.cpp's `granite` graph) is Llama with four multipliers
//! (`ModelConfig::multipliers`): `x = embedding · embedding_multiplier`, each residual branch
//! scaled by `residual_multiplier` before it is added, attention scaled by
//! `attention_multiplier` instead of head_dim^-1/2, and logits divided by `logits_scaling`
//! (folded into the final norm's weight, which the LM head multiplies linearly). Without
//! multipliers every one of these is 1 (or head_dim^-1/2), which changes no bit. Granite MoE
//! (`modeling_granitemoe.py`, `modeling_granitemoeshared.py`; llama.cpp's `granitemoe`) is
//! Granite whose MLPs are routed experts ([`MoeMlp`]: the softmax of the top-k router logits,
//! which equals the renormalised top-k of the full softmax), plus a shared expert every token
//! runs where the model has one.
//!
//! llama.cpp's converter permutes the q/k rows of Llama checkpoints so that RoPE pairs
//! dimensions (2i, 2i+1); Hugging Face keeps the "rotate half" order (i, i + head_dim/2). Each
//! checkpoint runs with its own pairing, which gives the same numbers without un-permuting.

use crate::error::Result;
use crate::gpu::kernels::embedding::{embedding, embedding_scaled};
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::paged::QkvLayout;
use crate::gpu::kernels::reduce::{add_scaled_rms_norm, rms_norm};
use crate::gpu::kernels::rope::RopePairing;
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::{Architecture, gguf_qk_interleaved};
use crate::model::config::{ModelConfig, Multipliers};
use crate::model::kv_pool::KvPool;
use crate::model::layers::{
    Activations, Attention, AttentionSetup, FeedForward, Gate, HfExperts, LayerLora, Mlp, MoeMlp, QkNorm, StepInputs,
};
use crate::model::lora_pool::LoraLayout;
use crate::model::weights::{Checkpoint, Loader, Part, WeightSource, tensor_name};
use crate::tensor::TensorFactory;

/// One block. Phi-3 (`phi3.rs`) loads its fused checkpoints into the same layers.
struct Layer {
    attn_norm: GpuTensor, // (hidden)
    attention: Attention,
    ffn_norm: GpuTensor, // (hidden)
    ffn: FeedForward,
}

pub struct LlamaModel {
    config: ModelConfig,
    embed: GpuTensor, // (vocab, hidden)
    layers: Vec<Layer>,
    norm: GpuTensor,            // (hidden), divided by logits_scaling
    lm_head: Option<GpuTensor>, // (vocab, hidden); None when tied to `embed`
    cos_sin: GpuTensor,         // (max_positions, rope_dim / 2, 2)
    no_rope: Option<GpuTensor>, // (1, rope_dim / 2, 2): (1, 0), for NoPE layers, if any
    pairing: RopePairing,
    multipliers: Multipliers,
}

/// Positions the RoPE table covers at most (a 32k × 64 × 2 f32 table is 16 MiB).
const MAX_TABLE_POSITIONS: usize = 32768;

/// How a checkpoint stores a layer's input projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Projections {
    /// q, k and v, and gate and up, as separate matrices (Llama, Mistral, Qwen).
    Separate,
    /// One qkv matrix (q, k, v rows stacked) and one gate-up matrix (gate rows, then up rows),
    /// the row orders `Attention` and `Mlp` read (Phi-3).
    Fused,
}

impl LlamaModel {
    /// Upload every weight of `config`'s model from `source`, calling `progress(layers done,
    /// layers in all)` as layers arrive.
    pub fn load(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<LlamaModel> {
        Self::load_projections(config, source, factory, progress, Projections::Separate)
    }

    /// [`load`](Self::load) from a checkpoint whose projections are stored as `projections`.
    pub(super) fn load_projections(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
        projections: Projections,
    ) -> Result<LlamaModel> {
        let c = &config;
        let (hidden, q_rows, kv_rows) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let w = Loader { source, factory };
        let qkv_bias = c.attention_bias.then_some(&[Part::QBias, Part::KBias, Part::VBias][..]);
        let inter = c.intermediate_size;
        // Each as (checkpoint part, rows) side by side.
        let (qkv, gate_up): (&[_], &[_]) = match projections {
            Projections::Separate => (
                &[(Part::Q, q_rows), (Part::K, kv_rows), (Part::V, kv_rows)],
                &[(Part::Gate, inter), (Part::Up, inter)],
            ),
            Projections::Fused => (&[(Part::Qkv, q_rows + 2 * kv_rows)], &[(Part::GateUp, 2 * inter)]),
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            layers.push(Layer {
                attn_norm: w.vector(Some(i), Part::AttnNorm, hidden)?,
                attention: Attention {
                    qkv: w.linear(i, qkv, qkv_bias, hidden)?,
                    o: w.linear(i, &[(Part::O, hidden)], None, q_rows)?,
                    qk_norm: if c.qk_norm {
                        Some(QkNorm {
                            q: w.vector(Some(i), Part::QNorm, c.head_dim)?,
                            k: w.vector(Some(i), Part::KNorm, c.head_dim)?,
                            eps: c.rms_norm_eps,
                        })
                    } else {
                        None
                    },
                    sinks: None,
                },
                ffn_norm: w.vector(Some(i), Part::FfnNorm, hidden)?,
                ffn: match c.moe {
                    Some(moe) => {
                        let prefix = format!("model.layers.{i}");
                        FeedForward::Experts(Box::new(MoeMlp::load(&w, moe, hidden, i, HfExperts::Granite(&prefix))?))
                    }
                    None => FeedForward::Dense(Mlp {
                        gate_up: w.linear(i, gate_up, None, hidden)?,
                        down: w.linear(i, &[(Part::Down, hidden)], None, inter)?,
                        gate: Gate::Silu,
                    }),
                },
            });
            progress(i + 1, c.num_layers);
        }
        let embed = w.matrix(None, Part::Q, &[c.vocab_size, hidden])?;
        let multipliers = c.multipliers.unwrap_or(Multipliers {
            embedding: 1.0,
            residual: 1.0,
            attention: 1.0 / (c.head_dim as f32).sqrt(),
            logits_scaling: 1.0,
        });
        let norm = if multipliers.logits_scaling == 1.0 {
            w.vector(None, Part::AttnNorm, hidden)?
        } else {
            let name = tensor_name(source.checkpoint(), None, Part::AttnNorm);
            let values: Vec<f32> =
                w.named_values(&name, hidden)?.iter().map(|v| v / multipliers.logits_scaling).collect();
            factory.upload_f32(&[hidden], &values)?
        };
        let lm_head =
            if c.tie_word_embeddings { None } else { Some(w.matrix(None, Part::O, &[c.vocab_size, hidden])?) };
        // The context served (the table's length) picks LongRoPE's factors; LongRoPE's and
        // YaRN's attention factor scales cos and sin (1 for every other RoPE). With partial
        // rotary (Phi-4-mini) the table covers the rotated dimensions only.
        let positions = c.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let table = c.rope_table(positions, positions);
        let half = c.rope_dim() / 2;
        let cos_sin = factory.upload_f32(&[positions, half, 2], &table)?;
        // Every position past this one-row table of angle 0 is left unrotated, and position 0
        // is rotated by the identity: NoPE.
        let no_rope = if c.no_rope_layers.is_empty() {
            None
        } else {
            Some(factory.upload_f32(&[1, half, 2], &[1.0f32, 0.0].repeat(half))?)
        };
        let pairing = match source.checkpoint() {
            Checkpoint::Gguf if gguf_qk_interleaved(&c.architecture) => RopePairing::Interleaved,
            _ => RopePairing::Neox,
        };
        Ok(LlamaModel { config, embed, layers, norm, lm_head, cos_sin, no_rope, pairing, multipliers })
    }
}

impl Architecture for LlamaModel {
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
        let m = &self.multipliers;
        let mut setup = AttentionSetup {
            layout: QkvLayout { num_heads: c.num_heads, num_kv_heads: c.num_kv_heads, head_dim: c.head_dim },
            cos_sin: &self.cos_sin,
            pairing: self.pairing,
            sliding_window: c.sliding_window,
            scale: m.attention,
        };

        let (eps, r) = (c.rms_norm_eps, m.residual);
        embedding_scaled(ctx, rec, &self.embed, inputs.token_ids, &a.x, m.embedding)?;
        for (i, layer) in self.layers.iter().enumerate() {
            if i == 0 {
                rms_norm(ctx, rec, &a.x, &layer.attn_norm, &a.xn, eps)?;
            } else {
                // The previous layer's residual connection, then this layer's first norm.
                add_scaled_rms_norm(ctx, rec, &a.x, &a.proj, r, &layer.attn_norm, &a.xn, eps)?;
            }
            setup.cos_sin = match &self.no_rope {
                Some(identity) if c.no_rope_layers.contains(&i) => identity,
                _ => &self.cos_sin,
            };
            let lora = inputs.lora.map(|step| LayerLora { step, layer: i });
            layer.attention.forward(ctx, rec, a, inputs, &kv.layer(i)?, &setup, lora)?;
            add_scaled_rms_norm(ctx, rec, &a.x, &a.proj, r, &layer.ffn_norm, &a.xn, eps)?;
            layer.ffn.forward(ctx, rec, a, lora)?;
        }
        add_scaled_rms_norm(ctx, rec, &a.x, &a.proj, r, &self.norm, &a.xn, eps)?;
        // Only the sampled rows need logits: gather those rows, then the LM head.
        embedding(ctx, rec, &a.xn, inputs.logit_rows, &a.rows)?;
        matmul(ctx, rec, &a.rows, self.lm_head.as_ref().unwrap_or(&self.embed), logits)
    }

    /// Adapters target q, k, v, o, gate, up and down; a checkpoint's fused qkv or gate-up
    /// (Phi-3) is read into those parts (`lora::Target`), whichever way the base stores them.
    /// Granite MoE takes none: its experts would need per-expert adapters.
    fn lora_layout(&self) -> Option<LoraLayout> {
        if self.config.moe.is_some() {
            return None;
        }
        Some(LoraLayout::llama(&self.config, self.pairing == RopePairing::Interleaved))
    }
}
