//! IBM Granite 4.0-H — Mamba2 and attention layers interleaved, dense or with experts (Tiny,
//! Small) — as one forward pass recorded on the GPU.
//!
//! Reference: transformers' `models/granitemoehybrid/modeling_granitemoehybrid.py`
//! (`GraniteMoeHybridForCausalLM`), and llama.cpp's
//! `granitehybrid` graph and `convert_hf_to_gguf.py` (`GraniteHybridModel`) for the GGUF
//! layout. Each layer is
//!
//! ```text
//! h = x + residual_multiplier · mixer(rms_norm(x))     mixer: Mamba2 (layers::SsmMixer), or
//!                                                       attention scaled by attention_multiplier
//! x = h + residual_multiplier · shared_mlp(rms_norm(h))  (a gated SiLU MLP)
//! ```
//!
//! where a model with experts adds its routed experts' weighted sum to `shared_mlp`'s output
//! (layers::MoeMlp: top-k of the router's logits, softmaxed).
//!
//! with `x = embedding · embedding_multiplier` at the bottom, a final RMSNorm and the LM head
//! on the sampled rows, and the logits divided by `logits_scaling` (folded into the final
//! norm's weight, which the LM head multiplies linearly). A layer attends where the GGUF gives
//! it KV heads (transformers: `layer_types`); Granite 4.0-H's attention uses no RoPE
//! (`position_embedding_type` unset), which weft runs as a rotation table of angle 0 (cos 1,
//! sin 0: exactly the identity).

use crate::error::{Result, WeftError};
use crate::gpu::kernels::embedding::{embedding, embedding_scaled};
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::paged::QkvLayout;
use crate::gpu::kernels::reduce::{add_scaled_rms_norm, rms_norm};
use crate::gpu::kernels::rope::RopePairing;
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::Architecture;
use crate::model::config::{ModelConfig, Multipliers};
use crate::model::kv_pool::KvPool;
use crate::model::layers::{
    Activations, Attention, AttentionSetup, FeedForward, Gate, HfExperts, LayerLora, Linear, Mlp, MoeMlp, SsmMixer,
    StepInputs,
};
use crate::model::lora_pool::LoraLayout;
use crate::model::weights::{Checkpoint, Loader, Part, WeightSource};
use crate::tensor::TensorFactory;

enum Mixer {
    // Boxed: both hold many tensors, and the layers are walked, not copied.
    Attention(Box<Attention>),
    Ssm(Box<SsmMixer>),
}

struct Layer {
    attn_norm: GpuTensor, // (hidden)
    mixer: Mixer,
    ffn_norm: GpuTensor, // (hidden)
    ffn: FeedForward,
}

pub struct GraniteHybridModel {
    config: ModelConfig,
    multipliers: Multipliers,
    embed: GpuTensor, // (vocab, hidden)
    layers: Vec<Layer>,
    norm: GpuTensor,            // (hidden), divided by logits_scaling
    lm_head: Option<GpuTensor>, // (vocab, hidden); None when tied to `embed`
    cos_sin: GpuTensor,         // (max_positions, head_dim / 2, 2); all (1, 0) without RoPE
    pairing: RopePairing,
}

/// Positions the rotation table covers at most (as for Llama).
const MAX_TABLE_POSITIONS: usize = 32768;

impl GraniteHybridModel {
    /// Upload every weight of `config`'s model from `source`, calling `progress(layers done,
    /// layers in all)` as layers arrive.
    pub fn load(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<GraniteHybridModel> {
        let c = &config;
        let file = source.file();
        let (Some(ssm), Some(hybrid), Some(multipliers)) = (c.ssm, c.hybrid.clone(), c.multipliers) else {
            return Err(WeftError::model(file, "a Granite hybrid needs its ssm, layer-type and multiplier metadata"));
        };
        let (hidden, q_rows, kv_rows) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let inter = c.intermediate_size;
        let w = Loader { source, factory };
        let gguf = source.checkpoint() == Checkpoint::Gguf;
        let qkv = [(Part::Q, q_rows), (Part::K, kv_rows), (Part::V, kv_rows)];
        let qkv_bias = c.attention_bias.then_some(&[Part::QBias, Part::KBias, Part::VBias][..]);
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            let mixer = if c.is_recurrent(i) {
                Mixer::Ssm(Box::new(SsmMixer::load(&w, ssm, hidden, i, &format!("model.layers.{i}.mamba"))?))
            } else {
                Mixer::Attention(Box::new(Attention {
                    qkv: w.linear(i, &qkv, qkv_bias, hidden)?,
                    o: w.linear(i, &[(Part::O, hidden)], None, q_rows)?,
                    qk_norm: None,
                    sinks: None,
                }))
            };
            // llama.cpp splits the shared MLP's input_linear into ffn_gate and ffn_up;
            // transformers keeps them as one matrix, gate rows first, as `Mlp` wants them.
            let ffn = if let Some(moe) = c.moe {
                let prefix = format!("model.layers.{i}");
                FeedForward::Experts(Box::new(MoeMlp::load(&w, moe, hidden, i, HfExperts::Granite(&prefix))?))
            } else if gguf {
                FeedForward::Dense(Mlp {
                    gate_up: w.linear(i, &[(Part::Gate, inter), (Part::Up, inter)], None, hidden)?,
                    down: w.linear(i, &[(Part::Down, hidden)], None, inter)?,
                    gate: Gate::Silu,
                })
            } else {
                let hf = |name: &str| format!("model.layers.{i}.shared_mlp.{name}.weight");
                FeedForward::Dense(Mlp {
                    gate_up: Linear {
                        weights: vec![w.named_matrix(&hf("input_linear"), &[2 * inter, hidden])?],
                        bias: None,
                    },
                    down: Linear { weights: vec![w.named_matrix(&hf("output_linear"), &[hidden, inter])?], bias: None },
                    gate: Gate::Silu,
                })
            };
            layers.push(Layer {
                attn_norm: w.vector(Some(i), Part::AttnNorm, hidden)?,
                mixer,
                ffn_norm: w.vector(Some(i), Part::FfnNorm, hidden)?,
                ffn,
            });
            progress(i + 1, c.num_layers);
        }
        let embed = w.matrix(None, Part::Q, &[c.vocab_size, hidden])?;
        let name = crate::model::weights::tensor_name(source.checkpoint(), None, Part::AttnNorm);
        let norm: Vec<f32> = w.named_values(&name, hidden)?.iter().map(|v| v / multipliers.logits_scaling).collect();
        let norm = factory.upload_f32(&[hidden], &norm)?;
        let lm_head =
            if c.tie_word_embeddings { None } else { w.optional_matrix(None, Part::O, &[c.vocab_size, hidden])? };
        let positions = c.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let half = c.rope_dim() / 2;
        let table = if hybrid.use_rope {
            c.rope_table(c.max_position_embeddings, positions)
        } else {
            [1.0f32, 0.0].repeat(positions * half)
        };
        let cos_sin = factory.upload_f32(&[positions, half, 2], &table)?;
        // llama.cpp permutes q/k for RoPE's (2i, 2i+1) pairs; transformers rotates halves.
        let pairing = if gguf { RopePairing::Interleaved } else { RopePairing::Neox };
        Ok(GraniteHybridModel { config, multipliers, embed, layers, norm, lm_head, cos_sin, pairing })
    }
}

impl Architecture for GraniteHybridModel {
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
        let setup = AttentionSetup {
            layout: QkvLayout { num_heads: c.num_heads, num_kv_heads: c.num_kv_heads, head_dim: c.head_dim },
            cos_sin: &self.cos_sin,
            pairing: self.pairing,
            sliding_window: None,
            scale: m.attention,
        };
        let (eps, r) = (c.rms_norm_eps, m.residual);
        embedding_scaled(ctx, rec, &self.embed, inputs.token_ids, &a.x, m.embedding)?;
        for (i, layer) in self.layers.iter().enumerate() {
            if i == 0 {
                rms_norm(ctx, rec, &a.x, &layer.attn_norm, &a.xn, eps)?;
            } else {
                // The previous layer's MLP residual, then this layer's first norm.
                add_scaled_rms_norm(ctx, rec, &a.x, &a.proj, r, &layer.attn_norm, &a.xn, eps)?;
            }
            let lora = inputs.lora.map(|step| LayerLora { step, layer: i });
            match &layer.mixer {
                Mixer::Attention(attention) => attention.forward(ctx, rec, a, inputs, &kv.layer(i)?, &setup, lora)?,
                Mixer::Ssm(mixer) => {
                    let (conv_state, ssm_state) = kv.states()?.layer(i)?;
                    mixer.forward(ctx, rec, a, inputs, conv_state, ssm_state, eps)?
                }
            }
            add_scaled_rms_norm(ctx, rec, &a.x, &a.proj, r, &layer.ffn_norm, &a.xn, eps)?;
            layer.ffn.forward(ctx, rec, a, lora)?;
        }
        add_scaled_rms_norm(ctx, rec, &a.x, &a.proj, r, &self.norm, &a.xn, eps)?;
        // Only the sampled rows need logits: gather those rows, then the LM head.
        embedding(ctx, rec, &a.xn, inputs.logit_rows, &a.rows)?;
        matmul(ctx, rec, &a.rows, self.lm_head.as_ref().unwrap_or(&self.embed), logits)
    }

    /// Adapters on the attention layers' q, k, v, o and every layer's MLP (`input_linear` as gate
    /// and up, `output_linear` as down); the Mamba2 mixers take none, nor do models with experts.
    fn lora_layout(&self) -> Option<LoraLayout> {
        if self.config.moe.is_some() {
            return None;
        }
        Some(LoraLayout::llama(&self.config, self.pairing == RopePairing::Interleaved))
    }
}
