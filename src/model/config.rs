//! The hyper-parameters of a model, read from GGUF metadata or a Hugging Face `config.json`,
//! and the RoPE frequencies they imply. One `ModelConfig` serves every architecture; fields an
//! architecture does not use keep their neutral values.

use serde_json::Value;

use crate::error::{Result, WeftError};
use crate::model::arch::{SUPPORTED, unsupported};
use crate::model::gguf::GgufFile;

pub use crate::gpu::kernels::moe::Routing;

/// How positions stretch beyond the trained context.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor` (all frequencies scaled alike).
    Linear { factor: f32 },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_max_position_embeddings: usize },
    /// Per-frequency divisors, as GGUF stores Llama 3 scaling (`rope_freqs.weight`).
    FreqFactors(Vec<f32>),
    /// Phi-3's LongRoPE: per-frequency divisors for contexts up to the original one (`short`)
    /// and beyond it (`long`), and cos/sin multiplied by `attention_factor`. A model serving
    /// more than `original_max_position_embeddings` positions uses the long factors for every
    /// position, as llama.cpp decides per context (transformers switches per forward pass once
    /// a position passes the original context; the two agree whenever a sequence stays on one
    /// side of it).
    LongRope { short: Vec<f32>, long: Vec<f32>, original_max_position_embeddings: usize, attention_factor: f32 },
    /// YaRN (transformers' `_compute_yarn_parameters`, llama.cpp's `rope_yarn`): each
    /// frequency blended between itself (extrapolation) and itself / `factor` (interpolation)
    /// by a linear ramp over the dimensions between the ones that turn `beta_fast` and
    /// `beta_slow` times over the original context, and cos/sin multiplied by
    /// `attention_factor` (0.1 · ln(factor) + 1 unless the checkpoint names one).
    Yarn {
        factor: f32,
        original_max_position_embeddings: usize,
        beta_fast: f32,
        beta_slow: f32,
        /// Whether the ramp's ends are rounded outwards to whole dimensions (transformers'
        /// `truncate`, true unless a checkpoint says otherwise; llama.cpp always rounds).
        truncate: bool,
        attention_factor: f32,
    },
}

/// YaRN's magnitude scale (the paper's eq. 21, transformers' `yarn_get_mscale`):
/// 0.1 · mscale · ln(scale) + 1 for scale > 1, else 1.
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 { 1.0 } else { 0.1 * mscale * scale.ln() + 1.0 }
}

/// YaRN's inverse frequencies for `dim` rotated dimensions, as transformers computes them (f32
/// tensors, the correction range in f64).
fn yarn_inv_freq(
    dim: usize,
    theta: f32,
    factor: f32,
    original: usize,
    beta_fast: f32,
    beta_slow: f32,
    truncate: bool,
) -> Vec<f32> {
    let correction_dim = |rotations: f64| {
        dim as f64 * (original as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * f64::from(theta).ln())
    };
    let (mut low, mut high) = (correction_dim(f64::from(beta_fast)), correction_dim(f64::from(beta_slow)));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0) as f32, high.min(dim as f64 - 1.0) as f32);
    if low == high {
        high += 0.001; // transformers' guard against a zero-width ramp
    }
    (0..dim / 2)
        .map(|i| {
            let pos_freq = theta.powf((2 * i) as f32 / dim as f32);
            let (extrapolation, interpolation) = (1.0 / pos_freq, 1.0 / (factor * pos_freq));
            let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolation_factor = 1.0 - ramp;
            interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
        })
        .collect()
}

/// LongRoPE's default attention factor (transformers' and llama.cpp's converter's):
/// sqrt(1 + ln(scale) / ln(original)) for scale = context / original > 1, else 1.
pub fn longrope_attention_factor(context: usize, original: usize) -> f32 {
    let scale = context as f64 / original as f64;
    if scale <= 1.0 { 1.0 } else { (1.0 + scale.ln() / (original as f64).ln()).sqrt() as f32 }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// "llama", "mistral", "qwen2", … (GGUF `general.architecture` or HF `model_type`).
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// The leading dimensions of each query and key head that RoPE rotates, when fewer than
    /// `head_dim` (Phi-4-mini: 96 of 128; llama.cpp's `rope.dimension_count`, transformers'
    /// head_dim · `partial_rotary_factor`); the rest pass through. `None`: the whole head.
    pub rotary_dim: Option<usize>,
    /// The norms' epsilon: RMSNorm's, or a BERT's LayerNorms'.
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2).
    pub attention_bias: bool,
    /// Attend only to this many most recent positions (Mistral; Gemma 3's local layers).
    pub sliding_window: Option<usize>,
    /// RMSNorm over each query and key head before RoPE (Qwen3, Gemma 3: `q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// With a sliding window, every `n`-th layer (layer i with (i + 1) % n == 0) attends
    /// globally instead (Gemma 3: 6); `None`: every layer uses the window.
    pub sliding_window_pattern: Option<usize>,
    /// The RoPE base of the sliding-window layers when it is not `rope_theta` (Gemma 3: 10000).
    pub rope_local_theta: Option<f32>,
    /// Queries scaled by query_pre_attn_scalar^-1/2 instead of head_dim^-1/2 (Gemma).
    pub query_pre_attn_scalar: Option<f32>,
    /// The Mamba2 mixer's shape, for models with state-space layers (mamba2, granitehybrid).
    pub ssm: Option<SsmConfig>,
    /// Granite 4.0-H, LFM2: which layers attend.
    pub hybrid: Option<HybridConfig>,
    /// LFM2: the window of its short convolutions (transformers' `conv_L_cache`, llama.cpp's
    /// `shortconv.l_cache`) over hidden_size channels, in every layer that does not attend.
    pub short_conv: Option<usize>,
    /// Qwen3.5: the shape of its Gated DeltaNet layers, every layer that does not attend.
    pub delta_net: Option<DeltaNetConfig>,
    /// Granite's four multipliers (Granite 3.x dense, Granite 4.0-H); `None`: all neutral.
    pub multipliers: Option<Multipliers>,
    /// Layers whose attention rotates nothing (NoPE: SmolLM3's every fourth layer, transformers'
    /// `no_rope_layers` 0s); empty: every layer uses RoPE.
    pub no_rope_layers: Vec<usize>,
    /// How an embedding model pools its hidden states (GGUF `{arch}.pooling_type`, or
    /// `EngineBuilder::pooling`); `None`: a generation-only model, which serves no embeddings.
    pub pooling: Option<Pooling>,
    /// The routed experts of a mixture-of-experts model (qwen3moe), in every layer; `None`: a
    /// dense model.
    pub moe: Option<MoeConfig>,
    /// What Gemma 4 adds (per-layer embeddings, KV sharing, full layers of their own shape);
    /// `None` for every other architecture.
    pub gemma4: Option<Gemma4Config>,
}

/// Gemma 4's text model beyond Gemma 3's shape (transformers' `Gemma4TextConfig`, llama.cpp's
/// `gemma4`): `ModelConfig::head_dim`, `num_kv_heads`, `rope_local_theta` describe its
/// sliding-window layers; its full-attention layers have their own head size and KV heads.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma4Config {
    /// Per layer: whether it attends within the sliding window (else over the whole context).
    pub sliding: Vec<bool>,
    /// The full-attention layers' head size (`global_head_dim`) and KV heads.
    pub global_head_dim: usize,
    pub global_kv_heads: usize,
    /// Full layers' values are their keys' projection (`attention_k_eq_v`: no v_proj).
    pub k_eq_v: bool,
    /// Angle pairs of a full layer's head that rotate (proportional RoPE: the first
    /// partial_rotary_factor · global_head_dim / 2); the rest keep angle 0.
    pub global_rope_angles: usize,
    /// Per layer, the layer whose KV cache it attends over: itself, or for the last
    /// `num_kv_shared_layers` (which have no k/v projections) the last earlier layer of their
    /// kind ([`gemma4_kv_sources`]).
    pub kv_sources: Vec<usize>,
    /// Each layer's MLP width (`use_double_wide_mlp` doubles the KV-sharing layers').
    pub intermediate_sizes: Vec<usize>,
    /// Per-layer embeddings: each layer's width (`hidden_size_per_layer_input`, 0: none) and
    /// the rows of their token table.
    pub per_layer_input_size: usize,
    pub per_layer_vocab_size: usize,
    /// Logits become cap · tanh(logits / cap).
    pub final_logit_softcapping: Option<f32>,
    /// What Gemma 3n adds on this shape (architecture "gemma3n"); `None` for Gemma 4.
    pub gemma3n: Option<Gemma3nConfig>,
}

/// Gemma 3n's text model beyond what it shares with Gemma 4's "E" models (transformers'
/// `Gemma3nTextConfig`, llama.cpp's `gemma3n`): AltUp, Laurel and activation sparsity. Read by
/// `model::arch::gemma3n`, which explains each.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3nConfig {
    /// AltUp's parallel copies of the hidden state (`altup_num_inputs`) and the one the layers
    /// compute on (`altup_active_idx`).
    pub altup_num_inputs: usize,
    pub altup_active_idx: usize,
    /// The corrected active stream is scaled by `correct_output_scale` before the per-layer
    /// branch (`altup_correct_scale`).
    pub altup_correct_scale: bool,
    /// Laurel's low-rank residual width.
    pub laurel_rank: usize,
    /// Per layer, the standard deviations above the mean of its MLP gate's row below which the
    /// gate is cut (the normal quantile of `activation_sparsity_pattern`); `None`: no sparsity.
    pub sparsity_std_multipliers: Vec<Option<f32>>,
}

/// A mixture-of-experts layer's shape and routing (llama.cpp's `expert_*` keys, transformers'
/// `Qwen3MoeConfig`, `GptOssConfig`, Granite MoE configs): each token goes through
/// `experts_per_token` experts chosen and weighted by `routing` from the router's logits, each
/// a gated MLP of `expert_intermediate_size`, their outputs weighted and summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub experts_per_token: usize,
    pub expert_intermediate_size: usize,
    /// Softmax then top-k (Qwen3-MoE, renormalised by `norm_topk_prob`), or top-k logits then
    /// their softmax (gpt-oss, Granite MoE).
    pub routing: Routing,
    /// The experts' gate.
    pub gate: ExpertGate,
    /// The width of a shared expert, a SwiGLU MLP every token runs beside its routed experts,
    /// its output added to theirs (Granite MoE's `shared_mlp`); 0: none.
    pub shared_expert_size: usize,
    /// The shared expert's output is scaled per token by sigmoid(x · g) of a one-row gate g
    /// before it joins the experts' (Qwen3.5-MoE's `shared_expert_gate`, llama.cpp's
    /// `ffn_gate_inp_shexp`); false: added as it is.
    pub shared_expert_gated: bool,
    /// The first layers keep a dense MLP of `ModelConfig::intermediate_size` (LFM2-MoE's
    /// `num_dense_layers`); every later layer routes.
    pub leading_dense_layers: usize,
}

/// The gate of a mixture-of-experts model's experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertGate {
    /// silu(gate) · up (Qwen3-MoE, Granite MoE).
    Silu,
    /// gpt-oss's clamped SwiGLU, `cpu::moe::swiglu_oai` (alpha 1.702, limit 7).
    SwigluOai,
    /// gelu_tanh(gate) · up (Gemma 4's experts, as its dense MLP).
    GeluTanh,
}

/// How the final hidden states of a prompt become one embedding (llama.cpp's
/// `LLAMA_POOLING_TYPE_*`, sentence-transformers' `Pooling` modes). The vector is then L2
/// normalised, as sentence-transformers' `Normalize` and llama.cpp's server do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The last token's state (Qwen3-Embedding: a causal model's last position has seen the
    /// whole prompt).
    Last,
    /// The first token's state, `[CLS]` (bge): an encoder's first position sees the whole prompt.
    Cls,
    /// The mean of every token's state, `[CLS]` and `[SEP]` included (all-MiniLM, nomic), as
    /// sentence-transformers averages over the attention mask.
    Mean,
}

impl Pooling {
    /// llama.cpp's `pooling_type` value; 0 (none) is `Ok(None)`, a kind weft does not pool
    /// is refused, naming it.
    pub fn from_gguf(value: u64) -> Result<Option<Pooling>> {
        match value {
            0 => Ok(None),
            1 => Ok(Some(Pooling::Mean)),
            2 => Ok(Some(Pooling::Cls)),
            3 => Ok(Some(Pooling::Last)),
            4 => Err(WeftError::Unsupported("rank pooling (a reranker; weft pools mean, cls and last)".into())),
            other => Err(WeftError::Unsupported(format!("pooling type {other}"))),
        }
    }

    /// Parse a `--pooling` value.
    pub fn parse(name: &str) -> Result<Pooling> {
        match name {
            "last" => Ok(Pooling::Last),
            "cls" => Ok(Pooling::Cls),
            "mean" => Ok(Pooling::Mean),
            other => Err(WeftError::Unsupported(format!(
                "pooling {other:?}; weft pools \"last\" (the last token), \"cls\" (the first) and \"mean\""
            ))),
        }
    }

    /// Whether it pools more than the prompt's last position, which a causal model's chunked
    /// prefill never holds in one step: encoders only.
    pub fn needs_whole_prompt(self) -> bool {
        self != Pooling::Last
    }
}

/// What a hybrid adds: attention layers among recurrent ones — Mamba2 in Granite 4.0-H
/// (transformers' `GraniteMoeHybridConfig`, llama.cpp's `granitehybrid`; its multipliers are
/// [`ModelConfig::multipliers`]), short convolutions in LFM2 ([`ModelConfig::short_conv`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HybridConfig {
    /// The layers with attention (and a KV cache); every other layer is a recurrent one.
    pub attention_layers: Vec<usize>,
    /// Attention layers rotate q and k (RoPE); Granite 4.0-H's do not (NoPE).
    pub use_rope: bool,
}

/// IBM Granite's scalars (transformers' `GraniteConfig` and `GraniteMoeHybridConfig`; llama.cpp's
/// `embedding_scale`, `residual_scale`, `attention.scale` and `logit_scale`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Multipliers {
    /// x = embedding · embedding_multiplier.
    pub embedding: f32,
    /// Each residual branch is scaled by this before it is added.
    pub residual: f32,
    /// The attention scale (instead of 1/sqrt(head_dim)).
    pub attention: f32,
    /// Logits are divided by this.
    pub logits_scaling: f32,
}

/// The shape of a Mamba2 mixer (transformers' `Mamba2Config`, llama.cpp's `ssm.*` keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SsmConfig {
    /// Width of the causal convolution (`d_conv`).
    pub conv_kernel: usize,
    /// State entries per head channel (`d_state`).
    pub state_size: usize,
    /// Groups sharing B and C (`n_groups`).
    pub num_groups: usize,
    pub num_heads: usize,
    pub head_dim: usize,
}

impl SsmConfig {
    /// `d_inner = num_heads · head_dim`: the width of x, z and y.
    pub fn inner_size(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// The convolved channels: x, B and C.
    pub fn conv_channels(&self) -> usize {
        self.inner_size() + 2 * self.num_groups * self.state_size
    }

    /// The in-projection's output: z, x, B, C, dt side by side.
    pub fn in_proj_size(&self) -> usize {
        self.inner_size() + self.conv_channels() + self.num_heads
    }
}

/// The shape of a Gated DeltaNet layer (Qwen3.5's linear attention: transformers'
/// `linear_*` keys, llama.cpp's `ssm.*` keys of `qwen35`): q and k of `num_k_heads` heads of
/// `head_k_dim`, v of `num_v_heads` heads of `head_v_dim`, each v head reading the q and k head
/// it is paired with; a depthwise causal convolution of `conv_kernel` over q, k and v.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetConfig {
    pub conv_kernel: usize,
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    /// How v heads pair with q/k heads when there are more v heads: transformers' order
    /// (`repeat_interleave`: v head h reads k head h / (v heads / k heads)), or the tiled order
    /// llama.cpp's converter reorders GGUF's v heads into (h reads k head h % k heads).
    pub v_heads_tiled: bool,
}

impl DeltaNetConfig {
    /// Width of q and of k: num_k_heads · head_k_dim.
    pub fn key_size(&self) -> usize {
        self.num_k_heads * self.head_k_dim
    }

    /// Width of v, z and the output: num_v_heads · head_v_dim.
    pub fn value_size(&self) -> usize {
        self.num_v_heads * self.head_v_dim
    }

    /// The convolved channels: q, k and v.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_size() + self.value_size()
    }

    /// The in-projections' outputs side by side: q, k, v (convolved), z, b (β), a (decay).
    pub fn in_proj_size(&self) -> usize {
        self.conv_channels() + self.value_size() + 2 * self.num_v_heads
    }
}

/// What one recurrent layer keeps per sequence in its state slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerState {
    /// The conv window: `conv_kernel - 1` past inputs of `conv_channels` channels.
    pub conv_kernel: usize,
    pub conv_channels: usize,
    /// Mamba2's SSM state (heads, head_dim, state_size), or a Gated DeltaNet's (v heads,
    /// head_v_dim, head_k_dim: each v head's matrix, a column of head_k_dim per value
    /// dimension); `None` for LFM2's short convolutions, whose window is their whole state.
    pub ssm: Option<[usize; 3]>,
}

impl LayerState {
    /// Bytes of one sequence's state in one layer (f32).
    pub fn bytes(&self) -> usize {
        let [heads, head_dim, state_size] = self.ssm.unwrap_or([0; 3]);
        crate::kv::RecurrentStateConfig::slot_size_bytes(
            1,
            self.conv_kernel,
            self.conv_channels,
            heads,
            head_dim,
            state_size,
        )
    }
}

/// Gemma 4's KV sharing (transformers' `kv_sharing_modes`, llama.cpp's `n_layer_kv_from_start`):
/// each of the layers from `first_shared` on reads the cache of the last layer before
/// `first_shared` that is of its kind (sliding or full); every other layer its own.
pub fn gemma4_kv_sources(sliding: &[bool], first_shared: usize) -> Vec<usize> {
    (0..sliding.len())
        .map(|i| match i < first_shared {
            true => i,
            false => (0..first_shared).rev().find(|&j| sliding[j] == sliding[i]).unwrap_or(i),
        })
        .collect()
}

/// Mixture-of-experts architectures weft runs (GGUF and Hugging Face names).
const MOE_SUPPORTED: &[&str] = &[
    "qwen35moe",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
    "qwen3moe",
    "qwen3_moe",
    "gpt-oss",
    "gpt_oss",
    "granitemoe",
    "granitemoeshared",
    "granitehybrid",
    "granitemoehybrid",
    "lfm2moe",
    "lfm2_moe",
    "gemma4",
    "gemma4_text",
];

/// Why weft refuses a mixture-of-experts model: `architecture` routes each token through
/// `experts` (how many the checkpoint says) per MoE layer.
fn moe_refusal(architecture: &str, experts: &str) -> String {
    format!(
        "mixture-of-experts is not supported: {architecture} has {experts} per layer (weft runs the experts of \
         qwen3moe, Qwen3.5-MoE, gpt-oss, Granite MoE, Granite 4.0-H and LFM2-MoE; the other MoE architectures not yet)"
    )
}

/// The refusal of a GGUF mixture-of-experts model (`{arch}.expert_count` > 0, or routed-expert
/// tensors such as `blk.N.ffn_gate_inp.weight` and `ffn_up_exps`) of an architecture whose
/// experts weft does not run, if it is one.
pub fn gguf_moe_refusal(gguf: &GgufFile) -> Option<String> {
    let arch = gguf.architecture()?;
    if MOE_SUPPORTED.contains(&arch) {
        return None;
    }
    if let Some(n) = gguf.get_u64(&format!("{arch}.expert_count")).filter(|&n| n > 0) {
        return Some(moe_refusal(arch, &format!("{n} experts")));
    }
    let routed = |name: &str| name.ends_with(".ffn_gate_inp.weight") || name.contains("_exps.");
    let tensor = gguf.tensors.iter().find(|t| routed(&t.name))?;
    Some(moe_refusal(arch, &format!("routed experts ({})", tensor.name)))
}

/// The refusal of a Hugging Face mixture-of-experts config (`num_local_experts`,
/// `num_experts` or `n_routed_experts` > 0) of an architecture whose experts weft does not run,
/// if it is one.
pub fn hf_moe_refusal(config: &Value) -> Option<String> {
    let arch = config["model_type"].as_str().unwrap_or("this model");
    if MOE_SUPPORTED.contains(&arch) {
        return None;
    }
    ["num_local_experts", "num_experts", "n_routed_experts"].iter().find_map(|key| {
        let n = config[key].as_u64().filter(|&n| n > 0)?;
        Some(moe_refusal(arch, &format!("{n} experts ({key})")))
    })
}

/// Granite MoE's experts from `config.json` (transformers' `GraniteMoeConfig`,
/// `GraniteMoeSharedConfig` and `GraniteMoeHybridConfig`): `intermediate_size` is each routed
/// expert's width, `shared_intermediate_size` the shared expert's (0 or absent: none).
fn granite_moe_from_hf(file: &str, v: &Value) -> Result<MoeConfig> {
    let int = |key: &str| v[key].as_u64().map(|x| x as usize).ok_or_else(|| missing(file, key));
    Ok(MoeConfig {
        num_experts: int("num_local_experts")?,
        experts_per_token: int("num_experts_per_tok")?,
        expert_intermediate_size: int("intermediate_size")?,
        routing: Routing::TopKSoftmax,
        gate: ExpertGate::Silu,
        shared_expert_size: v["shared_intermediate_size"].as_u64().unwrap_or(0) as usize,
        shared_expert_gated: false,
        leading_dense_layers: 0,
    })
}

/// Gemma 4's experts (transformers' `Gemma4TextRouter` and `Gemma4TextExperts`, llama.cpp's
/// `gemma4` MoE layers): `experts` GeGLU experts of `ff`, `top_k` a token by softmax,
/// renormalised (then scaled per expert, `MoeMlp::expert_scale`). The layer's dense MLP runs
/// beside them where Gemma 4's architecture places it, so no shared expert is counted here.
fn gemma4_moe(experts: usize, top_k: usize, ff: usize) -> MoeConfig {
    MoeConfig {
        num_experts: experts,
        experts_per_token: top_k,
        expert_intermediate_size: ff,
        routing: Routing::Softmax { normalize: true },
        gate: ExpertGate::GeluTanh,
        shared_expert_size: 0,
        shared_expert_gated: false,
        leading_dense_layers: 0,
    }
}

/// Qwen3-MoE's experts from `config.json` (transformers' `Qwen3MoeConfig`): every layer sparse,
/// or refused, naming the setting, where some layers are dense (`mlp_only_layers`,
/// `decoder_sparse_step` above 1) or the model has shared experts.
fn qwen3moe_from_hf(file: &str, v: &Value) -> Result<MoeConfig> {
    let int = |key: &str| v[key].as_u64().map(|x| x as usize).ok_or_else(|| missing(file, key));
    let refuse = |detail: String| Err(WeftError::model(file, detail));
    if v["mlp_only_layers"].as_array().is_some_and(|layers| !layers.is_empty()) {
        return refuse("mlp_only_layers lists dense layers; weft runs Qwen3-MoE with experts in every layer".into());
    }
    if let Some(step) = v["decoder_sparse_step"].as_u64().filter(|&s| s != 1) {
        return refuse(format!(
            "decoder_sparse_step is {step} (experts in every {step}th layer only); weft runs Qwen3-MoE with experts in \
             every layer"
        ));
    }
    if v["shared_expert_intermediate_size"].as_u64().is_some_and(|n| n > 0) {
        return refuse("shared_expert_intermediate_size is set; weft runs Qwen3-MoE without shared experts".into());
    }
    Ok(MoeConfig {
        num_experts: int("num_experts").or_else(|_| int("num_local_experts"))?,
        experts_per_token: int("num_experts_per_tok")?,
        expert_intermediate_size: int("moe_intermediate_size")?,
        // transformers' default.
        routing: Routing::Softmax { normalize: v["norm_topk_prob"].as_bool().unwrap_or(false) },
        gate: ExpertGate::Silu,
        shared_expert_size: 0,
        shared_expert_gated: false,
        leading_dense_layers: 0,
    })
}

/// gpt-oss's attention alternates a sliding window with full attention, the first layer
/// sliding (transformers' default `layer_types`, llama.cpp's swa pattern of 2): with
/// `sliding_window_pattern` 2, every second layer attends globally.
const GPT_OSS_PATTERN: usize = 2;

/// gpt-oss's experts from `config.json` (transformers' `GptOssConfig`): every layer sparse,
/// routed by a softmax over the top-k router logits, each expert a clamped SwiGLU whose
/// constants weft (like llama.cpp) fixes, so other values are refused; `layer_types` must
/// alternate sliding and full attention from a sliding first layer.
fn gpt_oss_from_hf(file: &str, v: &Value) -> Result<MoeConfig> {
    let int = |key: &str| v[key].as_u64().map(|x| x as usize).ok_or_else(|| missing(file, key));
    let refuse = |detail: String| Err(WeftError::model(file, detail));
    for (key, want) in [("swiglu_alpha", 1.702), ("swiglu_limit", 7.0)] {
        if let Some(value) = v[key].as_f64().filter(|&x| (x - want).abs() > 1e-6) {
            return refuse(format!("{key} is {value}; weft runs gpt-oss's experts with {want}, as llama.cpp does"));
        }
    }
    if let Some(types) = v["layer_types"].as_array() {
        let want = |i: usize| {
            if (i + 1).is_multiple_of(GPT_OSS_PATTERN) { "full_attention" } else { "sliding_attention" }
        };
        if types.iter().enumerate().any(|(i, t)| t.as_str() != Some(want(i))) {
            return refuse(
                "layer_types does not alternate sliding_attention and full_attention from a sliding first \
                           layer, as gpt-oss's do"
                    .into(),
            );
        }
    }
    Ok(MoeConfig {
        num_experts: int("num_local_experts")?,
        experts_per_token: int("num_experts_per_tok")?,
        expert_intermediate_size: int("intermediate_size")?,
        routing: Routing::TopKSoftmax,
        gate: ExpertGate::SwigluOai,
        shared_expert_size: 0,
        shared_expert_gated: false,
        leading_dense_layers: 0,
    })
}

/// llama.cpp's SmolLM3 makes every this-many-th layer NoPE (transformers' default
/// `no_rope_layer_interval`); its GGUF files carry no key for it.
const SMOLLM3_NO_ROPE_STEP: usize = 4;

/// SmolLM3's NoPE layers from `config.json`: `no_rope_layers` (1 = RoPE, 0 = NoPE, one per
/// layer at least), else every `no_rope_layer_interval`-th layer. A sliding window is refused.
fn smollm3_no_rope_layers(file: &str, v: &Value, num_layers: usize) -> Result<Vec<usize>> {
    if v["use_sliding_window"].as_bool() == Some(true) {
        return Err(WeftError::model(file, "use_sliding_window is set; weft runs SmolLM3 with global attention"));
    }
    match v["no_rope_layers"].as_array() {
        Some(flags) if flags.len() >= num_layers => {
            Ok((0..num_layers).filter(|&i| flags[i].as_u64() == Some(0)).collect())
        }
        Some(flags) => Err(WeftError::model(
            file,
            format!("no_rope_layers has {} entries; the model has {num_layers} layers", flags.len()),
        )),
        None => {
            let step = v["no_rope_layer_interval"].as_u64().unwrap_or(SMOLLM3_NO_ROPE_STEP as u64).max(1) as usize;
            Ok((0..num_layers).filter(|i| (i + 1).is_multiple_of(step)).collect())
        }
    }
}

/// A gpt-oss GGUF's sliding-window layers: llama.cpp's default pattern of 2 (the first layer
/// sliding), or `attention.sliding_window_pattern` where it says the same; another layout is
/// refused, naming it.
fn gpt_oss_swa_pattern(gguf: &GgufFile) -> Result<usize> {
    let key = "gpt-oss.attention.sliding_window_pattern";
    let fits = match (gguf.get_u64(key), gguf.get_bool_array(key)) {
        (Some(n), _) => n as usize == GPT_OSS_PATTERN,
        (None, Some(layers)) => layers.iter().enumerate().all(|(i, &s)| s != (i + 1).is_multiple_of(GPT_OSS_PATTERN)),
        (None, None) => true,
    };
    if !fits {
        return Err(WeftError::model(
            gguf.name(),
            format!("{key} is not gpt-oss's alternation of sliding and full attention layers (sliding first)"),
        ));
    }
    Ok(GPT_OSS_PATTERN)
}

/// The error for a config key (GGUF metadata or config.json) that is absent or of the wrong type.
pub(crate) fn missing(file: &str, key: &str) -> WeftError {
    WeftError::model(file, format!("missing or malformed metadata {key}"))
}

impl ModelConfig {
    /// From GGUF metadata (`<arch>.*` keys) and the tensors present.
    pub fn from_gguf(gguf: &GgufFile) -> Result<ModelConfig> {
        let file = gguf.name();
        let arch = gguf.architecture().ok_or_else(|| missing(file, "general.architecture"))?.to_string();
        if let Some(refusal) = gguf_moe_refusal(gguf) {
            return Err(WeftError::model(file, refusal));
        }
        if !SUPPORTED.contains(&arch.as_str()) {
            return Err(WeftError::model(file, unsupported(&arch)));
        }
        if arch == "gemma4" {
            return Self::gemma4_from_gguf(gguf);
        }
        if arch == "gemma3n" {
            return crate::model::arch::gemma3n::config_from_gguf(gguf);
        }
        let int = |key: &str| -> Result<usize> {
            let full = format!("{arch}.{key}");
            gguf.get_u64(&full).map(|v| v as usize).ok_or_else(|| missing(file, &full))
        };
        let float = |key: &str| gguf.get_f64(&format!("{arch}.{key}")).map(|v| v as f32);
        // Qwen3.5, dense or with experts: Gated DeltaNet layers among gated attention.
        let qwen35 = arch == "qwen35" || arch == "qwen35moe";
        // Qwen3.5 writes its Gated DeltaNet's shape under the same ssm.* keys as Mamba2.
        let ssm = if !qwen35 && gguf.get_u64(&format!("{arch}.ssm.state_size")).is_some() {
            // llama.cpp's time_step_rank of a Mamba2 is its head count.
            let num_heads = int("ssm.time_step_rank")?;
            Some(SsmConfig {
                conv_kernel: int("ssm.conv_kernel")?,
                state_size: int("ssm.state_size")?,
                num_groups: int("ssm.group_count").unwrap_or(1),
                num_heads,
                head_dim: int("ssm.inner_size")? / num_heads.max(1),
            })
        } else {
            None
        };
        let hidden_size = int("embedding_length")?;
        let num_heads = int("attention.head_count")?;
        let embed = gguf.tensor("token_embd.weight").ok_or_else(|| missing(file, "tensor token_embd.weight"))?;
        let vocab_size = int("vocab_size").unwrap_or_else(|_| embed.shape()[0]);
        // llama.cpp's reading: the head is key_length wide (else hidden / heads) and RoPE
        // rotates rope.dimension_count of it (else all of it).
        let head_dim = int("attention.key_length").unwrap_or(hidden_size / num_heads.max(1));
        let rotary_dim = int("rope.dimension_count").ok().filter(|&d| d != head_dim);
        let rope_scaling = Self::rope_scaling_from_gguf(gguf, &arch)?;
        // A hybrid lists each layer's KV heads: 0 marks a Mamba2 layer.
        let kv_heads_per_layer = gguf.get_i64_array(&format!("{arch}.attention.head_count_kv"));
        // llama.cpp writes whether a Granite uses RoPE as rope.scaling.finetuned (a hybrid's
        // default: no; a dense Granite's: yes).
        let granite_rope = gguf.get_bool(&format!("{arch}.rope.scaling.finetuned"));
        let attention_layers = |per_layer: &[i64]| (0..per_layer.len()).filter(|&i| per_layer[i] > 0).collect();
        let hybrid = match (&kv_heads_per_layer, arch.as_str()) {
            (Some(per_layer), "granitehybrid") => Some(HybridConfig {
                attention_layers: attention_layers(per_layer),
                use_rope: granite_rope.unwrap_or(false),
            }),
            // LFM2: 0 KV heads marks a short-convolution layer.
            (Some(per_layer), "lfm2" | "lfm2moe") => {
                Some(HybridConfig { attention_layers: attention_layers(per_layer), use_rope: true })
            }
            (None, "lfm2" | "lfm2moe") => {
                Some(HybridConfig { attention_layers: (0..int("block_count")?).collect(), use_rope: true })
            }
            // Qwen3.5: recurrent_layers marks the Gated DeltaNet layers; without it, llama.cpp
            // makes every full_attention_interval-th layer (default 4) attend.
            (_, "qwen35" | "qwen35moe") => {
                let num_layers = int("block_count")?.saturating_sub(int("nextn_predict_layers").unwrap_or(0));
                let attention_layers = match gguf.get_bool_array(&format!("{arch}.attention.recurrent_layers")) {
                    Some(recurrent) => (0..num_layers).filter(|&i| recurrent.get(i) == Some(&false)).collect(),
                    None => {
                        let interval = int("full_attention_interval").unwrap_or(4).max(1);
                        (0..num_layers).filter(|i| (i + 1) % interval == 0).collect()
                    }
                };
                Some(HybridConfig { attention_layers, use_rope: true })
            }
            _ => None,
        };
        let delta_net = if qwen35 {
            let num_v_heads = int("ssm.time_step_rank")?;
            Some(DeltaNetConfig {
                conv_kernel: int("ssm.conv_kernel")?,
                num_k_heads: int("ssm.group_count")?,
                num_v_heads,
                head_k_dim: int("ssm.state_size")?,
                head_v_dim: int("ssm.inner_size")? / num_v_heads.max(1),
                // The converter reorders v heads so that ggml's repeat of q and k pairs them.
                v_heads_tiled: true,
            })
        } else {
            None
        };
        let multipliers = match arch.as_str() {
            "granite" | "granitemoe" | "granitehybrid" => Some(Multipliers {
                embedding: float("embedding_scale").unwrap_or(1.0),
                residual: float("residual_scale").unwrap_or(1.0),
                // Without the key llama.cpp scales a dense Granite's attention by head_dim^-1/2.
                attention: float("attention.scale").unwrap_or(if arch != "granitehybrid" {
                    1.0 / (head_dim as f32).sqrt()
                } else {
                    1.0
                }),
                logits_scaling: float("logit_scale").unwrap_or(1.0),
            }),
            _ => None,
        };
        // Qwen3.5's multi-token-prediction layers follow its own in block_count (llama.cpp's
        // nextn_predict_layers); a plain forward pass does not run them.
        let num_layers = int("block_count")?.saturating_sub(int("nextn_predict_layers").unwrap_or(0));
        let no_rope_layers: Vec<usize> = match arch.as_str() {
            // llama.cpp's SmolLM3: every fourth layer is NoPE, a constant with no key.
            "smollm3" => (0..num_layers).filter(|i| (i + 1).is_multiple_of(SMOLLM3_NO_ROPE_STEP)).collect(),
            "granite" | "granitemoe" if granite_rope == Some(false) => (0..num_layers).collect(),
            _ => Vec::new(),
        };
        if arch == "olmo2" && int("attention.sliding_window").is_ok() {
            return Err(WeftError::model(
                file,
                "olmo2 with a sliding window (OLMo 3) is not supported; weft runs OLMo 2, which attends globally",
            ));
        }
        let num_kv_heads = match &kv_heads_per_layer {
            Some(per_layer) => per_layer.iter().copied().max().unwrap_or(0).max(0) as usize,
            None => int("attention.head_count_kv").unwrap_or(num_heads),
        };
        let moe = match gguf.get_u64(&format!("{arch}.expert_count")).filter(|&n| n > 0) {
            Some(num_experts) => {
                if int("expert_shared_count").is_ok_and(|n| n > 0) {
                    return Err(WeftError::model(file, format!("{arch} has shared experts, which weft does not run")));
                }
                let gpt_oss = arch == "gpt-oss";
                let granite = arch.starts_with("granite");
                // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE: 1 softmax, 2 sigmoid, 3 softmax of
                // the chosen logits.
                let sigmoid = match gguf.get_u64(&format!("{arch}.expert_gating_func")) {
                    None | Some(1) | Some(3) => false,
                    Some(2) => true,
                    Some(other) => {
                        return Err(WeftError::model(
                            file,
                            format!("{arch}.expert_gating_func {other} is not supported"),
                        ));
                    }
                };
                Some(MoeConfig {
                    num_experts: num_experts as usize,
                    experts_per_token: int("expert_used_count")?,
                    // Granite's converter writes the experts' width as feed_forward_length.
                    expert_intermediate_size: if granite {
                        int("feed_forward_length")?
                    } else {
                        int("expert_feed_forward_length")?
                    },
                    // llama.cpp's gpt-oss graph softmaxes the top-k logits (its SOFTMAX_WEIGHT
                    // gating), as transformers' Granite MoE does; its qwen3moe graph always
                    // renormalises (the converter writes no key for norm_topk_prob).
                    routing: if sigmoid {
                        Routing::Sigmoid {
                            normalize: gguf.get_bool(&format!("{arch}.expert_weights_norm")).unwrap_or(true),
                        }
                    } else if gpt_oss || granite {
                        Routing::TopKSoftmax
                    } else {
                        Routing::Softmax {
                            normalize: gguf.get_bool(&format!("{arch}.expert_weights_norm")).unwrap_or(true),
                        }
                    },
                    gate: if gpt_oss { ExpertGate::SwigluOai } else { ExpertGate::Silu },
                    // llama.cpp's qwen35moe reads its shared expert's width as feed_forward_length
                    // where the converter wrote no width of its own.
                    shared_expert_size: match arch.as_str() {
                        "qwen35moe" => {
                            int("expert_shared_feed_forward_length").or_else(|_| int("feed_forward_length"))?
                        }
                        _ if granite => int("expert_shared_feed_forward_length").unwrap_or(0),
                        _ => 0,
                    },
                    shared_expert_gated: arch == "qwen35moe",
                    leading_dense_layers: int("leading_dense_block_count").unwrap_or(0),
                })
            }
            None if arch == "qwen3moe" => return Err(missing(file, "qwen3moe.expert_count")),
            None => None,
        };
        // A dense Granite hybrid's MLP is its "shared expert"; a MoE's dense width is its
        // shared expert's, or its experts' where it has none.
        let intermediate_size = match moe {
            Some(m) if m.shared_expert_size > 0 => m.shared_expert_size,
            Some(m) if m.leading_dense_layers > 0 => int("feed_forward_length")?,
            Some(m) => m.expert_intermediate_size,
            None => int("expert_shared_feed_forward_length").or_else(|_| int("feed_forward_length"))?,
        };
        let config = ModelConfig {
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rotary_dim,
            // BERT's LayerNorms keep their epsilon in the same field.
            rms_norm_eps: float("attention.layer_norm_rms_epsilon")
                .or_else(|| float("attention.layer_norm_epsilon"))
                .unwrap_or(1e-5),
            rope_theta: float("rope.freq_base").unwrap_or(10000.0),
            rope_scaling,
            max_position_embeddings: int("context_length")?,
            tie_word_embeddings: gguf.tensor("output.weight").is_none(),
            attention_bias: gguf.tensor("blk.0.attn_q.bias").is_some(),
            sliding_window: int("attention.sliding_window").ok().filter(|&w| w > 0),
            // LFM2's layer 0 may be a convolution; its attention always norms q and k.
            qk_norm: arch.starts_with("lfm2") || qwen35 || gguf.tensor("blk.0.attn_q_norm.weight").is_some(),
            // llama.cpp's Gemma 3 constants: GGUF has no keys for them. Its query scale is
            // head_dim^-1/2 (query_pre_attn_scalar = head_dim) for every size but 27B.
            sliding_window_pattern: match arch.as_str() {
                "gemma3" => Some(6),
                "gpt-oss" => Some(gpt_oss_swa_pattern(gguf)?),
                _ => None,
            },
            rope_local_theta: (arch == "gemma3").then_some(10000.0),
            query_pre_attn_scalar: (arch == "gemma3").then_some(head_dim as f32),
            ssm,
            hybrid,
            short_conv: if arch.starts_with("lfm2") { Some(int("shortconv.l_cache")?) } else { None },
            delta_net,
            multipliers,
            no_rope_layers,
            pooling: match gguf.get_u64(&format!("{arch}.pooling_type")) {
                Some(value) => Pooling::from_gguf(value).map_err(|e| WeftError::model(file, e.to_string()))?,
                None => None,
            },
            moe,
            gemma4: None,
            architecture: arch,
        };
        config.check(file)?;
        Ok(config)
    }

    /// llama.cpp's `gemma4` keys: the sliding layers' head size and RoPE under `*_swa`, the
    /// full layers' under the plain keys; per-layer KV heads and MLP widths as arrays; which
    /// layers slide (`attention.sliding_window_pattern`); `attention.shared_kv_layers`; the
    /// full layers' proportional RoPE as `rope_freqs.weight` (1 for a rotating angle, 1e30 for
    /// one that stays 0).
    fn gemma4_from_gguf(gguf: &GgufFile) -> Result<ModelConfig> {
        let file = gguf.name();
        let key = |k: &str| format!("gemma4.{k}");
        let int = |k: &str| gguf.get_u64(&key(k)).map(|v| v as usize).ok_or_else(|| missing(file, &key(k)));
        let float = |k: &str| gguf.get_f64(&key(k)).map(|v| v as f32);
        let num_layers = int("block_count")?;
        // A key written per layer or once for all.
        let per_layer = |k: &str| -> Result<Vec<usize>> {
            match gguf.get_i64_array(&key(k)) {
                Some(values) if values.len() == num_layers => Ok(values.iter().map(|&x| x.max(0) as usize).collect()),
                Some(values) => Err(WeftError::model(
                    file,
                    format!("{} has {} entries; the model has {num_layers} layers", key(k), values.len()),
                )),
                None => Ok(vec![int(k)?; num_layers]),
            }
        };
        let sliding = gguf
            .get_bool_array(&key("attention.sliding_window_pattern"))
            .filter(|s| s.len() == num_layers)
            .ok_or_else(|| missing(file, &key("attention.sliding_window_pattern")))?;
        let kv_heads = per_layer("attention.head_count_kv")?;
        let kv_of = |want_sliding: bool| {
            (0..num_layers).find(|&i| sliding[i] == want_sliding).map_or(kv_heads[0], |i| kv_heads[i])
        };
        let global_head_dim = int("attention.key_length")?;
        let head_dim = int("attention.key_length_swa")?;
        // The full layers' rotating angles: rope_freqs' factors of 1 (the rest are 1e30).
        let global_rope_angles = match gguf.tensor("rope_freqs.weight") {
            Some(t) => gguf
                .tensor_bytes(t)?
                .chunks_exact(4)
                .filter(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) < 1e20)
                .count(),
            None => global_head_dim / 2,
        };
        let intermediate_sizes = per_layer("feed_forward_length")?;
        let per_layer_input_size = int("embedding_length_per_layer_input").unwrap_or(0);
        let per_layer_vocab_size = match gguf.tensor("per_layer_token_embd.weight") {
            Some(t) if per_layer_input_size > 0 => t.shape()[0],
            _ => 0,
        };
        let embed = gguf.tensor("token_embd.weight").ok_or_else(|| missing(file, "tensor token_embd.weight"))?;
        let moe = match int("expert_count").ok().filter(|&n| n > 0) {
            Some(n) => Some(gemma4_moe(n, int("expert_used_count")?, int("expert_feed_forward_length")?)),
            None => None,
        };
        let config = ModelConfig {
            architecture: "gemma4".into(),
            vocab_size: int("vocab_size").unwrap_or_else(|_| embed.shape()[0]),
            hidden_size: int("embedding_length")?,
            intermediate_size: intermediate_sizes[0],
            num_layers,
            num_heads: int("attention.head_count")?,
            num_kv_heads: kv_of(true),
            head_dim,
            rotary_dim: None,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            rope_theta: float("rope.freq_base").unwrap_or(1e6),
            rope_scaling: None,
            max_position_embeddings: int("context_length")?,
            tie_word_embeddings: gguf.tensor("output.weight").is_none(),
            attention_bias: false,
            sliding_window: int("attention.sliding_window").ok().filter(|&w| w > 0),
            qk_norm: true,
            sliding_window_pattern: None,
            rope_local_theta: Some(float("rope.freq_base_swa").unwrap_or(10000.0)),
            query_pre_attn_scalar: None,
            ssm: None,
            hybrid: None,
            short_conv: None,
            delta_net: None,
            multipliers: None,
            no_rope_layers: Vec::new(),
            pooling: None,
            moe,
            gemma4: Some(Gemma4Config {
                global_head_dim,
                global_kv_heads: kv_of(false),
                // llama.cpp's converter drops v_proj where keys serve as values.
                k_eq_v: (0..num_layers)
                    .any(|i| !sliding[i] && gguf.tensor(&format!("blk.{i}.attn_v.weight")).is_none()),
                global_rope_angles,
                kv_sources: gemma4_kv_sources(
                    &sliding,
                    num_layers.saturating_sub(int("attention.shared_kv_layers").unwrap_or(0)),
                ),
                sliding,
                intermediate_sizes,
                per_layer_input_size,
                per_layer_vocab_size,
                final_logit_softcapping: float("final_logit_softcapping").filter(|&c| c > 0.0),
                gemma3n: None,
            }),
        };
        config.check(file)?;
        Ok(config)
    }

    /// The RoPE scaling a GGUF file describes: llama.cpp's `rope_freqs.weight` (Llama 3) or
    /// LongRoPE factor tensors, else `{arch}.rope.scaling.type` with its keys. A type weft does
    /// not apply is refused, naming it, rather than run unscaled.
    fn rope_scaling_from_gguf(gguf: &GgufFile, arch: &str) -> Result<Option<RopeScaling>> {
        let file = gguf.name();
        let int = |key: &str| -> Result<usize> {
            let full = format!("{arch}.{key}");
            gguf.get_u64(&full).map(|v| v as usize).ok_or_else(|| missing(file, &full))
        };
        let float = |key: &str| gguf.get_f64(&format!("{arch}.{key}")).map(|v| v as f32);
        let values = |t| -> Result<Vec<f32>> {
            Ok(gguf.tensor_bytes(t)?.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
        };
        if let Some(factors) = gguf.tensor("rope_freqs.weight") {
            return Ok(Some(RopeScaling::FreqFactors(values(factors)?)));
        }
        if let (Some(short), Some(long)) =
            (gguf.tensor("rope_factors_short.weight"), gguf.tensor("rope_factors_long.weight"))
        {
            let original = int("rope.scaling.original_context_length")?;
            let context = int("context_length")?;
            return Ok(Some(RopeScaling::LongRope {
                short: values(short)?,
                long: values(long)?,
                original_max_position_embeddings: original,
                attention_factor: float("rope.scaling.attn_factor")
                    .unwrap_or_else(|| longrope_attention_factor(context, original)),
            }));
        }
        let key = format!("{arch}.rope.scaling.type");
        match gguf.get_str(&key) {
            None | Some("none") => Ok(None),
            Some("linear") => Ok(Some(RopeScaling::Linear { factor: float("rope.scaling.factor").unwrap_or(1.0) })),
            Some("yarn") => {
                let factor = float("rope.scaling.factor")
                    .ok_or_else(|| missing(file, &format!("{arch}.rope.scaling.factor")))?;
                let original = int("rope.scaling.original_context_length").or_else(|_| int("context_length"))?;
                // The converter writes a checkpoint's own attention_factor as yarn_attn_factor;
                // llama.cpp multiplies whatever it uses by rope.scaling.attn_factor.
                let attention_factor = float("rope.scaling.yarn_attn_factor")
                    .unwrap_or_else(|| yarn_mscale(f64::from(factor), 1.0) as f32)
                    * float("rope.scaling.attn_factor").unwrap_or(1.0);
                Ok(Some(RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    beta_fast: float("rope.scaling.yarn_beta_fast").unwrap_or(32.0),
                    beta_slow: float("rope.scaling.yarn_beta_slow").unwrap_or(1.0),
                    // gpt-oss is trained with YaRN's ramp unrounded (transformers' truncate:
                    // false, which its config sets); the GGUF has no key for it, and llama.cpp
                    // rounds for every model. weft follows the checkpoint's own definition.
                    truncate: arch != "gpt-oss",
                    attention_factor,
                }))
            }
            Some(other) => Err(WeftError::model(
                file,
                format!(
                    "{key} {other:?} is not supported (weft applies linear and yarn, and Llama 3's and LongRoPE's \
                     factor tensors)"
                ),
            )),
        }
    }

    /// From a Hugging Face `config.json`.
    pub fn from_hf_json(file: &str, json: &str) -> Result<ModelConfig> {
        let v: Value =
            serde_json::from_str(json).map_err(|e| WeftError::model(file, format!("not valid JSON: {e}")))?;
        let arch = v["model_type"].as_str().ok_or_else(|| missing(file, "model_type"))?.to_string();
        if let Some(refusal) = hf_moe_refusal(&v) {
            return Err(WeftError::model(file, refusal));
        }
        if arch == "gemma3_text" {
            return Self::gemma3_from_hf(file, &v);
        }
        if arch == "gemma4_text" {
            return Self::gemma4_from_hf(file, &v);
        }
        if arch == "gemma3n_text" || arch == "gemma3n" {
            return crate::model::arch::gemma3n::config_from_hf(file, &v);
        }
        if arch.starts_with("gemma") {
            return Err(WeftError::model(
                file,
                format!(
                    "{arch} is not supported from a Hugging Face directory; weft reads Gemma 3's, Gemma 3n's and Gemma \
                     4's text models (model_type gemma3_text, gemma3n_text or gemma3n, gemma4_text) there, and Gemma \
                     3, Gemma 3n and Gemma 4 GGUF files"
                ),
            ));
        }
        if !SUPPORTED.contains(&arch.as_str()) {
            return Err(WeftError::model(file, unsupported(&arch)));
        }
        let int = |key: &str| v[key].as_u64().map(|x| x as usize).ok_or_else(|| missing(file, key));
        let float = |key: &str| v[key].as_f64().map(|x| x as f32);
        if arch == "mamba2" {
            return Self::mamba2_from_hf(file, &v);
        }
        if arch == "granitemoehybrid" {
            return Self::granite_hybrid_from_hf(file, &v);
        }
        if arch == "lfm2" || arch == "lfm2_moe" {
            return Self::lfm2_from_hf(file, &v);
        }
        if arch == "qwen3_5_text" || arch == "qwen3_5_moe_text" {
            return Self::qwen35_from_hf(file, &v, &arch, None);
        }
        if arch == "qwen3_5" || arch == "qwen3_5_moe" {
            // Qwen3_5ForConditionalGeneration and Qwen3_5MoeForConditionalGeneration (the
            // published checkpoints): the text model's config inside, the LM head's tying
            // outside. weft runs the text model alone.
            if !v["text_config"].is_object() {
                return Err(missing(file, "text_config"));
            }
            return Self::qwen35_from_hf(file, &v["text_config"], &arch, v["tie_word_embeddings"].as_bool());
        }
        let hidden_size = int("hidden_size")?;
        let num_heads = int("num_attention_heads")?;
        // transformers 5 writes `rope_parameters` (with rope_theta inside); older configs
        // `rope_scaling` and a top-level rope_theta.
        let scaling = if v["rope_scaling"].is_object() { &v["rope_scaling"] } else { &v["rope_parameters"] };
        let rope_theta = float("rope_theta").or_else(|| v["rope_parameters"]["rope_theta"].as_f64().map(|x| x as f32));
        let max_position_embeddings = int("max_position_embeddings").unwrap_or(4096);
        let head_dim = int("head_dim").unwrap_or(hidden_size / num_heads.max(1));
        // transformers rotates int(head_dim · partial_rotary_factor) leading dimensions (Phi-4-mini: 0.75).
        let rotary_dim = v["partial_rotary_factor"]
            .as_f64()
            .or_else(|| v["rope_parameters"]["partial_rotary_factor"].as_f64())
            .map(|p| (head_dim as f64 * p) as usize)
            .filter(|&d| d != head_dim);
        let rope_scaling = match scaling {
            Value::Object(s) => {
                let kind = s.get("rope_type").or_else(|| s.get("type")).and_then(Value::as_str).unwrap_or("");
                let f = |key: &str| s.get(key).and_then(Value::as_f64).map(|x| x as f32);
                match kind {
                    "linear" => Some(RopeScaling::Linear { factor: f("factor").unwrap_or(1.0) }),
                    "llama3" => Some(RopeScaling::Llama3 {
                        factor: f("factor").ok_or_else(|| missing(file, "rope_scaling.factor"))?,
                        low_freq_factor: f("low_freq_factor").unwrap_or(1.0),
                        high_freq_factor: f("high_freq_factor").unwrap_or(4.0),
                        original_max_position_embeddings: s
                            .get("original_max_position_embeddings")
                            .and_then(Value::as_u64)
                            .unwrap_or(8192) as usize,
                    }),
                    "longrope" | "su" => {
                        let factors = |key: &str| -> Result<Vec<f32>> {
                            s.get(key)
                                .and_then(Value::as_array)
                                .and_then(|a| a.iter().map(|x| x.as_f64().map(|x| x as f32)).collect())
                                .ok_or_else(|| missing(file, &format!("rope_scaling.{key}")))
                        };
                        let original = s
                            .get("original_max_position_embeddings")
                            .and_then(Value::as_u64)
                            .or_else(|| v["original_max_position_embeddings"].as_u64())
                            .ok_or_else(|| missing(file, "original_max_position_embeddings"))?
                            as usize;
                        Some(RopeScaling::LongRope {
                            short: factors("short_factor")?,
                            long: factors("long_factor")?,
                            original_max_position_embeddings: original,
                            attention_factor: f("attention_factor")
                                .unwrap_or_else(|| longrope_attention_factor(max_position_embeddings, original)),
                        })
                    }
                    "yarn" => {
                        let original = s
                            .get("original_max_position_embeddings")
                            .and_then(Value::as_u64)
                            .or_else(|| v["original_max_position_embeddings"].as_u64())
                            .map_or(max_position_embeddings, |o| o as usize);
                        // transformers: without a factor, the ratio of the contexts.
                        let factor = f("factor").unwrap_or(max_position_embeddings as f32 / original.max(1) as f32);
                        let attention_factor = match (f("attention_factor"), f("mscale"), f("mscale_all_dim")) {
                            (Some(a), _, _) => a,
                            (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                                let factor = f64::from(factor);
                                (yarn_mscale(factor, f64::from(m)) / yarn_mscale(factor, f64::from(all))) as f32
                            }
                            _ => yarn_mscale(f64::from(factor), 1.0) as f32,
                        };
                        // transformers: `beta_fast or 32`, so 0 means the default too.
                        let beta = |key: &str, default: f32| f(key).filter(|b| *b != 0.0).unwrap_or(default);
                        Some(RopeScaling::Yarn {
                            factor,
                            original_max_position_embeddings: original,
                            beta_fast: beta("beta_fast", 32.0),
                            beta_slow: beta("beta_slow", 1.0),
                            truncate: s.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                            attention_factor,
                        })
                    }
                    "default" | "" => None,
                    other => {
                        return Err(WeftError::model(
                            file,
                            format!(
                                "rope_scaling type {other:?} is not supported (linear, llama3, longrope, yarn are)"
                            ),
                        ));
                    }
                }
            }
            _ => None,
        };
        let num_layers = int("num_hidden_layers")?;
        if v["mlp_bias"].as_bool() == Some(true) {
            return Err(WeftError::model(file, format!("mlp_bias is set; weft runs {arch} without MLP biases")));
        }
        let granite = matches!(arch.as_str(), "granite" | "granitemoe" | "granitemoeshared");
        let multipliers = granite.then(|| Multipliers {
            embedding: float("embedding_multiplier").unwrap_or(1.0),
            residual: float("residual_multiplier").unwrap_or(1.0),
            attention: float("attention_multiplier").unwrap_or(1.0),
            logits_scaling: float("logits_scaling").unwrap_or(1.0),
        });
        let no_rope_layers = if arch == "smollm3" { smollm3_no_rope_layers(file, &v, num_layers)? } else { Vec::new() };
        let moe = match arch.as_str() {
            "qwen3_moe" => Some(qwen3moe_from_hf(file, &v)?),
            "gpt_oss" => Some(gpt_oss_from_hf(file, &v)?),
            "granitemoe" | "granitemoeshared" => Some(granite_moe_from_hf(file, &v)?),
            _ => None,
        };
        let gpt_oss = arch == "gpt_oss";
        let config = ModelConfig {
            vocab_size: int("vocab_size")?,
            hidden_size,
            intermediate_size: int("intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads: int("num_key_value_heads").unwrap_or(num_heads),
            head_dim,
            rotary_dim,
            rms_norm_eps: float("rms_norm_eps").unwrap_or(1e-6),
            rope_theta: rope_theta.unwrap_or(10000.0),
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(false),
            attention_bias: v["attention_bias"].as_bool().unwrap_or(arch == "qwen2" || gpt_oss),
            sliding_window: if arch == "mistral" || gpt_oss || v["use_sliding_window"].as_bool() == Some(true) {
                v["sliding_window"].as_u64().map(|w| w as usize)
            } else {
                None
            },
            // Qwen3's (and Qwen3-MoE's) per head; OLMo 2's over the whole q and k projections.
            qk_norm: arch == "qwen3" || arch == "qwen3_moe" || arch == "olmo2",
            sliding_window_pattern: gpt_oss.then_some(GPT_OSS_PATTERN),
            rope_local_theta: None,
            query_pre_attn_scalar: None,
            ssm: None,
            hybrid: None,
            short_conv: None,
            delta_net: None,
            multipliers,
            no_rope_layers,
            pooling: None,
            moe,
            gemma4: None,
            architecture: arch,
        };
        config.check(file)?;
        Ok(config)
    }

    /// transformers' `Gemma3TextConfig`: sliding-window layers interleaved with global ones
    /// (one in six), a RoPE base for each kind, GeGLU with tanh GELU, no soft-capping.
    fn gemma3_from_hf(file: &str, v: &Value) -> Result<ModelConfig> {
        let int = |key: &str| v[key].as_u64().map(|x| x as usize).ok_or_else(|| missing(file, key));
        let num_layers = int("num_hidden_layers")?;
        let refuse = |detail: String| Err(WeftError::model(file, detail));
        for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
            if !v[key].is_null() {
                return refuse(format!("{key} is set; weft runs Gemma 3, which has none"));
            }
        }
        if let Some(act) = v["hidden_activation"].as_str().filter(|a| *a != "gelu_pytorch_tanh") {
            return refuse(format!("hidden_activation {act:?}; weft runs Gemma 3's gelu_pytorch_tanh"));
        }
        // weft interleaves as Gemma 3 does: layer i attends globally when (i + 1) % 6 == 0.
        const PATTERN: usize = 6;
        if let Some(types) = v["layer_types"].as_array() {
            let expected =
                |i: usize| if (i + 1).is_multiple_of(PATTERN) { "full_attention" } else { "sliding_attention" };
            if types.len() != num_layers || types.iter().enumerate().any(|(i, t)| t.as_str() != Some(expected(i))) {
                return refuse("layer_types is not Gemma 3's five sliding-window layers per global one".into());
            }
        }
        // transformers 5: rope_parameters per layer kind; older: rope_theta, rope_local_base_freq.
        let theta = |kind: &str, old_key: &str, default: f64| {
            v["rope_parameters"][kind]["rope_theta"].as_f64().or_else(|| v[old_key].as_f64()).unwrap_or(default) as f32
        };
        for kind in ["full_attention", "sliding_attention"] {
            if let Some(t) = v["rope_parameters"][kind]["rope_type"].as_str().filter(|t| *t != "default") {
                return refuse(format!("rope_parameters.{kind}.rope_type {t:?} is not supported for Gemma 3"));
            }
        }
        let hidden_size = int("hidden_size")?;
        let num_heads = int("num_attention_heads")?;
        let head_dim = int("head_dim").unwrap_or(hidden_size / num_heads.max(1));
        let config = ModelConfig {
            architecture: "gemma3".into(),
            vocab_size: int("vocab_size")?,
            hidden_size,
            intermediate_size: int("intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads: int("num_key_value_heads").unwrap_or(num_heads),
            head_dim,
            rotary_dim: None,
            rms_norm_eps: v["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32,
            rope_theta: theta("full_attention", "rope_theta", 1e6),
            rope_scaling: None,
            max_position_embeddings: int("max_position_embeddings").unwrap_or(32768),
            tie_word_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(true),
            attention_bias: v["attention_bias"].as_bool().unwrap_or(false),
            sliding_window: v["sliding_window"].as_u64().map(|w| w as usize),
            qk_norm: true,
            sliding_window_pattern: Some(PATTERN),
            rope_local_theta: Some(theta("sliding_attention", "rope_local_base_freq", 10000.0)),
            query_pre_attn_scalar: Some(v["query_pre_attn_scalar"].as_f64().unwrap_or(head_dim as f64) as f32),
            ssm: None,
            hybrid: None,
            short_conv: None,
            delta_net: None,
            multipliers: None,
            no_rope_layers: Vec::new(),
            pooling: None,
            moe: None,
            gemma4: None,
        };
        if config.attention_bias {
            return refuse("attention_bias is set; Gemma 3 has no projection biases".into());
        }
        config.check(file)?;
        Ok(config)
    }

    /// transformers' `Gemma4TextConfig` (`Gemma4ForCausalLM`): per-layer `layer_types`, the
    /// full layers' head size and KV heads in `per_layer_config` (or `global_head_dim` and
    /// `num_global_key_value_heads`), proportional RoPE on them, KV sharing, per-layer
    /// embeddings, and with `enable_moe_block` routed experts in every layer beside its MLP
    /// ([`gemma4_moe`]).
    fn gemma4_from_hf(file: &str, v: &Value) -> Result<ModelConfig> {
        let int = |key: &str| v[key].as_u64().map(|x| x as usize).ok_or_else(|| missing(file, key));
        let refuse = |detail: String| Err(WeftError::model(file, detail));
        let moe = match v["enable_moe_block"].as_bool() {
            Some(true) => Some(gemma4_moe(int("num_experts")?, int("top_k_experts")?, int("moe_intermediate_size")?)),
            _ => None,
        };
        if let Some(act) = v["hidden_activation"].as_str().filter(|a| *a != "gelu_pytorch_tanh") {
            return refuse(format!("hidden_activation {act:?}; weft runs Gemma 4's gelu_pytorch_tanh"));
        }
        if v["attention_bias"].as_bool() == Some(true) {
            return refuse("attention_bias is set; Gemma 4 has no projection biases".into());
        }
        if v["use_bidirectional_attention"].as_str() == Some("all") {
            return refuse("use_bidirectional_attention is \"all\"; weft runs Gemma 4 causally".into());
        }
        let num_layers = int("num_hidden_layers")?;
        let types = v["layer_types"].as_array().ok_or_else(|| missing(file, "layer_types"))?;
        if types.len() != num_layers {
            return refuse(format!("layer_types has {} entries; the model has {num_layers} layers", types.len()));
        }
        let sliding: Vec<bool> = types.iter().map(|t| t.as_str() == Some("sliding_attention")).collect();
        let head_dim = int("head_dim")?;
        let num_kv_heads = int("num_key_value_heads")?;
        // transformers writes the full layers' overrides per layer; older configs the two keys.
        let full = (0..num_layers).find(|&i| !sliding[i]).map(|i| &v["per_layer_config"][i.to_string()]);
        let global = |key: &str, override_key: &str, default: usize| {
            full.and_then(|c| c[override_key].as_u64()).or_else(|| v[key].as_u64()).map_or(default, |x| x as usize)
        };
        let global_head_dim = global("global_head_dim", "head_dim", head_dim);
        let global_kv_heads = global("num_global_key_value_heads", "num_key_value_heads", num_kv_heads);
        let rope = |kind: &str| &v["rope_parameters"][kind];
        for (kind, allowed) in [("sliding_attention", "default"), ("full_attention", "proportional")] {
            let t = rope(kind)["rope_type"].as_str().unwrap_or("default");
            if t != allowed && t != "default" {
                return refuse(format!("rope_parameters.{kind}.rope_type {t:?} is not supported for Gemma 4"));
            }
        }
        let theta = |kind: &str, default: f64| rope(kind)["rope_theta"].as_f64().unwrap_or(default) as f32;
        let full_fraction = match rope("full_attention")["rope_type"].as_str() {
            Some("proportional") => rope("full_attention")["partial_rotary_factor"].as_f64().unwrap_or(1.0),
            _ => 1.0,
        };
        let shared = v["num_kv_shared_layers"].as_u64().unwrap_or(0) as usize;
        let intermediate_size = int("intermediate_size")?;
        let first_shared_layer = num_layers.saturating_sub(shared);
        let double = v["use_double_wide_mlp"].as_bool() == Some(true);
        let per_layer_input_size = v["hidden_size_per_layer_input"].as_u64().unwrap_or(0) as usize;
        let hidden_size = int("hidden_size")?;
        let config = ModelConfig {
            architecture: "gemma4".into(),
            vocab_size: int("vocab_size")?,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads: int("num_attention_heads")?,
            num_kv_heads,
            head_dim,
            rotary_dim: None,
            rms_norm_eps: v["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32,
            rope_theta: theta("full_attention", 1e6),
            rope_scaling: None,
            max_position_embeddings: int("max_position_embeddings").unwrap_or(131072),
            tie_word_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(true),
            attention_bias: false,
            sliding_window: v["sliding_window"].as_u64().map(|w| w as usize),
            qk_norm: true,
            sliding_window_pattern: None,
            rope_local_theta: Some(theta("sliding_attention", 10000.0)),
            query_pre_attn_scalar: None,
            ssm: None,
            hybrid: None,
            short_conv: None,
            delta_net: None,
            multipliers: None,
            no_rope_layers: Vec::new(),
            pooling: None,
            moe,
            gemma4: Some(Gemma4Config {
                kv_sources: gemma4_kv_sources(&sliding, first_shared_layer),
                sliding,
                global_head_dim,
                global_kv_heads,
                k_eq_v: v["attention_k_eq_v"].as_bool() == Some(true),
                global_rope_angles: (full_fraction * global_head_dim as f64 / 2.0) as usize,
                intermediate_sizes: (0..num_layers)
                    .map(|i| if double && i >= first_shared_layer { 2 * intermediate_size } else { intermediate_size })
                    .collect(),
                per_layer_input_size,
                per_layer_vocab_size: if per_layer_input_size > 0 { int("vocab_size_per_layer_input")? } else { 0 },
                final_logit_softcapping: v["final_logit_softcapping"].as_f64().map(|c| c as f32),
                gemma3n: None,
            }),
        };
        config.check(file)?;
        Ok(config)
    }

    /// transformers' `GraniteMoeHybridConfig`, dense variants (no routed experts).
    fn granite_hybrid_from_hf(file: &str, v: &Value) -> Result<ModelConfig> {
        let int = |key: &str| v[key].as_u64().map(|x| x as usize).ok_or_else(|| missing(file, key));
        let float = |key: &str, default: f32| v[key].as_f64().map_or(default, |x| x as f32);
        let hidden_size = int("hidden_size")?;
        let num_heads = int("num_attention_heads")?;
        let num_layers = int("num_hidden_layers")?;
        let layer_types: Vec<&str> = match v["layer_types"].as_array() {
            Some(types) => types.iter().map(|t| t.as_str().unwrap_or("")).collect(),
            None => vec!["linear_attention"; num_layers],
        };
        let mamba_heads = int("mamba_n_heads")?;
        let expand = v["mamba_expand"].as_u64().unwrap_or(2) as usize;
        // "auto": the inner size split over the heads.
        let mamba_head_dim =
            v["mamba_d_head"].as_u64().map_or(expand * hidden_size / mamba_heads.max(1), |d| d as usize);
        let rope_theta = v["rope_parameters"]["rope_theta"].as_f64().or_else(|| v["rope_theta"].as_f64());
        // Granite 4.0-H Tiny and Small route each token through experts beside the shared MLP.
        let moe = match v["num_local_experts"].as_u64() {
            Some(n) if n > 0 => Some(granite_moe_from_hf(file, v)?),
            _ => None,
        };
        let config = ModelConfig {
            architecture: "granitemoehybrid".into(),
            vocab_size: int("vocab_size")?,
            hidden_size,
            intermediate_size: int("shared_intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads: int("num_key_value_heads").unwrap_or(num_heads),
            head_dim: hidden_size / num_heads.max(1),
            rotary_dim: None,
            rms_norm_eps: float("rms_norm_eps", 1e-6),
            rope_theta: rope_theta.unwrap_or(10000.0) as f32,
            rope_scaling: None,
            max_position_embeddings: int("max_position_embeddings").unwrap_or(4096),
            tie_word_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(false),
            attention_bias: v["attention_bias"].as_bool().unwrap_or(false),
            sliding_window: None,
            qk_norm: false,
            sliding_window_pattern: None,
            rope_local_theta: None,
            query_pre_attn_scalar: None,
            ssm: Some(SsmConfig {
                conv_kernel: int("mamba_d_conv")?,
                state_size: int("mamba_d_state")?,
                num_groups: v["mamba_n_groups"].as_u64().unwrap_or(1) as usize,
                num_heads: mamba_heads,
                head_dim: mamba_head_dim,
            }),
            hybrid: Some(HybridConfig {
                // "attention" in published checkpoints, "full_attention" as transformers 5 writes it.
                attention_layers: (0..num_layers)
                    .filter(|&i| matches!(layer_types.get(i), Some(&"attention" | &"full_attention")))
                    .collect(),
                use_rope: v["position_embedding_type"].as_str() == Some("rope"),
            }),
            short_conv: None,
            delta_net: None,
            multipliers: Some(Multipliers {
                embedding: float("embedding_multiplier", 1.0),
                residual: float("residual_multiplier", 1.0),
                attention: float("attention_multiplier", 1.0),
                logits_scaling: float("logits_scaling", 1.0),
            }),
            no_rope_layers: Vec::new(),
            pooling: None,
            moe,
            gemma4: None,
        };
        config.check(file)?;
        Ok(config)
    }

    /// transformers' `Lfm2Config`: attention layers (`layer_types` "full_attention", or
    /// `full_attn_idxs`) among short convolutions, and the MLP width `Lfm2MLP` derives from
    /// `intermediate_size` (as llama.cpp's converter writes it).
    fn lfm2_from_hf(file: &str, v: &Value) -> Result<ModelConfig> {
        let int = |key: &str| v[key].as_u64().map(|x| x as usize).ok_or_else(|| missing(file, key));
        let refuse = |detail: &str| Err(WeftError::model(file, detail.to_string()));
        if v["conv_bias"].as_bool() == Some(true) {
            return refuse("conv_bias is set; weft runs LFM2's convolutions and their projections without biases");
        }
        let hidden_size = int("hidden_size")?;
        let num_heads = int("num_attention_heads")?;
        let num_layers = int("num_hidden_layers")?;
        let attention_layers: Vec<usize> = match (v["layer_types"].as_array(), v["full_attn_idxs"].as_array()) {
            (Some(types), _) => {
                (0..num_layers).filter(|&i| types.get(i).and_then(Value::as_str) != Some("conv")).collect()
            }
            (None, Some(idxs)) => idxs.iter().filter_map(|i| i.as_u64().map(|i| i as usize)).collect(),
            (None, None) => (0..num_layers).collect(),
        };
        // `Lfm2MLP`: 2/3 of the configured width, times block_ffn_dim_multiplier, rounded up to
        // a multiple of block_multiple_of. LFM2-MoE's dense layers take intermediate_size as is.
        let with_experts = v["model_type"].as_str() == Some("lfm2_moe");
        let mut intermediate_size = int("block_ff_dim").or_else(|_| int("intermediate_size"))?;
        if !with_experts && v["block_auto_adjust_ff_dim"].as_bool().unwrap_or(true) {
            intermediate_size = 2 * intermediate_size / 3;
            if let Some(multiplier) = v["block_ffn_dim_multiplier"].as_f64() {
                intermediate_size = (multiplier * intermediate_size as f64) as usize;
                let multiple = v["block_multiple_of"].as_u64().unwrap_or(256).max(1) as usize;
                intermediate_size = intermediate_size.div_ceil(multiple) * multiple;
            }
        }
        let rope_theta = v["rope_parameters"]["rope_theta"].as_f64().or_else(|| v["rope_theta"].as_f64());
        if let Some(kind) = v["rope_parameters"]["rope_type"].as_str().filter(|t| *t != "default") {
            return refuse(&format!("rope_parameters.rope_type {kind:?} is not supported for LFM2"));
        }
        let moe = if with_experts {
            if let Some(scale) = v["routed_scaling_factor"].as_f64().filter(|&x| x != 1.0) {
                return refuse(&format!(
                    "routed_scaling_factor is {scale}; weft runs LFM2-MoE's experts unscaled, as llama.cpp does"
                ));
            }
            Some(MoeConfig {
                num_experts: int("num_experts")?,
                experts_per_token: int("num_experts_per_tok")?,
                expert_intermediate_size: int("moe_intermediate_size")?,
                routing: Routing::Sigmoid { normalize: v["norm_topk_prob"].as_bool().unwrap_or(true) },
                gate: ExpertGate::Silu,
                shared_expert_size: 0,
                shared_expert_gated: false,
                leading_dense_layers: int("num_dense_layers").unwrap_or(0),
            })
        } else {
            None
        };
        let config = ModelConfig {
            architecture: if with_experts { "lfm2moe" } else { "lfm2" }.into(),
            vocab_size: int("vocab_size")?,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads: int("num_key_value_heads").unwrap_or(num_heads),
            head_dim: hidden_size / num_heads.max(1),
            rotary_dim: None,
            rms_norm_eps: v["norm_eps"].as_f64().unwrap_or(1e-5) as f32,
            rope_theta: rope_theta.unwrap_or(1e6) as f32,
            rope_scaling: None,
            max_position_embeddings: int("max_position_embeddings").unwrap_or(128_000),
            tie_word_embeddings: v["tie_word_embeddings"].as_bool().or(v["tie_embedding"].as_bool()).unwrap_or(true),
            attention_bias: false,
            sliding_window: None,
            qk_norm: true,
            sliding_window_pattern: None,
            rope_local_theta: None,
            query_pre_attn_scalar: None,
            ssm: None,
            hybrid: Some(HybridConfig { attention_layers, use_rope: true }),
            short_conv: Some(int("conv_L_cache").unwrap_or(3)),
            delta_net: None,
            multipliers: None,
            no_rope_layers: Vec::new(),
            pooling: None,
            moe,
            gemma4: None,
        };
        config.check(file)?;
        Ok(config)
    }

    /// transformers' `Qwen3_5TextConfig` (the text model of Qwen3.5, `Qwen3_5ForCausalLM`, or
    /// the `text_config` of `Qwen3_5ForConditionalGeneration`, `architecture` "qwen3_5", whose
    /// `tie` is its own) and `Qwen3_5MoeTextConfig` (`architecture` "qwen3_5_moe_text", or
    /// "qwen3_5_moe" around it): Gated DeltaNet layers (`layer_types` "linear_attention", or all
    /// but every `full_attention_interval`-th) among gated attention layers with partial RoPE.
    /// Its multimodal RoPE sections rotate text positions as plain RoPE, every section seeing
    /// the same position. The MoE's every layer routes (`Qwen3_5MoeSparseMoeBlock`: softmax,
    /// top-k, always renormalised) beside a sigmoid-gated shared expert.
    fn qwen35_from_hf(file: &str, v: &Value, architecture: &str, tie: Option<bool>) -> Result<ModelConfig> {
        let int = |key: &str| v[key].as_u64().map(|x| x as usize).ok_or_else(|| missing(file, key));
        let refuse = |detail: &str| Err(WeftError::model(file, detail.to_string()));
        if v["attention_bias"].as_bool() == Some(true) {
            return refuse("attention_bias is set; weft runs Qwen3.5's attention without biases");
        }
        let rope = &v["rope_parameters"];
        if let Some(kind) = rope["rope_type"].as_str().filter(|t| *t != "default") {
            return refuse(&format!("rope_parameters.rope_type {kind:?} is not supported for Qwen3.5"));
        }
        let hidden_size = int("hidden_size")?;
        let num_heads = int("num_attention_heads")?;
        let num_layers = int("num_hidden_layers")?;
        let head_dim = int("head_dim").unwrap_or(hidden_size / num_heads.max(1));
        let attention_layers: Vec<usize> = match v["layer_types"].as_array() {
            Some(types) => {
                (0..num_layers).filter(|&i| types.get(i).and_then(Value::as_str) != Some("linear_attention")).collect()
            }
            None => {
                let interval = v["full_attention_interval"].as_u64().unwrap_or(4).max(1) as usize;
                (0..num_layers).filter(|i| (i + 1) % interval == 0).collect()
            }
        };
        // transformers' default partial_rotary_factor for Qwen3.5 is 0.25.
        let partial = rope["partial_rotary_factor"].as_f64().or_else(|| v["partial_rotary_factor"].as_f64());
        let rotary_dim = Some((head_dim as f64 * partial.unwrap_or(0.25)) as usize).filter(|&d| d != head_dim);
        let moe = if architecture.starts_with("qwen3_5_moe") {
            Some(MoeConfig {
                num_experts: int("num_experts")?,
                experts_per_token: int("num_experts_per_tok")?,
                expert_intermediate_size: int("moe_intermediate_size")?,
                routing: Routing::Softmax { normalize: true },
                gate: ExpertGate::Silu,
                shared_expert_size: int("shared_expert_intermediate_size")?,
                shared_expert_gated: true,
                leading_dense_layers: 0,
            })
        } else {
            None
        };
        let config = ModelConfig {
            architecture: architecture.into(),
            vocab_size: int("vocab_size")?,
            hidden_size,
            // The MoE's only dense MLP is its shared expert.
            intermediate_size: match moe {
                Some(m) => m.shared_expert_size,
                None => int("intermediate_size")?,
            },
            num_layers,
            num_heads,
            num_kv_heads: int("num_key_value_heads").unwrap_or(num_heads),
            head_dim,
            rotary_dim,
            rms_norm_eps: v["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32,
            rope_theta: rope["rope_theta"].as_f64().or_else(|| v["rope_theta"].as_f64()).unwrap_or(1e7) as f32,
            rope_scaling: None,
            max_position_embeddings: int("max_position_embeddings").unwrap_or(32768),
            tie_word_embeddings: tie.or(v["tie_word_embeddings"].as_bool()).unwrap_or(false),
            attention_bias: false,
            sliding_window: None,
            qk_norm: true,
            sliding_window_pattern: None,
            rope_local_theta: None,
            query_pre_attn_scalar: None,
            ssm: None,
            hybrid: Some(HybridConfig { attention_layers, use_rope: true }),
            short_conv: None,
            delta_net: Some(DeltaNetConfig {
                conv_kernel: int("linear_conv_kernel_dim").unwrap_or(4),
                num_k_heads: int("linear_num_key_heads")?,
                num_v_heads: int("linear_num_value_heads")?,
                head_k_dim: int("linear_key_head_dim")?,
                head_v_dim: int("linear_value_head_dim")?,
                v_heads_tiled: false,
            }),
            multipliers: None,
            no_rope_layers: Vec::new(),
            pooling: None,
            moe,
            gemma4: None,
        };
        config.check(file)?;
        Ok(config)
    }

    /// transformers' `Mamba2Config`: no attention, no MLP; the mixer's shape.
    fn mamba2_from_hf(file: &str, v: &Value) -> Result<ModelConfig> {
        let int = |key: &str| v[key].as_u64().map(|x| x as usize).ok_or_else(|| missing(file, key));
        let hidden_size = int("hidden_size")?;
        let expand = v["expand"].as_u64().unwrap_or(2) as usize;
        let num_heads = int("num_heads")?;
        let head_dim = int("head_dim")?;
        if num_heads * head_dim != expand * hidden_size {
            return Err(WeftError::model(
                file,
                format!(
                    "num_heads {num_heads} · head_dim {head_dim} must equal expand {expand} · hidden_size {hidden_size}"
                ),
            ));
        }
        let config = ModelConfig {
            architecture: "mamba2".into(),
            vocab_size: int("vocab_size")?,
            hidden_size,
            intermediate_size: 0,
            num_layers: int("num_hidden_layers")?,
            num_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            rotary_dim: None,
            rms_norm_eps: v["layer_norm_epsilon"].as_f64().unwrap_or(1e-5) as f32,
            rope_theta: 0.0,
            rope_scaling: None,
            // No positions: the state carries the context, however long.
            max_position_embeddings: 1 << 20,
            tie_word_embeddings: v["tie_word_embeddings"].as_bool().unwrap_or(false),
            attention_bias: false,
            sliding_window: None,
            qk_norm: false,
            sliding_window_pattern: None,
            rope_local_theta: None,
            query_pre_attn_scalar: None,
            hybrid: None,
            short_conv: None,
            delta_net: None,
            multipliers: None,
            no_rope_layers: Vec::new(),
            pooling: None,
            moe: None,
            gemma4: None,
            ssm: Some(SsmConfig {
                conv_kernel: int("conv_kernel")?,
                state_size: int("state_size")?,
                num_groups: v["n_groups"].as_u64().unwrap_or(1) as usize,
                num_heads,
                head_dim,
            }),
        };
        config.check(file)?;
        Ok(config)
    }

    /// Whether layer `layer` is a recurrent layer (Mamba2, or LFM2's short convolution) rather
    /// than attention.
    pub fn is_recurrent(&self, layer: usize) -> bool {
        self.layer_state().is_some() && !self.hybrid.as_ref().is_some_and(|h| h.attention_layers.contains(&layer))
    }

    /// Layers with a recurrent-state slot.
    pub fn num_recurrent_layers(&self) -> usize {
        (0..self.num_layers).filter(|&i| self.is_recurrent(i)).count()
    }

    /// What each recurrent layer keeps per sequence; `None` for a model without them.
    pub fn layer_state(&self) -> Option<LayerState> {
        if let Some(d) = self.delta_net {
            return Some(LayerState {
                conv_kernel: d.conv_kernel,
                conv_channels: d.conv_channels(),
                ssm: Some([d.num_v_heads, d.head_v_dim, d.head_k_dim]),
            });
        }
        match (self.ssm, self.short_conv) {
            (Some(ssm), _) => Some(LayerState {
                conv_kernel: ssm.conv_kernel,
                conv_channels: ssm.conv_channels(),
                ssm: Some([ssm.num_heads, ssm.head_dim, ssm.state_size]),
            }),
            (None, Some(kernel)) => {
                Some(LayerState { conv_kernel: kernel, conv_channels: self.hidden_size, ssm: None })
            }
            (None, None) => None,
        }
    }

    /// Layers with attention (and so a KV cache).
    pub fn num_attention_layers(&self) -> usize {
        (0..self.num_layers).filter(|&i| !self.is_recurrent(i)).count()
    }

    /// The leading dimensions of each head RoPE rotates (`rotary_dim`, else the whole head).
    pub fn rope_dim(&self) -> usize {
        self.rotary_dim.unwrap_or(self.head_dim)
    }

    pub(crate) fn check(&self, file: &str) -> Result<()> {
        if let Some(m) = &self.moe {
            if m.experts_per_token == 0 || m.experts_per_token > m.num_experts {
                return Err(WeftError::model(
                    file,
                    format!(
                        "each token goes to {} of {} experts; weft needs 1 to all of them",
                        m.experts_per_token, m.num_experts
                    ),
                ));
            }
        }
        let half = self.rope_dim() / 2;
        if let Some(RopeScaling::LongRope { short, long, .. }) = &self.rope_scaling {
            if short.len() != half || long.len() != half {
                return Err(WeftError::model(
                    file,
                    format!(
                        "LongRoPE needs rotated dims / 2 = {half} short and long factors; found {} and {}",
                        short.len(),
                        long.len()
                    ),
                ));
            }
        }
        if let Some(RopeScaling::FreqFactors(factors)) = &self.rope_scaling {
            if factors.len() != half {
                return Err(WeftError::model(
                    file,
                    format!("rope_freqs.weight has {} factors; the rotated dims need {half}", factors.len()),
                ));
            }
        }
        if let Some(d) = self.rotary_dim {
            if d == 0 || !d.is_multiple_of(2) || d > self.head_dim {
                return Err(WeftError::model(
                    file,
                    format!(
                        "RoPE rotates {d} dimensions of a {}-dimension head; weft needs an even number, at most the head",
                        self.head_dim
                    ),
                ));
            }
        }
        if let Some(ssm) = &self.ssm {
            let ok = ssm.num_heads > 0
                && ssm.head_dim > 0
                && ssm.num_groups > 0
                && ssm.num_heads % ssm.num_groups == 0
                && ssm.inner_size() % ssm.num_groups == 0
                && (2..=crate::gpu::kernels::ssm::MAX_CONV_KERNEL).contains(&ssm.conv_kernel)
                && ssm.state_size > 0
                && ssm.state_size % 4 == 0
                && ssm.head_dim % 4 == 0;
            if !ok {
                return Err(WeftError::model(
                    file,
                    format!(
                        "unsupported state-space shape: {ssm:?} (weft needs heads a multiple of groups, a conv kernel of 2 to {}, and a state size and head size that are multiples of 4)",
                        crate::gpu::kernels::ssm::MAX_CONV_KERNEL
                    ),
                ));
            }
            if self.num_attention_layers() == 0 {
                return Ok(());
            }
        }
        if let Some(d) = &self.delta_net {
            let ok = d.num_k_heads > 0
                && d.num_v_heads.is_multiple_of(d.num_k_heads)
                && d.num_v_heads > 0
                && d.head_k_dim > 0
                && d.head_k_dim.is_multiple_of(4)
                && d.head_v_dim > 0
                && d.head_v_dim.is_multiple_of(4)
                && (2..=crate::gpu::kernels::ssm::MAX_CONV_KERNEL).contains(&d.conv_kernel);
            if !ok {
                return Err(WeftError::model(
                    file,
                    format!(
                        "unsupported Gated DeltaNet shape: {d:?} (weft needs v heads a multiple of k heads, head sizes \
                         that are multiples of 4, and a conv kernel of 2 to {})",
                        crate::gpu::kernels::ssm::MAX_CONV_KERNEL
                    ),
                ));
            }
        }
        if let Some(kernel) = self.short_conv {
            if !(2..=crate::gpu::kernels::ssm::MAX_CONV_KERNEL).contains(&kernel) {
                return Err(WeftError::model(
                    file,
                    format!(
                        "a short convolution of {kernel}; weft runs 2 to {}",
                        crate::gpu::kernels::ssm::MAX_CONV_KERNEL
                    ),
                ));
            }
        }
        if let Some(g) = &self.gemma4 {
            let layers = self.num_layers;
            let ok = g.sliding.len() == layers
                && g.kv_sources.len() == layers
                && g.kv_sources.iter().all(|&source| g.kv_sources.get(source) == Some(&source))
                && g.intermediate_sizes.len() == layers
                && g.global_kv_heads > 0
                && self.num_heads.is_multiple_of(g.global_kv_heads)
                && g.global_head_dim.is_multiple_of(4)
                && g.global_rope_angles <= g.global_head_dim / 2
                && (0..layers)
                    .all(|i| self.kv_source(i) <= i && self.is_sliding(self.kv_source(i)) == self.is_sliding(i));
            if !ok {
                return Err(WeftError::model(file, format!("unsupported Gemma 4 layout: {g:?}")));
            }
            if g.global_head_dim > crate::gpu::kernels::paged::MAX_HEAD_DIM {
                return Err(WeftError::model(
                    file,
                    format!(
                        "Gemma 4's full-attention layers have heads of {} dimensions; weft's attention runs heads of at \
                         most {}",
                        g.global_head_dim,
                        crate::gpu::kernels::paged::MAX_HEAD_DIM
                    ),
                ));
            }
        }
        let ok = self.num_heads > 0
            && self.num_kv_heads > 0
            && self.num_heads.is_multiple_of(self.num_kv_heads)
            && self.head_dim > 0
            && self.head_dim.is_multiple_of(4)
            && self.head_dim <= crate::gpu::kernels::paged::MAX_HEAD_DIM
            && self.num_layers > 0
            && self.vocab_size > 0;
        if !ok {
            return Err(WeftError::model(
                file,
                format!(
                    "unsupported shape: {} heads, {} KV heads, head_dim {}, {} layers (weft needs heads a multiple of KV heads and a head_dim that is a multiple of 4, at most {})",
                    self.num_heads,
                    self.num_kv_heads,
                    self.head_dim,
                    self.num_layers,
                    crate::gpu::kernels::paged::MAX_HEAD_DIM
                ),
            ));
        }
        Ok(())
    }

    /// Whether layer `layer` attends within the sliding window (if there is one).
    pub fn is_sliding(&self, layer: usize) -> bool {
        if let Some(g) = &self.gemma4 {
            return self.sliding_window.is_some() && g.sliding.get(layer) == Some(&true);
        }
        self.sliding_window.is_some() && self.sliding_window_pattern.is_none_or(|n| !(layer + 1).is_multiple_of(n))
    }

    /// The layer whose KV cache layer `layer` attends over: itself, or for a Gemma 4
    /// KV-sharing layer its `Gemma4Config::kv_sources` entry.
    pub fn kv_source(&self, layer: usize) -> usize {
        self.gemma4.as_ref().map_or(layer, |g| g.kv_sources[layer])
    }

    /// The (KV heads, head size) layer `layer` attends with (a KV-sharing layer: its source's).
    pub fn attention_shape(&self, layer: usize) -> (usize, usize) {
        match &self.gemma4 {
            Some(g) if !g.sliding[layer] => (g.global_kv_heads, g.global_head_dim),
            _ => (self.num_kv_heads, self.head_dim),
        }
    }

    /// The (KV heads, head size) of layer `layer`'s own KV cache; `None` for a layer without
    /// one (a recurrent layer, or one that attends over an earlier layer's cache).
    pub fn kv_shape(&self, layer: usize) -> Option<(usize, usize)> {
        (!self.is_recurrent(layer) && self.kv_source(layer) == layer).then(|| self.attention_shape(layer))
    }

    /// The K values one token keeps over every layer's own cache (as many V values): what a
    /// KV block's size is counted in.
    pub fn kv_token_values(&self) -> usize {
        (0..self.num_layers).filter_map(|i| self.kv_shape(i)).map(|(heads, dim)| heads * dim).sum()
    }

    /// The most K values one token keeps in one layer's cache (a layer's K tensor must fit
    /// one binding).
    pub fn kv_layer_values_max(&self) -> usize {
        (0..self.num_layers).filter_map(|i| self.kv_shape(i)).map(|(heads, dim)| heads * dim).max().unwrap_or(0)
    }

    /// Layer `layer`'s MLP width.
    pub fn layer_intermediate_size(&self, layer: usize) -> usize {
        match &self.gemma4 {
            Some(g) => g.intermediate_sizes[layer],
            None => self.intermediate_size,
        }
    }

    /// The widest layer's attention activations: the (q/k/v row, attention output) widths
    /// `((heads + 2 · kv_heads) · head_dim, heads · head_dim)` and its head size.
    pub fn widest_attention(&self) -> (usize, usize, usize) {
        let shapes = (0..self.num_layers).map(|i| self.attention_shape(i)).chain([(self.num_kv_heads, self.head_dim)]);
        shapes.fold((0, 0, 0), |(qkv, attn, hd), (kv_heads, head_dim)| {
            (qkv.max((self.num_heads + 2 * kv_heads) * head_dim), attn.max(self.num_heads * head_dim), hd.max(head_dim))
        })
    }

    /// RoPE inverse frequencies after scaling, computed in f32 as transformers does, for a
    /// model serving `max_position_embeddings` positions.
    pub fn inv_freq(&self) -> Vec<f32> {
        self.inv_freq_for_context(self.max_position_embeddings)
    }

    /// [`inv_freq`](Self::inv_freq) for a model serving `context` positions (LongRoPE's
    /// factors depend on it).
    pub fn inv_freq_for_context(&self, context: usize) -> Vec<f32> {
        self.inv_freq_with_base(self.rope_theta, context)
    }

    /// [`inv_freq`](Self::inv_freq) of the sliding-window layers (their own base, if any).
    pub fn local_inv_freq(&self) -> Vec<f32> {
        self.inv_freq_with_base(self.rope_local_theta.unwrap_or(self.rope_theta), self.max_position_embeddings)
    }

    /// What RoPE's cos and sin are multiplied by (LongRoPE's and YaRN's attention factor;
    /// else 1).
    pub fn rope_attention_factor(&self) -> f32 {
        match &self.rope_scaling {
            Some(RopeScaling::LongRope { attention_factor, .. } | RopeScaling::Yarn { attention_factor, .. }) => {
                *attention_factor
            }
            _ => 1.0,
        }
    }

    /// The RoPE table of the global layers, (num_positions, rope_dim / 2, 2), for a model serving
    /// `context` positions: cos and sin of each position's angles
    /// (`gpu::kernels::rope::cos_sin_table`), times the attention factor. What the GPU's
    /// `rope_kv_write` and the CPU oracles read.
    pub fn rope_table(&self, context: usize, num_positions: usize) -> Vec<f32> {
        let attention_factor = self.rope_attention_factor();
        let table = crate::gpu::kernels::rope::cos_sin_table(&self.inv_freq_for_context(context), num_positions);
        if attention_factor == 1.0 { table } else { table.into_iter().map(|v| v * attention_factor).collect() }
    }

    fn inv_freq_with_base(&self, theta: f32, context: usize) -> Vec<f32> {
        let dim = self.rope_dim();
        let base = crate::gpu::kernels::rope::inv_freq(dim, theta);
        match &self.rope_scaling {
            None => base,
            Some(RopeScaling::LongRope { short, long, original_max_position_embeddings, .. }) => {
                let factors = if context > *original_max_position_embeddings { long } else { short };
                // transformers: 1 / (factor · theta^(2i/d)), in f32.
                let exponent = |i: usize| (2 * i) as f32 / dim as f32;
                factors.iter().enumerate().map(|(i, d)| 1.0 / (d * theta.powf(exponent(i)))).collect()
            }
            Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                ..
            }) => {
                yarn_inv_freq(dim, theta, *factor, *original_max_position_embeddings, *beta_fast, *beta_slow, *truncate)
            }
            Some(RopeScaling::Linear { factor }) => base.iter().map(|f| f / factor).collect(),
            Some(RopeScaling::FreqFactors(div)) => base.iter().zip(div).map(|(f, d)| f / d).collect(),
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let old = *original_max_position_embeddings as f32;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's pooling types and the `--pooling` names; a reranker's rank pooling and
    /// unknown values are refused, naming them.
    #[test]
    fn pooling_kinds_read_and_refused() {
        let kinds = [(0, None), (1, Some(Pooling::Mean)), (2, Some(Pooling::Cls)), (3, Some(Pooling::Last))];
        for (value, kind) in kinds {
            assert_eq!(Pooling::from_gguf(value).unwrap(), kind);
        }
        assert!(Pooling::from_gguf(4).unwrap_err().to_string().contains("rank pooling"));
        assert!(Pooling::from_gguf(9).unwrap_err().to_string().contains("pooling type 9"));
        for (name, kind) in [("last", Pooling::Last), ("cls", Pooling::Cls), ("mean", Pooling::Mean)] {
            assert_eq!(Pooling::parse(name).unwrap(), kind);
            assert_eq!(kind.needs_whole_prompt(), kind != Pooling::Last);
        }
        assert!(Pooling::parse("max").unwrap_err().to_string().contains("\"mean\""));
    }

    /// Llama 3.1 8B's frequencies: theta 5e5, head_dim 128, llama3 scaling (factor 8, low 1,
    /// high 4, original context 8192). Expected values printed by transformers 5.24
    /// (`ROPE_INIT_FUNCTIONS["llama3"]`, f32); they must agree to f32 rounding.
    #[test]
    fn llama3_scaling_matches_transformers() {
        let config = ModelConfig {
            architecture: "llama".into(),
            vocab_size: 128256,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_layers: 32,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            rotary_dim: None,
            rms_norm_eps: 1e-5,
            rope_theta: 500000.0,
            rope_scaling: Some(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            }),
            max_position_embeddings: 131072,
            tie_word_embeddings: false,
            attention_bias: false,
            sliding_window: None,
            qk_norm: false,
            sliding_window_pattern: None,
            rope_local_theta: None,
            query_pre_attn_scalar: None,
            ssm: None,
            hybrid: None,
            short_conv: None,
            delta_net: None,
            multipliers: None,
            no_rope_layers: Vec::new(),
            pooling: None,
            moe: None,
            gemma4: None,
        };
        let got = config.inv_freq();
        let want = [
            (0, 1.0),
            (1, 0.8146172165870667),
            (20, 0.016560440883040428),
            (30, 0.0013718936825171113),
            (40, 3.428102354519069e-05),
            (45, 1.2297638932068367e-05),
            (50, 4.411534519022098e-06),
            (63, 3.068925877869333e-07),
        ];
        for (i, w) in want {
            let rel = (f64::from(got[i]) - w).abs() / w;
            assert!(rel < 1e-6, "inv_freq[{i}] = {} vs {w}", got[i]);
        }
    }

    /// A Gemma 3 directory weft would run wrongly is refused, naming what differs.
    #[test]
    fn gemma3_hf_configs_weft_cannot_run_are_refused() {
        let base = r#"{"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
            "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 10, "sliding_window": 8"#;
        let config = ModelConfig::from_hf_json("config.json", &format!("{base}}}")).unwrap();
        assert_eq!((config.architecture.as_str(), config.sliding_window_pattern), ("gemma3", Some(6)));
        let capped = ModelConfig::from_hf_json("config.json", &format!(r#"{base}, "final_logit_softcapping": 30.0}}"#));
        assert!(capped.unwrap_err().to_string().contains("final_logit_softcapping"));
        let types = ModelConfig::from_hf_json(
            "config.json",
            &format!(r#"{base}, "layer_types": ["full_attention", "sliding_attention"]}}"#),
        );
        assert!(types.unwrap_err().to_string().contains("layer_types"));
        let gemma2 = ModelConfig::from_hf_json("config.json", r#"{"model_type": "gemma2"}"#);
        assert!(gemma2.unwrap_err().to_string().contains("gemma3_text"));
    }

    #[test]
    fn hf_config_errors_name_the_field() {
        let err = ModelConfig::from_hf_json("config.json", r#"{"model_type": "llama"}"#).unwrap_err().to_string();
        assert!(err.contains("config.json") && err.contains("hidden_size"), "{err}");
        let err = ModelConfig::from_hf_json(
            "config.json",
            r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3,
                "intermediate_size": 8, "num_hidden_layers": 1, "vocab_size": 10}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unsupported shape"), "{err}");
        let err = ModelConfig::from_hf_json(
            "config.json",
            r#"{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 8,
                "num_hidden_layers": 1, "vocab_size": 10, "rope_scaling": {"rope_type": "dynamic", "factor": 4}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("rope_scaling type \"dynamic\" is not supported"), "{err}");
    }

    /// SmolLM3's NoPE layers from config.json: the `no_rope_layers` list (0 = NoPE), else every
    /// `no_rope_layer_interval`-th layer (4 by default); a short list and a sliding window are
    /// refused.
    #[test]
    fn smollm3_nope_layers_are_read_as_transformers_reads_them() {
        let smollm3 = |extra: &str| {
            let json = format!(
                r#"{{"model_type": "smollm3", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 32,
                    "num_hidden_layers": 8, "vocab_size": 10{extra}}}"#
            );
            ModelConfig::from_hf_json("config.json", &json)
        };
        assert_eq!(smollm3("").unwrap().no_rope_layers, [3, 7]);
        assert_eq!(smollm3(r#", "no_rope_layer_interval": 3"#).unwrap().no_rope_layers, [2, 5]);
        let listed = smollm3(r#", "no_rope_layers": [0, 1, 1, 1, 1, 0, 1, 1]"#).unwrap();
        assert_eq!(listed.no_rope_layers, [0, 5]);
        let short = smollm3(r#", "no_rope_layers": [1, 1, 1, 0]"#).unwrap_err().to_string();
        assert!(short.contains("no_rope_layers has 4 entries"), "{short}");
        let window = smollm3(r#", "use_sliding_window": true, "sliding_window": 8"#).unwrap_err().to_string();
        assert!(window.contains("use_sliding_window"), "{window}");
    }

    /// config.json's YaRN keys as transformers reads them: the factor, the original context (in
    /// rope_scaling, else top level, else the context), betas (0 meaning the default), and the
    /// attention factor given, or from mscale / mscale_all_dim, or 0.1 · ln(factor) + 1.
    #[test]
    fn hf_yarn_keys_are_read_as_transformers_reads_them() {
        let yarn = |scaling: &str| {
            let json = format!(
                r#"{{"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 8,
                    "num_hidden_layers": 1, "vocab_size": 10, "max_position_embeddings": 128,
                    "rope_scaling": {{"rope_type": "yarn", {scaling}}}}}"#
            );
            ModelConfig::from_hf_json("config.json", &json).unwrap().rope_scaling.unwrap()
        };
        let RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            truncate,
            attention_factor,
        } = yarn(r#""factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 0"#)
        else {
            panic!("not YaRN")
        };
        assert_eq!(
            (factor, original_max_position_embeddings, beta_fast, beta_slow, truncate),
            (4.0, 32, 32.0, 1.0, true)
        );
        assert!((attention_factor - (1.0 + 0.1 * 4f32.ln())).abs() < 1e-6);
        let Some(RopeScaling::Yarn { attention_factor, .. }) = Some(yarn(
            r#""factor": 40.0, "original_max_position_embeddings": 32, "mscale": 1.0, "mscale_all_dim": 1.0"#,
        )) else {
            panic!("not YaRN")
        };
        assert_eq!(attention_factor, 1.0);
        let RopeScaling::Yarn { factor, original_max_position_embeddings, attention_factor, truncate, .. } =
            yarn(r#""original_max_position_embeddings": 64, "attention_factor": 0.5, "truncate": false"#)
        else {
            panic!("not YaRN")
        };
        assert_eq!((factor, original_max_position_embeddings, attention_factor, truncate), (2.0, 64, 0.5, false));
    }

    /// LFM2's config.json as `Lfm2Config` and `Lfm2MLP` read it: LFM2-1.2B's MLP width (12288
    /// configured, 2/3 of it times 1.0 rounded up to a multiple of 256: 8192), attention layers
    /// from `layer_types` or else `full_attn_idxs`, the conv window as each layer's state, and
    /// convolution biases refused.
    #[test]
    fn hf_lfm2_config_is_read_as_transformers_reads_it() {
        let lfm2 = |extra: &str| {
            let json = format!(
                r#"{{"model_type": "lfm2", "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
                    "num_hidden_layers": 4, "vocab_size": 65536, "intermediate_size": 12288,
                    "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "conv_L_cache": 3{extra}}}"#
            );
            ModelConfig::from_hf_json("config.json", &json)
        };
        let c = lfm2(r#", "layer_types": ["conv", "full_attention", "conv", "conv"]"#).unwrap();
        assert_eq!((c.intermediate_size, c.head_dim, c.short_conv), (8192, 64, Some(3)));
        assert_eq!(c.hybrid.as_ref().unwrap().attention_layers, [1]);
        assert_eq!((c.num_recurrent_layers(), c.num_attention_layers()), (3, 1));
        assert_eq!(c.layer_state(), Some(LayerState { conv_kernel: 3, conv_channels: 2048, ssm: None }));
        assert_eq!(c.layer_state().unwrap().bytes(), 2 * 2048 * 4);
        let c = lfm2(r#", "full_attn_idxs": [0, 2], "block_auto_adjust_ff_dim": false"#).unwrap();
        assert_eq!((c.intermediate_size, c.hybrid.unwrap().attention_layers), (12288, vec![0, 2]));
        let err = lfm2(r#", "conv_bias": true"#).unwrap_err().to_string();
        assert!(err.contains("conv_bias is set"), "{err}");
    }

    /// Qwen3.5-9B's text config (its `text_config`): every fourth layer attends by default,
    /// a quarter of each head rotates, and each DeltaNet layer keeps a 3-row window of q, k, v
    /// and a 128 × 128 matrix per v head.
    #[test]
    fn hf_qwen35_config_is_read_as_transformers_reads_it() {
        let qwen35 = |extra: &str| {
            let json = format!(
                r#"{{"model_type": "qwen3_5_text", "hidden_size": 4096, "num_attention_heads": 16,
                    "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 8, "vocab_size": 248320,
                    "intermediate_size": 12288, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                    "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                    "rope_parameters": {{"rope_type": "default", "rope_theta": 10000000}}{extra}}}"#
            );
            ModelConfig::from_hf_json("config.json", &json)
        };
        let c = qwen35("").unwrap();
        assert_eq!(c.hybrid.as_ref().unwrap().attention_layers, [3, 7]);
        assert_eq!((c.rope_dim(), c.rope_theta, c.tie_word_embeddings), (64, 1e7, false));
        let d = c.delta_net.unwrap();
        assert_eq!((d.conv_channels(), d.in_proj_size(), d.v_heads_tiled), (8192, 8192 + 4096 + 64, false));
        assert_eq!(
            c.layer_state(),
            Some(LayerState { conv_kernel: 4, conv_channels: 8192, ssm: Some([32, 128, 128]) })
        );
        let c = qwen35(
            r#", "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention",
            "linear_attention", "linear_attention", "linear_attention", "full_attention"]"#,
        )
        .unwrap();
        assert_eq!((c.num_recurrent_layers(), c.num_attention_layers()), (6, 2));
        let err = qwen35(r#", "linear_num_key_heads": 12"#).unwrap_err().to_string();
        assert!(err.contains("v heads a multiple of k heads"), "{err}");
        let err = qwen35(r#", "attention_bias": true"#).unwrap_err().to_string();
        assert!(err.contains("attention_bias is set"), "{err}");
    }

    /// Qwen3.5-35B-A3B's text config (no `intermediate_size`: its only dense MLP is the
    /// shared expert), alone and inside `Qwen3_5MoeForConditionalGeneration`'s; a missing
    /// expert width is named.
    #[test]
    fn hf_qwen35moe_config_is_read_as_transformers_reads_it() {
        let text = |extra: &str| {
            format!(
                r#"{{"model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_attention_heads": 16,
                    "num_key_value_heads": 2, "head_dim": 256, "num_hidden_layers": 40, "vocab_size": 248320,
                    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                    "linear_num_value_heads": 32, "num_experts": 256, "num_experts_per_tok": 8,
                    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512{extra}}}"#
            )
        };
        let want = MoeConfig {
            num_experts: 256,
            experts_per_token: 8,
            expert_intermediate_size: 512,
            routing: Routing::Softmax { normalize: true },
            gate: ExpertGate::Silu,
            shared_expert_size: 512,
            shared_expert_gated: true,
            leading_dense_layers: 0,
        };
        let c = ModelConfig::from_hf_json("config.json", &text("")).unwrap();
        assert_eq!((c.architecture.as_str(), c.moe, c.intermediate_size), ("qwen3_5_moe_text", Some(want), 512));
        assert_eq!((c.num_recurrent_layers(), c.num_attention_layers(), c.rope_dim()), (30, 10, 64));
        let wrapped =
            format!(r#"{{"model_type": "qwen3_5_moe", "tie_word_embeddings": false, "text_config": {}}}"#, text(""));
        let c = ModelConfig::from_hf_json("config.json", &wrapped).unwrap();
        assert_eq!((c.architecture.as_str(), c.moe), ("qwen3_5_moe", Some(want)));
        let json = text("").replace(r#""moe_intermediate_size": 512, "#, "");
        let err = ModelConfig::from_hf_json("config.json", &json).unwrap_err().to_string();
        assert!(err.contains("moe_intermediate_size"), "{err}");
    }
}
