//! Tiny random Llama models, written by weft itself, for fast tests: the same weights as a GGUF
//! file (llama.cpp's layout, q/k rows permuted, with a byte-level tokenizer and a ChatML
//! template) and as Hugging Face f32 tensors (for the CPU oracle in `cpu::llama` and for
//! safetensors directories).

use crate::cpu::llama::HfWeights;
use crate::model::config::ModelConfig;
use crate::model::gguf::{GgmlType, GgufWriter, MetaValue};
use crate::model::weights::{Checkpoint, Part, tensor_name};
use crate::quant::DType;

/// A small config with grouped-query attention: 2 layers, hidden 64, 4 heads over 2 KV heads.
pub fn tiny_config() -> ModelConfig {
    ModelConfig {
        architecture: "llama".into(),
        vocab_size: TINY_VOCAB.len(),
        hidden_size: 64,
        intermediate_size: 96,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: None,
        max_position_embeddings: 512,
        tie_word_embeddings: true,
        attention_bias: false,
        sliding_window: None,
        ssm: None,
        hybrid: None,
    }
}

/// The tiny vocabulary: the 256 bytes in GPT-2's byte alphabet, one merge ("ĠĠ", two spaces),
/// then the special tokens.
pub const TINY_VOCAB: [&str; 260] = tiny_vocab();

const fn tiny_vocab() -> [&'static str; 260] {
    // Filled at compile time from BYTE_TOKENS below.
    let mut out = [""; 260];
    let mut i = 0;
    while i < 256 {
        out[i] = BYTE_TOKENS[i];
        i += 1;
    }
    out[256] = "ĠĠ";
    out[257] = "<|endoftext|>";
    out[258] = "<|im_start|>";
    out[259] = "<|im_end|>";
    out
}

/// `<|endoftext|>`, the tiny tokenizer's end of sequence; `<|im_end|>` ends a chat turn.
pub const TINY_EOS: u32 = 257;
pub const TINY_IM_END: u32 = 259;

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// GPT-2's printable stand-in for each byte (`bytes_to_unicode`).
const BYTE_TOKENS: [&str; 256] = [
    "Ā", "ā", "Ă", "ă", "Ą", "ą", "Ć", "ć", "Ĉ", "ĉ", "Ċ", "ċ", "Č", "č", "Ď", "ď", "Đ", "đ", "Ē", "ē", "Ĕ", "ĕ", "Ė",
    "ė", "Ę", "ę", "Ě", "ě", "Ĝ", "ĝ", "Ğ", "ğ", "Ġ", "!", "\"", "#", "$", "%", "&", "'", "(", ")", "*", "+", ",", "-",
    ".", "/", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", ":", ";", "<", "=", ">", "?", "@", "A", "B", "C", "D",
    "E", "F", "G", "H", "I", "J", "K", "L", "M", "N", "O", "P", "Q", "R", "S", "T", "U", "V", "W", "X", "Y", "Z", "[",
    "\\", "]", "^", "_", "`", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r",
    "s", "t", "u", "v", "w", "x", "y", "z", "{", "|", "}", "~", "ġ", "Ģ", "ģ", "Ĥ", "ĥ", "Ħ", "ħ", "Ĩ", "ĩ", "Ī", "ī",
    "Ĭ", "ĭ", "Į", "į", "İ", "ı", "Ĳ", "ĳ", "Ĵ", "ĵ", "Ķ", "ķ", "ĸ", "Ĺ", "ĺ", "Ļ", "ļ", "Ľ", "ľ", "Ŀ", "ŀ", "Ł", "ł",
    "¡", "¢", "£", "¤", "¥", "¦", "§", "¨", "©", "ª", "«", "¬", "Ń", "®", "¯", "°", "±", "²", "³", "´", "µ", "¶", "·",
    "¸", "¹", "º", "»", "¼", "½", "¾", "¿", "À", "Á", "Â", "Ã", "Ä", "Å", "Æ", "Ç", "È", "É", "Ê", "Ë", "Ì", "Í", "Î",
    "Ï", "Ð", "Ñ", "Ò", "Ó", "Ô", "Õ", "Ö", "×", "Ø", "Ù", "Ú", "Û", "Ü", "Ý", "Þ", "ß", "à", "á", "â", "ã", "ä", "å",
    "æ", "ç", "è", "é", "ê", "ë", "ì", "í", "î", "ï", "ð", "ñ", "ò", "ó", "ô", "õ", "ö", "÷", "ø", "ù", "ú", "û", "ü",
    "ý", "þ", "ÿ",
];

/// The tokenizer metadata of the tiny vocabulary (GGUF `tokenizer.*` keys).
pub fn tokenizer_metadata() -> Vec<(&'static str, MetaValue)> {
    let strings = |v: &[&str]| MetaValue::Array(v.iter().map(|s| MetaValue::String(s.to_string())).collect());
    let types: Vec<MetaValue> = (0..TINY_VOCAB.len()).map(|i| MetaValue::I32(if i >= 257 { 3 } else { 1 })).collect();
    vec![
        ("tokenizer.ggml.model", MetaValue::String("gpt2".into())),
        ("tokenizer.ggml.pre", MetaValue::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&TINY_VOCAB)),
        ("tokenizer.ggml.token_type", MetaValue::Array(types)),
        ("tokenizer.ggml.merges", strings(&["Ġ Ġ"])),
        ("tokenizer.ggml.bos_token_id", MetaValue::U32(TINY_EOS)),
        ("tokenizer.ggml.eos_token_id", MetaValue::U32(TINY_EOS)),
        ("tokenizer.ggml.eot_token_id", MetaValue::U32(TINY_IM_END)),
        ("tokenizer.ggml.add_bos_token", MetaValue::Bool(false)),
        ("tokenizer.chat_template", MetaValue::String(CHATML.into())),
    ]
}

/// Deterministic values in [-scale, scale) (also test data for kernels, e.g. in the browser).
pub fn random_values(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = crate::sampling::SamplerRng::new(seed);
    (0..len).map(|_| (rng.next_uniform() * 2.0 - 1.0) * scale).collect()
}

/// Random weights in Hugging Face naming. Matrices of `dtype` are rounded through it, so the
/// f32 values are exactly what the GPU will decode.
pub fn random_weights(c: &ModelConfig, seed: u64, dtype: DType) -> HfWeights {
    let mut w = HfWeights::new();
    let mut seed = seed;
    let mut put = |name: String, len: usize, scale: f32, center: f32, quantize: bool| {
        seed += 1;
        let mut v: Vec<f32> = random_values(len, seed, scale).iter().map(|x| x + center).collect();
        if quantize {
            v = crate::quant::dequantize(dtype, &crate::quant::quantize(dtype, &v).unwrap()).unwrap();
        }
        w.insert(name, v);
    };
    let (q_rows, kv_rows) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let hf = |layer, part| tensor_name(Checkpoint::HuggingFace, layer, part);
    put(hf(None, Part::Q), c.vocab_size * c.hidden_size, 1.0, 0.0, true);
    put(hf(None, Part::AttnNorm), c.hidden_size, 0.2, 1.0, false);
    if !c.tie_word_embeddings {
        put(hf(None, Part::O), c.vocab_size * c.hidden_size, 0.5, 0.0, true);
    }
    for l in 0..c.num_layers {
        let l = Some(l);
        let matrix_scale = |n_in: usize| 1.5 / (n_in as f32).sqrt();
        put(hf(l, Part::AttnNorm), c.hidden_size, 0.2, 1.0, false);
        put(hf(l, Part::Q), q_rows * c.hidden_size, matrix_scale(c.hidden_size) * 2.0, 0.0, true);
        put(hf(l, Part::K), kv_rows * c.hidden_size, matrix_scale(c.hidden_size) * 2.0, 0.0, true);
        put(hf(l, Part::V), kv_rows * c.hidden_size, matrix_scale(c.hidden_size), 0.0, true);
        if c.attention_bias {
            put(hf(l, Part::QBias), q_rows, 0.3, 0.0, false);
            put(hf(l, Part::KBias), kv_rows, 0.3, 0.0, false);
            put(hf(l, Part::VBias), kv_rows, 0.3, 0.0, false);
        }
        put(hf(l, Part::O), c.hidden_size * q_rows, matrix_scale(q_rows), 0.0, true);
        put(hf(l, Part::FfnNorm), c.hidden_size, 0.2, 1.0, false);
        put(hf(l, Part::Gate), c.intermediate_size * c.hidden_size, matrix_scale(c.hidden_size), 0.0, true);
        put(hf(l, Part::Up), c.intermediate_size * c.hidden_size, matrix_scale(c.hidden_size), 0.0, true);
        put(hf(l, Part::Down), c.hidden_size * c.intermediate_size, matrix_scale(c.intermediate_size), 0.0, true);
    }
    w
}

/// llama.cpp's q/k row permutation: within each head, HF row a·(hd/2) + b becomes row 2b + a.
pub fn permute_rows_for_gguf(w: &[f32], num_heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; w.len()];
    let half = head_dim / 2;
    for h in 0..num_heads {
        for a in 0..2 {
            for b in 0..half {
                let from = (h * head_dim + a * half + b) * cols;
                let to = (h * head_dim + 2 * b + a) * cols;
                out[to..to + cols].copy_from_slice(&w[from..from + cols]);
            }
        }
    }
    out
}

fn ggml_type(dtype: DType) -> GgmlType {
    GgmlType::from_u32(dtype.format().expect("weights are never U32").ggml_type)
}

/// The weights as a GGUF file the way llama.cpp's converter writes a Llama checkpoint: matrices
/// in `dtype`, norms and biases in F32, q/k rows permuted.
pub fn gguf_bytes(c: &ModelConfig, w: &HfWeights, dtype: DType) -> Vec<u8> {
    let arch = c.architecture.clone();
    let mut g = GgufWriter::new();
    let key = |k: &str| format!("{arch}.{k}");
    g.metadata("general.architecture", MetaValue::String(arch.clone()))
        .metadata(&key("context_length"), MetaValue::U32(c.max_position_embeddings as u32))
        .metadata(&key("embedding_length"), MetaValue::U32(c.hidden_size as u32))
        .metadata(&key("feed_forward_length"), MetaValue::U32(c.intermediate_size as u32))
        .metadata(&key("block_count"), MetaValue::U32(c.num_layers as u32))
        .metadata(&key("attention.head_count"), MetaValue::U32(c.num_heads as u32))
        .metadata(&key("attention.head_count_kv"), MetaValue::U32(c.num_kv_heads as u32))
        .metadata(&key("attention.layer_norm_rms_epsilon"), MetaValue::F32(c.rms_norm_eps))
        .metadata(&key("rope.freq_base"), MetaValue::F32(c.rope_theta))
        .metadata(&key("rope.dimension_count"), MetaValue::U32(c.head_dim as u32));
    for (k, v) in tokenizer_metadata() {
        g.metadata(k, v);
    }
    let permute = arch == "llama" || arch == "mistral";
    let mut put = |layer: Option<usize>, part: Part, rows: usize, cols: usize| {
        let hf = tensor_name(Checkpoint::HuggingFace, layer, part);
        let Some(values) = w.get(&hf) else { return };
        let values = match part {
            Part::Q | Part::QBias if permute && layer.is_some() => {
                permute_rows_for_gguf(values, c.num_heads, c.head_dim, cols)
            }
            Part::K | Part::KBias if permute && layer.is_some() => {
                permute_rows_for_gguf(values, c.num_kv_heads, c.head_dim, cols)
            }
            _ => values.clone(),
        };
        let is_matrix = rows > 1;
        let (ty, bytes) = if is_matrix {
            (ggml_type(dtype), crate::quant::quantize(dtype, &values).unwrap())
        } else {
            (GgmlType::F32, crate::quant::quantize(DType::F32, &values).unwrap())
        };
        let dims: Vec<u64> = if is_matrix { vec![cols as u64, rows as u64] } else { vec![cols as u64] };
        g.tensor(&tensor_name(Checkpoint::Gguf, layer, part), &dims, ty, &bytes);
    };
    let (q_rows, kv_rows) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    put(None, Part::Q, c.vocab_size, c.hidden_size);
    put(None, Part::AttnNorm, 1, c.hidden_size);
    put(None, Part::O, c.vocab_size, c.hidden_size);
    for l in 0..c.num_layers {
        let l = Some(l);
        put(l, Part::AttnNorm, 1, c.hidden_size);
        put(l, Part::Q, q_rows, c.hidden_size);
        put(l, Part::K, kv_rows, c.hidden_size);
        put(l, Part::V, kv_rows, c.hidden_size);
        put(l, Part::QBias, 1, q_rows);
        put(l, Part::KBias, 1, kv_rows);
        put(l, Part::VBias, 1, kv_rows);
        put(l, Part::O, c.hidden_size, q_rows);
        put(l, Part::FfnNorm, 1, c.hidden_size);
        put(l, Part::Gate, c.intermediate_size, c.hidden_size);
        put(l, Part::Up, c.intermediate_size, c.hidden_size);
        put(l, Part::Down, c.hidden_size, c.intermediate_size);
    }
    g.to_bytes()
}
