//! Random-weight models with the real shapes of popular checkpoints, for benchmarks: speed does
//! not depend on the weights' values, so a Llama 3.1 8B-shaped GGUF written here runs exactly as
//! fast as the real one, without downloading it (`cargo xtask make-model`).
//!
//! A file has the checkpoint's architecture and hyper-parameters (layers, widths, heads, KV
//! heads, vocabulary size, RoPE base and Llama 3 frequency factors, tied or separate output,
//! Qwen2's q/k/v biases), laid out as llama.cpp's converter writes them, so both weft and
//! llama.cpp load it. The vocabulary is borrowed from another GGUF (the default model's, 49152
//! tokens) and padded with unused dummy tokens up to the shape's size, so the embedding and
//! output matrices have their real shapes. Matrices are in the chosen format; norms, biases
//! and RoPE factors in F32, as in real files.
//!
//! Tensors are streamed to the writer one chunk at a time (an 8B model in Q4_1 is 4.5 GB): each
//! tensor repeats one quantized chunk of random rows, which keeps writing disk-bound.

use std::io::Write;

use crate::model::gguf::{GgmlType, GgufWriter, MetaValue, Metadata, TensorDecl};
use crate::model::tiny::random_values;
use crate::quant::DType;
use crate::{Result, WeftError};

/// The hyper-parameters of one checkpoint's architecture.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// What `--shape` calls it ("llama-3.1-8b").
    pub name: &'static str,
    /// GGUF `general.architecture`: "llama" or "qwen2".
    pub architecture: &'static str,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub context_length: usize,
    /// No `output.weight`: the LM head reads the embedding table.
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2).
    pub attention_bias: bool,
    /// Llama 3.1's RoPE scaling, written as `rope_freqs.weight` the way llama.cpp does.
    pub llama3_rope: Option<Llama3Rope>,
}

/// Llama 3.1's frequency-dependent RoPE scaling parameters (`rope_scaling` in config.json).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Rope {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_context_length: usize,
}

/// Llama 3.1 and 3.2's scaling of an 8192-token original context by `factor`.
fn llama3_rope_8k(factor: f32) -> Llama3Rope {
    Llama3Rope { factor, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context_length: 8192 }
}

/// The shapes `cargo xtask make-model --shape` offers, from each checkpoint's config.json.
pub fn shapes() -> [Shape; 3] {
    [
        Shape {
            name: "llama-3.2-1b",
            architecture: "llama",
            vocab_size: 128_256,
            hidden_size: 2048,
            intermediate_size: 8192,
            num_layers: 16,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            context_length: 131_072,
            tie_word_embeddings: true,
            attention_bias: false,
            llama3_rope: Some(llama3_rope_8k(32.0)),
        },
        Shape {
            name: "llama-3.1-8b",
            architecture: "llama",
            vocab_size: 128_256,
            hidden_size: 4096,
            intermediate_size: 14_336,
            num_layers: 32,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            context_length: 131_072,
            tie_word_embeddings: false,
            attention_bias: false,
            llama3_rope: Some(llama3_rope_8k(8.0)),
        },
        Shape {
            name: "qwen2.5-1.5b",
            architecture: "qwen2",
            vocab_size: 151_936,
            hidden_size: 1536,
            intermediate_size: 8960,
            num_layers: 28,
            num_heads: 12,
            num_kv_heads: 2,
            head_dim: 128,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            context_length: 32_768,
            tie_word_embeddings: true,
            attention_bias: true,
            llama3_rope: None,
        },
    ]
}

/// The shape called `name`; the error lists the known ones.
pub fn shape(name: &str) -> Result<Shape> {
    let all = shapes();
    let known: Vec<&str> = all.iter().map(|s| s.name).collect();
    all.iter()
        .find(|s| s.name == name)
        .cloned()
        .ok_or_else(|| WeftError::Unsupported(format!("unknown shape {name:?}; the shapes are {}", known.join(", "))))
}

/// The weight format called `name` ("q4_1", "Q8_0", "f16", ...), among those weft computes with.
pub fn weight_format(name: &str) -> Result<DType> {
    DType::WEIGHTS.into_iter().find(|d| d.name().eq_ignore_ascii_case(name)).ok_or_else(|| {
        let known: Vec<String> = DType::WEIGHTS.iter().map(|d| d.name().to_lowercase()).collect();
        WeftError::Unsupported(format!("unknown weight format {name:?}; the formats are {}", known.join(", ")))
    })
}

/// llama.cpp's `general.file_type` (`LLAMA_FTYPE_*`) of a file whose matrices are `dtype`.
fn file_type(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 32,
        DType::Q4_0 => 2,
        DType::Q4_1 => 3,
        DType::Q8_0 => 7,
        DType::Q5_0 => 8,
        DType::Q5_1 => 9,
        DType::Q2_K => 10,
        DType::Q3_K => 12,
        DType::Q4_K => 15,
        DType::Q5_K => 17,
        DType::Q6_K => 18,
        DType::IQ4_NL => 25,
        DType::IQ4_XS => 30,
        // LLAMA_FTYPE_MOSTLY_MXFP4_MOE: gpt-oss's experts in MXFP4, the rest as they were.
        DType::MXFP4 => 38,
        DType::IQ2_XS => 20,
        DType::IQ3_XXS => 23,
        DType::IQ3_S => 26,
        DType::IQ2_S => 28,
        // No file type is all Q8_K (llama.cpp uses it only for activations): "mostly F32".
        DType::Q8_K | DType::U32 => 0,
    }
}

/// One tensor to write: its declaration and how to fill it.
struct Planned {
    decl: TensorDecl,
    /// (rows, row length) in elements.
    rows: usize,
    cols: usize,
    dtype: DType,
    fill: Fill,
}

enum Fill {
    /// Uniform in [center - scale, center + scale).
    Random { scale: f32, center: f32 },
    /// These exact values (RoPE frequency factors).
    Values(Vec<f32>),
}

/// Values per random chunk that a tensor repeats: big enough that rows differ within any
/// matrix-vector product's reach of the cache, small enough to quantize quickly.
const CHUNK_ELEMS: usize = 1 << 18;

impl Shape {
    /// Every tensor in file order, llama.cpp's names and shapes.
    fn plan(&self, dtype: DType) -> Vec<Planned> {
        let mut out = Vec::new();
        let mut put = |name: String, rows: usize, cols: usize, matrix: bool, fill: Fill| {
            let tensor_dtype = if matrix { dtype } else { DType::F32 };
            let ggml_type = GgmlType::from_u32(tensor_dtype.format().map_or(0, |f| f.ggml_type));
            let dims = if matrix { vec![cols as u64, rows as u64] } else { vec![cols as u64] };
            out.push(Planned { decl: TensorDecl { name, dims, ggml_type }, rows, cols, dtype: tensor_dtype, fill });
        };
        let norm = || Fill::Random { scale: 0.2, center: 1.0 };
        let matrix = |n_in: usize| Fill::Random { scale: 1.5 / (n_in as f32).sqrt(), center: 0.0 };
        let (h, q_rows, kv_rows) =
            (self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim);
        if let Some(rope) = &self.llama3_rope {
            let factors = rope.freq_factors(self.head_dim, self.rope_theta);
            put("rope_freqs.weight".into(), 1, factors.len(), false, Fill::Values(factors));
        }
        put("token_embd.weight".into(), self.vocab_size, h, true, Fill::Random { scale: 1.0, center: 0.0 });
        put("output_norm.weight".into(), 1, h, false, norm());
        if !self.tie_word_embeddings {
            put("output.weight".into(), self.vocab_size, h, true, matrix(h));
        }
        for l in 0..self.num_layers {
            let name = |part: &str| format!("blk.{l}.{part}");
            put(name("attn_norm.weight"), 1, h, false, norm());
            put(name("attn_q.weight"), q_rows, h, true, matrix(h));
            put(name("attn_k.weight"), kv_rows, h, true, matrix(h));
            put(name("attn_v.weight"), kv_rows, h, true, matrix(h));
            if self.attention_bias {
                put(name("attn_q.bias"), 1, q_rows, false, Fill::Random { scale: 0.3, center: 0.0 });
                put(name("attn_k.bias"), 1, kv_rows, false, Fill::Random { scale: 0.3, center: 0.0 });
                put(name("attn_v.bias"), 1, kv_rows, false, Fill::Random { scale: 0.3, center: 0.0 });
            }
            put(name("attn_output.weight"), h, q_rows, true, matrix(q_rows));
            put(name("ffn_norm.weight"), 1, h, false, norm());
            put(name("ffn_gate.weight"), self.intermediate_size, h, true, matrix(h));
            put(name("ffn_up.weight"), self.intermediate_size, h, true, matrix(h));
            put(name("ffn_down.weight"), h, self.intermediate_size, true, matrix(self.intermediate_size));
        }
        out
    }

    /// Parameters in the file (RoPE factors included).
    pub fn num_params(&self) -> u64 {
        self.plan(DType::F32).iter().map(|t| (t.rows * t.cols) as u64).sum()
    }

    /// Bytes of tensor data when matrices are `dtype` (the file adds its header and padding).
    pub fn data_bytes(&self, dtype: DType) -> Result<u64> {
        self.plan(dtype).iter().try_fold(0u64, |sum, t| Ok(sum + (t.rows * t.dtype.size_bytes(t.cols)?) as u64))
    }

    /// The GGUF metadata: architecture keys, then the tokenizer of `tokenizer` (a GGUF file's
    /// metadata) padded to this shape's vocabulary.
    fn metadata(&self, dtype: DType, tokenizer: &Metadata) -> Result<GgufWriter> {
        let arch = self.architecture;
        let key = |k: &str| format!("{arch}.{k}");
        let u32_of = |v: usize| MetaValue::U32(v as u32);
        let mut g = GgufWriter::new();
        g.metadata("general.architecture", MetaValue::String(arch.into()))
            .metadata("general.name", MetaValue::String(format!("synthetic {} {} (random weights)", self.name, dtype)))
            .metadata("general.file_type", MetaValue::U32(file_type(dtype)))
            .metadata("general.quantization_version", MetaValue::U32(2))
            .metadata(&key("vocab_size"), u32_of(self.vocab_size))
            .metadata(&key("context_length"), u32_of(self.context_length))
            .metadata(&key("embedding_length"), u32_of(self.hidden_size))
            .metadata(&key("feed_forward_length"), u32_of(self.intermediate_size))
            .metadata(&key("block_count"), u32_of(self.num_layers))
            .metadata(&key("attention.head_count"), u32_of(self.num_heads))
            .metadata(&key("attention.head_count_kv"), u32_of(self.num_kv_heads))
            .metadata(&key("attention.layer_norm_rms_epsilon"), MetaValue::F32(self.rms_norm_eps))
            .metadata(&key("rope.freq_base"), MetaValue::F32(self.rope_theta))
            .metadata(&key("rope.dimension_count"), u32_of(self.head_dim));
        if self.head_dim * self.num_heads != self.hidden_size {
            g.metadata(&key("attention.key_length"), u32_of(self.head_dim))
                .metadata(&key("attention.value_length"), u32_of(self.head_dim));
        }
        for (k, v) in padded_tokenizer(tokenizer, self.vocab_size)? {
            g.metadata(&k, v);
        }
        Ok(g)
    }
}

impl Llama3Rope {
    /// The per-frequency divisors llama.cpp's converter stores as `rope_freqs.weight`: 1 for
    /// short wavelengths, `factor` for long ones, a smooth blend between.
    pub fn freq_factors(&self, head_dim: usize, rope_theta: f32) -> Vec<f32> {
        let low_wavelen = self.original_context_length as f64 / self.low_freq_factor as f64;
        let high_wavelen = self.original_context_length as f64 / self.high_freq_factor as f64;
        (0..head_dim / 2)
            .map(|i| {
                let freq = 1.0 / (rope_theta as f64).powf(2.0 * i as f64 / head_dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let factor = if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    self.factor as f64
                } else {
                    let smooth = (self.original_context_length as f64 / wavelen - self.low_freq_factor as f64)
                        / (self.high_freq_factor as f64 - self.low_freq_factor as f64);
                    1.0 / ((1.0 - smooth) / self.factor as f64 + smooth)
                };
                factor as f32
            })
            .collect()
    }
}

/// llama.cpp's token type for a token that is never produced (`LLAMA_TOKEN_TYPE_UNUSED`).
const TOKEN_UNUSED: i32 = 5;

/// The `tokenizer.*` entries of `meta`, with the vocabulary (tokens, types, scores) padded by
/// unused `<|synthetic_pad_N|>` tokens to `vocab_size` entries.
pub fn padded_tokenizer(meta: &Metadata, vocab_size: usize) -> Result<Vec<(String, MetaValue)>> {
    let bad = |detail: String| WeftError::model("tokenizer source", detail);
    let Some(MetaValue::Array(tokens)) = meta.get("tokenizer.ggml.tokens") else {
        return Err(bad("has no tokenizer.ggml.tokens array to borrow a vocabulary from".into()));
    };
    let have = tokens.len();
    if have > vocab_size {
        return Err(bad(format!("its vocabulary has {have} tokens, more than the shape's {vocab_size}")));
    }
    let mut out = Vec::new();
    for (key, value) in meta.iter().filter(|(k, _)| k.starts_with("tokenizer.")) {
        let padded = match (key.as_str(), value) {
            ("tokenizer.ggml.tokens", MetaValue::Array(v)) => {
                pad(v, vocab_size, |i| MetaValue::String(format!("<|synthetic_pad_{i}|>")))
            }
            ("tokenizer.ggml.token_type", MetaValue::Array(v)) => pad(v, vocab_size, |_| MetaValue::I32(TOKEN_UNUSED)),
            ("tokenizer.ggml.scores", MetaValue::Array(v)) => pad(v, vocab_size, |_| MetaValue::F32(-1e9)),
            _ => value.clone(),
        };
        out.push((key.clone(), padded));
    }
    Ok(out)
}

/// `values` (one per token) extended to `want` entries with `filler(index)`, in the element type
/// the file used (a GGUF array holds one type; a U32 type array stays U32).
fn pad(values: &[MetaValue], want: usize, filler: impl Fn(usize) -> MetaValue) -> MetaValue {
    let mut out = values.to_vec();
    for i in values.len()..want {
        let fill = filler(i);
        out.push(match (values.first(), fill) {
            (Some(MetaValue::U32(_)), MetaValue::I32(x)) => MetaValue::U32(x as u32),
            (Some(MetaValue::I64(_)), MetaValue::I32(x)) => MetaValue::I64(x.into()),
            (Some(MetaValue::U8(_)), MetaValue::I32(x)) => MetaValue::U8(x as u8),
            (Some(MetaValue::F64(_)), MetaValue::F32(x)) => MetaValue::F64(x.into()),
            (_, fill) => fill,
        });
    }
    MetaValue::Array(out)
}

/// Writes `shape` as a GGUF file with random weights, matrices in `dtype`, the vocabulary of
/// `tokenizer` padded to the shape's size. `progress(done, total)` gets tensor-data bytes after
/// each tensor. Returns the bytes written.
pub fn write_gguf(
    shape: &Shape,
    dtype: DType,
    tokenizer: &Metadata,
    seed: u64,
    out: impl Write,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
    if dtype == DType::U32 {
        return Err(WeftError::Unsupported("U32 is not a weight format".into()));
    }
    let plan = shape.plan(dtype);
    let total = shape.data_bytes(dtype)?;
    let writer = shape.metadata(dtype, tokenizer)?;
    let mut stream = writer.stream(plan.iter().map(|t| t.decl.clone()).collect(), out)?;
    let mut done = 0u64;
    for (i, t) in plan.iter().enumerate() {
        let row_bytes = t.dtype.size_bytes(t.cols)?;
        let chunk: Vec<u8> = match &t.fill {
            Fill::Values(values) => crate::quant::quantize(t.dtype, values)?,
            Fill::Random { scale, center } => {
                let chunk_rows = (CHUNK_ELEMS / t.cols).clamp(1, t.rows);
                let values: Vec<f32> = random_values(chunk_rows * t.cols, seed.wrapping_add(i as u64), *scale)
                    .into_iter()
                    .map(|v| v + center)
                    .collect();
                crate::quant::quantize(t.dtype, &values)?
            }
        };
        let mut left = t.rows * row_bytes;
        while left > 0 {
            let take = left.min(chunk.len());
            stream.tensor_data(&chunk[..take])?;
            left -= take;
        }
        done += (t.rows * row_bytes) as u64;
        progress(done, total);
    }
    let written = stream.bytes_written();
    stream.finish()?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::ModelConfig;
    use crate::model::gguf::GgufFile;
    use crate::tokenizer::{HfTokenizer, Tokenizer};

    /// A shape small enough for a unit test, with every optional part switched on.
    fn small(architecture: &'static str, tied: bool, bias: bool, rope: bool) -> Shape {
        Shape {
            name: "small",
            architecture,
            vocab_size: 300,
            hidden_size: 64,
            intermediate_size: 96,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 32,
            rms_norm_eps: 1e-6,
            rope_theta: 500_000.0,
            context_length: 1024,
            tie_word_embeddings: tied,
            attention_bias: bias,
            llama3_rope: rope.then(|| llama3_rope_8k(8.0)),
        }
    }

    fn tiny_tokenizer() -> Metadata {
        crate::model::tiny::tokenizer_metadata().into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    #[test]
    fn written_files_load_with_the_shape_and_a_padded_vocabulary() {
        for (shape, dtype) in [
            (small("llama", true, false, true), DType::Q4_1),
            (small("llama", false, false, false), DType::F16),
            (small("qwen2", true, true, false), DType::Q8_0),
        ] {
            let mut bytes = Vec::new();
            let mut last = (0, 0);
            let written =
                write_gguf(&shape, dtype, &tiny_tokenizer(), 7, &mut bytes, &mut |d, t| last = (d, t)).unwrap();
            assert_eq!(written, bytes.len() as u64);
            assert_eq!(last, (shape.data_bytes(dtype).unwrap(), shape.data_bytes(dtype).unwrap()));
            let file = GgufFile::from_bytes("synthetic.gguf", bytes).unwrap();
            file.check_tensor_types().unwrap();
            let c = ModelConfig::from_gguf(&file).unwrap();
            assert_eq!(c.architecture, shape.architecture);
            assert_eq!(
                (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers),
                (300, 64, 96, 2),
                "{}",
                shape.architecture
            );
            assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 2, 32));
            assert_eq!(c.tie_word_embeddings, shape.tie_word_embeddings);
            assert_eq!(c.attention_bias, shape.attention_bias);
            assert_eq!(c.rope_scaling.is_some(), shape.llama3_rope.is_some());
            assert_eq!(file.tensor("blk.1.ffn_down.weight").unwrap().dtype().unwrap(), dtype);
            assert_eq!(file.tensor("token_embd.weight").unwrap().shape(), vec![300, 64]);
            let tokenizer = HfTokenizer::from_gguf_metadata(&file.metadata).unwrap();
            assert_eq!(tokenizer.vocab_size(), 300);
            // The real tokens keep their ids; the padding decodes to its own text.
            assert_eq!(tokenizer.encode("hi", false).unwrap(), vec![u32::from(b'h'), u32::from(b'i')]);
            assert_eq!(tokenizer.decode(&[299], false).unwrap(), "<|synthetic_pad_299|>");
        }
    }

    #[test]
    fn the_presets_have_their_checkpoints_sizes() {
        let params = |name| shape(name).unwrap().num_params();
        // Parameter counts as published, within the RoPE factors' few dozen.
        assert_eq!(params("llama-3.2-1b") / 1_000_000, 1235);
        assert_eq!(params("llama-3.1-8b") / 1_000_000, 8030);
        assert_eq!(params("qwen2.5-1.5b") / 1_000_000, 1543);
        assert!(shape("llama-9").unwrap_err().to_string().contains("llama-3.2-1b, llama-3.1-8b, qwen2.5-1.5b"));
        assert_eq!(weight_format("q4_1").unwrap(), DType::Q4_1);
        assert_eq!(weight_format("Q4_K").unwrap(), DType::Q4_K);
        assert!(weight_format("iq2_xxs").unwrap_err().to_string().contains("q8_0"));
    }

    #[test]
    fn llama3_factors_match_the_converter() {
        let f = llama3_rope_8k(8.0).freq_factors(128, 500_000.0);
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn a_smaller_shape_than_the_vocabulary_is_refused() {
        let mut shape = small("llama", true, false, false);
        shape.vocab_size = 100;
        let err = write_gguf(&shape, DType::Q8_0, &tiny_tokenizer(), 1, Vec::new(), &mut |_, _| {}).unwrap_err();
        assert!(err.to_string().contains("more than the shape's 100"), "{err}");
    }
}
