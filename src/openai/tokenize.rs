//! vLLM's `/tokenize` and `/detokenize`, without a transport.
//!
//! `/tokenize` takes a text prompt (`{model, prompt, add_special_tokens = true,
//! return_token_strs = false}`) or a conversation (`{model, messages, add_generation_prompt =
//! true, add_special_tokens = false, tools, chat_template_kwargs, return_token_strs = false}`,
//! rendered with the chat template exactly as a chat completion is) and answers `{count, max_model_len, tokens,
//! token_strs}` (`token_strs`: the tokens as the vocabulary spells them, or `null` unless asked).
//! `/detokenize` takes `{model, tokens}` and answers `{prompt}` (special tokens kept). As in the
//! completion endpoints, a field weft does not read is refused, naming it.

use serde_json::{Map, Value, json};

use crate::engine::render_chat;
use crate::error::WeftError;
use crate::openai::error::{ApiResult, OpenAiError};
use crate::openai::parse::{parse_messages_of, parse_template_kwargs};
use crate::openai::tools::parse_tools;
use crate::tokenizer::Tokenizer;

fn bad(field: &str, why: impl std::fmt::Display) -> OpenAiError {
    OpenAiError::invalid(field, format!("invalid {field}: {why}"))
}

fn flag(body: &Map<String, Value>, k: &str) -> ApiResult<Option<bool>> {
    match body.get(k).filter(|v| !v.is_null()) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(bad(k, format!("expected true or false, got {v}"))),
    }
}

fn refuse_unknown(body: &Map<String, Value>, known: &[&str], endpoint: &str) -> ApiResult<()> {
    let mut unknown: Vec<&String> =
        body.iter().filter(|(k, v)| !v.is_null() && !known.contains(&k.as_str())).map(|(k, _)| k).collect();
    unknown.sort();
    match unknown.first() {
        None => Ok(()),
        Some(k) => {
            Err(OpenAiError::invalid(k, format!("unknown field {k}: {endpoint} reads {}; remove it", known.join(", "))))
        }
    }
}

/// `/tokenize`: the body (already an object; its `model` checked by the caller) to the response.
pub fn tokenize(tok: &dyn Tokenizer, max_model_len: usize, body: &Map<String, Value>) -> ApiResult<Value> {
    let has = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    let tokens = match (has("prompt"), has("messages")) {
        (true, true) => return Err(bad("messages", "give prompt or messages, not both")),
        (false, false) => {
            return Err(OpenAiError::invalid_body(
                "a /tokenize request needs a prompt (a string) or messages (a conversation)",
            ));
        }
        (true, false) => {
            refuse_unknown(
                body,
                &["model", "prompt", "add_special_tokens", "return_token_strs"],
                "/tokenize with a prompt",
            )?;
            let prompt = match &body["prompt"] {
                Value::String(s) => s,
                v => return Err(bad("prompt", format!("expected a string, got {v}"))),
            };
            let add_special = flag(body, "add_special_tokens")?.unwrap_or(true);
            tok.encode(prompt, add_special).map_err(|e| bad("prompt", e))?
        }
        (false, true) => {
            refuse_unknown(
                body,
                &[
                    "model",
                    "messages",
                    "add_generation_prompt",
                    "add_special_tokens",
                    "continue_final_message",
                    "tools",
                    "chat_template_kwargs",
                    "return_token_strs",
                ],
                "/tokenize with messages",
            )?;
            let messages = parse_messages_of(body)?;
            let add_generation_prompt = flag(body, "add_generation_prompt")?.unwrap_or(true);
            if flag(body, "continue_final_message")? == Some(true) {
                return Err(bad(
                    "continue_final_message",
                    "weft does not continue a final message; remove continue_final_message",
                ));
            }
            let add_special = flag(body, "add_special_tokens")?.unwrap_or(false);
            let tools = parse_tools(body)?.tools;
            let kwargs = parse_template_kwargs(body)?;
            let text = render_chat(tok, &messages, &tools, &kwargs, add_generation_prompt).map_err(|e| match e {
                WeftError::InvalidRequest { .. } => OpenAiError::from_engine(e),
                e => bad("messages", e),
            })?;
            tok.encode(&text, add_special).map_err(|e| bad("messages", e))?
        }
    };
    let token_strs = match flag(body, "return_token_strs")?.unwrap_or(false) {
        false => Value::Null,
        true => tokens.iter().map(|&id| tok.id_to_token(id).unwrap_or_default()).collect(),
    };
    Ok(json!({"count": tokens.len(), "max_model_len": max_model_len, "tokens": tokens, "token_strs": token_strs}))
}

/// `/detokenize`: `{model, tokens}` to `{prompt}`; an id outside the vocabulary is refused.
pub fn detokenize(tok: &dyn Tokenizer, body: &Map<String, Value>) -> ApiResult<Value> {
    refuse_unknown(body, &["model", "tokens"], "/detokenize")?;
    let list = match body.get("tokens") {
        None | Some(Value::Null) => return Err(bad("tokens", "missing (a list of token ids)")),
        Some(Value::Array(list)) => list,
        Some(v) => return Err(bad("tokens", format!("expected a list of token ids, got {v}"))),
    };
    let vocab = tok.vocab_size();
    let mut ids = Vec::with_capacity(list.len());
    for v in list {
        let id =
            v.as_u64().ok_or_else(|| bad("tokens", format!("{v} is not a token id (a whole number, 0 or more)")))?;
        if id >= vocab as u64 {
            return Err(bad(
                "tokens",
                format!("token id {id} is outside the vocabulary (ids 0 to {}); send ids /tokenize gave", vocab - 1),
            ));
        }
        ids.push(id as u32);
    }
    let prompt = tok.decode(&ids, false).map_err(|e| bad("tokens", e))?;
    Ok(json!({ "prompt": prompt }))
}
