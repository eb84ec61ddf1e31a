//! [`DecodeStream`]: incremental detokenization for streaming. Fed one generated id at a time,
//! it returns the new text, and never a delta that ends inside a UTF-8 character.
//!
//! A byte-level BPE can spread one character over several tokens (an emoji is often four byte
//! tokens), and a SentencePiece decoder treats the first token's space specially, so a token's
//! text depends on its neighbours. The usual way out, used here: keep a short window of ids,
//! decode the window with and without the newest tokens, and emit the difference once it no
//! longer ends in an incomplete character (U+FFFD, the replacement the decoder writes for one).
//! After each emission the window drops everything before the tokens just emitted, so each step
//! decodes a few tokens, whatever the length of the sequence.
//!
//! The deltas concatenate to `decode(all ids)`. One exception: a model emitting more than
//! [`MAX_PENDING`] tokens in a row that never complete a character (invalid UTF-8) has them
//! flushed as U+FFFD rather than letting the window grow.

use std::sync::Arc;

use super::Tokenizer;
use crate::Result;

/// Tokens held back at most while waiting for a character to complete (a UTF-8 character has at
/// most four bytes, so real text never needs more than a handful).
pub const MAX_PENDING: usize = 16;

/// How many ids of a prompt [`DecodeStream::with_context`] keeps as context.
const CONTEXT_IDS: usize = 4;

/// Streaming detokenizer for one sequence.
pub struct DecodeStream {
    tokenizer: Arc<dyn Tokenizer>,
    skip_special_tokens: bool,
    /// The window: ids already emitted (kept as context) followed by pending ones.
    ids: Vec<u32>,
    /// `ids[..read]` are already emitted.
    read: usize,
    /// `decode(ids[..read])`.
    prefix_text: String,
}

impl std::fmt::Debug for DecodeStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeStream")
            .field("skip_special_tokens", &self.skip_special_tokens)
            .field("ids", &self.ids)
            .field("read", &self.read)
            .finish()
    }
}

impl DecodeStream {
    pub fn new(tokenizer: Arc<dyn Tokenizer>, skip_special_tokens: bool) -> Self {
        DecodeStream { tokenizer, skip_special_tokens, ids: Vec::new(), read: 0, prefix_text: String::new() }
    }

    /// A stream that continues after `context` (the prompt): its last few ids decode the first
    /// generated tokens in context (a SentencePiece vocabulary keeps the leading space of the
    /// first generated word), and are not emitted themselves.
    pub fn with_context(tokenizer: Arc<dyn Tokenizer>, skip_special_tokens: bool, context: &[u32]) -> Result<Self> {
        let mut stream = Self::new(tokenizer, skip_special_tokens);
        let tail = &context[context.len().saturating_sub(CONTEXT_IDS)..];
        stream.ids.extend_from_slice(tail);
        stream.read = tail.len();
        stream.prefix_text = stream.decode(&stream.ids)?;
        Ok(stream)
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, self.skip_special_tokens)
    }

    /// Feeds one id; returns the text it completes, or `None` while a character is still
    /// incomplete (or the token adds no text, like a skipped special token).
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        // Decode first so that a bad id leaves the stream as it was.
        self.ids.push(id);
        let text = match self.decode(&self.ids) {
            Ok(text) => text,
            Err(e) => {
                self.ids.pop();
                return Err(e);
            }
        };
        let pending = self.ids.len() - self.read;
        if text.ends_with('\u{FFFD}') && pending <= MAX_PENDING {
            return Ok(None);
        }
        let delta = suffix_after(&text, &self.prefix_text).to_owned();
        // The tokens just emitted become the context of the next window.
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        self.prefix_text = self.decode(&self.ids)?;
        Ok(if delta.is_empty() { None } else { Some(delta) })
    }

    /// Flushes what is still held back (an incomplete character comes out as U+FFFD, as
    /// `decode` writes it) and empties the stream.
    pub fn finish(&mut self) -> Result<Option<String>> {
        let delta = if self.ids.len() > self.read {
            let text = self.decode(&self.ids)?;
            suffix_after(&text, &self.prefix_text).to_owned()
        } else {
            String::new()
        };
        self.ids.clear();
        self.read = 0;
        self.prefix_text.clear();
        Ok(if delta.is_empty() { None } else { Some(delta) })
    }
}

/// The part of `text` after `prefix`; where `text` does not start with `prefix` (a decoder that
/// rewrites earlier text), the part after their longest common prefix, cut at a character.
fn suffix_after<'t>(text: &'t str, prefix: &str) -> &'t str {
    if let Some(rest) = text.strip_prefix(prefix) {
        return rest;
    }
    let mut common = 0;
    for ((i, a), b) in text.char_indices().zip(prefix.chars()) {
        if a != b {
            break;
        }
        common = i + a.len_utf8();
    }
    &text[common..]
}
