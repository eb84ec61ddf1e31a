//! Tiny random Llama models, written by weft itself, for fast tests: the same weights as a GGUF
//! file (llama.cpp's layout, q/k rows permuted, with a byte-level tokenizer and a ChatML
//! template that shows tools as Qwen2.5 does) and as Hugging Face f32 tensors (for the CPU oracle in `cpu::llama` and for
//! safetensors directories).

use crate::cpu::llama::HfWeights;
use crate::model::config::{ModelConfig, RopeScaling};
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
        rotary_dim: None,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: None,
        max_position_embeddings: 2048,
        tie_word_embeddings: true,
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

/// ChatML, with tools the way Qwen2.5 (Hermes) shows them: a system message listing them and
/// asking for `<tool_call>` JSON, calls and results written back into the conversation. With
/// no tools it renders plain ChatML.
const CHATML: &str = concat!(
    "{% if tools %}<|im_start|>system\n",
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}",
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n",
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}\n</tools>\n\n",
    "For each function call, return a json object with function name and arguments within ",
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": ",
    "<args-json-object>}\n</tool_call><|im_end|>\n{% endif %}",
    "{% for m in messages %}",
    "{% if tools and loop.first and m['role'] == 'system' %}",
    "{% elif m['role'] == 'assistant' and m['tool_calls'] is defined %}<|im_start|>assistant\n{{ m['content'] }}",
    "{% for tc in m['tool_calls'] %}{% if not loop.first or m['content'] %}{{ '\\n' }}{% endif %}",
    "<tool_call>\n{\"name\": \"{{ tc['function']['name'] }}\", \"arguments\": ",
    "{{ tc['function']['arguments'] | tojson }}{{ '}' }}\n</tool_call>{% endfor %}<|im_end|>\n",
    "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n",
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
);

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

/// Qwen3-0.6B's chat template, as Qwen published it (via llama.cpp's
/// `models/templates/Qwen-Qwen3-0.6B.jinja`): thinking on by default, `enable_thinking: false`
/// appends an empty `<think>\n\n</think>\n\n` to the generation prompt.
pub const QWEN3_CHAT_TEMPLATE: &str = include_str!("../../tests/fixtures/qwen3-0.6b.chat_template.jinja");

/// The tiny Qwen3's extra tokens after the tiny vocabulary: Qwen3's reasoning markers, plain
/// added tokens (USER_DEFINED, decoded into the text) as in Qwen3's own vocabulary.
pub const QWEN3_EXTRA_TOKENS: [&str; 2] = ["<think>", "</think>"];
/// `<think>` and `</think>` in the tiny Qwen3's vocabulary.
pub const QWEN3_THINK: u32 = 260;
pub const QWEN3_END_THINK: u32 = 261;

/// A tiny random Qwen3 (per-head q/k norms) with the tiny vocabulary plus `<think>` and
/// `</think>`, and Qwen3's real chat template: what reasoning separation is tested on.
pub fn qwen3_config() -> ModelConfig {
    ModelConfig {
        architecture: "qwen3".into(),
        vocab_size: TINY_VOCAB.len() + QWEN3_EXTRA_TOKENS.len(),
        qk_norm: true,
        // Its own output matrix: tied to the embeddings, a random model repeats the prompt's
        // last token (every chat prompt here ends with a newline) whatever the seed.
        tie_word_embeddings: false,
        ..tiny_config()
    }
}

/// The tokenizer metadata of the tiny Qwen3: the tiny vocabulary, `<think>`, `</think>`, and
/// Qwen3's chat template.
pub fn qwen3_tokenizer_metadata() -> Vec<(&'static str, MetaValue)> {
    let mut meta = tokenizer_metadata();
    for (k, v) in &mut meta {
        match *k {
            "tokenizer.ggml.tokens" => {
                let tokens = TINY_VOCAB.iter().chain(&QWEN3_EXTRA_TOKENS);
                *v = MetaValue::Array(tokens.map(|s| MetaValue::String(s.to_string())).collect());
            }
            "tokenizer.ggml.token_type" => {
                let types = (0..TINY_VOCAB.len()).map(|i| if i >= 257 { 3 } else { 1 });
                *v = MetaValue::Array(types.chain([4, 4]).map(MetaValue::I32).collect());
            }
            "tokenizer.chat_template" => *v = MetaValue::String(QWEN3_CHAT_TEMPLATE.into()),
            _ => {}
        }
    }
    meta
}

/// The tiny Qwen3 ([`qwen3_config`]) as GGUF bytes, from `seed`.
pub fn qwen3_gguf(seed: u64, dtype: DType) -> Vec<u8> {
    let c = qwen3_config();
    gguf_bytes_with(&c, &random_weights(&c, seed, dtype), dtype, qwen3_tokenizer_metadata())
}

/// Deterministic values in [-scale, scale) (also test data for kernels, e.g. in the browser).
pub fn random_values(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = crate::sampling::SamplerRng::new(seed);
    (0..len).map(|_| (rng.next_uniform() * 2.0 - 1.0) * scale).collect()
}

/// The format a matrix with rows of `cols` elements is stored in when the model is `dtype`: the
/// format itself when a row is whole blocks of it, else the fallback llama.cpp's quantizer picks
/// for such a tensor (real K-quant files hold such Q5_0 / Q8_0 / IQ4_NL tensors).
pub fn storage_dtype(dtype: DType, cols: usize) -> DType {
    if cols.is_multiple_of(dtype.block_elems()) {
        return dtype;
    }
    match dtype {
        DType::Q4_K => DType::Q5_0,
        DType::Q5_K => DType::Q5_1,
        DType::Q2_K | DType::Q3_K | DType::IQ4_XS | DType::IQ2_XS | DType::IQ3_XXS | DType::IQ3_S | DType::IQ2_S => {
            DType::IQ4_NL
        }
        _ => DType::Q8_0,
    }
}

/// Values `dtype` stores exactly: encoding them again decodes to the same values, so
/// [`gguf_bytes`], which encodes what it is given, writes exactly these. The 32-element encoders
/// get there in one round; the plain super-block encoders (whose sub-block scales are derived
/// from the values' range) in a few.
fn stored_values(dtype: DType, values: Vec<f32>) -> Vec<f32> {
    let round = |v: &[f32]| crate::quant::dequantize(dtype, &crate::quant::quantize(dtype, v).unwrap()).unwrap();
    let mut v = round(&values);
    for _ in 0..32 {
        let next = round(&v);
        if next == v {
            return v;
        }
        v = next;
    }
    panic!("{dtype}: encoding did not reach a fixed point");
}

/// Random weights in Hugging Face naming. Matrices are rounded through the format they are
/// stored in ([`storage_dtype`] of `dtype`), so the f32 values are exactly what the GPU will
/// decode.
pub fn random_weights(c: &ModelConfig, seed: u64, dtype: DType) -> HfWeights {
    let mut w = HfWeights::new();
    let mut seed = seed;
    // `cols`: the row length of a matrix, None for a vector (kept in f32).
    let mut put = |name: String, len: usize, scale: f32, center: f32, cols: Option<usize>| {
        seed += 1;
        let mut v: Vec<f32> = random_values(len, seed, scale).iter().map(|x| x + center).collect();
        if let Some(cols) = cols {
            v = stored_values(storage_dtype(dtype, cols), v);
        }
        w.insert(name, v);
    };
    let (q_rows, kv_rows) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let (hidden, inter) = (Some(c.hidden_size), Some(c.intermediate_size));
    let hf = |layer, part| tensor_name(Checkpoint::HuggingFace, layer, part);
    put(hf(None, Part::Q), c.vocab_size * c.hidden_size, 1.0, 0.0, hidden);
    put(hf(None, Part::AttnNorm), c.hidden_size, 0.2, 1.0, None);
    if !c.tie_word_embeddings {
        put(hf(None, Part::O), c.vocab_size * c.hidden_size, 0.5, 0.0, hidden);
    }
    for l in 0..c.num_layers {
        let l = Some(l);
        let matrix_scale = |n_in: usize| 1.5 / (n_in as f32).sqrt();
        put(hf(l, Part::AttnNorm), c.hidden_size, 0.2, 1.0, None);
        put(hf(l, Part::Q), q_rows * c.hidden_size, matrix_scale(c.hidden_size) * 2.0, 0.0, hidden);
        put(hf(l, Part::K), kv_rows * c.hidden_size, matrix_scale(c.hidden_size) * 2.0, 0.0, hidden);
        put(hf(l, Part::V), kv_rows * c.hidden_size, matrix_scale(c.hidden_size), 0.0, hidden);
        if c.attention_bias {
            put(hf(l, Part::QBias), q_rows, 0.3, 0.0, None);
            put(hf(l, Part::KBias), kv_rows, 0.3, 0.0, None);
            put(hf(l, Part::VBias), kv_rows, 0.3, 0.0, None);
        }
        if c.qk_norm {
            put(hf(l, Part::QNorm), c.head_dim, 0.2, 1.0, None);
            put(hf(l, Part::KNorm), c.head_dim, 0.2, 1.0, None);
        }
        put(hf(l, Part::O), c.hidden_size * q_rows, matrix_scale(q_rows), 0.0, Some(q_rows));
        put(hf(l, Part::FfnNorm), c.hidden_size, 0.2, 1.0, None);
        put(hf(l, Part::Gate), c.intermediate_size * c.hidden_size, matrix_scale(c.hidden_size), 0.0, hidden);
        put(hf(l, Part::Up), c.intermediate_size * c.hidden_size, matrix_scale(c.hidden_size), 0.0, hidden);
        put(hf(l, Part::Down), c.hidden_size * c.intermediate_size, matrix_scale(c.intermediate_size), 0.0, inter);
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
/// in `dtype` (or its [`storage_dtype`] fallback), norms and biases in F32, q/k rows permuted.
pub fn gguf_bytes(c: &ModelConfig, w: &HfWeights, dtype: DType) -> Vec<u8> {
    gguf_bytes_with(c, w, dtype, tokenizer_metadata())
}

/// [`gguf_bytes`] with another tokenizer's metadata.
pub fn gguf_bytes_with(
    c: &ModelConfig,
    w: &HfWeights,
    dtype: DType,
    tokenizer: Vec<(&'static str, MetaValue)>,
) -> Vec<u8> {
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
        .metadata(&key("rope.dimension_count"), MetaValue::U32(c.rope_dim() as u32));
    if c.head_dim * c.num_heads != c.hidden_size {
        g.metadata(&key("attention.key_length"), MetaValue::U32(c.head_dim as u32))
            .metadata(&key("attention.value_length"), MetaValue::U32(c.head_dim as u32));
    }
    // RoPE scaling as llama.cpp's converter writes it (YaRN's attention factor as the
    // checkpoint's own, `yarn_attn_factor`).
    match &c.rope_scaling {
        Some(RopeScaling::Linear { factor }) => {
            g.metadata(&key("rope.scaling.type"), MetaValue::String("linear".into()))
                .metadata(&key("rope.scaling.factor"), MetaValue::F32(*factor));
        }
        Some(RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            attention_factor,
            ..
        }) => {
            g.metadata(&key("rope.scaling.type"), MetaValue::String("yarn".into()))
                .metadata(&key("rope.scaling.factor"), MetaValue::F32(*factor))
                .metadata(
                    &key("rope.scaling.original_context_length"),
                    MetaValue::U32(*original_max_position_embeddings as u32),
                )
                .metadata(&key("rope.scaling.yarn_beta_fast"), MetaValue::F32(*beta_fast))
                .metadata(&key("rope.scaling.yarn_beta_slow"), MetaValue::F32(*beta_slow))
                .metadata(&key("rope.scaling.yarn_attn_factor"), MetaValue::F32(*attention_factor));
        }
        _ => {}
    }
    for (k, v) in tokenizer {
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
            let stored = storage_dtype(dtype, cols);
            (ggml_type(stored), crate::quant::quantize(stored, &values).unwrap())
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
        put(l, Part::QNorm, 1, c.head_dim);
        put(l, Part::KNorm, 1, c.head_dim);
        put(l, Part::O, c.hidden_size, q_rows);
        put(l, Part::FfnNorm, 1, c.hidden_size);
        put(l, Part::Gate, c.intermediate_size, c.hidden_size);
        put(l, Part::Up, c.intermediate_size, c.hidden_size);
        put(l, Part::Down, c.hidden_size, c.intermediate_size);
    }
    g.to_bytes()
}

/// A tiny Gemma 3: 7 layers (layer 5 attends globally, the rest within a window of 4 tokens,
/// each kind with its own RoPE base), 4 query heads over one KV head, per-head q/k norms.
pub fn gemma3_config() -> ModelConfig {
    ModelConfig {
        architecture: "gemma3".into(),
        num_layers: 7,
        num_kv_heads: 1,
        head_dim: 32,
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        tie_word_embeddings: true,
        sliding_window: Some(4),
        qk_norm: true,
        sliding_window_pattern: Some(6),
        rope_local_theta: Some(10000.0),
        query_pre_attn_scalar: Some(32.0),
        ..tiny_config()
    }
}

/// A random Gemma 3 as llama.cpp's converter writes one (norm weights hold 1 + w), with
/// matrices in `dtype` (or its [`storage_dtype`] fallback): the GGUF bytes, and the exact f32
/// values of every tensor by its GGUF name (for `cpu::gemma3`).
pub fn gemma3_gguf(c: &ModelConfig, seed: u64, dtype: DType) -> (Vec<u8>, HfWeights) {
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
        .metadata(&key("attention.key_length"), MetaValue::U32(c.head_dim as u32))
        .metadata(&key("attention.value_length"), MetaValue::U32(c.head_dim as u32))
        .metadata(&key("attention.layer_norm_rms_epsilon"), MetaValue::F32(c.rms_norm_eps))
        .metadata(&key("attention.sliding_window"), MetaValue::U32(c.sliding_window.unwrap_or(0) as u32))
        .metadata(&key("rope.freq_base"), MetaValue::F32(c.rope_theta));
    for (k, v) in tokenizer_metadata() {
        g.metadata(k, v);
    }
    let mut w = HfWeights::new();
    let mut seed = seed;
    let (hidden, hd) = (c.hidden_size, c.head_dim);
    let mut put = |name: String, rows: usize, cols: usize, scale: f32, center: f32| {
        seed += 1;
        let values: Vec<f32> = random_values(rows * cols, seed, scale).iter().map(|x| x + center).collect();
        let (ty, values) = if rows > 1 {
            let stored = storage_dtype(dtype, cols);
            (stored, stored_values(stored, values))
        } else {
            (DType::F32, values)
        };
        let dims: Vec<u64> = if rows > 1 { vec![cols as u64, rows as u64] } else { vec![cols as u64] };
        g.tensor(&name, &dims, ggml_type(ty), &crate::quant::quantize(ty, &values).unwrap());
        w.insert(name, values);
    };
    let matrix_scale = |n_in: usize| 1.5 / (n_in as f32).sqrt();
    put("token_embd.weight".into(), c.vocab_size, hidden, 0.2, 0.0);
    put("output_norm.weight".into(), 1, hidden, 0.2, 1.0);
    let (q_rows, kv_rows) = (c.num_heads * hd, c.num_kv_heads * hd);
    for l in 0..c.num_layers {
        let p = |s: &str| format!("blk.{l}.{s}");
        put(p("attn_norm.weight"), 1, hidden, 0.2, 1.0);
        put(p("attn_q.weight"), q_rows, hidden, matrix_scale(hidden) * 2.0, 0.0);
        put(p("attn_k.weight"), kv_rows, hidden, matrix_scale(hidden) * 2.0, 0.0);
        put(p("attn_v.weight"), kv_rows, hidden, matrix_scale(hidden), 0.0);
        put(p("attn_q_norm.weight"), 1, hd, 0.2, 1.0);
        put(p("attn_k_norm.weight"), 1, hd, 0.2, 1.0);
        put(p("attn_output.weight"), hidden, q_rows, matrix_scale(q_rows), 0.0);
        put(p("post_attention_norm.weight"), 1, hidden, 0.2, 1.0);
        put(p("ffn_norm.weight"), 1, hidden, 0.2, 1.0);
        put(p("ffn_gate.weight"), c.intermediate_size, hidden, matrix_scale(hidden), 0.0);
        put(p("ffn_up.weight"), c.intermediate_size, hidden, matrix_scale(hidden), 0.0);
        put(p("ffn_down.weight"), hidden, c.intermediate_size, matrix_scale(c.intermediate_size), 0.0);
        put(p("post_ffw_norm.weight"), 1, hidden, 0.2, 1.0);
    }
    (g.to_bytes(), w)
}
