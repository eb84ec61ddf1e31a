//! Shaping engine output as OpenAI JSON: whole responses, streamed chunks (the chat role
//! first, then deltas, then the finish reason and usage), log-probabilities and usage.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::constraint::tools::{ToolEvent, ToolStream, parse_calls};
use crate::engine::ContinuousBatchEngine;
use crate::engine::request::{FinishReason, InferenceResponse, StreamChunk, TokenLogprob, Usage};
use crate::openai::error::{ApiResult, OpenAiError};
use crate::openai::tools::{ToolsRequest, call_delta_json, call_json, format_of};
use crate::openai::{Endpoint, OpenAiRequest};
use crate::tokenizer::Tokenizer;

/// OpenAI's `finish_reason` for the engine's.
pub fn finish_str(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop | FinishReason::Eos => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "abort",
        FinishReason::Error => "error",
    }
}

/// The `usage` object.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
    })
}

/// The error a request that failed inside the engine answers with.
fn engine_failed() -> OpenAiError {
    OpenAiError::internal("the request failed in the engine")
}

pub(crate) fn piece(tok: &dyn Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// Chat's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn chat_logprobs(tok: &dyn Tokenizer, lps: &[TokenLogprob], top: usize) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let t = piece(tok, l.token);
            let tops: Vec<Value> = l
                .top
                .iter()
                .take(top)
                .map(|(id, lp)| {
                    let s = piece(tok, *id);
                    json!({"token": s, "logprob": lp, "bytes": s.as_bytes()})
                })
                .collect();
            json!({"token": t, "logprob": l.logprob, "bytes": t.as_bytes(), "top_logprobs": tops})
        })
        .collect();
    json!({ "content": content })
}

/// Completions' `logprobs`: parallel lists, with text offsets counted on from `offset`.
fn completion_logprobs(tok: &dyn Tokenizer, lps: &[TokenLogprob], top: usize, offset: &mut usize) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for l in lps {
        let t = piece(tok, l.token);
        offsets.push(*offset);
        *offset += t.len();
        tokens.push(t);
        token_logprobs.push(l.logprob);
        let m: Map<String, Value> = l.top.iter().take(top).map(|(id, lp)| (piece(tok, *id), json!(lp))).collect();
        tops.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets})
}

/// The non-streaming response object (`chat.completion` / `text_completion`) for a finished
/// request; an error when the request failed in the engine.
pub fn response_json(
    engine: &ContinuousBatchEngine,
    req: &OpenAiRequest,
    id: &str,
    created: u64,
    model: &str,
    response: &InferenceResponse,
) -> ApiResult<Value> {
    response_json_with(engine.tokenizer().as_ref(), req, id, created, model, response)
}

/// [`response_json`] with the tokenizer that decodes log-probability tokens, and no engine.
pub fn response_json_with(
    tok: &dyn Tokenizer,
    req: &OpenAiRequest,
    id: &str,
    created: u64,
    model: &str,
    response: &InferenceResponse,
) -> ApiResult<Value> {
    if response.finish_reason == FinishReason::Error {
        return Err(engine_failed());
    }
    let mut finish = finish_str(response.finish_reason);
    Ok(match req.endpoint {
        Endpoint::Chat => {
            let logprobs = req.logprobs.map(|top| chat_logprobs(tok, &response.logprobs, top)).unwrap_or(Value::Null);
            let mut message = json!({"role": "assistant", "content": response.text});
            let calls = req
                .tools
                .as_ref()
                .filter(|t| t.reads_calls())
                .and_then(|t| parse_calls(format_of(tok), &response.text, &t.names()).map(|found| (t, found)));
            if let Some((t, (content, calls))) = calls {
                message["content"] = content.map_or(Value::Null, Value::String);
                message["tool_calls"] = calls.iter().map(call_json).collect();
                finish = calls_finish(t, response.finish_reason);
            }
            json!({
                "id": id, "object": "chat.completion", "created": created, "model": model,
                "choices": [{
                    "index": 0,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }],
                "usage": usage_json(&response.usage),
            })
        }
        Endpoint::Completion => {
            let logprobs = req
                .logprobs
                .map(|top| completion_logprobs(tok, &response.logprobs, top, &mut 0))
                .unwrap_or(Value::Null);
            json!({
                "id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": response.text, "logprobs": logprobs, "finish_reason": finish}],
                "usage": usage_json(&response.usage),
            })
        }
    })
}

/// The finish reason of an answer that made tool calls: OpenAI's "tool_calls" (or "stop" for a
/// named function) when it ended by itself, the engine's reason otherwise (cut off by length).
fn calls_finish(tools: &ToolsRequest, reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::Eos => tools.finish_reason(),
        other => finish_str(other),
    }
}

/// Turns engine `StreamChunk`s into OpenAI chunk objects for one streamed request.
pub struct ChunkShaper {
    tokenizer: Arc<dyn Tokenizer>,
    endpoint: Endpoint,
    include_usage: bool,
    logprobs: Option<usize>,
    id: String,
    created: u64,
    model: String,
    /// Completions' text offset of the next log-probability token.
    offset: usize,
    started: bool,
    finished: bool,
    /// Chat with tools: reads calls out of the streamed text.
    tools: Option<(ToolsRequest, ToolStream)>,
    /// Tool calls streamed so far (the next one's `index`).
    num_calls: usize,
}

impl ChunkShaper {
    pub fn new(engine: ContinuousBatchEngine, req: &OpenAiRequest, id: String, created: u64, model: String) -> Self {
        Self::with_tokenizer(engine.tokenizer().clone(), req, id, created, model)
    }

    /// A shaper with the tokenizer that decodes log-probability tokens, and no engine.
    pub fn with_tokenizer(
        tokenizer: Arc<dyn Tokenizer>,
        req: &OpenAiRequest,
        id: String,
        created: u64,
        model: String,
    ) -> Self {
        ChunkShaper {
            endpoint: req.endpoint,
            include_usage: req.include_usage,
            logprobs: req.logprobs,
            id,
            created,
            model,
            offset: 0,
            started: false,
            finished: false,
            tools: req.tools.clone().filter(ToolsRequest::reads_calls).map(|t| {
                let stream = ToolStream::new(format_of(tokenizer.as_ref()), &t.names());
                (t, stream)
            }),
            tokenizer,
            num_calls: 0,
        }
    }

    fn chunk(&self, choices: Value, usage: Option<&Usage>) -> Value {
        let mut v = json!({"id": self.id, "object": self.endpoint.chunk_object(), "created": self.created, "model": self.model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = usage_json(u);
        }
        v
    }

    /// The chunks to send before the engine's first item: chat's assistant role delta (once;
    /// nothing for completions). Call it to send the role at once; otherwise [`Self::shape`]
    /// puts it first.
    pub fn start(&mut self) -> Vec<Value> {
        if self.started {
            return Vec::new();
        }
        self.started = true;
        match self.endpoint {
            Endpoint::Chat => vec![self.chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]), None)],
            Endpoint::Completion => Vec::new(),
        }
    }

    /// The chunk objects to send for this engine item: the content chunk (text or
    /// log-probabilities), then on the last item the finish chunk and, with `include_usage`,
    /// the usage chunk; an `{"error": …}` object for an error. Nothing once finished.
    pub fn shape(&mut self, item: crate::Result<StreamChunk>) -> Vec<Value> {
        if self.finished {
            return Vec::new();
        }
        let mut out = self.start();
        let c = match item {
            Ok(c) => c,
            Err(e) => {
                out.push(OpenAiError::from_engine(e).body());
                self.finished = true;
                return out;
            }
        };
        let chat = self.endpoint == Endpoint::Chat;
        let logprobs = match self.logprobs {
            Some(top) if !c.logprobs.is_empty() => {
                if chat {
                    chat_logprobs(self.tokenizer.as_ref(), &c.logprobs, top)
                } else {
                    completion_logprobs(self.tokenizer.as_ref(), &c.logprobs, top, &mut self.offset)
                }
            }
            _ => Value::Null,
        };
        let mut logprobs = Some(logprobs);
        if chat {
            let mut deltas = Vec::new();
            match &mut self.tools {
                Some((_, stream)) => {
                    let mut events = stream.push(&c.text);
                    if c.finish_reason.is_some() {
                        events.extend(stream.finish());
                    }
                    for event in events {
                        deltas.push(match event {
                            ToolEvent::Content(text) => json!({"content": text}),
                            ToolEvent::Call(call) => {
                                self.num_calls += 1;
                                json!({"tool_calls": [call_delta_json(self.num_calls - 1, &call)]})
                            }
                        });
                    }
                }
                None if !c.text.is_empty() => deltas.push(json!({"content": c.text})),
                None => {}
            }
            if deltas.is_empty() && logprobs.as_ref().is_some_and(|l| !l.is_null()) {
                deltas.push(json!({"content": ""}));
            }
            for delta in deltas {
                let lp = logprobs.take().unwrap_or(Value::Null);
                out.push(
                    self.chunk(json!([{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": null}]), None),
                );
            }
        } else if !c.text.is_empty() || logprobs.as_ref().is_some_and(|l| !l.is_null()) {
            let lp = logprobs.take().unwrap_or(Value::Null);
            out.push(self.chunk(json!([{"index": 0, "text": c.text, "logprobs": lp, "finish_reason": null}]), None));
        }
        if let Some(reason) = c.finish_reason {
            if reason == FinishReason::Error {
                out.push(engine_failed().body());
            } else {
                let finish = match &self.tools {
                    Some((t, _)) if self.num_calls > 0 => calls_finish(t, reason),
                    _ => finish_str(reason),
                };
                let choice = if chat {
                    json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish})
                } else {
                    json!({"index": 0, "text": "", "logprobs": null, "finish_reason": finish})
                };
                out.push(self.chunk(json!([choice]), None));
                if self.include_usage {
                    out.push(self.chunk(json!([]), Some(&c.usage.unwrap_or_default())));
                }
            }
            self.finished = true;
        }
        out
    }

    /// True once the finish chunk (or an error) was produced: the caller then sends `[DONE]`.
    pub fn finished(&self) -> bool {
        self.finished
    }
}
