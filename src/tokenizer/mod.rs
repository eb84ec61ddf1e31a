//! Tokenizers (Hugging Face `tokenizers` under a `Tokenizer` trait), chat templates and
//! streaming detokenization.
//!
//! - [`Tokenizer`] is what the engine holds (`Arc<dyn Tokenizer>`): text to ids and back, the
//!   special ids that matter for generation (BOS, the end-of-generation set) and the model's chat
//!   template.
//! - [`HfTokenizer`] implements it on the `tokenizers` crate, built either from a Hugging Face
//!   model directory (`tokenizer.json` + `tokenizer_config.json`) or from the vocabulary a GGUF
//!   file carries in its metadata (`tokenizer.ggml.*`, byte-level BPE "gpt2" or SentencePiece
//!   "llama"), reproducing llama.cpp's pre-tokenizer splits.
//! - [`ChatTemplate`] renders the model's own Jinja chat template the way transformers does.
//! - [`DecodeStream`] turns a stream of generated ids into text deltas that never split a
//!   UTF-8 character.
//!
//! Encoding always recognises the vocabulary's special tokens written in the text
//! (`"<|im_start|>"` becomes one id), as transformers and llama.cpp (`parse_special`) do;
//! `add_special_tokens` only decides whether BOS/EOS are added around the text.

mod chat;
mod gguf;
mod hf;
mod stream;

pub use chat::{ChatMessage, ChatTemplate, RESERVED_VARIABLES};
pub use hf::HfTokenizer;
pub use stream::DecodeStream;

use crate::Result;

/// One vocabulary entry as the bytes it adds to the text. Structured output matches grammars
/// against these, so they must be exact: a byte-level BPE token that holds half a UTF-8
/// character is that half, not a replacement character.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenBytes {
    pub bytes: Vec<u8>,
    /// A control token (`<|im_end|>`, ...): it never stands for its spelling in text.
    pub special: bool,
}

/// Text to token ids and back, for one model's vocabulary. Object safe: the engine holds an
/// `Arc<dyn Tokenizer>`.
pub trait Tokenizer: Send + Sync {
    /// The ids of `text`. Special tokens written in the text are recognised as such;
    /// `add_special_tokens` adds the BOS (and EOS) tokens the model asks for, if any.
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>>;

    /// The text of `ids`. An id outside the vocabulary is an error, not silently dropped.
    /// `skip_special_tokens` leaves control tokens (`<|im_end|>`, ...) out of the text.
    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String>;

    /// The number of ids (one more than the largest id).
    fn vocab_size(&self) -> usize;

    /// The beginning-of-sequence id, if the vocabulary has one.
    fn bos_token_id(&self) -> Option<u32>;

    /// The ids that end generation: EOS first, then end-of-turn / end-of-message tokens.
    fn eos_token_ids(&self) -> &[u32];

    /// The text of one token on its own (lossy where the token is a fragment of a UTF-8
    /// character); `None` for an id outside the vocabulary.
    fn token_to_piece(&self, id: u32) -> Option<String>;

    /// The model's chat template, if it has one.
    fn chat_template(&self) -> Option<&ChatTemplate>;

    /// The token as the vocabulary spells it (`Ġworld` in a byte-level BPE, `▁world` in a
    /// SentencePiece one); `None` for an id outside the vocabulary. The default is its text,
    /// [`token_to_piece`](Self::token_to_piece).
    fn id_to_token(&self, id: u32) -> Option<String> {
        self.token_to_piece(id)
    }

    /// Every id's bytes, in id order. The default spells each id with
    /// [`token_to_piece`](Self::token_to_piece), which is lossy for tokens holding part of a
    /// UTF-8 character; tokenizers that know their byte encoding override it.
    fn token_bytes(&self) -> Vec<TokenBytes> {
        (0..self.vocab_size() as u32)
            .map(|id| TokenBytes { bytes: self.token_to_piece(id).unwrap_or_default().into_bytes(), special: false })
            .collect()
    }
}
