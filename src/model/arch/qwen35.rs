//! Qwen3.5, dense and with experts — Gated DeltaNet linear attention with gated full
//! attention every few layers — as one forward pass recorded on the GPU.
//!
//! Reference: transformers' `models/qwen3_5/modeling_qwen3_5.py` (`Qwen3_5ForCausalLM`; the
//! text model of `Qwen3_5ForConditionalGeneration`, whose vision tower weft does not run) and
//! `models/qwen3_5_moe/modeling_qwen3_5_moe.py` (`Qwen3_5MoeForCausalLM`, likewise), and
//! llama.cpp's `src/models/qwen35.cpp`, `qwen35moe.cpp` and `conversion/qwen.py`
//! (`Qwen3_5TextModel`, `Qwen3_5MoeTextModel`) for the GGUF layout. Each layer is
//!
//! ```text
//! h = x + mixer(rms_norm(x))      mixer: gated attention, or the Gated DeltaNet below
//! x = h + ffn(rms_norm(h))        a SwiGLU MLP, or (MoE) the sparse block below
//! ```
//!
//! with a final RMSNorm and the LM head (tied to the embedding in the small models). Every
//! RMSNorm but the DeltaNet's output norm scales by (1 + w) in transformers; llama.cpp's
//! converter stores 1 + w, so a Hugging Face directory's weights get the 1 added at load.
//!
//! Gated attention: `q_proj` gives each head its query and, beside it, an output gate
//! (rows interleaved per head: query rows, then gate rows; split apart at load); q and k are
//! RMS-normalised per head, the first `rope_dim` dimensions rotate (partial RoPE; Qwen3.5's
//! multimodal sections all see the same text position, so this is plain RoPE), and the
//! attention output is multiplied by sigmoid(gate) before `o_proj`.
//!
//! Gated DeltaNet (transformers' `Qwen3_5GatedDeltaNet`):
//!
//! ```text
//! q, k, v = silu(conv(in_proj_qkv(h)))      causal depthwise conv, kernel 4, no bias
//! z = in_proj_z(h); b = in_proj_b(h); a = in_proj_a(h)
//! y = delta_rule(l2norm(q), l2norm(k), v, g = -exp(A_log) · softplus(a + dt_bias), β = sigmoid(b))
//! out = out_proj(rms_norm(y) · w · silu(z))  per v head
//! ```
//!
//! The conv window and each v head's (head_k × head_v) state matrix live in the
//! recurrent-state slots Mamba2's do (`ssm_conv`, then `gated_delta_net`), so chunked prefill,
//! preemption and prefix-state snapshots work as for Granite 4.0-H. The recurrence runs token
//! by token (no chunked form yet: see `shaders/gated_delta_net.wgsl`). GGUF's v heads are in
//! llama.cpp's tiled order, transformers' grouped; `DeltaNetConfig::v_heads_tiled` says which.
//!
//! The MoE's sparse block (transformers' `Qwen3_5MoeSparseMoeBlock`, run by [`MoeMlp`]):
//!
//! ```text
//! p = softmax(router(h));  e_1 … e_k = the k largest p;  w_s = p[e_s] / Σ p[e_s]
//! ffn(h) = Σ_s w_s · expert_{e_s}(h) + sigmoid(h · shared_expert_gate) · shared_expert(h)
//! ```
//!
//! every expert and the shared expert a SwiGLU MLP (GGUF `ffn_{gate,up,down}_exps`, router
//! `ffn_gate_inp`, `ffn_{gate,up,down}_shexp`, the gate `ffn_gate_inp_shexp`; transformers
//! `mlp.experts.E.*_proj`, `mlp.gate`, `mlp.shared_expert.*_proj`, `mlp.shared_expert_gate`).

use std::borrow::Cow;

use crate::error::{Result, WeftError};
use crate::gpu::kernels::elementwise::sigmoid_mul;
use crate::gpu::kernels::embedding::embedding;
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::paged::{PagedKv, QkvLayout, paged_attention, rope_kv_write};
use crate::gpu::kernels::reduce::{add_rms_norm, head_rms_norm, rms_norm};
use crate::gpu::kernels::rope::RopePairing;
use crate::gpu::kernels::ssm::{ConvForm, DeltaShape, GateAt, gated_delta_net, gated_rms_norm, ssm_conv};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::Architecture;
use crate::model::config::{DeltaNetConfig, ModelConfig};
use crate::model::kv_pool::KvPool;
use crate::model::layers::{Activations, FeedForward, Gate, HfExperts, Linear, Mlp, MoeMlp, StepInputs};
use crate::model::weights::{Checkpoint, HostTensor, Loader, Part, Renamed, WeightSource, upload_matrix};
use crate::tensor::TensorFactory;

/// The checkpoint's name of layer `layer`'s tensor: GGUF `blk.N.{gguf}`, Hugging Face
/// `model.layers.N.{hf}`.
fn layer_name(checkpoint: Checkpoint, layer: usize, gguf: &str, hf: &str) -> String {
    match checkpoint {
        Checkpoint::Gguf => format!("blk.{layer}.{gguf}"),
        Checkpoint::HuggingFace => format!("model.layers.{layer}.{hf}"),
    }
}

/// The name of a `Qwen3_5ForCausalLM` tensor in a `Qwen3_5ForConditionalGeneration`
/// checkpoint (`model.X` is `model.language_model.X`; the LM head keeps its name).
pub(super) fn language_model_name(checkpoint: Checkpoint, name: &str) -> Option<String> {
    let rest = name.strip_prefix("model.").filter(|_| checkpoint == Checkpoint::HuggingFace)?;
    Some(format!("model.language_model.{rest}"))
}

/// A (1 + w) RMSNorm's weight, as the kernels take it (1 + w): GGUF stores it so, Hugging
/// Face stores w.
fn norm_weight(w: &Loader<'_>, name: &str, len: usize) -> Result<GpuTensor> {
    let mut values = w.named_values(name, len)?;
    if w.source.checkpoint() == Checkpoint::HuggingFace {
        values.iter_mut().for_each(|v| *v += 1.0);
    }
    w.factory.upload_f32(&[len], &values)
}

/// A Gated DeltaNet layer: `a.proj = out_proj(gated_norm(delta_rule(conv(qkv)), z))`,
/// continuing each sequence's conv window and state matrices in its slot.
struct DeltaNet {
    shape: DeltaNetConfig,
    in_proj: Linear,        // (conv_channels + value + 2 · v_heads, hidden): qkv, z, b, a
    conv_weight: GpuTensor, // (conv_channels, conv_kernel) F32
    zero_bias: GpuTensor,   // (conv_channels) F32: the convolution has no bias
    a_neg: GpuTensor,       // (v_heads): -exp(A_log)
    dt_bias: GpuTensor,     // (v_heads)
    norm: GpuTensor,        // (value): the (head_v) norm weight, once per v head
    out_proj: Linear,       // (hidden, value)
}

impl DeltaNet {
    /// Layer `layer`'s DeltaNet: GGUF `blk.N.attn_qkv`, `attn_gate` (z), `ssm_beta` (b),
    /// `ssm_alpha` (a), `ssm_conv1d`, `ssm_a` (stored as -exp(A_log)), `ssm_dt.bias`,
    /// `ssm_norm`, `ssm_out`; transformers `model.layers.N.linear_attn.{in_proj_qkv, in_proj_z,
    /// in_proj_b, in_proj_a, conv1d, A_log, dt_bias, norm, out_proj}`.
    fn load(w: &Loader<'_>, shape: DeltaNetConfig, hidden: usize, layer: usize) -> Result<DeltaNet> {
        let checkpoint = w.source.checkpoint();
        let name = |gguf: &str, hf: &str| layer_name(checkpoint, layer, gguf, &format!("linear_attn.{hf}"));
        let (channels, value, heads) = (shape.conv_channels(), shape.value_size(), shape.num_v_heads);
        let parts = [
            (name("attn_qkv.weight", "in_proj_qkv.weight"), channels),
            (name("attn_gate.weight", "in_proj_z.weight"), value),
            (name("ssm_beta.weight", "in_proj_b.weight"), heads),
            (name("ssm_alpha.weight", "in_proj_a.weight"), heads),
        ];
        let f32s = |name: String, shape: &[usize]| -> Result<GpuTensor> {
            w.factory.upload_f32(shape, &w.named_values(&name, shape.iter().product())?)
        };
        let mut a_neg = w.named_values(&name("ssm_a", "A_log"), heads)?;
        if checkpoint == Checkpoint::HuggingFace {
            a_neg.iter_mut().for_each(|v| *v = -v.exp());
        }
        let norm = w.named_values(&name("ssm_norm.weight", "norm.weight"), shape.head_v_dim)?;
        let norm: Vec<f32> = (0..heads).flat_map(|_| norm.iter().copied()).collect();
        Ok(DeltaNet {
            shape,
            in_proj: w.named_linear(&parts, None, hidden)?,
            conv_weight: f32s(name("ssm_conv1d.weight", "conv1d.weight"), &[channels, shape.conv_kernel])?,
            zero_bias: w.factory.upload_f32(&[channels], &vec![0.0; channels])?,
            a_neg: w.factory.upload_f32(&[heads], &a_neg)?,
            dt_bias: f32s(name("ssm_dt.bias", "dt_bias"), &[heads])?,
            norm: w.factory.upload_f32(&[value], &norm)?,
            out_proj: Linear {
                weights: vec![w.named_matrix(&name("ssm_out.weight", "out_proj.weight"), &[hidden, value])?],
                bias: None,
            },
        })
    }

    /// `a.proj = delta_net(a.xn)`, reading and writing the slots' `conv_state` (slots,
    /// conv_kernel - 1, conv_channels) and `state` (slots, v_heads, head_v, head_k).
    fn forward(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        a: &Activations,
        inputs: &StepInputs<'_>,
        (conv_state, state): (&GpuTensor, &GpuTensor),
        eps: f32,
    ) -> Result<()> {
        let d = &self.shape;
        let acts = a.delta_net()?;
        let (channels, value) = (d.conv_channels(), d.value_size());
        // q, k, v, z, b, a side by side.
        self.in_proj.forward(ctx, rec, &a.xn, &acts.mixed)?;
        let (w, b, seqs) = (&self.conv_weight, &self.zero_bias, &inputs.seq_states);
        ssm_conv(ctx, rec, &acts.mixed, 0, ConvForm::Silu, w, b, seqs, conv_state, &acts.qkv)?;
        let shape = DeltaShape {
            num_k_heads: d.num_k_heads,
            num_v_heads: d.num_v_heads,
            head_k_dim: d.head_k_dim,
            head_v_dim: d.head_v_dim,
            v_heads_tiled: d.v_heads_tiled,
        };
        let (a_neg, dt_bias) = (&self.a_neg, &self.dt_bias);
        let ba_offset = channels + value;
        gated_delta_net(ctx, rec, shape, &acts.qkv, &acts.mixed, ba_offset, a_neg, dt_bias, seqs, state, &acts.core)?;
        let (z, group) = (&acts.mixed, d.head_v_dim);
        gated_rms_norm(ctx, rec, &acts.core, z, channels, &self.norm, group, &acts.normed, eps, GateAt::Output)?;
        self.out_proj.forward(ctx, rec, &acts.normed, &a.proj)
    }
}

/// Qwen3.5's gated attention: RoPE'd, q/k-normalised grouped-query attention whose output
/// is multiplied by sigmoid(gate) before `o`.
struct GatedAttention {
    qkv: Linear,       // q, k, v side by side: ((heads + 2 · kv_heads) · head_dim, hidden)
    gate: Linear,      // (heads · head_dim, hidden): the gate rows of q_proj
    o: Linear,         // (hidden, heads · head_dim)
    q_norm: GpuTensor, // (head_dim): 1 + w
    k_norm: GpuTensor, // (head_dim): 1 + w
}

/// The query rows and the gate rows of a `q_proj` of `heads` heads of `head_dim` whose rows
/// alternate per head (query, then gate), each as a (heads · head_dim, cols) tensor in the
/// checkpoint's format (a row holds whole blocks, so rows move as bytes).
fn split_query_gate<'a>(q: &HostTensor<'a>, heads: usize, head_dim: usize) -> [HostTensor<'a>; 2] {
    let row_bytes = q.bytes.len() / (2 * heads * head_dim);
    let half = |second: usize| {
        let mut bytes = Vec::with_capacity(q.bytes.len() / 2);
        for h in 0..heads {
            let first_row = (2 * h + second) * head_dim;
            bytes.extend_from_slice(&q.bytes[first_row * row_bytes..(first_row + head_dim) * row_bytes]);
        }
        HostTensor { shape: vec![heads * head_dim, q.shape[1]], dtype: q.dtype, bytes: Cow::Owned(bytes) }
    };
    [half(0), half(1)]
}

impl GatedAttention {
    /// Layer `layer`'s attention: GGUF `blk.N.attn_{q,k,v,output,q_norm,k_norm}`, transformers
    /// `model.layers.N.self_attn.{q,k,v,o}_proj`, `q_norm`, `k_norm`.
    fn load(w: &Loader<'_>, c: &ModelConfig, layer: usize) -> Result<GatedAttention> {
        let checkpoint = w.source.checkpoint();
        let file = w.source.file();
        let name = |gguf: &str, hf: &str| layer_name(checkpoint, layer, gguf, &format!("self_attn.{hf}"));
        let (hidden, hd) = (c.hidden_size, c.head_dim);
        let (q_rows, kv_rows) = (c.num_heads * hd, c.num_kv_heads * hd);
        let q_name = name("attn_q.weight", "q_proj.weight");
        let [query, gate] = split_query_gate(&w.named_host(&q_name, &[2 * q_rows, hidden])?, c.num_heads, hd);
        let k = w.named_host(&name("attn_k.weight", "k_proj.weight"), &[kv_rows, hidden])?;
        let v = w.named_host(&name("attn_v.weight", "v_proj.weight"), &[kv_rows, hidden])?;
        // q, k and v run as one matmul when they share a format.
        let qkv = if query.dtype == k.dtype && k.dtype == v.dtype {
            let bytes = [&query.bytes[..], &k.bytes[..], &v.bytes[..]].concat();
            let fused = HostTensor { shape: vec![q_rows + 2 * kv_rows, hidden], dtype: k.dtype, bytes: bytes.into() };
            vec![upload_matrix(file, &format!("{q_name} (query rows)+k+v"), &fused, w.factory)?]
        } else {
            [&query, &k, &v].iter().map(|t| upload_matrix(file, &q_name, t, w.factory)).collect::<Result<_>>()?
        };
        Ok(GatedAttention {
            qkv: Linear { weights: qkv, bias: None },
            gate: Linear {
                weights: vec![upload_matrix(file, &format!("{q_name} (gate rows)"), &gate, w.factory)?],
                bias: None,
            },
            o: Linear {
                weights: vec![w.named_matrix(&name("attn_output.weight", "o_proj.weight"), &[hidden, q_rows])?],
                bias: None,
            },
            q_norm: norm_weight(w, &name("attn_q_norm.weight", "q_norm.weight"), hd)?,
            k_norm: norm_weight(w, &name("attn_k_norm.weight", "k_norm.weight"), hd)?,
        })
    }

    /// `a.proj = o(attention(rope(q), rope(k), v) · sigmoid(gate))` with q, k, v and the gate
    /// from `a.xn`, writing this step's K and V into `cache`.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        a: &Activations,
        inputs: &StepInputs<'_>,
        cache: &PagedKv<'_>,
        layout: QkvLayout,
        cos_sin: &GpuTensor,
        eps: f32,
    ) -> Result<()> {
        let gate = &a.delta_net()?.attn_gate;
        self.qkv.forward(ctx, rec, &a.xn, &a.qkv)?;
        self.gate.forward(ctx, rec, &a.xn, gate)?;
        head_rms_norm(ctx, rec, &a.qkv, layout, &self.q_norm, &self.k_norm, eps)?;
        let (positions, slots) = (inputs.positions, inputs.slots);
        rope_kv_write(ctx, rec, &a.qkv, layout, positions, cos_sin, RopePairing::Neox, slots, cache)?;
        let (tables, info, partials) = (inputs.block_tables, inputs.token_info, &a.attn_partials);
        let scale = 1.0 / (layout.head_dim as f32).sqrt();
        paged_attention(ctx, rec, &a.qkv, layout, cache, tables, info, &a.attn, partials, None, scale, None)?;
        sigmoid_mul(ctx, rec, &a.attn, gate)?;
        self.o.forward(ctx, rec, &a.attn, &a.proj)
    }
}

enum Mixer {
    // Boxed: both hold several tensors, and the layers are walked, not copied.
    Attention(Box<GatedAttention>),
    DeltaNet(Box<DeltaNet>),
}

struct Layer {
    input_norm: GpuTensor, // (hidden): 1 + w
    mixer: Mixer,
    post_norm: GpuTensor, // (hidden): 1 + w
    ffn: FeedForward,
}

pub struct Qwen35Model {
    config: ModelConfig,
    embed: GpuTensor, // (vocab, hidden)
    layers: Vec<Layer>,
    norm: GpuTensor,            // (hidden): 1 + w
    lm_head: Option<GpuTensor>, // (vocab, hidden); None when tied to `embed`
    cos_sin: GpuTensor,         // (max_positions, rope_dim / 2, 2)
}

/// Positions the rotation table covers at most (as for Llama).
const MAX_TABLE_POSITIONS: usize = 32768;

impl Qwen35Model {
    /// Upload every weight of `config`'s model from `source`, calling `progress(layers done,
    /// layers in all)` as layers arrive.
    pub fn load(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Qwen35Model> {
        let c = &config;
        let Some(shape) = c.delta_net else {
            return Err(WeftError::model(source.file(), "a Qwen3.5 model needs its Gated DeltaNet shape"));
        };
        let (hidden, inter) = (c.hidden_size, c.intermediate_size);
        // Qwen3_5(Moe)ForConditionalGeneration keeps the text model under model.language_model.
        let renamed = Renamed { source, rename: language_model_name };
        let wrapped = c.architecture == "qwen3_5" || c.architecture == "qwen3_5_moe";
        let source: &dyn WeightSource = if wrapped { &renamed } else { source };
        let w = Loader { source, factory };
        let checkpoint = source.checkpoint();
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            let mixer = if c.is_recurrent(i) {
                Mixer::DeltaNet(Box::new(DeltaNet::load(&w, shape, hidden, i)?))
            } else {
                Mixer::Attention(Box::new(GatedAttention::load(&w, c, i)?))
            };
            let name = |gguf: &str, hf: &str| layer_name(checkpoint, i, gguf, hf);
            layers.push(Layer {
                input_norm: norm_weight(&w, &name("attn_norm.weight", "input_layernorm.weight"), hidden)?,
                mixer,
                post_norm: norm_weight(
                    &w,
                    &name("post_attention_norm.weight", "post_attention_layernorm.weight"),
                    hidden,
                )?,
                ffn: match c.moe {
                    Some(moe) => {
                        let prefix = format!("model.layers.{i}.mlp");
                        FeedForward::Experts(Box::new(MoeMlp::load(&w, moe, hidden, i, HfExperts::PerExpert(&prefix))?))
                    }
                    None => FeedForward::Dense(Mlp {
                        gate_up: w.linear(i, &[(Part::Gate, inter), (Part::Up, inter)], None, hidden)?,
                        down: w.linear(i, &[(Part::Down, hidden)], None, inter)?,
                        gate: Gate::Silu,
                    }),
                },
            });
            progress(i + 1, c.num_layers);
        }
        let embed = w.matrix(None, Part::Q, &[c.vocab_size, hidden])?;
        let norm_name = match checkpoint {
            Checkpoint::Gguf => "output_norm.weight",
            Checkpoint::HuggingFace => "model.norm.weight",
        };
        let norm = norm_weight(&w, norm_name, hidden)?;
        let lm_head =
            if c.tie_word_embeddings { None } else { w.optional_matrix(None, Part::O, &[c.vocab_size, hidden])? };
        let positions = c.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let cos_sin = factory.upload_f32(&[positions, c.rope_dim() / 2, 2], &c.rope_table(positions, positions))?;
        Ok(Qwen35Model { config, embed, layers, norm, lm_head, cos_sin })
    }
}

impl Architecture for Qwen35Model {
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
                rms_norm(ctx, rec, &a.x, &layer.input_norm, &a.xn, eps)?;
            } else {
                // The previous layer's MLP residual, then this layer's first norm.
                add_rms_norm(ctx, rec, &a.x, &a.proj, &layer.input_norm, &a.xn, eps)?;
            }
            match &layer.mixer {
                Mixer::Attention(attention) => {
                    attention.forward(ctx, rec, a, inputs, &kv.layer(i)?, layout, &self.cos_sin, eps)?
                }
                Mixer::DeltaNet(delta) => delta.forward(ctx, rec, a, inputs, kv.states()?.layer(i)?, eps)?,
            }
            add_rms_norm(ctx, rec, &a.x, &a.proj, &layer.post_norm, &a.xn, eps)?;
            layer.ffn.forward(ctx, rec, a, None)?;
        }
        add_rms_norm(ctx, rec, &a.x, &a.proj, &self.norm, &a.xn, eps)?;
        // Only the sampled rows need logits: gather those rows, then the LM head.
        embedding(ctx, rec, &a.xn, inputs.logit_rows, &a.rows)?;
        matmul(ctx, rec, &a.rows, self.lm_head.as_ref().unwrap_or(&self.embed), logits)
    }
}
