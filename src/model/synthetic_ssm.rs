//! Random-weight state-space models (and a Llama of similar size) of realistic shapes, as GGUF
//! files in llama.cpp's layout, for
//! benchmarks (`cargo xtask make-model`, `benches/recurrent.rs`): the numbers are noise, the
//! shapes — and so the time a step takes — are the real models'.
//!
//! - `mamba2-130m`, `mamba2-370m`: state-spaces/mamba2-130m and -370m (d_model 768 / 1024,
//!   24 / 48 layers, 2x expansion, heads of 64, state 128, one group, conv 4, vocab 50288, tied).
//! - `granite-4.0-h-1b`: IBM Granite-4.0-H-1B, the dense hybrid (hidden 1536, 40 layers of which
//!   5, 15, 25 and 35 attend — 12 query heads over 4 KV heads of 128, no RoPE — and the rest are
//!   Mamba2 with 48 heads of 64, state 128, one group, conv 4; every layer has a SwiGLU MLP of
//!   4096; vocab 100352, tied), as llama.cpp's converter writes `granitehybrid`.
//! - `llama-135m`: SmolLM2-135M's Llama shape (30 layers, hidden 576, 9 heads over 3 KV heads,
//!   MLP 1536, vocab 49152, tied), the attention model of similar size.

use crate::error::{Result, WeftError};
use crate::model::config::{ModelConfig, SsmConfig};
use crate::model::gguf::{GgmlType, GgufWriter, MetaValue};
use crate::model::tiny;
use crate::quant::DType;

/// The shapes [`gguf_bytes`] writes.
pub const SHAPES: &[&str] = &["mamba2-130m", "mamba2-370m", "granite-4.0-h-1b", "llama-135m"];

/// `shape` with random weights, matrices in `dtype`, as GGUF bytes.
pub fn gguf_bytes(shape: &str, dtype: DType) -> Result<Vec<u8>> {
    match shape {
        "mamba2-130m" => Ok(mamba2(768, 24, dtype)),
        "mamba2-370m" => Ok(mamba2(1024, 48, dtype)),
        "granite-4.0-h-1b" => Ok(granite_hybrid_gguf(&GRANITE_4_0_H_1B, dtype)),
        "llama-135m" => {
            let c = ModelConfig {
                vocab_size: 49152,
                hidden_size: 576,
                intermediate_size: 1536,
                num_layers: 30,
                num_heads: 9,
                num_kv_heads: 3,
                head_dim: 64,
                rope_theta: 100000.0,
                max_position_embeddings: 8192,
                ..tiny::tiny_config()
            };
            let w = tiny::random_weights(&c, 135, dtype);
            Ok(tiny::gguf_bytes(&c, &w, dtype))
        }
        other => Err(WeftError::invalid_request(format!("unknown shape {other:?}; weft makes {}", SHAPES.join(", ")))),
    }
}

/// The byte-level tokenizer of the tiny models, its token list padded to `vocab_size`.
fn tokenizer(g: &mut GgufWriter, vocab_size: usize) {
    for (key, value) in tiny::tokenizer_metadata() {
        let value = match (key, value) {
            ("tokenizer.ggml.tokens", MetaValue::Array(mut tokens)) => {
                tokens.extend((tokens.len()..vocab_size).map(|i| MetaValue::String(format!("<pad{i}>"))));
                MetaValue::Array(tokens)
            }
            ("tokenizer.ggml.token_type", MetaValue::Array(mut types)) => {
                // Unused (5), as llama.cpp marks padding.
                types.extend((types.len()..vocab_size).map(|_| MetaValue::I32(5)));
                MetaValue::Array(types)
            }
            (_, value) => value,
        };
        g.metadata(key, value);
    }
}

/// Random tensors into a GGUF: matrices (quantized ones) in `dtype`, the rest in F32.
struct RandomTensors {
    g: GgufWriter,
    seed: u64,
    dtype: DType,
}

impl RandomTensors {
    /// `dims` innermost first, as GGUF lists them; values uniform in center ± scale.
    fn put(&mut self, name: String, dims: &[usize], quantized: bool, scale: f32, center: f32) {
        self.seed += 1;
        let len: usize = dims.iter().product();
        let values: Vec<f32> = tiny::random_values(len, self.seed, scale).iter().map(|v| v + center).collect();
        let (ty, dtype) = if quantized {
            (GgmlType::from_u32(self.dtype.format().map_or(0, |f| f.ggml_type)), self.dtype)
        } else {
            (GgmlType::F32, DType::F32)
        };
        let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        self.g.tensor(&name, &dims, ty, &crate::quant::quantize(dtype, &values).unwrap_or_default());
    }

    /// A matrix of `n_out` rows over `n_in` columns, scaled so activations keep their size.
    fn matrix(&mut self, name: String, n_in: usize, n_out: usize) {
        self.put(name, &[n_in, n_out], true, 1.5 / (n_in as f32).sqrt(), 0.0);
    }

    /// A norm's weight around 1.
    fn norm(&mut self, name: String, dims: &[usize]) {
        self.put(name, dims, false, 0.2, 1.0);
    }

    /// Layer `i`'s Mamba2 mixer, under llama.cpp's names.
    fn mamba_mixer(&mut self, i: usize, hidden: usize, ssm: &SsmConfig) {
        let (inner, channels) = (ssm.inner_size(), ssm.conv_channels());
        self.matrix(format!("blk.{i}.ssm_in.weight"), hidden, ssm.in_proj_size());
        self.put(format!("blk.{i}.ssm_conv1d.weight"), &[ssm.conv_kernel, channels], false, 0.3, 0.0);
        self.put(format!("blk.{i}.ssm_conv1d.bias"), &[channels], false, 0.1, 0.0);
        self.put(format!("blk.{i}.ssm_dt.bias"), &[ssm.num_heads], false, 0.5, -1.0);
        self.put(format!("blk.{i}.ssm_a"), &[1, ssm.num_heads], false, 2.0, -2.5);
        self.put(format!("blk.{i}.ssm_d"), &[1, ssm.num_heads], false, 0.2, 1.0);
        self.norm(format!("blk.{i}.ssm_norm.weight"), &[inner / ssm.num_groups, ssm.num_groups]);
        self.matrix(format!("blk.{i}.ssm_out.weight"), inner, hidden);
    }

    /// The metadata keys of `arch`'s Mamba2 layers.
    fn ssm_metadata(&mut self, arch: &str, ssm: &SsmConfig) {
        let u32v = |v: usize| MetaValue::U32(v as u32);
        self.g
            .metadata(&format!("{arch}.ssm.conv_kernel"), u32v(ssm.conv_kernel))
            .metadata(&format!("{arch}.ssm.inner_size"), u32v(ssm.inner_size()))
            .metadata(&format!("{arch}.ssm.state_size"), u32v(ssm.state_size))
            .metadata(&format!("{arch}.ssm.time_step_rank"), u32v(ssm.num_heads))
            .metadata(&format!("{arch}.ssm.group_count"), u32v(ssm.num_groups));
    }
}

/// A Mamba2 of `hidden` and `num_layers` with state-spaces' other hyper-parameters.
fn mamba2(hidden: usize, num_layers: usize, dtype: DType) -> Vec<u8> {
    let ssm = SsmConfig { conv_kernel: 4, state_size: 128, num_groups: 1, num_heads: 2 * hidden / 64, head_dim: 64 };
    let vocab = 50288usize;
    let mut w = RandomTensors { g: GgufWriter::new(), seed: 370, dtype };
    let u32v = |v: usize| MetaValue::U32(v as u32);
    w.g.metadata("general.architecture", MetaValue::String("mamba2".into()))
        .metadata("mamba2.context_length", u32v(1 << 20))
        .metadata("mamba2.embedding_length", u32v(hidden))
        .metadata("mamba2.feed_forward_length", u32v(0))
        .metadata("mamba2.attention.head_count", u32v(0))
        .metadata("mamba2.block_count", u32v(num_layers))
        .metadata("mamba2.attention.layer_norm_rms_epsilon", MetaValue::F32(1e-5));
    w.ssm_metadata("mamba2", &ssm);
    tokenizer(&mut w.g, vocab);
    w.put("token_embd.weight".into(), &[hidden, vocab], true, 1.0, 0.0);
    w.norm("output_norm.weight".into(), &[hidden]);
    for i in 0..num_layers {
        w.norm(format!("blk.{i}.attn_norm.weight"), &[hidden]);
        w.mamba_mixer(i, hidden, &ssm);
    }
    w.g.to_bytes()
}

/// The shape of a dense Granite 4.0-H hybrid.
#[derive(Clone, Copy, Debug)]
pub struct HybridShape {
    pub hidden: usize,
    pub num_layers: usize,
    /// The layers that attend; the others are Mamba2.
    pub attention_layers: &'static [usize],
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Every layer's SwiGLU MLP.
    pub ffn: usize,
    pub vocab: usize,
    pub ssm: SsmConfig,
}

/// Granite-4.0-H-1B (see the module docs).
pub const GRANITE_4_0_H_1B: HybridShape = HybridShape {
    hidden: 1536,
    num_layers: 40,
    attention_layers: &[5, 15, 25, 35],
    num_heads: 12,
    num_kv_heads: 4,
    head_dim: 128,
    ffn: 4096,
    vocab: 100352,
    ssm: SsmConfig { conv_kernel: 4, state_size: 128, num_groups: 1, num_heads: 48, head_dim: 64 },
};

/// A hybrid of `shape` with random weights, matrices in `dtype`, as llama.cpp's converter
/// writes `granitehybrid`.
pub fn granite_hybrid_gguf(shape: &HybridShape, dtype: DType) -> Vec<u8> {
    let HybridShape { hidden, num_layers, attention_layers, num_heads, num_kv_heads, head_dim, ffn, vocab, ssm } =
        *shape;
    let attends = |i: usize| attention_layers.contains(&i);
    let arch = "granitehybrid";
    let mut w = RandomTensors { g: GgufWriter::new(), seed: 1000, dtype };
    let u32v = |v: usize| MetaValue::U32(v as u32);
    let kv_heads = (0..num_layers).map(|i| MetaValue::I32(if attends(i) { num_kv_heads as i32 } else { 0 })).collect();
    let key = |k: &str| format!("{arch}.{k}");
    w.g.metadata("general.architecture", MetaValue::String(arch.into()))
        .metadata(&key("context_length"), u32v(131072))
        .metadata(&key("embedding_length"), u32v(hidden))
        .metadata(&key("feed_forward_length"), u32v(ffn))
        .metadata(&key("expert_shared_feed_forward_length"), u32v(ffn))
        .metadata(&key("block_count"), u32v(num_layers))
        .metadata(&key("vocab_size"), u32v(vocab))
        .metadata(&key("attention.head_count"), u32v(num_heads))
        .metadata(&key("attention.head_count_kv"), MetaValue::Array(kv_heads))
        .metadata(&key("rope.dimension_count"), u32v(head_dim))
        .metadata(&key("rope.freq_base"), MetaValue::F32(10000.0))
        .metadata(&key("rope.scaling.finetuned"), MetaValue::Bool(false))
        .metadata(&key("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-5))
        .metadata(&key("attention.scale"), MetaValue::F32(1.0 / head_dim as f32))
        .metadata(&key("embedding_scale"), MetaValue::F32(12.0))
        .metadata(&key("residual_scale"), MetaValue::F32(0.22))
        .metadata(&key("logit_scale"), MetaValue::F32(6.0));
    w.ssm_metadata(arch, &ssm);
    tokenizer(&mut w.g, vocab);
    w.put("token_embd.weight".into(), &[hidden, vocab], true, 1.0, 0.0);
    w.norm("output_norm.weight".into(), &[hidden]);
    let (q_rows, kv_rows) = (num_heads * head_dim, num_kv_heads * head_dim);
    for i in 0..num_layers {
        w.norm(format!("blk.{i}.attn_norm.weight"), &[hidden]);
        if attends(i) {
            w.matrix(format!("blk.{i}.attn_q.weight"), hidden, q_rows);
            w.matrix(format!("blk.{i}.attn_k.weight"), hidden, kv_rows);
            w.matrix(format!("blk.{i}.attn_v.weight"), hidden, kv_rows);
            w.matrix(format!("blk.{i}.attn_output.weight"), q_rows, hidden);
        } else {
            w.mamba_mixer(i, hidden, &ssm);
        }
        w.norm(format!("blk.{i}.ffn_norm.weight"), &[hidden]);
        w.matrix(format!("blk.{i}.ffn_gate.weight"), hidden, ffn);
        w.matrix(format!("blk.{i}.ffn_up.weight"), hidden, ffn);
        w.matrix(format!("blk.{i}.ffn_down.weight"), ffn, hidden);
    }
    w.g.to_bytes()
}
