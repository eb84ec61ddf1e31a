//! OpenAI's gpt-oss (gpt-oss-20b, gpt-oss-120b) as one forward pass recorded on the GPU, from
//! llama.cpp's GGUF layout (`gpt-oss`) or a Hugging Face directory (`gpt_oss`: experts
//! unquantized, or MXFP4 as OpenAI ships them).
//!
//! Reference: transformers' `models/gpt_oss/modeling_gpt_oss.py` (`GptOssForCausalLM`) and
//! llama.cpp's `openai-moe` graph (`src/models/openai-moe.cpp`). Biased q/k/v/o projections,
//! attention with a learned sink logit per head, layers alternating a sliding window with full
//! attention (the first sliding), YaRN RoPE on halves, and in every layer a sparse MoE block:
//!
//! ```text
//! h = x + o_proj(attention_with_sinks(rope(q_proj(rms_norm(x))), rope(k_proj(…)), v_proj(…)))
//! l = router(rms_norm(h)) + router_bias;   e_1 … e_k = the k largest l   (ties to the lower expert)
//! w_s = softmax(l[e_1], …, l[e_k])_s
//! g, u = gate_{e}(rms_norm(h)) + b_gate, up_{e}(rms_norm(h)) + b_up
//! x = h + Σ_s w_s · (down_{e_s}(min(g, 7) · σ(1.702 · min(g, 7)) · (clamp(u, -7, 7) + 1)) + b_down)
//! ```
//!
//! then a final RMSNorm and the untied LM head on the sampled rows. Attention with sinks:
//! softmax over a head's scores and its sink logit, the sink's share dropped (it carries no
//! value). The experts are stacked as Qwen3-MoE's ([`MoeMlp`]); Hugging Face's fused
//! `gate_up_proj` (gate and up in alternate columns, input-major) is rearranged at load, as
//! llama.cpp's converter splits it into `ffn_gate_exps` and `ffn_up_exps`. Its tokenizer (o200k
//! with the harmony chat format) comes from the GGUF's vocabulary as any GPT-2-style BPE.

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
use crate::model::layers::{Activations, Attention, AttentionSetup, HfExperts, MoeMlp, StepInputs};
use crate::model::weights::{Checkpoint, Loader, Part, WeightSource};
use crate::tensor::TensorFactory;

struct Layer {
    attn_norm: GpuTensor,      // (hidden)
    attention: Attention,      // biased q, k, v, o; sinks (heads)
    post_attn_norm: GpuTensor, // (hidden): the norm before the experts
    moe: MoeMlp,
}

pub struct GptOssModel {
    config: ModelConfig,
    embed: GpuTensor, // (vocab, hidden)
    layers: Vec<Layer>,
    norm: GpuTensor,    // (hidden)
    lm_head: GpuTensor, // (vocab, hidden)
    cos_sin: GpuTensor, // (max_positions, head_dim / 2, 2), YaRN's attention factor applied
}

/// Positions the RoPE table covers at most (as for Llama).
const MAX_TABLE_POSITIONS: usize = 32768;

impl GptOssModel {
    /// Upload every weight of `config`'s model from `source`, calling `progress(layers done,
    /// layers in all)` as layers arrive.
    pub fn load(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<GptOssModel> {
        let c = &config;
        let (hidden, q_rows, kv_rows) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let moe = c.moe.ok_or_else(|| {
            crate::error::WeftError::model(source.file(), "a gpt-oss model needs its experts' shape (expert_count)")
        })?;
        let w = Loader { source, factory };
        let qkv = [(Part::Q, q_rows), (Part::K, kv_rows), (Part::V, kv_rows)];
        let qkv_bias = [Part::QBias, Part::KBias, Part::VBias];
        let sinks_name = |i: usize| match source.checkpoint() {
            Checkpoint::Gguf => format!("blk.{i}.attn_sinks.weight"),
            Checkpoint::HuggingFace => format!("model.layers.{i}.self_attn.sinks"),
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            let sinks = w.named_values(&sinks_name(i), c.num_heads)?;
            let hf_prefix = format!("model.layers.{i}.mlp");
            layers.push(Layer {
                attn_norm: w.vector(Some(i), Part::AttnNorm, hidden)?,
                attention: Attention {
                    qkv: w.linear(i, &qkv, Some(&qkv_bias), hidden)?,
                    o: w.linear(i, &[(Part::O, hidden)], Some(&[Part::OBias]), q_rows)?,
                    qk_norm: None,
                    sinks: Some(factory.upload_f32(&[c.num_heads], &sinks)?),
                },
                // GGUF's `post_attention_norm`, transformers' `post_attention_layernorm`.
                post_attn_norm: w.vector(Some(i), Part::PostAttnNorm, hidden)?,
                moe: MoeMlp::load(&w, moe, hidden, i, HfExperts::GptOss(&hf_prefix))?,
            });
            progress(i + 1, c.num_layers);
        }
        let embed = w.matrix(None, Part::Q, &[c.vocab_size, hidden])?;
        let norm = w.vector(None, Part::AttnNorm, hidden)?;
        let lm_head = w.matrix(None, Part::O, &[c.vocab_size, hidden])?;
        let positions = c.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let table = c.rope_table(c.max_position_embeddings, positions);
        let cos_sin = factory.upload_f32(&[positions, c.rope_dim() / 2, 2], &table)?;
        Ok(GptOssModel { config, embed, layers, norm, lm_head, cos_sin })
    }
}

impl Architecture for GptOssModel {
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
        let eps = c.rms_norm_eps;
        embedding(ctx, rec, &self.embed, inputs.token_ids, &a.x)?;
        for (i, layer) in self.layers.iter().enumerate() {
            if i == 0 {
                rms_norm(ctx, rec, &a.x, &layer.attn_norm, &a.xn, eps)?;
            } else {
                // The previous layer's residual connection, then this layer's first norm.
                add_rms_norm(ctx, rec, &a.x, &a.proj, &layer.attn_norm, &a.xn, eps)?;
            }
            let setup = AttentionSetup {
                layout,
                cos_sin: &self.cos_sin,
                pairing: RopePairing::Neox,
                sliding_window: if c.is_sliding(i) { c.sliding_window } else { None },
                scale: 1.0 / (c.head_dim as f32).sqrt(),
            };
            layer.attention.forward(ctx, rec, a, inputs, &kv.layer(i)?, &setup, None)?;
            add_rms_norm(ctx, rec, &a.x, &a.proj, &layer.post_attn_norm, &a.xn, eps)?;
            layer.moe.forward(ctx, rec, a)?;
        }
        add_rms_norm(ctx, rec, &a.x, &a.proj, &self.norm, &a.xn, eps)?;
        // Only the sampled rows need logits: gather those rows, then the LM head.
        embedding(ctx, rec, &a.xn, inputs.logit_rows, &a.rows)?;
        matmul(ctx, rec, &a.rows, &self.lm_head, logits)
    }
}
