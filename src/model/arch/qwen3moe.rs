//! Qwen3-MoE as one forward pass recorded on the GPU, from llama.cpp's GGUF layout
//! (`qwen3moe`) or a Hugging Face directory (`qwen3_moe`).
//!
//! Reference: transformers' `models/qwen3_moe/modeling_qwen3_moe.py` (`Qwen3MoeForCausalLM`)
//! and llama.cpp's `qwen3moe` graph (`src/models/qwen3moe.cpp`). Qwen3's attention (each query
//! and key head RMS-normalised before RoPE), then in every layer a sparse MoE block instead of
//! the dense MLP:
//!
//! ```text
//! h = x + o_proj(attention(rope(q_norm(q_proj(rms_norm(x)))), rope(k_norm(k_proj(…))), v_proj(…)))
//! p = softmax(router(rms_norm(h)));  e_1 … e_k = the k largest p   (ties to the lower expert)
//! w_s = p[e_s] / Σ p[e_s]   (norm_topk_prob; else w_s = p[e_s])
//! x = h + Σ_s w_s · down_{e_s}(silu(gate_{e_s}(rms_norm(h))) * up_{e_s}(rms_norm(h)))
//! ```
//!
//! then a final RMSNorm and the LM head on the sampled rows. The routing is computed and used
//! on the GPU ([`MoeMlp`]); RoPE rotates halves (i, i + head_dim/2) in both checkpoints
//! (llama.cpp's converter does not permute Qwen's q/k rows). Layers with a dense MLP
//! (`mlp_only_layers`, `decoder_sparse_step`) and shared experts are refused when the config
//! is read.

use crate::error::Result;
use crate::gpu::kernels::embedding::embedding;
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::paged::QkvLayout;
use crate::gpu::kernels::reduce::{add_rms_norm, rms_norm};
use crate::gpu::kernels::rope::RopePairing;
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::Architecture;
use crate::model::config::ModelConfig;
use crate::model::kv_pool::KvPool;
use crate::model::layers::{Activations, Attention, AttentionSetup, HfExperts, MoeMlp, QkNorm, StepInputs};
use crate::model::weights::{Loader, Part, WeightSource};
use crate::tensor::TensorFactory;

struct Layer {
    attn_norm: GpuTensor, // (hidden)
    attention: Attention, // q_norm, k_norm (head_dim)
    ffn_norm: GpuTensor,  // (hidden)
    moe: MoeMlp,
}

pub struct Qwen3MoeModel {
    config: ModelConfig,
    embed: GpuTensor, // (vocab, hidden)
    layers: Vec<Layer>,
    norm: GpuTensor,            // (hidden)
    lm_head: Option<GpuTensor>, // (vocab, hidden); None when tied to `embed`
    cos_sin: GpuTensor,         // (max_positions, head_dim / 2, 2)
}

/// Positions the RoPE table covers at most (as for Llama).
const MAX_TABLE_POSITIONS: usize = 32768;

impl Qwen3MoeModel {
    /// Upload every weight of `config`'s model from `source`, calling `progress(layers done,
    /// layers in all)` as layers arrive.
    pub fn load(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Qwen3MoeModel> {
        let c = &config;
        let (hidden, q_rows, kv_rows) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let moe = c.moe.ok_or_else(|| {
            crate::error::WeftError::model(source.file(), "a qwen3moe model needs its experts' shape (expert_count)")
        })?;
        let w = Loader { source, factory };
        let qkv = [(Part::Q, q_rows), (Part::K, kv_rows), (Part::V, kv_rows)];
        let qkv_bias = c.attention_bias.then_some(&[Part::QBias, Part::KBias, Part::VBias][..]);
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            layers.push(Layer {
                attn_norm: w.vector(Some(i), Part::AttnNorm, hidden)?,
                attention: Attention {
                    qkv: w.linear(i, &qkv, qkv_bias, hidden)?,
                    o: w.linear(i, &[(Part::O, hidden)], None, q_rows)?,
                    qk_norm: Some(QkNorm {
                        q: w.vector(Some(i), Part::QNorm, c.head_dim)?,
                        k: w.vector(Some(i), Part::KNorm, c.head_dim)?,
                        eps: c.rms_norm_eps,
                    }),
                    sinks: None,
                },
                ffn_norm: w.vector(Some(i), Part::FfnNorm, hidden)?,
                moe: MoeMlp::load(&w, moe, hidden, i, HfExperts::PerExpert(&format!("model.layers.{i}.mlp")))?,
            });
            progress(i + 1, c.num_layers);
        }
        let embed = w.matrix(None, Part::Q, &[c.vocab_size, hidden])?;
        let norm = w.vector(None, Part::AttnNorm, hidden)?;
        let lm_head =
            if c.tie_word_embeddings { None } else { Some(w.matrix(None, Part::O, &[c.vocab_size, hidden])?) };
        let positions = c.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let table = c.rope_table(positions, positions);
        let cos_sin = factory.upload_f32(&[positions, c.rope_dim() / 2, 2], &table)?;
        Ok(Qwen3MoeModel { config, embed, layers, norm, lm_head, cos_sin })
    }
}

impl Architecture for Qwen3MoeModel {
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
        let setup = AttentionSetup {
            layout: QkvLayout { num_heads: c.num_heads, num_kv_heads: c.num_kv_heads, head_dim: c.head_dim },
            cos_sin: &self.cos_sin,
            pairing: RopePairing::Neox,
            sliding_window: c.sliding_window,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        let eps = c.rms_norm_eps;
        embedding(ctx, rec, &self.embed, inputs.token_ids, &a.x)?;
        for (i, layer) in self.layers.iter().enumerate() {
            if i == 0 {
                rms_norm(ctx, rec, &a.x, &layer.attn_norm, &a.xn, eps)?;
            } else {
                // The previous layer's residual connection, then this layer's first norm.
                add_rms_norm(ctx, rec, &a.x, &a.proj, &layer.attn_norm, &a.xn, eps)?;
            }
            layer.attention.forward(ctx, rec, a, inputs, &kv.layer(i)?, &setup, None)?;
            add_rms_norm(ctx, rec, &a.x, &a.proj, &layer.ffn_norm, &a.xn, eps)?;
            layer.moe.forward(ctx, rec, a)?;
        }
        add_rms_norm(ctx, rec, &a.x, &a.proj, &self.norm, &a.xn, eps)?;
        // Only the sampled rows need logits: gather those rows, then the LM head.
        embedding(ctx, rec, &a.xn, inputs.logit_rows, &a.rows)?;
        matmul(ctx, rec, &a.rows, self.lm_head.as_ref().unwrap_or(&self.embed), logits)
    }
}
