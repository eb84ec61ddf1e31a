//! Gemma 4 (text) as one forward pass recorded on the GPU, from llama.cpp's GGUF layout or a
//! Hugging Face directory (`gemma4_text`), with the small "E" models' per-layer embeddings and
//! KV sharing.
//!
//! Reference: transformers' `models/gemma4/modeling_gemma4.py` (`Gemma4ForCausalLM`) and
//! llama.cpp's `src/models/gemma4.cpp`. Before the layers, from the token embeddings scaled by
//! √hidden (`x`) and a second table of per-layer embeddings (`per_layer_token_embd`, layers ·
//! per_layer wide):
//!
//! ```text
//! ple = (rms_norm_per_layer(per_layer_model_proj(x) / √hidden) + per_layer_token_embd[t] · √per_layer) / √2
//! ```
//!
//! Each layer i is
//!
//! ```text
//! h = x + post_attn_norm(o(attention(rope(q_norm(q(norm(x)))), rope(k_norm(k(…))), v_norm(v(…)))))
//! h = h + post_ffw_norm(down(gelu_tanh(gate(ffn_norm(h))) · up(ffn_norm(h))))
//! h = h + post_norm(proj(gelu_tanh(inp_gate(h)) · ple[i]))            (per-layer embeddings)
//! x = h · layer_scalar
//! ```
//!
//! and the logits are cap · tanh(lm_head(norm(x)) / cap) with the final soft-cap. Unlike Gemma 3
//! every norm multiplies by w itself (both checkpoints store w), v_norm has no weight, and
//! attention is unscaled (q_norm does it). Sliding-window layers and full-attention layers have
//! their own head size, KV heads and RoPE: the sliding ones rotate whole heads with their own
//! base, the full ones "proportional" RoPE, where only the first `global_rope_angles` angle pairs
//! turn and the rest stay at angle 0 (llama.cpp writes 1e30 frequency divisors for them). A full
//! layer may take its keys' projection as its values (`attention_k_eq_v`; still v-normed, not
//! k-normed or rotated). The last `num_kv_shared_layers` layers have no k/v projections: each
//! attends over the KV cache of the last earlier layer of its kind (`Gemma4Config::kv_sources`), so it neither writes a cache
//! nor owns one (`ModelConfig::kv_source`, `kv_shape`); those layers' MLPs may be twice as wide
//! (`use_double_wide_mlp`). RoPE pairs (i, i + head_dim/2), as Gemma's checkpoints keep them.
//! Gemma 4's mixture-of-experts layers are refused when the config is read.

use crate::error::{Result, WeftError};
use crate::gpu::kernels::elementwise::{add, gelu_mul_at, scale, softcap};
use crate::gpu::kernels::embedding::{embedding, embedding_scaled};
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::paged::{PagedKv, QkvLayout, paged_attention, rope_kv_write};
use crate::gpu::kernels::reduce::{QkvPart, add_rms_norm, head_rms_norm, qkv_part_rms_norm, rms_norm};
use crate::gpu::kernels::rope::{RopePairing, cos_sin_table, inv_freq};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::Architecture;
use crate::model::config::{Gemma4Config, ModelConfig};
use crate::model::kv_pool::KvPool;
use crate::model::layers::{Activations, Gate, Linear, Mlp, StepInputs};
use crate::model::weights::{Checkpoint, Loader, Part, WeightSource};
use crate::tensor::TensorFactory;

/// A layer's attention: q (and, where the layer keeps its own cache, k and v) side by side.
struct Attention {
    qkv: Linear, // q, k, v (v = k's projection where keys serve as values); q alone in a KV-sharing layer
    o: Linear,
    q_norm: GpuTensor,         // (head_dim)
    k_norm: Option<GpuTensor>, // (head_dim); `None` in a KV-sharing layer
}

/// A layer's per-layer-embedding branch.
struct PerLayerBranch {
    gate: GpuTensor, // (per_layer, hidden): inp_gate
    proj: GpuTensor, // (hidden, per_layer)
    norm: GpuTensor, // (hidden): post_norm
}

struct Layer {
    attn_norm: GpuTensor, // (hidden)
    attention: Attention,
    post_attn_norm: GpuTensor, // (hidden)
    ffn_norm: GpuTensor,       // (hidden)
    mlp: Mlp,
    post_ffn_norm: GpuTensor, // (hidden)
    per_layer: Option<PerLayerBranch>,
    /// The layer's output scale (`layer_scalar`; 1 skips the dispatch).
    scalar: f32,
}

/// The model-level half of the per-layer embeddings.
struct PerLayerInputs {
    embed: GpuTensor,      // (per_layer_vocab, layers · per_layer): per_layer_token_embd, any format
    model_proj: GpuTensor, // (layers · per_layer, hidden)
    proj_norm: GpuTensor,  // (per_layer)
}

pub struct Gemma4Model {
    config: ModelConfig,
    embed: GpuTensor,           // (vocab, hidden)
    lm_head: Option<GpuTensor>, // (vocab, hidden) when untied; else the embedding
    layers: Vec<Layer>,
    per_layer: Option<PerLayerInputs>,
    norm: GpuTensor,           // (hidden)
    global_cos_sin: GpuTensor, // (positions, global_head_dim / 2, 2): full layers, proportional
    local_cos_sin: GpuTensor,  // (positions, head_dim / 2, 2): sliding-window layers
    ones: GpuTensor,           // (head_dim): v_norm's weight in sliding layers
    global_ones: GpuTensor,    // (global_head_dim): in full layers
}

/// Positions the RoPE tables cover at most.
const MAX_TABLE_POSITIONS: usize = 32768;

/// Workgroups one dimension of a dispatch holds (row kernels take one per row).
const MAX_WORKGROUPS: usize = 65535;

/// A checkpoint's name of a Gemma 4 tensor the `Part` table does not hold: (GGUF, Hugging Face)
/// suffixes of layer `layer`'s tensor, or of a model-level one.
fn own_name(checkpoint: Checkpoint, layer: Option<usize>, gguf: &str, hf: &str) -> String {
    match (checkpoint, layer) {
        (Checkpoint::Gguf, Some(i)) => format!("blk.{i}.{gguf}"),
        (Checkpoint::Gguf, None) => gguf.to_string(),
        (Checkpoint::HuggingFace, Some(i)) => format!("model.layers.{i}.{hf}"),
        (Checkpoint::HuggingFace, None) => format!("model.{hf}"),
    }
}

impl Gemma4Model {
    /// Upload every weight of `config`'s model from `source`, calling `progress(layers done,
    /// layers in all)` as layers arrive.
    pub fn load(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Gemma4Model> {
        let g: Gemma4Config = config
            .gemma4
            .clone()
            .ok_or_else(|| WeftError::model(source.file(), "a gemma4 model without its Gemma 4 configuration"))?;
        let c = &config;
        let hidden = c.hidden_size;
        let w = Loader { source, factory };
        let named = |layer, gguf, hf| own_name(source.checkpoint(), layer, gguf, hf);
        let per_layer = g.per_layer_input_size;
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            let (kv_heads, head_dim) = c.attention_shape(i);
            let (q_rows, kv_rows) = (c.num_heads * head_dim, kv_heads * head_dim);
            let shares = c.kv_source(i) != i;
            let values = if g.k_eq_v && !g.sliding[i] { Part::K } else { Part::V };
            let qkv: &[(Part, usize)] =
                if shares { &[(Part::Q, q_rows)] } else { &[(Part::Q, q_rows), (Part::K, kv_rows), (values, kv_rows)] };
            let inter = c.layer_intermediate_size(i);
            let norm = |part| w.vector(Some(i), part, hidden);
            let per_layer = if per_layer > 0 {
                Some(PerLayerBranch {
                    gate: w.named_matrix(
                        &named(Some(i), "inp_gate.weight", "per_layer_input_gate.weight"),
                        &[per_layer, hidden],
                    )?,
                    proj: w.named_matrix(
                        &named(Some(i), "proj.weight", "per_layer_projection.weight"),
                        &[hidden, per_layer],
                    )?,
                    norm: factory.upload_f32(
                        &[hidden],
                        &w.named_values(
                            &named(Some(i), "post_norm.weight", "post_per_layer_input_norm.weight"),
                            hidden,
                        )?,
                    )?,
                })
            } else {
                None
            };
            let scalar = named(Some(i), "layer_output_scale.weight", "layer_scalar");
            let scalar = if source.get_source(&scalar)?.is_some() { w.named_values(&scalar, 1)?[0] } else { 1.0 };
            layers.push(Layer {
                attn_norm: norm(Part::AttnNorm)?,
                attention: Attention {
                    qkv: w.linear(i, qkv, None, hidden)?,
                    o: w.linear(i, &[(Part::O, hidden)], None, q_rows)?,
                    q_norm: w.vector(Some(i), Part::QNorm, head_dim)?,
                    k_norm: if shares { None } else { Some(w.vector(Some(i), Part::KNorm, head_dim)?) },
                },
                post_attn_norm: norm(Part::PostAttnNorm)?,
                ffn_norm: norm(Part::PreFfnNorm)?,
                mlp: Mlp {
                    gate_up: w.linear(i, &[(Part::Gate, inter), (Part::Up, inter)], None, hidden)?,
                    down: w.linear(i, &[(Part::Down, hidden)], None, inter)?,
                    gate: Gate::GeluTanh,
                },
                post_ffn_norm: norm(Part::PostFfnNorm)?,
                per_layer,
                scalar,
            });
            progress(i + 1, c.num_layers);
        }
        let per_layer = if per_layer > 0 {
            let all = c.num_layers * per_layer;
            Some(PerLayerInputs {
                embed: w.named_matrix(
                    &named(None, "per_layer_token_embd.weight", "embed_tokens_per_layer.weight"),
                    &[g.per_layer_vocab_size, all],
                )?,
                model_proj: w.named_matrix(
                    &named(None, "per_layer_model_proj.weight", "per_layer_model_projection.weight"),
                    &[all, hidden],
                )?,
                proj_norm: factory.upload_f32(
                    &[per_layer],
                    &w.named_values(
                        &named(None, "per_layer_proj_norm.weight", "per_layer_projection_norm.weight"),
                        per_layer,
                    )?,
                )?,
            })
        } else {
            None
        };
        let embed = w.matrix(None, Part::Q, &[c.vocab_size, hidden])?;
        let lm_head =
            if c.tie_word_embeddings { None } else { w.optional_matrix(None, Part::O, &[c.vocab_size, hidden])? };
        let norm = w.vector(None, Part::AttnNorm, hidden)?;
        let positions = c.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let local = inv_freq(c.head_dim, c.rope_local_theta.unwrap_or(c.rope_theta));
        // Proportional RoPE: the first angles turn as plain RoPE over the whole head would;
        // the rest have frequency 0 (cos 1, sin 0: the dimensions pass through).
        let mut global = inv_freq(g.global_head_dim, c.rope_theta);
        global[g.global_rope_angles..].fill(0.0);
        let table = |freqs: &[f32]| factory.upload_f32(&[positions, freqs.len(), 2], &cos_sin_table(freqs, positions));
        Ok(Gemma4Model {
            embed,
            lm_head,
            layers,
            per_layer,
            norm,
            global_cos_sin: table(&global)?,
            local_cos_sin: table(&local)?,
            ones: factory.upload_f32(&[c.head_dim], &vec![1.0; c.head_dim])?,
            global_ones: factory.upload_f32(&[g.global_head_dim], &vec![1.0; g.global_head_dim])?,
            config,
        })
    }

    /// Every layer's per-layer input, side by side in `a.per_layer.inputs` (tokens, layers ·
    /// per_layer), from `a.x` (the scaled token embeddings) and the per-layer token table.
    fn record_per_layer_inputs(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        inputs: &StepInputs<'_>,
        a: &Activations,
    ) -> Result<()> {
        let (Some(p), Some(buffers)) = (&self.per_layer, &a.per_layer) else { return Ok(()) };
        let c = &self.config;
        let per_layer = p.proj_norm.shape()[0];
        matmul(ctx, rec, &a.x, &p.model_proj, &buffers.scratch)?;
        scale(ctx, rec, &buffers.scratch, (c.hidden_size as f64).powf(-0.5) as f32)?;
        // Each layer's slice normed on its own, as rows of per_layer: tokens · layers rows, a
        // workgroup each, so a long prefill takes several dispatches of at most 65535.
        let tokens_per_dispatch = (MAX_WORKGROUPS / c.num_layers).max(1);
        let tokens = a.x.shape()[0];
        for first in (0..tokens).step_by(tokens_per_dispatch) {
            let range = first..(first + tokens_per_dispatch).min(tokens);
            let rows = [range.len() * c.num_layers, per_layer];
            let (x, y) = (buffers.scratch.slice_rows(range.clone())?, buffers.inputs.slice_rows(range)?);
            rms_norm(ctx, rec, &x.reshape(&rows)?, &p.proj_norm, &y.reshape(&rows)?, c.rms_norm_eps)?;
        }
        let token_scale = (per_layer as f64).sqrt() as f32;
        embedding_scaled(ctx, rec, &p.embed, inputs.token_ids, &buffers.scratch, token_scale)?;
        add(ctx, rec, &buffers.inputs, &buffers.scratch)?;
        scale(ctx, rec, &buffers.inputs, std::f64::consts::FRAC_1_SQRT_2 as f32)
    }
}

impl Architecture for Gemma4Model {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn max_context(&self) -> usize {
        self.local_cos_sin.shape()[0]
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
        let eps = c.rms_norm_eps;
        embedding(ctx, rec, &self.embed, inputs.token_ids, &a.x)?;
        scale(ctx, rec, &a.x, (c.hidden_size as f32).sqrt())?;
        self.record_per_layer_inputs(ctx, rec, inputs, a)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let (num_kv_heads, head_dim) = c.attention_shape(i);
            let layout = QkvLayout { num_heads: c.num_heads, num_kv_heads, head_dim };
            let la = a.for_layer(layout, c.layer_intermediate_size(i))?;
            let sliding = c.is_sliding(i);

            // Attention, over this layer's cache or the one it shares.
            rms_norm(ctx, rec, &la.x, &layer.attn_norm, &la.xn, eps)?;
            let attn = &layer.attention;
            attn.qkv.forward(ctx, rec, &la.xn, &la.qkv)?;
            let cache = kv.layer(c.kv_source(i))?;
            let written = match &attn.k_norm {
                Some(k_norm) => {
                    head_rms_norm(ctx, rec, &la.qkv, layout, &attn.q_norm, k_norm, eps)?;
                    let ones = if sliding { &self.ones } else { &self.global_ones };
                    qkv_part_rms_norm(ctx, rec, &la.qkv, layout, QkvPart::Value, ones, eps)?;
                    cache
                }
                None => {
                    qkv_part_rms_norm(ctx, rec, &la.qkv, layout, QkvPart::Query, &attn.q_norm, eps)?;
                    // No slot is in a view of none: only the queries rotate, nothing is written.
                    PagedKv { num_slots: 0, ..cache }
                }
            };
            let cos_sin = if sliding { &self.local_cos_sin } else { &self.global_cos_sin };
            let pairing = RopePairing::Neox;
            rope_kv_write(ctx, rec, &la.qkv, layout, inputs.positions, cos_sin, pairing, inputs.slots, &written)?;
            let (tables, info, window) = (inputs.block_tables, inputs.token_info, c.sliding_window.filter(|_| sliding));
            let (out, partials) = (&la.attn, &la.attn_partials);
            paged_attention(ctx, rec, &la.qkv, layout, &cache, tables, info, out, partials, window, 1.0, None)?;
            attn.o.forward(ctx, rec, &la.attn, &la.proj)?;
            rms_norm(ctx, rec, &la.proj, &layer.post_attn_norm, &la.normed, eps)?;

            // The MLP.
            add_rms_norm(ctx, rec, &la.x, &la.normed, &layer.ffn_norm, &la.xn, eps)?;
            layer.mlp.forward(ctx, rec, &la, None)?;
            rms_norm(ctx, rec, &la.proj, &layer.post_ffn_norm, &la.normed, eps)?;
            add(ctx, rec, &la.x, &la.normed)?;

            // The per-layer embedding's branch.
            if let (Some(branch), Some(buffers)) = (&layer.per_layer, &la.per_layer) {
                matmul(ctx, rec, &la.x, &branch.gate, &buffers.gate)?;
                gelu_mul_at(ctx, rec, &buffers.gate, &buffers.inputs, i * buffers.gate.shape()[1])?;
                matmul(ctx, rec, &buffers.gate, &branch.proj, &la.proj)?;
                rms_norm(ctx, rec, &la.proj, &branch.norm, &la.normed, eps)?;
                add(ctx, rec, &la.x, &la.normed)?;
            }
            if layer.scalar != 1.0 {
                scale(ctx, rec, &la.x, layer.scalar)?;
            }
        }
        rms_norm(ctx, rec, &a.x, &self.norm, &a.xn, eps)?;
        // Only the sampled rows need logits: gather those rows, then the LM head.
        embedding(ctx, rec, &a.xn, inputs.logit_rows, &a.rows)?;
        matmul(ctx, rec, &a.rows, self.lm_head.as_ref().unwrap_or(&self.embed), logits)?;
        match c.gemma4.as_ref().and_then(|g| g.final_logit_softcapping) {
            Some(cap) => softcap(ctx, rec, logits, cap),
            None => Ok(()),
        }
    }
}
