//! Gemma 4 (text) as one forward pass recorded on the GPU, from llama.cpp's GGUF layout or a
//! Hugging Face directory (`gemma4_text`), with the small "E" models' per-layer embeddings and
//! KV sharing, and the 26B A4B's mixture-of-experts layers.
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
//! In a mixture-of-experts layer (`enable_moe_block`) the dense MLP is one of two branches,
//! each with its own norms, that meet before `post_ffw_norm`:
//!
//! ```text
//! m = post_ffw_norm_1(down(gelu_tanh(gate(ffn_norm(h))) · up(ffn_norm(h))))
//! p = softmax(router(rms_norm(h) · router_scale / √hidden));  e_1 … e_k = the k largest p
//! w_s = p[e_s] / Σ p[e_s] · per_expert_scale[e_s]
//! r = post_ffw_norm_2(Σ_s w_s · down_{e_s}(gelu_tanh(gate_{e_s}(n)) · up_{e_s}(n))),  n = pre_ffw_norm_2(h)
//! h = h + post_ffw_norm(m + r)
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
//! The experts run as every MoE model's do ([`MoeMlp`]): the router's own input norm is an
//! RMSNorm whose weight is router_scale / √hidden, and the per-expert scales (llama.cpp's
//! `ffn_down_exps.scale`) multiply the routing weights.

use crate::error::{Result, WeftError};
use crate::gpu::kernels::elementwise::{add, scale, softcap};
use crate::gpu::kernels::embedding::embedding;
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::paged::{PagedKv, QkvLayout, paged_attention, rope_kv_write};
use crate::gpu::kernels::reduce::{QkvPart, add_rms_norm, head_rms_norm, qkv_part_rms_norm, rms_norm};
use crate::gpu::kernels::rope::{RopePairing, cos_sin_table, inv_freq};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::Architecture;
use crate::model::arch::per_layer::{PerLayerBranch, PerLayerInputs, own_name};
use crate::model::config::{Gemma4Config, ModelConfig};
use crate::model::kv_pool::KvPool;
use crate::model::layers::{Activations, Gate, HfExperts, Linear, Mlp, MoeMlp, StepInputs};
use crate::model::weights::{Loader, Part, WeightSource};
use crate::tensor::TensorFactory;

/// A layer's attention: q (and, where the layer keeps its own cache, k and v) side by side.
struct Attention {
    qkv: Linear, // q, k, v (v = k's projection where keys serve as values); q alone in a KV-sharing layer
    o: Linear,
    q_norm: GpuTensor,         // (head_dim)
    k_norm: Option<GpuTensor>, // (head_dim); `None` in a KV-sharing layer
}

/// A mixture-of-experts layer's routed experts and the norms around them and the dense MLP.
struct Experts {
    router_norm: GpuTensor,   // (hidden): router_scale / √hidden, the router's input norm weight
    pre_norm: GpuTensor,      // (hidden): pre_ffw_norm_2, the experts' input norm
    moe: MoeMlp,              // router, experts, per-expert scales
    mlp_post_norm: GpuTensor, // (hidden): post_ffw_norm_1, the dense MLP's output norm
    post_norm: GpuTensor,     // (hidden): post_ffw_norm_2, the experts' output norm
}

struct Layer {
    attn_norm: GpuTensor, // (hidden)
    attention: Attention,
    post_attn_norm: GpuTensor, // (hidden)
    ffn_norm: GpuTensor,       // (hidden)
    mlp: Mlp,
    post_ffn_norm: GpuTensor, // (hidden)
    experts: Option<Experts>,
    per_layer: Option<PerLayerBranch>,
    /// The layer's output scale (`layer_scalar`; 1 skips the dispatch).
    scalar: f32,
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
            let per_layer = if per_layer > 0 { Some(PerLayerBranch::load(&w, i, hidden, per_layer)?) } else { None };
            let experts = match c.moe {
                Some(moe) => {
                    let vector = |gguf, hf| -> Result<GpuTensor> {
                        factory.upload_f32(&[hidden], &w.named_values(&named(Some(i), gguf, hf), hidden)?)
                    };
                    let root = (hidden as f64).powf(-0.5) as f32;
                    let router_scale = w.named_values(&named(Some(i), "ffn_gate_inp.scale", "router.scale"), hidden)?;
                    let router_norm: Vec<f32> = router_scale.iter().map(|s| s * root).collect();
                    Some(Experts {
                        router_norm: factory.upload_f32(&[hidden], &router_norm)?,
                        pre_norm: vector("pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight")?,
                        moe: MoeMlp::load(&w, moe, hidden, i, HfExperts::Gemma4(&format!("model.layers.{i}")))?,
                        mlp_post_norm: vector("post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight")?,
                        post_norm: vector("post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight")?,
                    })
                }
                None => None,
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
                experts,
                per_layer,
                scalar,
            });
            progress(i + 1, c.num_layers);
        }
        let per_layer = if per_layer > 0 {
            Some(PerLayerInputs::load(&w, c.num_layers, hidden, per_layer, g.per_layer_vocab_size)?)
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
        if let (Some(p), Some(buffers)) = (&self.per_layer, &a.per_layer) {
            p.record(ctx, rec, inputs, &a.x, buffers, eps)?;
        }
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

            // The MLP (beside the experts in a mixture-of-experts layer).
            add_rms_norm(ctx, rec, &la.x, &la.normed, &layer.ffn_norm, &la.xn, eps)?;
            layer.mlp.forward(ctx, rec, &la, None)?;
            let ffn_out = match &layer.experts {
                None => {
                    rms_norm(ctx, rec, &la.proj, &layer.post_ffn_norm, &la.normed, eps)?;
                    &la.normed
                }
                Some(e) => {
                    rms_norm(ctx, rec, &la.proj, &e.mlp_post_norm, &la.normed, eps)?;
                    // a.proj is free until the experts' sum: it holds the router's input.
                    rms_norm(ctx, rec, &la.x, &e.router_norm, &la.proj, eps)?;
                    rms_norm(ctx, rec, &la.x, &e.pre_norm, &la.xn, eps)?;
                    e.moe.forward_routed_by(ctx, rec, &la, &la.proj)?;
                    rms_norm(ctx, rec, &la.proj, &e.post_norm, &la.xn, eps)?;
                    // The two branches summed, then the layer's post-norm.
                    add_rms_norm(ctx, rec, &la.normed, &la.xn, &layer.post_ffn_norm, &la.proj, eps)?;
                    &la.proj
                }
            };
            add(ctx, rec, &la.x, ffn_out)?;

            // The per-layer embedding's branch.
            if let (Some(branch), Some(buffers)) = (&layer.per_layer, &la.per_layer) {
                branch.record(ctx, rec, i, &la.x, buffers, &la.proj, &la.normed, eps)?;
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
