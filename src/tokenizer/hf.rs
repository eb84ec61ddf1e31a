//! [`HfTokenizer`]: the [`Tokenizer`] trait on the Hugging Face `tokenizers` crate, read from a
//! model directory's `tokenizer.json` + `tokenizer_config.json` (the GGUF path is in `gguf.rs`).

use std::fmt;
use std::path::Path;

use serde_json::Value as Json;

use super::{ChatTemplate, TokenBytes, Tokenizer};
use crate::{Result, WeftError};

/// Token texts that end a turn in the chat formats we know; where the vocabulary has one of them
/// as a special token, generation stops on it too (llama.cpp keeps the same list).
pub(super) const END_OF_GENERATION_TOKENS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// A tokenizer on the Hugging Face `tokenizers` crate.
///
/// Build it with [`HfTokenizer::from_file`] (a Hugging Face model directory) or
/// [`HfTokenizer::from_gguf_metadata`] (the vocabulary inside a GGUF file).
#[derive(Clone)]
pub struct HfTokenizer {
    pub(super) inner: tokenizers::Tokenizer,
    /// Names the file (or metadata) this came from, in error messages.
    pub(super) source: String,
    pub(super) vocab_size: usize,
    pub(super) bos: Option<u32>,
    pub(super) eos_ids: Vec<u32>,
    pub(super) add_bos: bool,
    pub(super) add_eos: bool,
    /// BOS/EOS are added here rather than by the `tokenizers` post-processor.
    pub(super) manual_specials: bool,
    /// Drop one leading space from decoded text (SentencePiece's prefix space).
    pub(super) strip_leading_space: bool,
    pub(super) chat_template: Option<ChatTemplate>,
}

impl fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("source", &self.source)
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos_ids", &self.eos_ids)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("chat_template", &self.chat_template.is_some())
            .finish()
    }
}

impl HfTokenizer {
    /// Reads a Hugging Face tokenizer: `tokenizer.json`, and optionally `tokenizer_config.json`
    /// for the BOS/EOS tokens, `add_bos_token`/`add_eos_token` and the chat template (a
    /// `chat_template.jinja` beside it is used when the config has no template).
    pub fn from_file(tokenizer_json: &Path, tokenizer_config_json: Option<&Path>) -> Result<Self> {
        let source = tokenizer_json.display().to_string();
        let bytes = std::fs::read(tokenizer_json)
            .map_err(|e| WeftError::model(&source, format!("cannot read the tokenizer: {e}")))?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| WeftError::model(&source, format!("not a tokenizer.json the tokenizers crate reads: {e}")))?;

        let config = match tokenizer_config_json {
            Some(path) => Some(read_config(path)?),
            None => None,
        };
        let config_str = |key: &str| config.as_ref().and_then(|c| token_text(c.get(key)?));
        let config_bool = |key: &str| config.as_ref().and_then(|c| c.get(key)?.as_bool());

        let bos_text = config_str("bos_token");
        let eos_text = config_str("eos_token");
        let id_of = |text: &Option<String>, key: &str| -> Result<Option<u32>> {
            match text {
                None => Ok(None),
                Some(t) => inner.token_to_id(t).map(Some).ok_or_else(|| {
                    WeftError::model(
                        &source,
                        format!("{key} {t:?} from tokenizer_config.json is not in the vocabulary"),
                    )
                }),
            }
        };
        let bos = id_of(&bos_text, "bos_token")?;
        let eos = id_of(&eos_text, "eos_token")?;

        let mut eos_ids = Vec::new();
        eos_ids.extend(eos);
        let specials: std::collections::HashSet<u32> =
            inner.get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, _)| id).collect();
        for text in END_OF_GENERATION_TOKENS {
            if let Some(id) = inner.token_to_id(text) {
                if specials.contains(&id) && !eos_ids.contains(&id) {
                    eos_ids.push(id);
                }
            }
        }

        let vocab_size = inner.get_vocab(true).values().map(|&id| id as usize + 1).max().unwrap_or(0);
        let manual_specials = inner.get_post_processor().is_none();

        let mut template_source = config.as_ref().and_then(|c| chat_template_of(c.get("chat_template")?));
        let beside = tokenizer_config_json.and_then(Path::parent).map(|dir| dir.join("chat_template.jinja"));
        if let (None, Some(jinja)) = (&template_source, beside) {
            if jinja.is_file() {
                template_source = Some(
                    std::fs::read_to_string(&jinja)
                        .map_err(|e| WeftError::model(jinja.display().to_string(), format!("cannot read: {e}")))?,
                );
            }
        }
        let chat_template = match template_source {
            Some(t) => Some(ChatTemplate::new(&t, bos_text.as_deref(), eos_text.as_deref())?),
            None => None,
        };

        Ok(HfTokenizer {
            inner,
            source,
            vocab_size,
            bos,
            eos_ids,
            add_bos: manual_specials && config_bool("add_bos_token").unwrap_or(false),
            add_eos: manual_specials && config_bool("add_eos_token").unwrap_or(false),
            manual_specials,
            strip_leading_space: false,
            chat_template,
        })
    }

    /// The `tokenizers` tokenizer underneath.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Whether `encode(.., add_special_tokens = true)` puts BOS in front (for a GGUF vocabulary:
    /// `tokenizer.ggml.add_bos_token`; for a `tokenizer.json`, what its post-processor does
    /// is not reflected here).
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// Replace the model's chat template (or give one to a model without) with the Jinja
    /// `source`; it sees this vocabulary's BOS and EOS tokens as `bos_token` / `eos_token`.
    /// A template that does not parse is an error, and the old one stays.
    pub fn set_chat_template(&mut self, source: &str) -> Result<()> {
        let text = |id: Option<u32>| id.and_then(|id| self.inner.id_to_token(id));
        let template =
            ChatTemplate::new(source, text(self.bos).as_deref(), text(self.eos_ids.first().copied()).as_deref())?;
        self.chat_template = Some(template);
        Ok(())
    }

    /// The id of a token by its text as the vocabulary spells it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(WeftError::model(
                &self.source,
                format!(
                    "token id {bad} is out of range: the vocabulary has {} tokens (ids 0..={})",
                    self.vocab_size,
                    self.vocab_size.saturating_sub(1)
                ),
            ));
        }
        Ok(())
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens && !self.manual_specials)
            .map_err(|e| WeftError::model(&self.source, format!("tokenizing failed: {e}")))?;
        let ids = encoding.get_ids();
        if !(add_special_tokens && self.manual_specials) {
            return Ok(ids.to_vec());
        }
        let mut out = Vec::with_capacity(ids.len() + 2);
        if self.add_bos {
            out.extend(self.bos);
        }
        out.extend_from_slice(ids);
        if self.add_eos {
            out.extend(self.eos_ids.first().copied());
        }
        Ok(out)
    }

    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.check_ids(ids)?;
        let mut text = self
            .inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| WeftError::model(&self.source, format!("decoding failed: {e}")))?;
        if self.strip_leading_space && text.starts_with(' ') {
            text.remove(0);
        }
        Ok(text)
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    fn eos_token_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    fn token_to_piece(&self, id: u32) -> Option<String> {
        if id as usize >= self.vocab_size {
            return None;
        }
        // Without the prefix-space strip: a piece keeps its leading space.
        self.inner.decode(&[id], false).ok()
    }

    fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        if id as usize >= self.vocab_size {
            return None;
        }
        self.inner.id_to_token(id)
    }

    fn token_bytes(&self) -> Vec<TokenBytes> {
        let added = self.inner.get_added_tokens_decoder();
        let byte_level = is_byte_level(self.inner.get_decoder());
        let byte_of = if byte_level { byte_level_decoder() } else { std::collections::HashMap::new() };
        (0..self.vocab_size as u32)
            .map(|id| {
                // Added tokens are spelled as themselves, not in the model's byte encoding.
                if let Some(t) = added.get(&id) {
                    return TokenBytes { bytes: t.content.as_bytes().to_vec(), special: t.special };
                }
                let Some(piece) = self.inner.id_to_token(id) else { return TokenBytes::default() };
                let bytes = if byte_level {
                    // A piece outside the byte alphabet cannot be produced by this encoding: it
                    // stays unspellable (never allowed by a grammar) rather than guessed.
                    piece.chars().map(|c| byte_of.get(&c).copied()).collect::<Option<Vec<u8>>>().unwrap_or_default()
                } else {
                    sentencepiece_bytes(&piece)
                };
                TokenBytes { bytes, special: false }
            })
            .collect()
    }
}

/// Whether the decoder is GPT-2's byte-level one (alone or inside a sequence).
fn is_byte_level(decoder: Option<&tokenizers::DecoderWrapper>) -> bool {
    use tokenizers::DecoderWrapper as D;
    match decoder {
        Some(D::ByteLevel(_)) => true,
        Some(D::Sequence(seq)) => seq.get_decoders().iter().any(|d| matches!(d, D::ByteLevel(_))),
        _ => false,
    }
}

/// GPT-2's byte alphabet backwards: the printable stand-in of each byte to the byte. Printable
/// Latin-1 bytes stand for themselves; the others take the code points from U+0100 on, in order.
fn byte_level_decoder() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (b as char, b)
            } else {
                next += 1;
                (char::from_u32(next - 1).unwrap_or('\0'), b)
            }
        })
        .collect()
}

/// A SentencePiece piece as text bytes: `<0xHH>` is the byte HH (byte fallback), and `▁`
/// stands for a space.
fn sentencepiece_bytes(piece: &str) -> Vec<u8> {
    if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>'))
        && hex.len() == 2
        && let Ok(b) = u8::from_str_radix(hex, 16)
    {
        return vec![b];
    }
    piece.replace('\u{2581}', " ").into_bytes()
}

fn read_config(path: &Path) -> Result<Json> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| WeftError::model(&file, format!("cannot read: {e}")))?;
    let json: Json =
        serde_json::from_str(&text).map_err(|e| WeftError::model(&file, format!("not valid JSON: {e}")))?;
    if !json.is_object() {
        return Err(WeftError::model(&file, "expected a JSON object (tokenizer_config.json)"));
    }
    Ok(json)
}

/// A special token in tokenizer_config.json: `"<s>"` or `{"content": "<s>", ...}`.
fn token_text(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of `{"name", "template"}` of which "default" is the
/// one transformers uses.
fn chat_template_of(value: &Json) -> Option<String> {
    match value {
        Json::String(s) => Some(s.clone()),
        Json::Array(list) => {
            let named = |name: &str| {
                list.iter().find(|t| t.get("name").and_then(Json::as_str) == Some(name))?.get("template")?.as_str()
            };
            named("default").or_else(|| list.first()?.get("template")?.as_str()).map(str::to_owned)
        }
        _ => None,
    }
}
