//! Shaping engine output as OpenAI JSON: whole responses, streamed chunks (the chat role
//! first, then deltas, then the finish reason and usage), log-probabilities and usage; a
//! request's `n` choices (each its own engine request) as one response; a thinking model's
//! reasoning as `reasoning_content`, apart from the answer (`reasoning`).

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::constraint::tools::{ToolEvent, ToolStream, parse_calls};
use crate::engine::ContinuousBatchEngine;
use crate::engine::request::{FinishReason, InferenceResponse, StreamChunk, TokenLogprob, Usage};
use crate::openai::error::{ApiResult, OpenAiError};
use crate::openai::reasoning::{self, Piece, ReasoningSplitter};
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
    response_json_with(engine.tokenizer().as_ref(), req, id, created, model, std::slice::from_ref(response))
}

/// [`response_json`] for a request's `n` choices (`responses[i]` is choice `i`), with the
/// tokenizer that decodes log-probability tokens, and no engine. The usage counts the prompt
/// once, as OpenAI does, and every choice's completion tokens.
pub fn response_json_with(
    tok: &dyn Tokenizer,
    req: &OpenAiRequest,
    id: &str,
    created: u64,
    model: &str,
    responses: &[InferenceResponse],
) -> ApiResult<Value> {
    if responses.iter().any(|r| r.finish_reason == FinishReason::Error) {
        return Err(engine_failed());
    }
    let choices: Vec<Value> = responses.iter().enumerate().map(|(i, r)| choice_json(tok, req, i, r)).collect();
    let usage = sum_usage(responses.iter().map(|r| &r.usage));
    Ok(json!({
        "id": id, "object": req.endpoint.object(), "created": created, "model": model,
        "choices": choices,
        "usage": usage_json(&usage),
    }))
}

/// The usage of a request's choices together: the prompt once (the first choice's, which
/// computed it; the others found it in the prefix cache where it is on), every completion.
fn sum_usage<'a>(usages: impl IntoIterator<Item = &'a Usage>) -> Usage {
    let mut total: Option<Usage> = None;
    for u in usages {
        match &mut total {
            None => total = Some(*u),
            Some(t) => t.completion_tokens += u.completion_tokens,
        }
    }
    total.unwrap_or_default()
}

/// Choice `index` of a whole response.
fn choice_json(tok: &dyn Tokenizer, req: &OpenAiRequest, index: usize, response: &InferenceResponse) -> Value {
    let mut finish = finish_str(response.finish_reason);
    match req.endpoint {
        Endpoint::Chat => {
            let logprobs = req.logprobs.map(|top| chat_logprobs(tok, &response.logprobs, top)).unwrap_or(Value::Null);
            let mut message = json!({"role": "assistant", "content": response.text});
            let mut answer = response.text.clone();
            if let Some(r) = &req.reasoning {
                let (reasoning, content) = reasoning::split(r.family, r.open, &response.text);
                answer = content.clone().unwrap_or_default();
                message["content"] = content.map_or(Value::Null, Value::String);
                message["reasoning_content"] = reasoning.map_or(Value::Null, Value::String);
            }
            // Tool calls are read out of the answer, never out of the reasoning.
            let calls = req
                .tools
                .as_ref()
                .filter(|t| t.reads_calls())
                .and_then(|t| parse_calls(format_of(tok), &answer, &t.names()).map(|found| (t, found)));
            if let Some((t, (content, calls))) = calls {
                message["content"] = content.map_or(Value::Null, Value::String);
                message["tool_calls"] = calls.iter().map(call_json).collect();
                finish = calls_finish(t, response.finish_reason);
            }
            json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
        }
        Endpoint::Completion => {
            let logprobs = req
                .logprobs
                .map(|top| completion_logprobs(tok, &response.logprobs, top, &mut 0))
                .unwrap_or(Value::Null);
            json!({"index": index, "text": response.text, "logprobs": logprobs, "finish_reason": finish})
        }
    }
}

/// The finish reason of an answer that made tool calls: OpenAI's "tool_calls" (or "stop" for a
/// named function) when it ended by itself, the engine's reason otherwise (cut off by length).
fn calls_finish(tools: &ToolsRequest, reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::Eos => tools.finish_reason(),
        other => finish_str(other),
    }
}

/// One choice's place in a streamed response.
struct ChoiceStream {
    /// Completions' text offset of the next log-probability token.
    offset: usize,
    finished: bool,
    /// Chat with tools: reads calls out of the streamed answer.
    tools: Option<(ToolsRequest, ToolStream)>,
    /// Tool calls streamed so far (the next one's `index`).
    num_calls: usize,
    /// A thinking model's output: separates the reasoning from the answer.
    reasoning: Option<ReasoningSplitter>,
    /// The choice's usage, once it finished.
    usage: Option<Usage>,
}

/// Turns engine `StreamChunk`s into OpenAI chunk objects for one streamed request, whose `n`
/// choices are `n` engine streams: each choice's chunks carry its `index`, and the usage chunk
/// (with `include_usage`) comes once every choice has finished.
pub struct ChunkShaper {
    tokenizer: Arc<dyn Tokenizer>,
    endpoint: Endpoint,
    include_usage: bool,
    logprobs: Option<usize>,
    id: String,
    created: u64,
    model: String,
    started: bool,
    /// An error ended the whole response.
    failed: bool,
    choices: Vec<ChoiceStream>,
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
        let choices = (0..req.n.max(1))
            .map(|_| ChoiceStream {
                offset: 0,
                finished: false,
                tools: req.tools.clone().filter(ToolsRequest::reads_calls).map(|t| {
                    let stream = ToolStream::new(format_of(tokenizer.as_ref()), &t.names());
                    (t, stream)
                }),
                num_calls: 0,
                reasoning: req.reasoning.map(|r| ReasoningSplitter::new(r.family, r.open)),
                usage: None,
            })
            .collect();
        ChunkShaper {
            endpoint: req.endpoint,
            include_usage: req.include_usage,
            logprobs: req.logprobs,
            id,
            created,
            model,
            started: false,
            failed: false,
            choices,
            tokenizer,
        }
    }

    fn chunk(&self, choices: Value, usage: Option<&Usage>) -> Value {
        let mut v = json!({"id": self.id, "object": self.endpoint.chunk_object(), "created": self.created, "model": self.model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = usage_json(u);
        }
        v
    }

    /// The chunks to send before the engine's first item: chat's assistant role delta for
    /// each choice (once; nothing for completions). Call it to send the roles at once;
    /// otherwise [`Self::shape`] puts them first.
    pub fn start(&mut self) -> Vec<Value> {
        if self.started {
            return Vec::new();
        }
        self.started = true;
        match self.endpoint {
            Endpoint::Chat => (0..self.choices.len())
                .map(|i| self.chunk(json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]), None))
                .collect(),
            Endpoint::Completion => Vec::new(),
        }
    }

    /// [`Self::shape_choice`] for choice 0 (a request with `n` = 1).
    pub fn shape(&mut self, item: crate::Result<StreamChunk>) -> Vec<Value> {
        self.shape_choice(0, item)
    }

    /// The chunk objects to send for choice `index`'s engine item: its content chunks (text,
    /// reasoning, tool calls or log-probabilities), then on its last item its finish chunk and,
    /// once every choice has finished and with `include_usage`, the usage chunk; an
    /// `{"error": …}` object for an error, which ends the whole response. Nothing once the
    /// choice (or the response) has finished.
    pub fn shape_choice(&mut self, index: usize, item: crate::Result<StreamChunk>) -> Vec<Value> {
        if self.failed || self.choices.get(index).is_none_or(|c| c.finished) {
            return Vec::new();
        }
        let mut out = self.start();
        let c = match item {
            Ok(c) => c,
            Err(e) => {
                out.push(OpenAiError::from_engine(e).body());
                self.failed = true;
                return out;
            }
        };
        let chat = self.endpoint == Endpoint::Chat;
        let tok = self.tokenizer.clone();
        let logprobs = match self.logprobs {
            Some(top) if !c.logprobs.is_empty() => {
                if chat {
                    chat_logprobs(tok.as_ref(), &c.logprobs, top)
                } else {
                    completion_logprobs(tok.as_ref(), &c.logprobs, top, &mut self.choices[index].offset)
                }
            }
            _ => Value::Null,
        };
        let mut logprobs = Some(logprobs);
        let mut chunks = Vec::new();
        if chat {
            let choice = &mut self.choices[index];
            let finishing = c.finish_reason.is_some();
            let pieces = match &mut choice.reasoning {
                Some(splitter) => {
                    let mut pieces = splitter.push(&c.text);
                    if finishing {
                        pieces.extend(splitter.finish());
                    }
                    pieces
                }
                None => vec![Piece::Content(c.text.clone())],
            };
            let mut deltas = Vec::new();
            for piece in pieces {
                let text = match piece {
                    Piece::Reasoning(t) => {
                        deltas.push(json!({"reasoning_content": t}));
                        continue;
                    }
                    Piece::Content(t) => t,
                };
                match &mut choice.tools {
                    Some((_, stream)) => {
                        for event in stream.push(&text) {
                            deltas.push(tool_delta(event, &mut choice.num_calls));
                        }
                    }
                    None if !text.is_empty() => deltas.push(json!({"content": text})),
                    None => {}
                }
            }
            if finishing && let Some((_, stream)) = &mut choice.tools {
                for event in stream.finish() {
                    deltas.push(tool_delta(event, &mut choice.num_calls));
                }
            }
            if deltas.is_empty() && logprobs.as_ref().is_some_and(|l| !l.is_null()) {
                deltas.push(json!({"content": ""}));
            }
            for delta in deltas {
                let lp = logprobs.take().unwrap_or(Value::Null);
                chunks.push(json!([{"index": index, "delta": delta, "logprobs": lp, "finish_reason": null}]));
            }
        } else if !c.text.is_empty() || logprobs.as_ref().is_some_and(|l| !l.is_null()) {
            let lp = logprobs.take().unwrap_or(Value::Null);
            chunks.push(json!([{"index": index, "text": c.text, "logprobs": lp, "finish_reason": null}]));
        }
        for choices in chunks {
            out.push(self.chunk(choices, None));
        }
        if let Some(reason) = c.finish_reason {
            if reason == FinishReason::Error {
                out.push(engine_failed().body());
                self.failed = true;
                return out;
            }
            let choice = &mut self.choices[index];
            let finish = match &choice.tools {
                Some((t, _)) if choice.num_calls > 0 => calls_finish(t, reason),
                _ => finish_str(reason),
            };
            choice.finished = true;
            choice.usage = Some(c.usage.unwrap_or_default());
            let last = if chat {
                json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": finish})
            } else {
                json!({"index": index, "text": "", "logprobs": null, "finish_reason": finish})
            };
            out.push(self.chunk(json!([last]), None));
            if self.include_usage && self.finished() {
                let usage = sum_usage(self.choices.iter().filter_map(|c| c.usage.as_ref()));
                out.push(self.chunk(json!([]), Some(&usage)));
            }
        }
        out
    }

    /// True once every choice's finish chunk (or an error) was produced: the caller then sends
    /// `[DONE]`.
    pub fn finished(&self) -> bool {
        self.failed || self.choices.iter().all(|c| c.finished)
    }
}

/// A tool-call stream's event as a chat delta.
fn tool_delta(event: ToolEvent, num_calls: &mut usize) -> Value {
    match event {
        ToolEvent::Content(text) => json!({"content": text}),
        ToolEvent::Call(call) => {
            *num_calls += 1;
            json!({"tool_calls": [call_delta_json(*num_calls - 1, &call)]})
        }
    }
}
