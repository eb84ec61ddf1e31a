//! OLMo 2 as one forward pass recorded on the GPU, from llama.cpp's GGUF layout or a Hugging
//! Face directory.
//!
//! Reference: transformers' `models/olmo2/modeling_olmo2.py` (`Olmo2ForCausalLM`) and
//! llama.cpp's `olmo2` graph (`src/models/olmo2.cpp`). Llama's blocks with the norms moved: none
//! before attention or the MLP, one on each sub-layer's output before its residual add, and
//! q and k normalised over their whole projections (all heads together, not per head) before
//! RoPE:
//!
//! ```text
//! q = q_norm(q_proj(x)),  k = k_norm(k_proj(x))        (RMSNorm over heads · head_dim)
//! h = x + post_attention_layernorm(o_proj(attention(rope(q), rope(k), v_proj(x))))
//! x = h + post_feedforward_layernorm(down_proj(silu(gate_proj(h)) * up_proj(h)))
//! ```
//!
//! then a final RMSNorm and the LM head on the sampled rows. RoPE rotates halves (i, i +
//! head_dim/2) in both checkpoints: llama.cpp's converter does not permute OLMo 2's q/k rows.
//!
//! The shared layers read their input from `Activations::xn`, which in Llama holds the normed
//! residual stream; with no pre-norm to write it, the residual stream itself lives in `xn`
//! here, and the final norm writes `x`.

use crate::error::Result;
use crate::gpu::kernels::elementwise::add;
use crate::gpu::kernels::embedding::embedding;
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::paged::QkvLayout;
use crate::gpu::kernels::reduce::rms_norm;
use crate::gpu::kernels::rope::RopePairing;
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::Architecture;
use crate::model::config::ModelConfig;
use crate::model::kv_pool::KvPool;
use crate::model::layers::{Activations, Attention, AttentionSetup, Gate, LayerLora, Mlp, QkNorm, StepInputs};
use crate::model::lora_pool::LoraLayout;
use crate::model::weights::{Loader, Part, WeightSource};
use crate::tensor::TensorFactory;

struct Layer {
    attention: Attention,      // q_norm (heads · head_dim), k_norm (kv_heads · head_dim)
    post_attn_norm: GpuTensor, // (hidden)
    mlp: Mlp,
    post_ffn_norm: GpuTensor, // (hidden)
}

pub struct Olmo2Model {
    config: ModelConfig,
    embed: GpuTensor, // (vocab, hidden)
    layers: Vec<Layer>,
    norm: GpuTensor,            // (hidden)
    lm_head: Option<GpuTensor>, // (vocab, hidden); None when tied to `embed`
    cos_sin: GpuTensor,         // (max_positions, head_dim / 2, 2)
}

/// Positions the RoPE table covers at most (as for Llama).
const MAX_TABLE_POSITIONS: usize = 32768;

impl Olmo2Model {
    /// Upload every weight of `config`'s model from `source`, calling `progress(layers done,
    /// layers in all)` as layers arrive.
    pub fn load(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Olmo2Model> {
        let c = &config;
        let (hidden, q_rows, kv_rows) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let w = Loader { source, factory };
        let qkv = [(Part::Q, q_rows), (Part::K, kv_rows), (Part::V, kv_rows)];
        let qkv_bias = c.attention_bias.then_some(&[Part::QBias, Part::KBias, Part::VBias][..]);
        let inter = c.intermediate_size;
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            layers.push(Layer {
                attention: Attention {
                    qkv: w.linear(i, &qkv, qkv_bias, hidden)?,
                    o: w.linear(i, &[(Part::O, hidden)], None, q_rows)?,
                    // As wide as all the heads: `head_rms_norm` normalises each projection whole.
                    qk_norm: Some(QkNorm {
                        q: w.vector(Some(i), Part::QNorm, q_rows)?,
                        k: w.vector(Some(i), Part::KNorm, kv_rows)?,
                        eps: c.rms_norm_eps,
                    }),
                    sinks: None,
                },
                post_attn_norm: w.vector(Some(i), Part::PostAttnNorm, hidden)?,
                mlp: Mlp {
                    gate_up: w.linear(i, &[(Part::Gate, inter), (Part::Up, inter)], None, hidden)?,
                    down: w.linear(i, &[(Part::Down, hidden)], None, inter)?,
                    gate: Gate::Silu,
                },
                post_ffn_norm: w.vector(Some(i), Part::PostFfnNorm, hidden)?,
            });
            progress(i + 1, c.num_layers);
        }
        let embed = w.matrix(None, Part::Q, &[c.vocab_size, hidden])?;
        let norm = w.vector(None, Part::AttnNorm, hidden)?;
        let lm_head =
            if c.tie_word_embeddings { None } else { Some(w.matrix(None, Part::O, &[c.vocab_size, hidden])?) };
        let positions = c.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let table = c.rope_table(c.max_position_embeddings, positions);
        let cos_sin = factory.upload_f32(&[positions, c.rope_dim() / 2, 2], &table)?;
        Ok(Olmo2Model { config, embed, layers, norm, lm_head, cos_sin })
    }
}

impl Architecture for Olmo2Model {
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
            sliding_window: None,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        let eps = c.rms_norm_eps;
        // The residual stream, in `xn` (see above).
        embedding(ctx, rec, &self.embed, inputs.token_ids, &a.xn)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let lora = inputs.lora.map(|step| LayerLora { step, layer: i });
            layer.attention.forward(ctx, rec, a, inputs, &kv.layer(i)?, &setup, lora)?;
            rms_norm(ctx, rec, &a.proj, &layer.post_attn_norm, &a.normed, eps)?;
            add(ctx, rec, &a.xn, &a.normed)?;
            layer.mlp.forward(ctx, rec, a, lora)?;
            rms_norm(ctx, rec, &a.proj, &layer.post_ffn_norm, &a.normed, eps)?;
            add(ctx, rec, &a.xn, &a.normed)?;
        }
        rms_norm(ctx, rec, &a.xn, &self.norm, &a.x, eps)?;
        // Only the sampled rows need logits: gather those rows, then the LM head.
        embedding(ctx, rec, &a.x, inputs.logit_rows, &a.rows)?;
        matmul(ctx, rec, &a.rows, self.lm_head.as_ref().unwrap_or(&self.embed), logits)
    }

    /// q, k, v, o, gate, up and down as Llama's; OLMo 2's GGUFs keep Hugging Face's q/k order.
    fn lora_layout(&self) -> Option<LoraLayout> {
        Some(LoraLayout::llama(&self.config, false))
    }
}
