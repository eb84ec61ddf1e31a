//! Random-weight state-space models (and a Llama of similar size) of realistic shapes, as GGUF
//! files in llama.cpp's layout, for
//! benchmarks (`cargo xtask make-model`, `benches/recurrent.rs`): the numbers are noise, the
//! shapes — and so the time a step takes — are the real models'.
//!
//! - `mamba2-130m`, `mamba2-370m`: state-spaces/mamba2-130m and -370m (d_model 768 / 1024,
//!   24 / 48 layers, 2x expansion, heads of 64, state 128, one group, conv 4, vocab 50288, tied).
//! - `llama-135m`: SmolLM2-135M's Llama shape (30 layers, hidden 576, 9 heads over 3 KV heads,
//!   MLP 1536, vocab 49152, tied), the attention model of similar size.

use crate::error::{Result, WeftError};
use crate::model::config::{ModelConfig, SsmConfig};
use crate::model::gguf::{GgmlType, GgufWriter, MetaValue};
use crate::model::tiny;
use crate::quant::DType;

/// The shapes [`gguf_bytes`] writes.
pub const SHAPES: &[&str] = &["mamba2-130m", "mamba2-370m", "llama-135m"];

/// `shape` with random weights, matrices in `dtype`, as GGUF bytes.
pub fn gguf_bytes(shape: &str, dtype: DType) -> Result<Vec<u8>> {
    match shape {
        "mamba2-130m" => Ok(mamba2(768, 24, dtype)),
        "mamba2-370m" => Ok(mamba2(1024, 48, dtype)),
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

/// A Mamba2 of `hidden` and `num_layers` with state-spaces' other hyper-parameters.
fn mamba2(hidden: usize, num_layers: usize, dtype: DType) -> Vec<u8> {
    let ssm = SsmConfig { conv_kernel: 4, state_size: 128, num_groups: 1, num_heads: 2 * hidden / 64, head_dim: 64 };
    let (inner, channels, vocab) = (ssm.inner_size(), ssm.conv_channels(), 50288usize);
    let mut g = GgufWriter::new();
    let arch = "mamba2";
    let u32v = |v: usize| MetaValue::U32(v as u32);
    g.metadata("general.architecture", MetaValue::String(arch.into()))
        .metadata("mamba2.context_length", u32v(1 << 20))
        .metadata("mamba2.embedding_length", u32v(hidden))
        .metadata("mamba2.feed_forward_length", u32v(0))
        .metadata("mamba2.attention.head_count", u32v(0))
        .metadata("mamba2.block_count", u32v(num_layers))
        .metadata("mamba2.ssm.conv_kernel", u32v(ssm.conv_kernel))
        .metadata("mamba2.ssm.inner_size", u32v(inner))
        .metadata("mamba2.ssm.state_size", u32v(ssm.state_size))
        .metadata("mamba2.ssm.time_step_rank", u32v(ssm.num_heads))
        .metadata("mamba2.ssm.group_count", u32v(ssm.num_groups))
        .metadata("mamba2.attention.layer_norm_rms_epsilon", MetaValue::F32(1e-5));
    tokenizer(&mut g, vocab);
    let mut seed = 370;
    // GGUF lists dimensions innermost first.
    let mut put = |name: String, dims: &[usize], quantized: bool, scale: f32, center: f32| {
        seed += 1;
        let len: usize = dims.iter().product();
        let values: Vec<f32> = tiny::random_values(len, seed, scale).iter().map(|v| v + center).collect();
        let (ty, dtype) = if quantized {
            (GgmlType::from_u32(dtype.format().map_or(0, |f| f.ggml_type)), dtype)
        } else {
            (GgmlType::F32, DType::F32)
        };
        let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        g.tensor(&name, &dims, ty, &crate::quant::quantize(dtype, &values).unwrap_or_default());
    };
    put("token_embd.weight".into(), &[hidden, vocab], true, 1.0, 0.0);
    put("output_norm.weight".into(), &[hidden], false, 0.2, 1.0);
    for i in 0..num_layers {
        let matrix_scale = |n_in: usize| 1.5 / (n_in as f32).sqrt();
        put(format!("blk.{i}.attn_norm.weight"), &[hidden], false, 0.2, 1.0);
        put(format!("blk.{i}.ssm_in.weight"), &[hidden, ssm.in_proj_size()], true, matrix_scale(hidden), 0.0);
        put(format!("blk.{i}.ssm_conv1d.weight"), &[ssm.conv_kernel, channels], false, 0.3, 0.0);
        put(format!("blk.{i}.ssm_conv1d.bias"), &[channels], false, 0.1, 0.0);
        put(format!("blk.{i}.ssm_dt.bias"), &[ssm.num_heads], false, 0.5, -1.0);
        put(format!("blk.{i}.ssm_a"), &[1, ssm.num_heads], false, 2.0, -2.5);
        put(format!("blk.{i}.ssm_d"), &[1, ssm.num_heads], false, 0.2, 1.0);
        put(format!("blk.{i}.ssm_norm.weight"), &[inner / ssm.num_groups, ssm.num_groups], false, 0.2, 1.0);
        put(format!("blk.{i}.ssm_out.weight"), &[inner, hidden], true, matrix_scale(inner), 0.0);
    }
    g.to_bytes()
}
