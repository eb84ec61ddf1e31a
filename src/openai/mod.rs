//! The OpenAI protocol without a transport: reading chat and text completion requests
//! (`parse`), and shaping responses and streamed chunks (`shape`) as JSON values, with
//! OpenAI's error shape (`error`).
//!
//! vLLM's `/tokenize` and `/detokenize` bodies are read and answered here too (`tokenize`), and
//! `/v1/embeddings` (`embeddings`).
//!
//! Structured output (`response_format`, vLLM's `structured_outputs` and `guided_*`,
//! llama.cpp's `grammar`) becomes the request's constraint (`structured`); `tools` are shown to
//! the model by its chat template, a required or named `tool_choice` becomes a grammar, and
//! calls are read back out of the answer in the model's own format (`tools`).
//!
//! The native server (`weft serve`) and the browser build speak the same protocol through this
//! module; they add only their transport (HTTP status codes and SSE framing, or JS messages).
//! Every known request field is type-checked, and an error names the field in OpenAI's shape
//! (`{"error": {"message", "type", "param", "code"}}`). Nothing is dropped silently: a field is
//! honoured, refused naming it (`n` above 16, `echo`, `audio`, a field weft does not
//! know), or one of a few metadata fields ignored on purpose (`fields_tests` is the table).
//! A request's `n` choices are `n` engine requests, seeded `seed + i`
//! ([`OpenAiRequest::choice_requests`]), shaped back into one response.
//!
//! A thinking model's reasoning (Qwen3's and DeepSeek-R1's `<think>` … `</think>`) is
//! separated from its answer as `reasoning_content` (`reasoning`), and `chat_template_kwargs`
//! reaches the chat template (`enable_thinking: false`).
//! Values are validated once, by the engine when the request is submitted;
//! [`OpenAiError::from_engine`] gives that refusal OpenAI's shape.
//!
//! **Boundary:** no HTTP, no async runtime; callers add status codes and framing.

#[cfg(test)]
mod choices_tests;
mod embeddings;
mod error;
#[cfg(test)]
mod fields_tests;
mod parse;
pub mod reasoning;
mod shape;
mod structured;
#[cfg(test)]
mod structured_tests;
#[cfg(test)]
mod tests;
mod tokenize;
mod tools;

pub use embeddings::{EmbeddingsRequest, MAX_INPUTS, embeddings_json, parse_embeddings};
pub use error::OpenAiError;
pub use parse::{MAX_N, OpenAiRequest, parse, parse_body, requested_model};
pub use reasoning::{Reasoning, ReasoningParser};
pub use shape::{ChunkShaper, finish_str, response_json, response_json_with, usage_json};
pub use tokenize::{detokenize, tokenize};
pub use tools::{ToolsRequest, call_id};

/// Which OpenAI endpoint a request is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Endpoint {
    /// `/v1/chat/completions`: `messages` rendered with the model's chat template.
    Chat,
    /// `/v1/completions`: a raw `prompt`.
    Completion,
}

impl Endpoint {
    /// The `object` of a whole response.
    pub fn object(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completion => "text_completion",
        }
    }

    /// The `object` of a streamed chunk.
    pub fn chunk_object(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        }
    }

    /// The prefix of response ids ("chatcmpl", "cmpl").
    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        }
    }
}

/// A fresh response id for `endpoint` ("chatcmpl-…", "cmpl-…"), unique within the process.
pub fn request_id(endpoint: Endpoint) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = web_time::SystemTime::now().duration_since(web_time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}-{:x}{:04x}", endpoint.id_prefix(), t as u64, n & 0xffff)
}

/// Seconds since the Unix epoch: the `created` of a response.
pub fn unix_now() -> u64 {
    web_time::SystemTime::now().duration_since(web_time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
