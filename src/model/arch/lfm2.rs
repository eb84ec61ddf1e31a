//! Liquid AI's LFM2 — short gated convolutions and attention layers interleaved — as one
//! forward pass recorded on the GPU.
//!
//! Reference: transformers' `models/lfm2/modeling_lfm2.py` (`Lfm2ForCausalLM`), and
//! llama.cpp's `lfm2` graph and `convert_hf_to_gguf.py` (`LFM2Model`) for the GGUF layout.
//! Each layer is
//!
//! ```text
//! h = x + mixer(rms_norm(x))      mixer: attention (per-head RMSNorm of q and k, RoPE, GQA), or
//!                                        the short convolution below
//! x = h + mlp(rms_norm(h))        SwiGLU (feed_forward.w1 gate, w3 up, w2 down)
//! ```
//!
//! LFM2-MoE (transformers' `modeling_lfm2_moe.py`, llama.cpp's `lfm2moe`) keeps that MLP in its
//! first `num_dense_layers` layers only; every later one routes each token to its top-k experts
//! by sigmoid(router logit) + a per-expert bias that steers the choice alone, weighting them by
//! their sigmoids renormalised (`layers::MoeMlp`, `Routing::Sigmoid`).
//!
//! with a final RMSNorm (`embedding_norm`) and the LM head, tied to the embedding, on the
//! sampled rows. The short convolution is
//!
//! ```text
//! B, C, x = in_proj(h)                        side by side in one row
//! y       = out_proj(C · conv(B · x))         causal, depthwise, kernel conv_L_cache (3), no bias
//! ```
//!
//! whose only state is the window of its last kernel - 1 inputs B · x: kept per sequence in the
//! recurrent-state slots Mamba2's conv windows use, and run by the same kernel (`ssm_conv` in
//! its gated form), so chunked prefill, preemption and prefix-state snapshots work as for
//! Granite 4.0-H. A layer attends where the GGUF gives it KV heads (transformers:
//! `layer_types`). Neither checkpoint permutes q and k: RoPE rotates halves in both.

use crate::error::{Result, WeftError};
use crate::gpu::kernels::embedding::embedding;
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::paged::QkvLayout;
use crate::gpu::kernels::reduce::{add_rms_norm, rms_norm};
use crate::gpu::kernels::rope::RopePairing;
use crate::gpu::kernels::ssm::{ConvForm, ssm_conv};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::Architecture;
use crate::model::config::ModelConfig;
use crate::model::kv_pool::KvPool;
use crate::model::layers::{
    Activations, Attention, AttentionSetup, FeedForward, Gate, HfExperts, Linear, Mlp, MoeMlp, QkNorm, StepInputs,
};
use crate::model::weights::{Checkpoint, Loader, Part, Renamed, WeightSource, lfm2_name};
use crate::tensor::TensorFactory;

/// LFM2's gated short convolution: `a.proj = out_proj(C · conv(B · x))` with B, C, x from
/// `in_proj(a.xn)`, continuing each sequence's window in its state slot.
struct ShortConv {
    in_proj: Linear,      // (3 · hidden, hidden): B, C, x
    weight: GpuTensor,    // (hidden, kernel) F32
    zero_bias: GpuTensor, // (hidden) F32: LFM2's convolutions have no bias
    out_proj: Linear,     // (hidden, hidden)
}

impl ShortConv {
    /// Layer `layer`'s convolution: GGUF `blk.N.shortconv.*`, transformers
    /// `model.layers.N.conv.*` (its conv weight shaped (hidden, 1, kernel)).
    fn load(w: &Loader<'_>, hidden: usize, kernel: usize, layer: usize) -> Result<ShortConv> {
        let name = |gguf: &str, hf: &str| match w.source.checkpoint() {
            Checkpoint::Gguf => format!("blk.{layer}.shortconv.{gguf}.weight"),
            Checkpoint::HuggingFace => format!("model.layers.{layer}.conv.{hf}.weight"),
        };
        let matrix = |name: String, shape: &[usize]| -> Result<Linear> {
            Ok(Linear { weights: vec![w.named_matrix(&name, shape)?], bias: None })
        };
        let weight = w.named_values(&name("conv", "conv"), hidden * kernel)?;
        Ok(ShortConv {
            in_proj: matrix(name("in_proj", "in_proj"), &[3 * hidden, hidden])?,
            weight: w.factory.upload_f32(&[hidden, kernel], &weight)?,
            zero_bias: w.factory.upload_f32(&[hidden], &vec![0.0; hidden])?,
            out_proj: matrix(name("out_proj", "out_proj"), &[hidden, hidden])?,
        })
    }

    /// `a.proj = conv(a.xn)`, reading and writing the slots' `conv_state` (slots, kernel - 1,
    /// hidden).
    fn forward(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        a: &Activations,
        inputs: &StepInputs<'_>,
        conv_state: &GpuTensor,
    ) -> Result<()> {
        let acts = a.short_conv()?;
        self.in_proj.forward(ctx, rec, &a.xn, &acts.bcx)?;
        let (w, b, seqs) = (&self.weight, &self.zero_bias, &inputs.seq_states);
        ssm_conv(ctx, rec, &acts.bcx, 0, ConvForm::Gated, w, b, seqs, conv_state, &acts.y)?;
        self.out_proj.forward(ctx, rec, &acts.y, &a.proj)
    }
}

enum Mixer {
    // Boxed: both hold several tensors, and the layers are walked, not copied.
    Attention(Box<Attention>),
    Conv(Box<ShortConv>),
}

struct Layer {
    operator_norm: GpuTensor, // (hidden)
    mixer: Mixer,
    ffn_norm: GpuTensor, // (hidden)
    ffn: FeedForward,
}

pub struct Lfm2Model {
    config: ModelConfig,
    embed: GpuTensor, // (vocab, hidden)
    layers: Vec<Layer>,
    norm: GpuTensor,            // (hidden): embedding_norm, applied last
    lm_head: Option<GpuTensor>, // (vocab, hidden); None when tied to `embed`
    cos_sin: GpuTensor,         // (max_positions, head_dim / 2, 2)
}

/// Positions the rotation table covers at most (as for Llama).
const MAX_TABLE_POSITIONS: usize = 32768;

impl Lfm2Model {
    /// Upload every weight of `config`'s model from `source`, calling `progress(layers done,
    /// layers in all)` as layers arrive.
    pub fn load(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Lfm2Model> {
        let c = &config;
        let Some(kernel) = c.short_conv else {
            return Err(WeftError::model(source.file(), "an LFM2 model needs its short-convolution width"));
        };
        let (hidden, q_rows, kv_rows) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let inter = c.intermediate_size;
        // The Llama family's parts, read under LFM2's names.
        let source = &Renamed { source, rename: lfm2_name };
        let w = Loader { source, factory };
        let qkv = [(Part::Q, q_rows), (Part::K, kv_rows), (Part::V, kv_rows)];
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            let mixer = if c.is_recurrent(i) {
                Mixer::Conv(Box::new(ShortConv::load(&w, hidden, kernel, i)?))
            } else {
                Mixer::Attention(Box::new(Attention {
                    qkv: w.linear(i, &qkv, None, hidden)?,
                    o: w.linear(i, &[(Part::O, hidden)], None, q_rows)?,
                    qk_norm: Some(QkNorm {
                        q: w.vector(Some(i), Part::QNorm, c.head_dim)?,
                        k: w.vector(Some(i), Part::KNorm, c.head_dim)?,
                        eps: c.rms_norm_eps,
                    }),
                    sinks: None,
                }))
            };
            layers.push(Layer {
                operator_norm: w.vector(Some(i), Part::AttnNorm, hidden)?,
                mixer,
                ffn_norm: w.vector(Some(i), Part::FfnNorm, hidden)?,
                ffn: match c.moe {
                    Some(moe) if i >= moe.leading_dense_layers => {
                        let prefix = format!("model.layers.{i}.feed_forward");
                        FeedForward::Experts(Box::new(MoeMlp::load(&w, moe, hidden, i, HfExperts::Lfm2(&prefix))?))
                    }
                    _ => FeedForward::Dense(Mlp {
                        gate_up: w.linear(i, &[(Part::Gate, inter), (Part::Up, inter)], None, hidden)?,
                        down: w.linear(i, &[(Part::Down, hidden)], None, inter)?,
                        gate: Gate::Silu,
                    }),
                },
            });
            progress(i + 1, c.num_layers);
        }
        let embed = w.matrix(None, Part::Q, &[c.vocab_size, hidden])?;
        let norm = w.vector(None, Part::AttnNorm, hidden)?;
        let lm_head =
            if c.tie_word_embeddings { None } else { w.optional_matrix(None, Part::O, &[c.vocab_size, hidden])? };
        let positions = c.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let cos_sin = factory.upload_f32(&[positions, c.rope_dim() / 2, 2], &c.rope_table(positions, positions))?;
        Ok(Lfm2Model { config, embed, layers, norm, lm_head, cos_sin })
    }
}

impl Architecture for Lfm2Model {
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
        embedding(ctx, rec, &self.embed, inputs.token_ids, &a.x)?;
        for (i, layer) in self.layers.iter().enumerate() {
            if i == 0 {
                rms_norm(ctx, rec, &a.x, &layer.operator_norm, &a.xn, eps)?;
            } else {
                // The previous layer's MLP residual, then this layer's first norm.
                add_rms_norm(ctx, rec, &a.x, &a.proj, &layer.operator_norm, &a.xn, eps)?;
            }
            match &layer.mixer {
                Mixer::Attention(attention) => attention.forward(ctx, rec, a, inputs, &kv.layer(i)?, &setup, None)?,
                Mixer::Conv(conv) => conv.forward(ctx, rec, a, inputs, kv.states()?.conv(i)?)?,
            }
            add_rms_norm(ctx, rec, &a.x, &a.proj, &layer.ffn_norm, &a.xn, eps)?;
            layer.ffn.forward(ctx, rec, a, None)?;
        }
        add_rms_norm(ctx, rec, &a.x, &a.proj, &self.norm, &a.xn, eps)?;
        // Only the sampled rows need logits: gather those rows, then the LM head.
        embedding(ctx, rec, &a.xn, inputs.logit_rows, &a.rows)?;
        matmul(ctx, rec, &a.rows, self.lm_head.as_ref().unwrap_or(&self.embed), logits)
    }
}
