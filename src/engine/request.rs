//! What a caller asks the engine for, and what comes back.

use serde::{Deserialize, Serialize};

use crate::constraint::Constraint;
use crate::error::{Result, WeftError};
use crate::sampling::SamplingParams;
use crate::tokenizer::ChatMessage;

/// The prompt: raw text, token ids, or chat messages rendered with the model's own template.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Chat(Vec<ChatMessage>),
}

/// `max_tokens` of a request that gives none: the rest of the context, at most this many.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// Everything about how to continue a prompt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationParams {
    pub sampling: SamplingParams,
    /// Generate at most this many tokens; `None`: the rest of the context after the prompt, at
    /// most [`DEFAULT_MAX_TOKENS`].
    pub max_tokens: Option<usize>,
    /// Stop before any of these strings; they never appear in the output.
    pub stop: Vec<String>,
    /// Stop after generating any of these token ids (the token itself is not part of the text).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past the model's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Higher runs first when the engine must choose, and is preempted last.
    pub priority: i32,
    /// Structured output: what the generated text must match (compiled when the request is
    /// submitted; a request whose constraint is complete ends with `Stop`).
    pub constraint: Option<Constraint>,
    /// A thinking model's end-of-reasoning token (`</think>`): the constraint applies to the
    /// answer after it, so the tokens up to and including it are free, and the constraint
    /// starts with the token after. Without a constraint it changes nothing.
    pub constraint_after: Option<u32>,
    /// An embedding request: the prompt's embedding (its final hidden states pooled and L2
    /// normalised, `model::config::Pooling`) instead of generated text; the last chunk carries
    /// it. Sampling, stops and `max_tokens` do not apply.
    pub embedding: Option<EmbeddingParams>,
}

/// What an embedding request asks beyond its prompt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmbeddingParams {
    /// Keep the first `dimensions` values of the pooled state, then normalise (OpenAI's
    /// `dimensions`; Matryoshka-trained models such as Qwen3-Embedding keep their quality so
    /// truncated); `None`: all of them.
    pub dimensions: Option<usize>,
}

/// L2-normalise the first `dimensions` values of a pooled hidden state (all when `None`), in
/// f64 so the result does not depend on how a sum was split. A zero vector stays zero.
pub fn normalize_embedding(hidden: &[f32], dimensions: Option<usize>) -> Vec<f32> {
    let kept = &hidden[..dimensions.unwrap_or(hidden.len()).min(hidden.len())];
    let norm = kept.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
    let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    kept.iter().map(|&v| (f64::from(v) * scale) as f32).collect()
}

#[derive(Clone, Debug, PartialEq)]
pub struct InferenceRequest {
    pub prompt: Prompt,
    pub params: GenerationParams,
    /// Tool definitions a chat prompt's template shows the model (OpenAI's `{"type":
    /// "function", "function": {...}}` objects, its `tools` variable); empty: none.
    pub tools: Vec<serde_json::Value>,
    /// Extra variables for a chat prompt's template (`chat_template_kwargs`, e.g.
    /// `{"enable_thinking": false}`); empty: none.
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// The LoRA adapter to run with, by the name it was registered under (OpenAI's `model`
    /// naming an adapter); `None`: the base model.
    pub lora: Option<String>,
}

impl InferenceRequest {
    pub fn new(prompt: Prompt, params: GenerationParams) -> Self {
        InferenceRequest { prompt, params, tools: Vec::new(), chat_template_kwargs: serde_json::Map::new(), lora: None }
    }

    /// Reject values no engine can honour, naming the field. The engine calls this at its door
    /// (`submit`); lengths against the context and the KV pool are checked there too, once the
    /// prompt is tokenized.
    pub fn validate(&self) -> Result<()> {
        self.params.sampling.validate()?;
        let bad = |field: &str, why: &str| Err(WeftError::invalid(field, why));
        if self.params.max_tokens == Some(0) {
            return bad("max_tokens", "0 (must be at least 1)");
        }
        if self.params.stop.len() > 16 {
            return bad("stop", "more than 16 stop strings");
        }
        match &self.prompt {
            Prompt::Text(t) if t.is_empty() => bad("prompt", "the prompt is empty"),
            Prompt::Tokens(t) if t.is_empty() => bad("prompt", "no prompt tokens"),
            Prompt::Chat(m) if m.is_empty() => bad("messages", "there are no messages"),
            Prompt::Chat(m) => {
                match m.iter().find(|m| !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool")) {
                    Some(m) => bad("messages", &format!("unknown role {:?} (system, user, assistant or tool)", m.role)),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop string or stop token id.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The model's end-of-sequence token.
    Eos,
    /// The caller went away or the engine shut down.
    Cancelled,
    /// The request failed; the chunk's error says why.
    Error,
}

impl FinishReason {
    /// Its name in metrics and reports: "stop", "length", "eos", "cancelled" or "error".
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Eos => "eos",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_prompt_tokens: usize,
}

/// One generated token's log-probability, with the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// A piece of a streamed response.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamChunk {
    /// New text (never half a UTF-8 character, never part of a stop string).
    pub text: String,
    /// The tokens generated since the previous chunk.
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    /// Set on the last chunk only.
    pub finish_reason: Option<FinishReason>,
    /// Set on the last chunk only.
    pub usage: Option<Usage>,
    /// An embedding request's embedding, on its last (and only) chunk.
    pub embedding: Option<Vec<f32>>,
}

/// A whole response.
#[derive(Clone, Debug, PartialEq)]
pub struct InferenceResponse {
    pub text: String,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(prompt: Prompt, f: impl FnOnce(&mut GenerationParams)) -> InferenceRequest {
        let mut params = GenerationParams::default();
        f(&mut params);
        InferenceRequest::new(prompt, params)
    }

    #[test]
    fn validation_names_the_field() {
        let text = || Prompt::Text("hi".into());
        let cases = [
            (req(text(), |p| p.max_tokens = Some(0)), "max_tokens"),
            (req(text(), |p| p.sampling.temperature = -0.5), "temperature"),
            (req(text(), |p| p.sampling.top_p = 1.5), "top_p"),
            (req(Prompt::Text(String::new()), |_| {}), "prompt"),
            (req(Prompt::Tokens(vec![]), |_| {}), "prompt"),
            (req(Prompt::Chat(vec![]), |_| {}), "messages"),
            (req(Prompt::Chat(vec![ChatMessage::new("wizard", "hi")]), |_| {}), "unknown role \"wizard\""),
            (req(text(), |p| p.stop = vec!["x".into(); 17]), "stop"),
        ];
        for (r, field) in cases {
            let err = r.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
        assert!(req(Prompt::Chat(vec![ChatMessage::user("hi")]), |_| {}).validate().is_ok());
    }

    #[test]
    fn embeddings_are_truncated_then_normalised() {
        assert_eq!(normalize_embedding(&[3.0, 4.0, 12.0], None), vec![3.0 / 13.0, 4.0 / 13.0, 12.0 / 13.0]);
        assert_eq!(normalize_embedding(&[3.0, 4.0, 12.0], Some(2)), vec![0.6, 0.8]);
        assert_eq!(normalize_embedding(&[0.0, 0.0], None), vec![0.0, 0.0]);
    }
}
