//! Gemma 3n (text) as one forward pass recorded on the GPU, from llama.cpp's GGUF layout or a
//! Hugging Face directory (`gemma3n_text`, or the `text_config` of a multimodal `gemma3n`,
//! whose vision and audio towers weft does not load).
//!
//! Reference: transformers' `models/gemma3n/modeling_gemma3n.py` (`Gemma3nForCausalLM`,
//! `Gemma3nTextModel`) and llama.cpp's `src/models/gemma3n.cpp`. Gemma 3n shares with Gemma 4's
//! "E" models their per-layer embeddings (`arch::per_layer`), KV sharing, sliding and full
//! layers, q/k/v norms, unscaled attention and final soft-cap (`Gemma4Config`). It adds:
//!
//! - **AltUp**: the hidden state is n parallel copies ("streams"). The scaled token embedding
//!   is stream 0; stream j > 0 is altup_projections[j-1] of it, rescaled to stream 0's root
//!   mean square (`magnitude_match`). Each layer first *predicts* every stream from all of them,
//!   with per-token coefficients from a router over the active stream
//!   (`tanh(modality_router(router_norm(s[active]) / hidden))`, `altup_predict`), runs on the
//!   active prediction only, then *corrects* every prediction by the layer's innovation on it
//!   (`altup_correct`). After the last layer streams j > 0 are projected back
//!   (altup_unembed_projections), rescaled to stream 0, and all n averaged before the final norm.
//! - **Laurel**: beside attention, a low-rank residual `xn + norm(right(left(xn)))` of the
//!   normalised input, averaged in: `h = (p + post_attn_norm(attn) + laurel) / √2`.
//! - **Activation sparsity**: in the layers whose `activation_sparsity_pattern` p > 0 the MLP's
//!   gate row becomes `max(gate - (mean + std · icdf(p)), 0)` before its GELU (`gaussian_topk`).
//!
//! Layer i, with streams s and active index a:
//!
//! ```text
//! p  = predict(s)                                    (every stream)
//! xn = input_layernorm(p[a])
//! h  = (p[a] + post_attn_norm(attention(xn)) + laurel(xn)) / √2
//! h  = h + post_ffw_norm(down(gelu_tanh(sparse(gate(ffn_norm(h)))) · up(ffn_norm(h))))
//! s  = correct(p, h)                                 (every stream)
//! s[j] += post_norm(proj(gelu_tanh(inp_gate(s[a] · correct_output_scale)) · ple[i]))   for j ≥ 1
//! ```
//!
//! transformers adds the per-layer branch to streams 1.. whatever the active index; weft does
//! the same.

use serde_json::Value;

use crate::error::{Result, WeftError};
use crate::gpu::kernels::altup::{MAX_STREAMS, altup_correct, altup_predict, gaussian_topk, magnitude_match};
use crate::gpu::kernels::elementwise::{add, gelu_mul, scale, softcap};
use crate::gpu::kernels::embedding::embedding;
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::paged::{PagedKv, QkvLayout, paged_attention, rope_kv_write};
use crate::gpu::kernels::reduce::{QkvPart, head_rms_norm, qkv_part_rms_norm, rms_norm};
use crate::gpu::kernels::rope::{RopePairing, cos_sin_table, inv_freq};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::Architecture;
use crate::model::arch::per_layer::{PerLayerBranch, PerLayerInputs, own_name};
use crate::model::arch::qwen35::language_model_name;
use crate::model::config::{Gemma3nConfig, Gemma4Config, ModelConfig, gemma4_kv_sources, missing};
use crate::model::gguf::GgufFile;
use crate::model::kv_pool::KvPool;
use crate::model::layers::{Activations, Gate, Linear, Mlp, StepInputs};
use crate::model::weights::{Checkpoint, Loader, Part, Renamed, WeightSource};
use crate::tensor::TensorFactory;

// ---- config ---------------------------------------------------------------------------------

/// The standard normal distribution's quantile function (Acklam's rational approximation,
/// relative error under 1.2e-9: far inside the f32 transformers computes `icdf` in).
pub fn normal_icdf(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.383_577_518_672_69e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] =
        [-5.447609879822406e1, 1.615858368580409e2, -1.556989798598866e2, 6.680131188771972e1, -1.328068155288572e1];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [7.784695709041462e-3, 3.224671290700398e-1, 2.445134137142996, 3.754408661907416];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    const LOW: f64 = 0.02425;
    if p < LOW {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - LOW {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// The normal quantile of `p` as transformers gets it (`Normal(0, 1).icdf` in f32:
/// √2 · erfinv(2p - 1), each step rounded to f32), which lands an ulp from the f32 nearest the
/// exact quantile (0.95: 1.6448535919 against 1.6448534727); the converter's GGUF carries the
/// same value.
fn torch_normal_icdf(p: f32) -> f32 {
    let t = 2.0 * p - 1.0;
    let erfinv = (normal_icdf((1.0 + f64::from(t)) / 2.0) / std::f64::consts::SQRT_2) as f32;
    erfinv * std::f32::consts::SQRT_2
}

/// The shape both readers find, made into a `ModelConfig` and checked.
struct Shape {
    architecture: &'static str,
    vocab_size: usize,
    hidden_size: usize,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    rms_norm_eps: f32,
    rope_theta: f32,
    rope_local_theta: f32,
    max_position_embeddings: usize,
    tie_word_embeddings: bool,
    sliding_window: Option<usize>,
    sliding: Vec<bool>,
    num_kv_shared_layers: usize,
    intermediate_sizes: Vec<usize>,
    per_layer_input_size: usize,
    per_layer_vocab_size: usize,
    final_logit_softcapping: Option<f32>,
    gemma3n: Gemma3nConfig,
}

impl Shape {
    fn into_config(self, file: &str) -> Result<ModelConfig> {
        let num_layers = self.sliding.len();
        let g = &self.gemma3n;
        let problem = if !(2..=MAX_STREAMS).contains(&g.altup_num_inputs) {
            Some(format!("altup_num_inputs is {}; weft runs 2 to {MAX_STREAMS}", g.altup_num_inputs))
        } else if g.altup_active_idx >= g.altup_num_inputs {
            Some(format!("altup_active_idx {} of {} streams", g.altup_active_idx, g.altup_num_inputs))
        } else if self.per_layer_input_size == 0 {
            Some("hidden_size_per_layer_input is 0; Gemma 3n has per-layer embeddings".into())
        } else if self.intermediate_sizes.len() != num_layers || g.sparsity_std_multipliers.len() != num_layers {
            Some(format!("per-layer MLP widths or sparsities do not cover the model's {num_layers} layers"))
        } else if g.laurel_rank == 0 {
            Some("laurel_rank is 0".into())
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(WeftError::model(file, problem));
        }
        let first_shared = num_layers.saturating_sub(self.num_kv_shared_layers);
        let config = ModelConfig {
            architecture: self.architecture.into(),
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_sizes.iter().copied().max().unwrap_or(0),
            num_layers,
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            rotary_dim: None,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            rope_scaling: None,
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            attention_bias: false,
            sliding_window: self.sliding_window,
            qk_norm: true,
            sliding_window_pattern: None,
            rope_local_theta: Some(self.rope_local_theta),
            query_pre_attn_scalar: None,
            ssm: None,
            hybrid: None,
            short_conv: None,
            delta_net: None,
            multipliers: None,
            no_rope_layers: Vec::new(),
            pooling: None,
            moe: None,
            // Gemma 3n's full layers have the sliding ones' heads, whole-head RoPE and v_proj.
            gemma4: Some(Gemma4Config {
                kv_sources: gemma4_kv_sources(&self.sliding, first_shared),
                sliding: self.sliding,
                global_head_dim: self.head_dim,
                global_kv_heads: self.num_kv_heads,
                k_eq_v: false,
                global_rope_angles: self.head_dim / 2,
                intermediate_sizes: self.intermediate_sizes,
                per_layer_input_size: self.per_layer_input_size,
                per_layer_vocab_size: self.per_layer_vocab_size,
                final_logit_softcapping: self.final_logit_softcapping,
                gemma3n: Some(self.gemma3n),
            }),
        };
        config.check(file)?;
        Ok(config)
    }
}

/// transformers' `Gemma3nTextConfig`: `model_type` "gemma3n_text", or the `text_config` of a
/// "gemma3n" (`Gemma3nForConditionalGeneration`, whose text weights are under
/// `model.language_model.`; its vision and audio towers are not read).
pub fn config_from_hf(file: &str, outer: &Value) -> Result<ModelConfig> {
    let multimodal = outer["model_type"].as_str() == Some("gemma3n");
    let v = if multimodal { &outer["text_config"] } else { outer };
    if !v.is_object() {
        return Err(missing(file, "text_config"));
    }
    let int = |key: &str| v[key].as_u64().map(|x| x as usize).ok_or_else(|| missing(file, key));
    let refuse = |detail: String| Err(WeftError::model(file, detail));
    if let Some(act) = v["hidden_activation"].as_str().filter(|a| *a != "gelu_pytorch_tanh") {
        return refuse(format!("hidden_activation {act:?}; weft runs Gemma 3n's gelu_pytorch_tanh"));
    }
    if v["attention_bias"].as_bool() == Some(true) {
        return refuse("attention_bias is set; Gemma 3n has no projection biases".into());
    }
    let num_layers = int("num_hidden_layers")?;
    // transformers' default: every fifth layer attends fully.
    let sliding: Vec<bool> = match v["layer_types"].as_array() {
        Some(types) => types.iter().map(|t| t.as_str() == Some("sliding_attention")).collect(),
        None => (0..num_layers).map(|i| !(i + 1).is_multiple_of(5)).collect(),
    };
    if sliding.len() != num_layers {
        return refuse(format!("layer_types has {} entries; the model has {num_layers} layers", sliding.len()));
    }
    let per_layer_list = |key: &str, default: Option<f64>| -> Result<Vec<f64>> {
        match &v[key] {
            Value::Array(values) => {
                values.iter().map(|x| x.as_f64().ok_or_else(|| missing(file, key))).collect::<Result<Vec<f64>>>()
            }
            Value::Number(x) => Ok(vec![x.as_f64().unwrap_or(0.0); num_layers]),
            _ => default.map(|d| vec![d; num_layers]).ok_or_else(|| missing(file, key)),
        }
    };
    let intermediate_sizes: Vec<usize> =
        per_layer_list("intermediate_size", None)?.iter().map(|&x| x as usize).collect();
    // transformers' default sparsity: 0.95 in the first 10 layers of a model of more than 10.
    let sparsity = match &v["activation_sparsity_pattern"] {
        Value::Null => (0..num_layers).map(|i| if num_layers > 10 && i < 10 { 0.95 } else { 0.0 }).collect(),
        _ => per_layer_list("activation_sparsity_pattern", None)?,
    };
    for kind in ["sliding_attention", "full_attention"] {
        let t = v["rope_parameters"][kind]["rope_type"].as_str().unwrap_or("default");
        if t != "default" {
            return refuse(format!("rope_parameters.{kind}.rope_type {t:?} is not supported for Gemma 3n"));
        }
    }
    if v["rope_scaling"].is_object() {
        return refuse("rope_scaling is set; weft runs Gemma 3n's RoPE unscaled".into());
    }
    let theta = |kind: &str, old_key: &str, default: f64| {
        v["rope_parameters"][kind]["rope_theta"].as_f64().or_else(|| v[old_key].as_f64()).unwrap_or(default) as f32
    };
    let per_layer_input_size = int("hidden_size_per_layer_input")?;
    Shape {
        architecture: if multimodal { "gemma3n" } else { "gemma3n_text" },
        vocab_size: int("vocab_size")?,
        hidden_size: int("hidden_size")?,
        num_heads: int("num_attention_heads")?,
        num_kv_heads: int("num_key_value_heads")?,
        head_dim: int("head_dim")?,
        rms_norm_eps: v["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32,
        rope_theta: theta("full_attention", "rope_theta", 1e6),
        rope_local_theta: theta("sliding_attention", "rope_local_base_freq", 10000.0),
        max_position_embeddings: int("max_position_embeddings").unwrap_or(32768),
        tie_word_embeddings: outer["tie_word_embeddings"]
            .as_bool()
            .or(v["tie_word_embeddings"].as_bool())
            .unwrap_or(true),
        sliding_window: v["sliding_window"].as_u64().map(|w| w as usize),
        sliding,
        num_kv_shared_layers: v["num_kv_shared_layers"].as_u64().unwrap_or(0) as usize,
        intermediate_sizes,
        per_layer_input_size,
        per_layer_vocab_size: int("vocab_size_per_layer_input")?,
        final_logit_softcapping: v["final_logit_softcapping"].as_f64().map(|c| c as f32),
        gemma3n: Gemma3nConfig {
            altup_num_inputs: v["altup_num_inputs"].as_u64().unwrap_or(4) as usize,
            altup_active_idx: v["altup_active_idx"].as_u64().unwrap_or(0) as usize,
            altup_correct_scale: v["altup_correct_scale"].as_bool().unwrap_or(true),
            laurel_rank: v["laurel_rank"].as_u64().unwrap_or(64) as usize,
            sparsity_std_multipliers: sparsity
                .iter()
                .map(|&p| (p > 0.0).then(|| torch_normal_icdf(p as f32)))
                .collect(),
        },
    }
    .into_config(file)
}

/// llama.cpp's `gemma3n` keys: per-layer MLP widths, `attention.sliding_window_pattern`,
/// `attention.shared_kv_layers`, `altup.*`, and the sparsity as its quantiles already
/// (`activation_sparsity_scale`, -inf or 0 for none); Laurel's rank is its tensors'.
pub fn config_from_gguf(gguf: &GgufFile) -> Result<ModelConfig> {
    let file = gguf.name();
    let key = |k: &str| format!("gemma3n.{k}");
    let int = |k: &str| gguf.get_u64(&key(k)).map(|v| v as usize).ok_or_else(|| missing(file, &key(k)));
    let float = |k: &str| gguf.get_f64(&key(k)).map(|v| v as f32);
    let num_layers = int("block_count")?;
    let intermediate_sizes = match gguf.get_i64_array(&key("feed_forward_length")) {
        Some(values) => values.iter().map(|&x| x.max(0) as usize).collect(),
        None => vec![int("feed_forward_length")?; num_layers],
    };
    let sliding = gguf
        .get_bool_array(&key("attention.sliding_window_pattern"))
        .ok_or_else(|| missing(file, &key("attention.sliding_window_pattern")))?;
    if sliding.len() != num_layers {
        return Err(WeftError::model(
            file,
            format!(
                "{} has {} entries; the model has {num_layers} layers",
                key("attention.sliding_window_pattern"),
                sliding.len()
            ),
        ));
    }
    let sparsity = gguf.get_f32_array(&key("activation_sparsity_scale")).unwrap_or_else(|| vec![0.0; num_layers]);
    let tensor_rows =
        |name: &str| gguf.tensor(name).map(|t| t.shape()[0]).ok_or_else(|| missing(file, &format!("tensor {name}")));
    let embed_rows = tensor_rows("token_embd.weight")?;
    Shape {
        architecture: "gemma3n",
        vocab_size: int("vocab_size").unwrap_or(embed_rows),
        hidden_size: int("embedding_length")?,
        num_heads: int("attention.head_count")?,
        num_kv_heads: int("attention.head_count_kv")?,
        head_dim: int("attention.key_length")?,
        rms_norm_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
        rope_theta: float("rope.freq_base").unwrap_or(1e6),
        rope_local_theta: float("rope.freq_base_swa").unwrap_or(10000.0),
        max_position_embeddings: int("context_length")?,
        tie_word_embeddings: gguf.tensor("output.weight").is_none(),
        sliding_window: int("attention.sliding_window").ok().filter(|&w| w > 0),
        sliding,
        num_kv_shared_layers: int("attention.shared_kv_layers").unwrap_or(0),
        intermediate_sizes,
        per_layer_input_size: int("embedding_length_per_layer_input")?,
        per_layer_vocab_size: tensor_rows("per_layer_token_embd.weight")?,
        final_logit_softcapping: float("final_logit_softcapping").filter(|&c| c > 0.0),
        gemma3n: Gemma3nConfig {
            altup_num_inputs: int("altup.num_inputs")?,
            altup_active_idx: int("altup.active_idx").unwrap_or(0),
            altup_correct_scale: gguf.tensor("blk.0.altup_correct_scale.weight").is_some(),
            laurel_rank: tensor_rows("blk.0.laurel_l.weight")?,
            sparsity_std_multipliers: sparsity.iter().map(|&m| (m.is_finite() && m != 0.0).then_some(m)).collect(),
        },
    }
    .into_config(file)
}

// ---- weights --------------------------------------------------------------------------------

/// A layer's AltUp router and coefficients.
struct AltUp {
    router_norm: GpuTensor,   // (hidden): router_norm's weight / hidden (router_input_scale folded in)
    router: GpuTensor,        // (n, hidden): modality_router
    predict_coefs: GpuTensor, // (n · n, n): prediction_coefs, F32
    correct_coefs: GpuTensor, // (n, n): correction_coefs, F32
    out_scale: GpuTensor,     // (hidden): correct_output_scale, or ones without altup_correct_scale
}

impl AltUp {
    /// `modal = tanh(router(router_norm(x) / hidden))`, through `xn`.
    #[allow(clippy::too_many_arguments)]
    fn modalities(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        x: &GpuTensor,
        xn: &GpuTensor,
        modal: &GpuTensor,
        eps: f32,
    ) -> Result<()> {
        rms_norm(ctx, rec, x, &self.router_norm, xn, eps)?;
        matmul(ctx, rec, xn, &self.router, modal)?;
        softcap(ctx, rec, modal, 1.0)
    }
}

/// A layer's Laurel branch: `xn + norm(right(left(xn)))`.
struct Laurel {
    left: GpuTensor,  // (rank, hidden)
    right: GpuTensor, // (hidden, rank)
    norm: GpuTensor,  // (hidden): post_laurel_norm
}

struct Attention {
    qkv: Linear, // q, k, v side by side; q alone in a KV-sharing layer
    o: Linear,
    q_norm: GpuTensor,         // (head_dim)
    k_norm: Option<GpuTensor>, // (head_dim); `None` in a KV-sharing layer
}

struct Layer {
    altup: AltUp,
    attn_norm: GpuTensor, // (hidden): input_layernorm
    laurel: Laurel,
    attention: Attention,
    post_attn_norm: GpuTensor, // (hidden)
    ffn_norm: GpuTensor,       // (hidden): pre_feedforward_layernorm
    mlp: Mlp,
    /// The gate's cutoff in standard deviations above its row's mean; `None`: a dense gate.
    sparsity: Option<f32>,
    post_ffn_norm: GpuTensor, // (hidden)
    per_layer: PerLayerBranch,
}

pub struct Gemma3nModel {
    config: ModelConfig,
    embed: GpuTensor,           // (vocab, hidden)
    lm_head: Option<GpuTensor>, // (vocab, hidden) when untied; else the embedding
    per_layer: PerLayerInputs,
    altup_proj: Vec<GpuTensor>,    // n - 1 of (hidden, hidden): stream j's from the embedding
    altup_unembed: Vec<GpuTensor>, // n - 1 of (hidden, hidden): stream j's back
    layers: Vec<Layer>,
    norm: GpuTensor,           // (hidden)
    global_cos_sin: GpuTensor, // (positions, head_dim / 2, 2): full layers
    local_cos_sin: GpuTensor,  // (positions, head_dim / 2, 2): sliding-window layers
    ones: GpuTensor,           // (head_dim): v_norm's weight
}

/// Positions the RoPE tables cover at most.
const MAX_TABLE_POSITIONS: usize = 32768;

/// Gemma 3n's additions, or an error naming `file` for a config without them.
fn gemma3n_of<'c>(c: &'c ModelConfig, file: &str) -> Result<(&'c Gemma4Config, &'c Gemma3nConfig)> {
    match &c.gemma4 {
        Some(g) => g.gemma3n.as_ref().map(|x| (g, x)),
        None => None,
    }
    .ok_or_else(|| WeftError::model(file, "a gemma3n model without its Gemma 3n configuration"))
}

impl Gemma3nModel {
    /// Upload every weight of `config`'s model from `source`, calling `progress(layers done,
    /// layers in all)` as layers arrive.
    pub fn load(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Gemma3nModel> {
        let (g, x) = gemma3n_of(&config, source.file())?;
        let renamed = Renamed { source, rename: language_model_name };
        let source: &dyn WeightSource = if config.architecture == "gemma3n" { &renamed } else { source };
        let c = &config;
        let (hidden, n) = (c.hidden_size, x.altup_num_inputs);
        let w = Loader { source, factory };
        let checkpoint = source.checkpoint();
        let named = |layer, gguf, hf| own_name(checkpoint, layer, gguf, hf);
        let values = |name: &str, len| -> Result<Vec<f32>> { w.named_values(name, len) };
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            let (kv_heads, head_dim) = c.attention_shape(i);
            let (q_rows, kv_rows) = (c.num_heads * head_dim, kv_heads * head_dim);
            let shares = c.kv_source(i) != i;
            let qkv: &[(Part, usize)] = if shares {
                &[(Part::Q, q_rows)]
            } else {
                &[(Part::Q, q_rows), (Part::K, kv_rows), (Part::V, kv_rows)]
            };
            let inter = c.layer_intermediate_size(i);
            let norm = |part| w.vector(Some(i), part, hidden);
            let own = |gguf, hf, len| -> Result<GpuTensor> {
                factory.upload_f32(&[len], &values(&named(Some(i), gguf, hf), len)?)
            };
            let mut router_norm =
                values(&named(Some(i), "altup_router_norm.weight", "altup.router_norm.weight"), hidden)?;
            router_norm.iter_mut().for_each(|v| *v /= hidden as f32);
            let coefs = |gguf, hf, shape: [usize; 2]| -> Result<GpuTensor> {
                factory.upload_f32(&shape, &w.named_f32(&named(Some(i), gguf, hf), &shape)?)
            };
            let altup = AltUp {
                router_norm: factory.upload_f32(&[hidden], &router_norm)?,
                router: w.named_matrix(
                    &named(Some(i), "altup_router.weight", "altup.modality_router.weight"),
                    &[n, hidden],
                )?,
                predict_coefs: coefs("altup_predict_coef.weight", "altup.prediction_coefs.weight", [n * n, n])?,
                correct_coefs: coefs("altup_correct_coef.weight", "altup.correction_coefs.weight", [n, n])?,
                out_scale: if x.altup_correct_scale {
                    own("altup_correct_scale.weight", "altup.correct_output_scale", hidden)?
                } else {
                    factory.upload_f32(&[hidden], &vec![1.0; hidden])?
                },
            };
            let laurel = Laurel {
                left: w.named_matrix(
                    &named(Some(i), "laurel_l.weight", "laurel.linear_left.weight"),
                    &[x.laurel_rank, hidden],
                )?,
                right: w.named_matrix(
                    &named(Some(i), "laurel_r.weight", "laurel.linear_right.weight"),
                    &[hidden, x.laurel_rank],
                )?,
                norm: own("laurel_post_norm.weight", "laurel.post_laurel_norm.weight", hidden)?,
            };
            layers.push(Layer {
                altup,
                attn_norm: norm(Part::AttnNorm)?,
                laurel,
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
                sparsity: x.sparsity_std_multipliers[i],
                post_ffn_norm: norm(Part::PostFfnNorm)?,
                per_layer: PerLayerBranch::load(&w, i, hidden, g.per_layer_input_size)?,
            });
            progress(i + 1, c.num_layers);
        }
        let (altup_proj, altup_unembed) = stream_projections(&w, n, hidden)?;
        let positions = c.max_position_embeddings.min(MAX_TABLE_POSITIONS);
        let table = |freqs: &[f32]| factory.upload_f32(&[positions, freqs.len(), 2], &cos_sin_table(freqs, positions));
        Ok(Gemma3nModel {
            embed: w.matrix(None, Part::Q, &[c.vocab_size, hidden])?,
            lm_head: if c.tie_word_embeddings {
                None
            } else {
                w.optional_matrix(None, Part::O, &[c.vocab_size, hidden])?
            },
            per_layer: PerLayerInputs::load(&w, c.num_layers, hidden, g.per_layer_input_size, g.per_layer_vocab_size)?,
            altup_proj,
            altup_unembed,
            layers,
            norm: w.vector(None, Part::AttnNorm, hidden)?,
            global_cos_sin: table(&inv_freq(c.head_dim, c.rope_theta))?,
            local_cos_sin: table(&inv_freq(c.head_dim, c.rope_local_theta.unwrap_or(c.rope_theta)))?,
            ones: factory.upload_f32(&[c.head_dim], &vec![1.0; c.head_dim])?,
            config,
        })
    }
}

/// The n - 1 projections making streams 1.. from the embedding and back: Hugging Face keeps
/// each as its own matrix (`altup_projections.{j}`), llama.cpp's converter stacks them in one
/// (n - 1, hidden, hidden) tensor (`altup_proj`), split here into matrices. The stacked one is
/// decoded to F32 whatever its format (a quantized stack cannot be split into matrices of its
/// own format row by row on every device): the same values, at 4 bytes each.
fn stream_projections(w: &Loader<'_>, n: usize, hidden: usize) -> Result<(Vec<GpuTensor>, Vec<GpuTensor>)> {
    let each = |gguf: &str, hf: &str| -> Result<Vec<GpuTensor>> {
        match w.source.checkpoint() {
            Checkpoint::HuggingFace => {
                (0..n - 1).map(|j| w.named_matrix(&format!("model.{hf}.{j}.weight"), &[hidden, hidden])).collect()
            }
            Checkpoint::Gguf => {
                let file = w.source.file();
                let t =
                    w.source.get(gguf)?.ok_or_else(|| WeftError::model(file, format!("tensor {gguf} is missing")))?;
                if t.shape != [n - 1, hidden, hidden] {
                    return Err(WeftError::model(
                        file,
                        format!("tensor {gguf} has shape {:?}, expected {:?}", t.shape, [n - 1, hidden, hidden]),
                    ));
                }
                let all = crate::quant::dequantize(t.dtype, &t.bytes)?;
                all.chunks(hidden * hidden).map(|m| w.factory.upload_f32(&[hidden, hidden], m)).collect()
            }
        }
    };
    Ok((
        each("altup_proj.weight", "altup_projections")?,
        each("altup_unembd_proj.weight", "altup_unembed_projections")?,
    ))
}

// ---- forward --------------------------------------------------------------------------------

impl Architecture for Gemma3nModel {
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
        let (g, x) = gemma3n_of(c, "gemma3n")?;
        let eps = c.rms_norm_eps;
        let (n, active) = (x.altup_num_inputs, x.altup_active_idx);
        let (Some(alt), Some(ple)) = (&a.altup, &a.per_layer) else {
            return Err(WeftError::Unsupported("Gemma 3n's activations were not made for this model".into()));
        };
        let tokens = a.x.shape()[0];
        // Stream j of a (n · capacity, hidden) buffer: its first `tokens` rows.
        let stream = |t: &GpuTensor, j: usize| {
            let capacity = t.shape()[0] / n;
            t.slice_rows(j * capacity..j * capacity + tokens)
        };
        let s0 = stream(&alt.streams, 0)?;

        // The scaled embedding is stream 0; the per-layer inputs and the other streams come from
        // it. It is gathered twice, into stream 0 and into x, because a dispatch may not read
        // the buffer it writes: the projections read x and write the streams.
        let embed_scale = (c.hidden_size as f32).sqrt();
        for x0 in [&s0, &a.x] {
            embedding(ctx, rec, &self.embed, inputs.token_ids, x0)?;
            scale(ctx, rec, x0, embed_scale)?;
        }
        self.per_layer.record(ctx, rec, inputs, &a.x, ple, eps)?;
        for (j, proj) in self.altup_proj.iter().enumerate() {
            let s = stream(&alt.streams, j + 1)?;
            matmul(ctx, rec, &a.x, proj, &s)?;
            magnitude_match(ctx, rec, &s, &a.x)?;
        }

        for (i, layer) in self.layers.iter().enumerate() {
            let (num_kv_heads, head_dim) = c.attention_shape(i);
            let layout = QkvLayout { num_heads: c.num_heads, num_kv_heads, head_dim };
            let inter = c.layer_intermediate_size(i);
            let la = a.for_layer(layout, inter)?;
            let sliding = c.is_sliding(i);

            // AltUp's prediction of every stream; the layer runs on the active one.
            layer.altup.modalities(ctx, rec, &stream(&alt.streams, active)?, &la.xn, &alt.modal, eps)?;
            altup_predict(ctx, rec, &alt.streams, &alt.modal, &layer.altup.predict_coefs, &alt.predictions)?;
            let predicted = stream(&alt.predictions, active)?;
            rms_norm(ctx, rec, &predicted, &layer.attn_norm, &la.xn, eps)?;

            // Laurel, into x: xn + norm(right(left(xn))).
            matmul(ctx, rec, &la.xn, &layer.laurel.left, &alt.laurel)?;
            matmul(ctx, rec, &alt.laurel, &layer.laurel.right, &la.proj)?;
            rms_norm(ctx, rec, &la.proj, &layer.laurel.norm, &la.x, eps)?;
            add(ctx, rec, &la.x, &la.xn)?;

            // Attention, over this layer's cache or the one it shares.
            let attn = &layer.attention;
            attn.qkv.forward(ctx, rec, &la.xn, &la.qkv)?;
            let cache = kv.layer(c.kv_source(i))?;
            let written = match &attn.k_norm {
                Some(k_norm) => {
                    head_rms_norm(ctx, rec, &la.qkv, layout, &attn.q_norm, k_norm, eps)?;
                    qkv_part_rms_norm(ctx, rec, &la.qkv, layout, QkvPart::Value, &self.ones, eps)?;
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

            // h = (prediction + attention + laurel) / √2.
            add(ctx, rec, &la.x, &la.normed)?;
            add(ctx, rec, &la.x, &predicted)?;
            scale(ctx, rec, &la.x, std::f32::consts::FRAC_1_SQRT_2)?;

            // The MLP, its gate sparse in the first layers.
            rms_norm(ctx, rec, &la.x, &layer.ffn_norm, &la.xn, eps)?;
            match layer.sparsity {
                Some(multiplier) => {
                    layer.mlp.gate_up.forward(ctx, rec, &la.xn, &la.gate_up)?;
                    gaussian_topk(ctx, rec, &la.gate_up, inter, multiplier)?;
                    gelu_mul(ctx, rec, &la.gate_up, &la.act)?;
                    layer.mlp.down.forward(ctx, rec, &la.act, &la.proj)?;
                }
                None => layer.mlp.forward(ctx, rec, &la, None)?,
            }
            rms_norm(ctx, rec, &la.proj, &layer.post_ffn_norm, &la.normed, eps)?;
            add(ctx, rec, &la.x, &la.normed)?;

            // AltUp's correction of every stream; the scaled active one feeds the per-layer
            // branch, added to streams 1...
            layer.altup.modalities(ctx, rec, &la.x, &la.xn, &alt.modal, eps)?;
            let altup = &layer.altup;
            let (coefs, out_scale) = (&altup.correct_coefs, &altup.out_scale);
            altup_correct(
                ctx,
                rec,
                &alt.predictions,
                &la.x,
                &alt.modal,
                coefs,
                out_scale,
                active,
                &alt.streams,
                &la.xn,
            )?;
            layer.per_layer.record(ctx, rec, i, &la.xn, ple, &la.proj, &la.normed, eps)?;
            for j in 1..n {
                add(ctx, rec, &stream(&alt.streams, j)?, &la.normed)?;
            }
        }

        // Streams 1.. projected back and rescaled to stream 0, then all n averaged (into stream
        // 0, in the order transformers sums them).
        for (j, unembed) in self.altup_unembed.iter().enumerate() {
            let p = stream(&alt.predictions, j + 1)?;
            matmul(ctx, rec, &stream(&alt.streams, j + 1)?, unembed, &p)?;
            magnitude_match(ctx, rec, &p, &s0)?;
        }
        for j in 1..n {
            add(ctx, rec, &s0, &stream(&alt.predictions, j)?)?;
        }
        scale(ctx, rec, &s0, 1.0 / n as f32)?;
        rms_norm(ctx, rec, &s0, &self.norm, &a.xn, eps)?;
        // Only the sampled rows need logits: gather those rows, then the LM head.
        embedding(ctx, rec, &a.xn, inputs.logit_rows, &a.rows)?;
        matmul(ctx, rec, &a.rows, self.lm_head.as_ref().unwrap_or(&self.embed), logits)?;
        match g.final_logit_softcapping {
            Some(cap) => softcap(ctx, rec, logits, cap),
            None => Ok(()),
        }
    }
}
