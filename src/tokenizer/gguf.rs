//! [`HfTokenizer::from_gguf_metadata`]: a tokenizer from the vocabulary a GGUF file carries in
//! its metadata (`tokenizer.ggml.*`), built on the `tokenizers` crate so that it splits and merges
//! text the way llama.cpp does for the same file.
//!
//! Four vocabulary kinds (`tokenizer.ggml.model`):
//! - `"gpt2"`: byte-level BPE. Tokens are spelled in GPT-2's byte alphabet and ranked merges
//!   come with them; text is first cut by the regexes llama.cpp uses for the file's
//!   `tokenizer.ggml.pre` (each one splits every piece the previous ones left, keeping both the
//!   matches and the text between them), then turned into byte symbols and merged.
//! - `"llama"`: SentencePiece-style. Tokens carry scores instead of merges; spaces are written
//!   `▁`, a `▁` is put in front of the text (and after every special token) when
//!   `tokenizer.ggml.add_space_prefix` says so (the default), and a character missing from the
//!   vocabulary falls back to its UTF-8 bytes as `<0xXX>` tokens. llama.cpp merges the adjacent
//!   pair whose union is the best-scoring token first; BPE with merges ranked by that score is
//!   the same procedure.
//! - `"gemma4"`: the same spelling as `"llama"` without the space in front, but with ranked
//!   merges in the file, applied to each line and each run of newlines apart (llama.cpp's
//!   `gemma4` pre-tokenizer); BOS always added, as llama.cpp does.
//! - `"bert"`: WordPiece (BERT encoders such as bge). llama.cpp's converter writes a word's first
//!   piece with a leading `▁` and a continuation without the `##` Hugging Face gives it; the
//!   vocabulary is turned back into WordPiece's spelling and run as transformers'
//!   `BertTokenizerFast` does: the BERT normaliser (control characters dropped, CJK characters
//!   spaced, lower-cased and accents stripped when `tokenizer.ggml.normalizer.lowercase`, true by
//!   default), the BERT pre-tokenizer (whitespace and punctuation), longest-match-first pieces,
//!   `[UNK]` for a word that cannot be pieced; `[CLS]` and `[SEP]` around the text are the
//!   file's BOS and EOS, added as llama.cpp adds them.
//!
//! Tokens typed CONTROL in `tokenizer.ggml.token_type` become special tokens (recognised whole in
//! text, left out by `skip_special_tokens`), USER_DEFINED ones plain added tokens (recognised
//! whole, kept when decoding).

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::ChatTemplate;
use super::hf::{END_OF_GENERATION_TOKENS, HfTokenizer};
use crate::model::gguf::{MetaValue, Metadata};
use crate::{Result, WeftError};

// llama.cpp's token types (`tokenizer.ggml.token_type`).
const TOKEN_NORMAL: i64 = 1;
const TOKEN_UNKNOWN: i64 = 2;
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;
const TOKEN_BYTE: i64 = 6;

/// The label errors name when the caller did not say which file the metadata came from.
const DEFAULT_SOURCE: &str = "GGUF metadata";

// The pre-tokenizer regexes llama.cpp (src/llama-vocab.cpp) uses for each `tokenizer.ggml.pre`.
const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

// DeepSeek's splits name their scripts by explicit ranges, as llama.cpp (and the reference
// tokenizers) write them.
const DEEPSEEK_LLM_SPLITS: &[&str] = &[
    r"[\r\n]",
    r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    r"\s?[!-/:-~！-／：-～‘-‟\x{3000}-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-\x{D7FF}]+",
    r"\p{N}+",
];
const DEEPSEEK_CODER_SPLITS: &[&str] = &[r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-\x{D7FF}]+", r"\p{N}"];
const QWEN35_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How one `tokenizer.ggml.pre` family splits text before BPE.
struct PreTokenizerKind {
    regexes: &'static [&'static str],
    /// A word that is a whole token is taken as is, without merging (Llama 3).
    ignore_merges: bool,
    /// llama.cpp's default for `add_bos_token` when the file does not say.
    add_bos: bool,
}

/// The `tokenizer.ggml.pre` names we read, grouped as llama.cpp groups them.
fn pre_tokenizer_kind(name: &str) -> Option<PreTokenizerKind> {
    const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]"];
    let kind = |regexes, ignore_merges, add_bos| Some(PreTokenizerKind { regexes, ignore_merges, add_bos });
    match name {
        "default" => kind(DEFAULT, false, false),
        "gpt2" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0"
        | "mellum" | "mpt" | "olmo" | "jais" | "trillion" | "exaone4" | "granite-docling" => {
            kind(&[GPT2_SPLIT], false, false)
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => {
            kind(&[LLAMA3_SPLIT], true, true)
        }
        "dbrx" | "smaug-bpe" | "glm4" | "chatglm-bpe" => kind(&[LLAMA3_SPLIT], false, false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "megrez" | "stablelm2" | "hunyuan" => {
            kind(&[QWEN2_SPLIT], false, false)
        }
        "qwen35" => kind(&[QWEN35_SPLIT], false, false),
        "deepseek-llm" => kind(DEEPSEEK_LLM_SPLITS, false, false),
        "deepseek-coder" => kind(DEEPSEEK_CODER_SPLITS, false, false),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            kind(&[r"\p{N}", GPT2_SPLIT], false, false)
        }
        "falcon" => kind(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_SPLIT, r"[0-9][0-9][0-9]"], false, false),
        "tekken" => kind(&[TEKKEN_SPLIT], true, true),
        "gpt-4o" | "llama4" | "minimax-m2" => kind(&[GPT4O_SPLIT], false, false),
        _ => None,
    }
}

const SUPPORTED_PRE: &str = "default, gpt2/gpt-2, llama3/llama-bpe, qwen2, qwen35, smollm/starcoder, \
                             falcon, tekken, gpt-4o/llama4, dbrx, chatglm-bpe, deepseek-llm, deepseek-coder";

/// Typed access to the `tokenizer.*` keys, with errors that name the file and the key.
struct Meta<'a> {
    meta: &'a Metadata,
    file: &'a str,
}

impl<'a> Meta<'a> {
    fn err(&self, detail: impl Into<String>) -> WeftError {
        WeftError::model(self.file, detail)
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.err(format!("{key} should be a string, found {}", type_name(other)))),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.err(format!("{key} should be a bool, found {}", type_name(other)))),
        }
    }

    fn int(&self, key: &str) -> Result<Option<i64>> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(v) => as_int(v)
                .map(Some)
                .ok_or_else(|| self.err(format!("{key} should be an integer, found {}", type_name(v)))),
        }
    }

    /// A token id key: absent, or an id inside the vocabulary (one outside is ignored with a
    /// warning, as llama.cpp does, because such files exist and their text still tokenizes).
    fn token_id(&self, key: &str, n_tokens: usize) -> Result<Option<u32>> {
        match self.int(key)? {
            None => Ok(None),
            Some(id) if id >= 0 && (id as usize) < n_tokens => Ok(Some(id as u32)),
            Some(id) => {
                tracing::warn!("{}: {key} = {id} is outside the vocabulary of {n_tokens} tokens; ignored", self.file);
                Ok(None)
            }
        }
    }

    fn array(&self, key: &str) -> Result<Option<&'a [MetaValue]>> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::Array(items)) => Ok(Some(items)),
            Some(other) => Err(self.err(format!("{key} should be an array, found {}", type_name(other)))),
        }
    }

    fn str_array(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        let Some(items) = self.array(key)? else { return Ok(None) };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                MetaValue::String(s) => Ok(s.as_str()),
                other => Err(self.err(format!("{key}[{i}] should be a string, found {}", type_name(other)))),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    fn int_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(items) = self.array(key)? else { return Ok(None) };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                as_int(v).ok_or_else(|| self.err(format!("{key}[{i}] should be an integer, found {}", type_name(v))))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    fn float_array(&self, key: &str) -> Result<Option<Vec<f32>>> {
        let Some(items) = self.array(key)? else { return Ok(None) };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                MetaValue::F32(x) => Ok(*x),
                MetaValue::F64(x) => Ok(*x as f32),
                other => as_int(other)
                    .map(|x| x as f32)
                    .ok_or_else(|| self.err(format!("{key}[{i}] should be a number, found {}", type_name(other)))),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

fn as_int(v: &MetaValue) -> Option<i64> {
    Some(match *v {
        MetaValue::U8(x) => x as i64,
        MetaValue::I8(x) => x as i64,
        MetaValue::U16(x) => x as i64,
        MetaValue::I16(x) => x as i64,
        MetaValue::U32(x) => x as i64,
        MetaValue::I32(x) => x as i64,
        MetaValue::U64(x) => i64::try_from(x).ok()?,
        MetaValue::I64(x) => x,
        _ => return None,
    })
}

fn type_name(v: &MetaValue) -> &'static str {
    match v {
        MetaValue::U8(_) => "u8",
        MetaValue::I8(_) => "i8",
        MetaValue::U16(_) => "u16",
        MetaValue::I16(_) => "i16",
        MetaValue::U32(_) => "u32",
        MetaValue::I32(_) => "i32",
        MetaValue::U64(_) => "u64",
        MetaValue::I64(_) => "i64",
        MetaValue::F32(_) => "f32",
        MetaValue::F64(_) => "f64",
        MetaValue::Bool(_) => "bool",
        MetaValue::String(_) => "string",
        MetaValue::Array(_) => "array",
    }
}

/// The vocabulary both kinds share: token texts and their types.
struct Vocab<'a> {
    tokens: Vec<&'a str>,
    types: Vec<i64>,
}

impl HfTokenizer {
    /// Builds the tokenizer a GGUF file describes in its metadata. Errors name "GGUF metadata";
    /// [`HfTokenizer::from_gguf_metadata_of`] names the file instead.
    pub fn from_gguf_metadata(meta: &Metadata) -> Result<Self> {
        Self::from_gguf_metadata_of(meta, DEFAULT_SOURCE)
    }

    /// As [`HfTokenizer::from_gguf_metadata`], naming `file` in errors.
    pub fn from_gguf_metadata_of(meta: &Metadata, file: &str) -> Result<Self> {
        let m = Meta { meta, file };
        let model = m.str("tokenizer.ggml.model")?.ok_or_else(|| {
            m.err(
                "tokenizer.ggml.model is missing: this GGUF carries no tokenizer; \
                 load the model's tokenizer.json instead",
            )
        })?;
        if !["gpt2", "llama", "bert", "gemma4"].contains(&model) {
            return Err(m.err(format!(
                "tokenizer.ggml.model is {model:?}; weft reads gpt2 (byte-level BPE), llama \
                 (SentencePiece), gemma4 (SentencePiece-style BPE) and bert (WordPiece) vocabularies; load the \
                 model's tokenizer.json instead"
            )));
        }

        let tokens = m.str_array("tokenizer.ggml.tokens")?.ok_or_else(|| {
            m.err(format!(
                "tokenizer.ggml.tokens is missing: the file names a {model:?} tokenizer but has no vocabulary"
            ))
        })?;
        if tokens.is_empty() {
            return Err(m.err("tokenizer.ggml.tokens is empty"));
        }
        let n = tokens.len();
        let types = match m.int_array("tokenizer.ggml.token_type")? {
            Some(types) if types.len() != n => {
                return Err(m.err(format!(
                    "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {n}",
                    types.len()
                )));
            }
            Some(types) => types,
            None => vec![TOKEN_NORMAL; n],
        };
        let vocab = Vocab { tokens, types };

        let pre_name = m.str("tokenizer.ggml.pre")?.unwrap_or("default");
        let (mut tokenizer, default_add_bos, add_space_prefix) = if model == "gpt2" {
            let kind = pre_tokenizer_kind(pre_name).ok_or_else(|| {
                m.err(format!(
                    "tokenizer.ggml.pre is {pre_name:?}, a pre-tokenizer weft does not know; it knows {SUPPORTED_PRE}"
                ))
            })?;
            (byte_level_bpe(&m, &vocab, &kind)?, kind.add_bos, false)
        } else if model == "bert" {
            (wordpiece(&m, &vocab)?, true, false)
        } else if model == "gemma4" {
            // llama.cpp adds BOS to Gemma 4's prompts whatever the file says.
            (gemma4_bpe(&m, &vocab)?, true, false)
        } else {
            let add_space_prefix = m.bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
            (sentencepiece_bpe(&m, &vocab, add_space_prefix)?, true, add_space_prefix)
        };

        let mut first_id: HashMap<&str, u32> = HashMap::with_capacity(n);
        for (id, &text) in vocab.tokens.iter().enumerate() {
            first_id.entry(text).or_insert(id as u32);
        }

        // Special tokens: CONTROL ones are special, USER_DEFINED ones are matched whole but decoded.
        let mut control = Vec::new();
        let mut user_defined = Vec::new();
        for (id, (&text, &ty)) in vocab.tokens.iter().zip(&vocab.types).enumerate() {
            if text.is_empty() {
                continue;
            }
            match ty {
                TOKEN_CONTROL => control.push((id, AddedToken::from(text, true).normalized(false))),
                TOKEN_USER_DEFINED => user_defined.push((id, AddedToken::from(text, false).normalized(false))),
                _ => {}
            }
        }
        tokenizer
            .add_special_tokens(control.iter().map(|(_, t)| t.clone()))
            .map_err(|e| m.err(format!("adding the control tokens failed: {e}")))?;
        tokenizer
            .add_tokens(user_defined.iter().map(|(_, t)| t.clone()))
            .map_err(|e| m.err(format!("adding the user-defined tokens failed: {e}")))?;
        for (id, token) in control.iter().chain(&user_defined) {
            let got = tokenizer.token_to_id(&token.content);
            let first_with_text = first_id.get(token.content.as_str()).copied();
            if got != Some(*id as u32) && first_with_text == Some(*id as u32) {
                return Err(m.err(format!(
                    "special token {:?} (id {id}) did not keep its id (got {got:?}); the vocabulary is inconsistent",
                    token.content
                )));
            }
        }

        let mut bos = m.token_id("tokenizer.ggml.bos_token_id", n)?;
        let mut eos = m.token_id("tokenizer.ggml.eos_token_id", n)?;
        let wordpiece = model == "bert";
        if wordpiece {
            // llama.cpp puts [CLS] (its BOS) before every text and [SEP] (its separator, key
            // spelled so) after it, whatever the add_* keys say; older files name [CLS] only as
            // cls_token_id.
            bos = bos.or(m.token_id("tokenizer.ggml.cls_token_id", n)?);
            eos = m.token_id("tokenizer.ggml.seperator_token_id", n)?.or(eos);
        }
        let eot = m.token_id("tokenizer.ggml.eot_token_id", n)?;
        let eom = m.token_id("tokenizer.ggml.eom_token_id", n)?;
        let mut eos_ids: Vec<u32> = Vec::new();
        for id in [eos, eot, eom].into_iter().flatten() {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        for text in END_OF_GENERATION_TOKENS {
            if let Some(&id) = first_id.get(text) {
                if vocab.types[id as usize] == TOKEN_CONTROL && !eos_ids.contains(&id) {
                    eos_ids.push(id);
                }
            }
        }

        let add_bos =
            wordpiece || model == "gemma4" || m.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(default_add_bos);
        let add_eos = wordpiece || m.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        if add_bos && bos.is_none() {
            return Err(m.err("tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is not set"));
        }
        if add_eos && eos.is_none() {
            return Err(m.err("tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is not set"));
        }

        let chat_template = match m.str("tokenizer.chat_template")? {
            Some(source) => {
                let text = |id: Option<u32>| id.map(|i| vocab.tokens[i as usize]);
                Some(
                    ChatTemplate::new(source, text(bos), text(eos))
                        .map_err(|e| m.err(format!("tokenizer.chat_template does not compile: {e}")))?,
                )
            }
            None => None,
        };

        Ok(HfTokenizer {
            inner: tokenizer,
            source: file.to_owned(),
            vocab_size: n,
            bos,
            eos_ids,
            add_bos,
            add_eos,
            manual_specials: true,
            strip_leading_space: add_space_prefix,
            chat_template,
        })
    }
}

fn regex_split(m: &Meta<'_>, regex: &str) -> Result<PreTokenizerWrapper> {
    Split::new(SplitPattern::Regex(regex.to_owned()), SplitDelimiterBehavior::Isolated, false)
        .map(PreTokenizerWrapper::Split)
        .map_err(|e| m.err(format!("pre-tokenizer regex {regex:?} does not compile: {e}")))
}

fn build_bpe(
    m: &Meta<'_>,
    vocab: HashMap<String, u32>,
    merges: Vec<(String, String)>,
    configure: impl FnOnce(tokenizers::models::bpe::BpeBuilder) -> tokenizers::models::bpe::BpeBuilder,
) -> Result<BPE> {
    let vocab: tokenizers::models::bpe::Vocab = vocab.into_iter().collect();
    let builder = BPE::builder().vocab_and_merges(vocab, merges);
    configure(builder).build().map_err(|e| m.err(format!("the vocabulary does not form a BPE model: {e}")))
}

/// A map from token text to the first id with that text (a few vocabularies repeat a text; the
/// later ids still decode, through the added-token table or as unknown).
fn first_ids<'t>(texts: impl Iterator<Item = (usize, std::borrow::Cow<'t, str>)>) -> HashMap<String, u32> {
    let mut map = HashMap::new();
    for (id, text) in texts {
        map.entry(text.into_owned()).or_insert(id as u32);
    }
    map
}

/// `tokenizer.ggml.merges`, ranked, as (left, right) pairs; `kind` names the vocabulary that
/// needs them when they are missing.
fn file_merges(m: &Meta<'_>, kind: &str) -> Result<Vec<(String, String)>> {
    let merges_list = m
        .str_array("tokenizer.ggml.merges")?
        .ok_or_else(|| m.err(format!("tokenizer.ggml.merges is missing: a {kind} vocabulary needs its merges")))?;
    merges_list
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let (a, b) = line.split_once(' ').ok_or_else(|| {
                m.err(format!("tokenizer.ggml.merges[{i}] = {line:?} is not two tokens separated by a space"))
            })?;
            Ok((a.to_owned(), b.to_owned()))
        })
        .collect()
}

fn byte_level_bpe(m: &Meta<'_>, vocab: &Vocab<'_>, kind: &PreTokenizerKind) -> Result<tokenizers::Tokenizer> {
    let merges = file_merges(m, "gpt2 (byte-level BPE)")?;

    // Ordinary tokens are spelled in the byte alphabet; one that is not (a converter's slip) is
    // respelled, as transformers does. Special and user-defined tokens keep their raw text: that
    // is what they are matched against. A respelled token never takes the text of a token
    // spelled right: llama.cpp looks tokens up by their file text, so Command-R's NORMAL
    // token "\u{200d}" (id 264) must not shadow "âĢį" (id 35927), which the merges produce.
    let alphabet = ByteLevel::alphabet();
    let bytes_to_char = byte_to_char_table();
    let (mut as_written, mut respelled): (Vec<(usize, std::borrow::Cow<'_, str>)>, Vec<_>) = (Vec::new(), Vec::new());
    for (id, (&text, &ty)) in vocab.tokens.iter().zip(&vocab.types).enumerate() {
        if matches!(ty, TOKEN_CONTROL | TOKEN_USER_DEFINED) || text.chars().all(|c| alphabet.contains(&c)) {
            as_written.push((id, text.into()));
        } else {
            respelled.push((id, text.bytes().map(|b| bytes_to_char[b as usize]).collect::<String>().into()));
        }
    }
    let bpe = build_bpe(m, first_ids(as_written.into_iter().chain(respelled)), merges, |b| {
        b.ignore_merges(kind.ignore_merges)
    })?;

    let mut pre = kind.regexes.iter().map(|r| regex_split(m, r)).collect::<Result<Vec<_>>>()?;
    pre.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)));

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer
        .with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(PreSequence::new(pre))))
        .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::new(false, false, false))));
    Ok(tokenizer)
}

/// GPT-2's byte alphabet: byte -> the printable character standing for it.
fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256u32;
    for b in 0..256u32 {
        table[b as usize] = if printable(b) {
            char::from_u32(b).unwrap_or('\0')
        } else {
            let c = char::from_u32(next).unwrap_or('\0');
            next += 1;
            c
        };
    }
    table
}

fn sentencepiece_bpe(m: &Meta<'_>, vocab: &Vocab<'_>, add_space_prefix: bool) -> Result<tokenizers::Tokenizer> {
    let scores = m.float_array("tokenizer.ggml.scores")?.ok_or_else(|| {
        m.err("tokenizer.ggml.scores is missing: a llama (SentencePiece) vocabulary needs a score per token")
    })?;
    if scores.len() != vocab.tokens.len() {
        return Err(m.err(format!(
            "tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {}",
            scores.len(),
            vocab.tokens.len()
        )));
    }
    let ids = first_ids(vocab.tokens.iter().enumerate().map(|(id, &t)| (id, t.into())));

    // Merges implied by the scores: every way to cut a mergeable token into two tokens, the
    // best-scoring result first (transformers' `generate_merges`, i.e. llama.cpp's SPM order).
    let mut ranked: Vec<(f32, usize, usize, u32, u32)> = Vec::new();
    for (id, (&text, &ty)) in vocab.tokens.iter().zip(&vocab.types).enumerate() {
        if !matches!(ty, TOKEN_NORMAL | TOKEN_USER_DEFINED) || ids.get(text) != Some(&(id as u32)) {
            continue;
        }
        let mut local = Vec::new();
        for (cut, _) in text.char_indices().skip(1) {
            let (left, right) = text.split_at(cut);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                local.push((scores[id], left.len(), right.len(), l, r));
            }
        }
        local.sort_by_key(|&(_, _, _, l, r)| (l, r));
        ranked.extend(local);
    }
    // Best score first; equal scores: longer left piece, then longer right piece first.
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| b.1.cmp(&a.1)).then_with(|| b.2.cmp(&a.2)));
    let merges = ranked
        .into_iter()
        .map(|(_, _, _, l, r)| (vocab.tokens[l as usize].to_owned(), vocab.tokens[r as usize].to_owned()))
        .collect();
    spm_style_bpe(m, vocab, ids, merges, add_space_prefix, None)
}

/// Gemma 4's vocabulary (`tokenizer.ggml.model` "gemma4", llama.cpp's pre-tokenizer of the same
/// name): SentencePiece's spelling (spaces written `▁`, no space put in front, unknown
/// characters as `<0xXX>` byte tokens) with ranked merges from the file, run over each line and
/// each run of newlines apart, as llama.cpp splits the text before merging. A run of newlines
/// that is a token of its own is that token (llama.cpp's lookup before merging).
fn gemma4_bpe(m: &Meta<'_>, vocab: &Vocab<'_>) -> Result<tokenizers::Tokenizer> {
    let ids = first_ids(vocab.tokens.iter().enumerate().map(|(id, &t)| (id, t.into())));
    let merges = file_merges(m, "gemma4")?;
    spm_style_bpe(m, vocab, ids, merges, false, Some(regex_split(m, "[^\\n]+|[\\n]+")?))
}

/// A BPE over SentencePiece's spelling: `▁` for spaces (and in front of the text with
/// `add_space_prefix`), byte fallback where the vocabulary has byte tokens, `merges` ranked,
/// the text first cut by `split` if given.
fn spm_style_bpe(
    m: &Meta<'_>,
    vocab: &Vocab<'_>,
    ids: HashMap<String, u32>,
    merges: Vec<(String, String)>,
    add_space_prefix: bool,
    split: Option<PreTokenizerWrapper>,
) -> Result<tokenizers::Tokenizer> {
    let has_byte_tokens = vocab.types.contains(&TOKEN_BYTE);
    let unk = m
        .token_id("tokenizer.ggml.unknown_token_id", vocab.tokens.len())?
        .or_else(|| vocab.types.iter().position(|&t| t == TOKEN_UNKNOWN).map(|i| i as u32));
    let unk_text = unk.map(|id| vocab.tokens[id as usize].to_owned());
    let bpe = build_bpe(m, ids, merges, |mut b| {
        b = b.byte_fallback(has_byte_tokens).fuse_unk(true);
        if let Some(unk) = unk_text {
            b = b.unk_token(unk);
        }
        b
    })?;

    let to_meta = Replace::new(" ", "\u{2581}").map_err(|e| m.err(format!("normalizer: {e}")))?;
    let normalizer = if add_space_prefix {
        NormalizerWrapper::Sequence(tokenizers::normalizers::Sequence::new(vec![
            NormalizerWrapper::Prepend(Prepend::new("\u{2581}".to_owned())),
            NormalizerWrapper::Replace(to_meta),
        ]))
    } else {
        NormalizerWrapper::Replace(to_meta)
    };
    let from_meta = Replace::new("\u{2581}", " ").map_err(|e| m.err(format!("decoder: {e}")))?;
    let decoder = DecoderSequence::new(vec![
        DecoderWrapper::Replace(from_meta),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ]);

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer
        .with_normalizer(Some(normalizer))
        .map_err(|e| m.err(format!("normalizer: {e}")))?
        .with_pre_tokenizer(split)
        .with_decoder(Some(DecoderWrapper::Sequence(decoder)));
    Ok(tokenizer)
}

fn wordpiece(m: &Meta<'_>, vocab: &Vocab<'_>) -> Result<tokenizers::Tokenizer> {
    // Back to WordPiece's spelling: "▁word" starts a word, "iece" continues one as "##iece";
    // control tokens ([CLS], [SEP], …) keep their text.
    let unk = m.token_id("tokenizer.ggml.unknown_token_id", vocab.tokens.len())?;
    let spelled = |id: usize, text: &'_ str| -> String {
        match text.strip_prefix('\u{2581}') {
            Some(word) => word.to_owned(),
            None if vocab.types[id] == TOKEN_CONTROL || unk == Some(id as u32) => text.to_owned(),
            None => format!("##{text}"),
        }
    };
    let ids = first_ids(vocab.tokens.iter().enumerate().map(|(id, &t)| (id, spelled(id, t).into())));
    let unk_text = match unk {
        Some(id) => spelled(id as usize, vocab.tokens[id as usize]),
        None => {
            return Err(m.err("tokenizer.ggml.unknown_token_id is missing: a bert (WordPiece) vocabulary needs one"));
        }
    };
    // WordPiece's vocabulary map is the same type as BPE's.
    let pieces: tokenizers::models::bpe::Vocab = ids.into_iter().collect();
    let model = WordPiece::builder()
        .vocab(pieces)
        .unk_token(unk_text)
        .continuing_subword_prefix("##".to_owned())
        .build()
        .map_err(|e| m.err(format!("the vocabulary does not form a WordPiece model: {e}")))?;
    let lowercase = m.bool("tokenizer.ggml.normalizer.lowercase")?.unwrap_or(true);
    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer
        .with_normalizer(Some(NormalizerWrapper::BertNormalizer(BertNormalizer::new(true, true, None, lowercase))))
        .map_err(|e| m.err(format!("normalizer: {e}")))?
        .with_pre_tokenizer(Some(PreTokenizerWrapper::BertPreTokenizer(BertPreTokenizer)))
        .with_decoder(Some(DecoderWrapper::WordPiece(WordPieceDecoder::new("##".to_owned(), true))));
    Ok(tokenizer)
}
