//! OpenAI's `/v1/embeddings`, without a transport.
//!
//! The body is `{model, input, encoding_format = "float", dimensions, user}`: `input` is a
//! string, an array of strings, an array of token ids or an array of such arrays (each one
//! embedding, in order; at most [`MAX_INPUTS`]); `encoding_format` "float" gives each vector as
//! numbers, "base64" as its little-endian f32 bytes in base64 (what the OpenAI Python client
//! asks for by default, and decodes); `dimensions` keeps that many leading values of each
//! vector, normalised again (up to the model's size). The response is `{object: "list", data:
//! [{object: "embedding", index, embedding}], model, usage: {prompt_tokens, total_tokens}}`. A
//! field weft does not read is refused, naming it; the engine checks the rest (that the model
//! serves embeddings, `dimensions` against its size, prompt lengths).

use serde_json::{Map, Value, json};

use crate::engine::request::{EmbeddingParams, Prompt, Usage};
use crate::openai::error::{ApiResult, OpenAiError};

/// Inputs one request may embed at most (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// A parsed `/v1/embeddings` request.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingsRequest {
    /// One prompt per input, in order.
    pub inputs: Vec<Prompt>,
    pub params: EmbeddingParams,
    /// Vectors as base64 of their little-endian f32 bytes instead of numbers.
    pub base64: bool,
}

fn bad(field: &str, why: impl std::fmt::Display) -> OpenAiError {
    OpenAiError::invalid(field, format!("invalid {field}: {why}"))
}

/// Token ids from a JSON array, or `None` when it is not one of non-negative integers.
fn token_ids(v: &Value) -> Option<Vec<u32>> {
    v.as_array()?.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect()
}

/// The body (already an object; its `model` checked by the caller) to a request.
pub fn parse_embeddings(body: &Map<String, Value>) -> ApiResult<EmbeddingsRequest> {
    const KNOWN: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];
    if let Some(k) = body.keys().filter(|k| !KNOWN.contains(&k.as_str())).min() {
        return Err(OpenAiError::invalid(
            k,
            format!("unknown field {k}: /v1/embeddings reads {}; remove it", KNOWN.join(", ")),
        ));
    }
    let why = "expected a string, an array of strings, an array of token ids or an array of such arrays";
    let inputs = match body.get("input") {
        None | Some(Value::Null) => return Err(bad("input", "it is missing; give the text to embed")),
        Some(Value::String(s)) => vec![Prompt::Text(s.clone())],
        Some(Value::Array(items)) if items.is_empty() => return Err(bad("input", "the array is empty")),
        Some(Value::Array(items)) => match &items[0] {
            Value::String(_) => items
                .iter()
                .map(|i| i.as_str().map(|s| Prompt::Text(s.to_string())).ok_or_else(|| bad("input", why)))
                .collect::<ApiResult<_>>()?,
            Value::Number(_) => {
                vec![Prompt::Tokens(token_ids(&Value::Array(items.clone())).ok_or_else(|| bad("input", why))?)]
            }
            _ => items
                .iter()
                .map(|i| token_ids(i).map(Prompt::Tokens).ok_or_else(|| bad("input", why)))
                .collect::<ApiResult<_>>()?,
        },
        Some(_) => return Err(bad("input", why)),
    };
    if inputs.len() > MAX_INPUTS {
        return Err(bad("input", format!("{} inputs; at most {MAX_INPUTS} a request", inputs.len())));
    }
    if let Some(i) = inputs
        .iter()
        .position(|p| matches!(p, Prompt::Text(t) if t.is_empty()) || matches!(p, Prompt::Tokens(t) if t.is_empty()))
    {
        return Err(bad("input", format!("input {i} is empty")));
    }
    let base64 = match body.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(v) => return Err(bad("encoding_format", format!("{v}; expected \"float\" or \"base64\""))),
    };
    let dimensions = match body.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&d| d > 0)
                .ok_or_else(|| bad("dimensions", format!("{v}; expected a positive integer")))? as usize,
        ),
    };
    Ok(EmbeddingsRequest { inputs, params: EmbeddingParams { dimensions }, base64 })
}

/// Base64 (RFC 4648, padded) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            let c = if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] } else { b'=' };
            out.push(c as char);
        }
    }
    out
}

/// The response to `req`: one `(embedding, usage)` per input, in order.
pub fn embeddings_json(req: &EmbeddingsRequest, model: &str, embeddings: &[(Vec<f32>, Usage)]) -> Value {
    let data: Vec<Value> = embeddings
        .iter()
        .enumerate()
        .map(|(index, (v, _))| {
            let embedding = match req.base64 {
                true => json!(base64(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())),
                false => json!(v),
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let prompt_tokens: usize = embeddings.iter().map(|(_, u)| u.prompt_tokens).sum();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> ApiResult<EmbeddingsRequest> {
        parse_embeddings(v.as_object().unwrap())
    }

    #[test]
    fn every_input_shape_parses() {
        let text = |s: &str| Prompt::Text(s.into());
        assert_eq!(parse(json!({"input": "hi"})).unwrap().inputs, vec![text("hi")]);
        assert_eq!(parse(json!({"input": ["a", "b"]})).unwrap().inputs, vec![text("a"), text("b")]);
        assert_eq!(parse(json!({"input": [1, 2]})).unwrap().inputs, vec![Prompt::Tokens(vec![1, 2])]);
        let nested = parse(json!({"input": [[1], [2, 3]], "encoding_format": "base64", "dimensions": 8})).unwrap();
        assert_eq!(nested.inputs, vec![Prompt::Tokens(vec![1]), Prompt::Tokens(vec![2, 3])]);
        assert!(nested.base64);
        assert_eq!(nested.params.dimensions, Some(8));
    }

    #[test]
    fn bad_requests_name_their_field() {
        for (body, field) in [
            (json!({}), "input"),
            (json!({"input": []}), "input"),
            (json!({"input": [""]}), "input"),
            (json!({"input": ["a", 1]}), "input"),
            (json!({"input": [1, -2]}), "input"),
            (json!({"input": {"text": "a"}}), "input"),
            (json!({"input": "a", "encoding_format": "int8"}), "encoding_format"),
            (json!({"input": "a", "dimensions": 0}), "dimensions"),
            (json!({"input": "a", "temperature": 0.5}), "temperature"),
        ] {
            assert_eq!(parse(body.clone()).unwrap_err().param.as_deref(), Some(field), "{body}");
        }
    }

    #[test]
    fn base64_is_little_endian_f32() {
        assert_eq!(base64(b"Man"), "TWFu");
        assert_eq!(base64(b"Ma"), "TWE=");
        assert_eq!(base64(b"M"), "TQ==");
        let req = EmbeddingsRequest { inputs: vec![], params: EmbeddingParams::default(), base64: true };
        let usage = Usage { prompt_tokens: 3, ..Default::default() };
        let v = embeddings_json(&req, "m", &[(vec![1.0], usage)]);
        // 1.0f32 is 00 00 80 3f.
        assert_eq!(v["data"][0]["embedding"], "AACAPw==");
        assert_eq!(v["usage"]["total_tokens"], 3);
    }
}
