//! The OpenAI protocol without a transport: reading chat and text completion requests, and
//! shaping responses and streamed chunks, as JSON values.
//!
//! The native server (`weft serve`) and the browser build speak the same protocol through this
//! module; they add only their transport (HTTP status codes and SSE framing, or JS messages).
//! Every known request field is type-checked, and an error names the field in OpenAI's shape
//! (`{"error": {"message", "type", "param", "code"}}`).
//!
//! Parsing is two steps: [`parse`] reads the body with no engine, and [`ParsedRequest::resolve`]
//! adds what needs the model (the default `max_tokens` from the context length and the prompt's
//! token count) and validates the request. [`parse_request`] does both against an engine.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::engine::ContinuousBatchEngine;
use crate::engine::request::{
    FinishReason, GenerationParams, InferenceRequest, InferenceResponse, Prompt, StreamChunk, TokenLogprob, Usage,
};
use crate::error::WeftError;
use crate::sampling::SamplingParams;
use crate::tokenizer::{ChatMessage, Tokenizer};

/// `max_tokens` when a request names none: the rest of the context, at most this many.
pub const DEFAULT_MAX_TOKENS_CAP: usize = 256;

/// The most alternatives `top_logprobs` (chat) or `logprobs` (completions) may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;

// ---------------------------------------------------------------------------------------------
// Errors.

/// An OpenAI-shaped error: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenAiError {
    pub message: String,
    /// OpenAI's `type`: "invalid_request_error", "service_unavailable", "internal_error", ...
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl OpenAiError {
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        OpenAiError { message: message.into(), kind, param: None, code: None }
    }

    /// The caller's fault, in field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        OpenAiError { param: Some(param.to_string()), ..Self::new("invalid_request_error", message) }
    }

    /// The caller's fault, in no one field (the body as a whole).
    pub fn invalid_body(message: impl Into<String>) -> Self {
        Self::new("invalid_request_error", message)
    }

    /// Not now: retrying later may succeed.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new("service_unavailable", message)
    }

    /// Our fault.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new("internal_error", message)
    }

    /// The JSON error object.
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }

    /// An engine error: validation errors ("invalid <field>: ...") are the caller's fault, a
    /// shut-down engine is unavailable, anything else is internal.
    pub fn from_engine(e: WeftError) -> Self {
        match &e {
            WeftError::Unsupported(m) if m.starts_with("invalid ") => {
                let field = m["invalid ".len()..].split(':').next().unwrap_or("").trim().to_string();
                let param = if field == "request" { None } else { Some(field) };
                OpenAiError { param, ..Self::invalid_body(m.clone()) }
            }
            WeftError::Unsupported(m) if m.contains("shut down") => Self::unavailable(m.clone()),
            _ => Self::internal(e.to_string()),
        }
    }
}

impl std::fmt::Display for OpenAiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OpenAiError {}

impl From<WeftError> for OpenAiError {
    fn from(e: WeftError) -> Self {
        Self::from_engine(e)
    }
}

type ApiResult<T> = std::result::Result<T, OpenAiError>;

// ---------------------------------------------------------------------------------------------
// Requests.

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

/// Parse a JSON request body, which must be an object.
pub fn parse_body(text: &[u8]) -> ApiResult<Map<String, Value>> {
    match serde_json::from_slice::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(OpenAiError::invalid_body("the request body must be a JSON object")),
        Err(e) => Err(OpenAiError::invalid_body(format!("the request body is not valid JSON: {e}"))),
    }
}

/// The `model` a request names, if any (an error if it is not a string).
pub fn requested_model(body: &Map<String, Value>) -> ApiResult<Option<&str>> {
    Fields(body).string("model")
}

/// A request read from its body with no engine: everything but what needs the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedRequest {
    pub endpoint: Endpoint,
    pub prompt: Prompt,
    /// The parameters; `max_tokens` is filled in by [`ParsedRequest::resolve`].
    pub params: GenerationParams,
    /// `max_completion_tokens` or `max_tokens`, if the request names one.
    pub max_tokens: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: Option<usize>,
    pub model: Option<String>,
}

impl ParsedRequest {
    /// Fill in the default `max_tokens` (the rest of a `max_model_len` context after the
    /// prompt's `prompt_tokens`, at most [`DEFAULT_MAX_TOKENS_CAP`]; 1 when the prompt's length
    /// is unknown or over the context, which the engine then refuses) and validate the request.
    pub fn resolve(self, max_model_len: usize, prompt_tokens: Option<usize>) -> ApiResult<OpenAiRequest> {
        let mut params = self.params;
        params.max_tokens = match self.max_tokens {
            Some(x) => x,
            None => match prompt_tokens {
                Some(n) if n < max_model_len => (max_model_len - n).min(DEFAULT_MAX_TOKENS_CAP),
                _ => 1,
            },
        };
        let request = InferenceRequest::new(self.prompt, params);
        request.validate().map_err(OpenAiError::from_engine)?;
        Ok(OpenAiRequest {
            endpoint: self.endpoint,
            request,
            stream: self.stream,
            include_usage: self.include_usage,
            logprobs: self.logprobs,
            model: self.model,
        })
    }
}

/// A parsed request: the engine request plus the response options.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenAiRequest {
    pub endpoint: Endpoint,
    pub request: InferenceRequest,
    /// Answer with a stream of chunks.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// Report log-probabilities, with this many alternatives each.
    pub logprobs: Option<usize>,
    /// The model the request names, for the caller to check.
    pub model: Option<String>,
}

/// Parse a JSON body (already an object) for an endpoint against this engine: the engine's
/// tokenizer and context length give the default `max_tokens`.
pub fn parse_request(
    engine: &ContinuousBatchEngine,
    endpoint: Endpoint,
    body: &Map<String, Value>,
) -> ApiResult<OpenAiRequest> {
    let parsed = parse(endpoint, body)?;
    let prompt_len = match parsed.max_tokens {
        Some(_) => None,
        None => prompt_tokens(engine.tokenizer().as_ref(), &parsed.prompt),
    };
    parsed.resolve(engine.config().max_model_len, prompt_len)
}

/// Read a JSON body (already an object) for an endpoint, with no engine. Fields are checked in
/// a fixed order (model, messages or prompt, then the rest), so the first error is stable.
pub fn parse(endpoint: Endpoint, body: &Map<String, Value>) -> ApiResult<ParsedRequest> {
    let f = Fields(body);
    let model = f.string("model")?.map(str::to_string);
    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Chat(parse_messages(&f)?),
        Endpoint::Completion => {
            let prompt = parse_prompt(&f)?;
            if f.bool("echo")?.unwrap_or(false) {
                return Err(OpenAiError::invalid("echo", "invalid echo: echo is not supported"));
            }
            Prompt::Text(prompt)
        }
    };
    let common = parse_common(&f, endpoint == Endpoint::Chat)?;
    Ok(ParsedRequest {
        endpoint,
        prompt,
        params: common.params,
        max_tokens: common.max_tokens,
        stream: common.stream,
        include_usage: common.include_usage,
        logprobs: common.logprobs,
        model,
    })
}

/// The prompt's length in tokens, as the engine will count it (None if it cannot be counted).
pub fn prompt_tokens(tok: &dyn Tokenizer, prompt: &Prompt) -> Option<usize> {
    match prompt {
        Prompt::Text(t) => tok.encode(t, true).ok().map(|v| v.len()),
        Prompt::Tokens(t) => Some(t.len()),
        Prompt::Chat(m) => {
            let text = tok.chat_template()?.render(m, true).ok()?;
            tok.encode(&text, false).ok().map(|v| v.len())
        }
    }
}

/// Reading request fields: every known field is type-checked and named in the error. `null`
/// counts as absent.
struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn get(&self, k: &str) -> Option<&'a Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }
    fn f32(&self, k: &str) -> ApiResult<Option<f32>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| OpenAiError::invalid(k, format!("invalid {k}: expected a number, got {v}"))),
        }
    }
    fn int(&self, k: &str) -> ApiResult<Option<i64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| OpenAiError::invalid(k, format!("invalid {k}: expected an integer, got {v}"))),
        }
    }
    fn uint(&self, k: &str) -> ApiResult<Option<u64>> {
        match self.int(k)? {
            Some(x) if x < 0 => Err(OpenAiError::invalid(k, format!("invalid {k}: {x} (must not be negative)"))),
            x => Ok(x.map(|x| x as u64)),
        }
    }
    fn bool(&self, k: &str) -> ApiResult<Option<bool>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| OpenAiError::invalid(k, format!("invalid {k}: expected true or false, got {v}"))),
        }
    }
    fn string(&self, k: &str) -> ApiResult<Option<&'a str>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| OpenAiError::invalid(k, format!("invalid {k}: expected a string, got {v}"))),
        }
    }
    /// A string or a list of strings.
    fn strings(&self, k: &str) -> ApiResult<Vec<String>> {
        match self.get(k) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        OpenAiError::invalid(k, format!("invalid {k}: expected a string or a list of strings"))
                    })
                })
                .collect(),
            Some(v) => {
                Err(OpenAiError::invalid(k, format!("invalid {k}: expected a string or a list of strings, got {v}")))
            }
        }
    }
}

/// What both endpoints share, parsed.
struct Common {
    max_tokens: Option<usize>,
    params: GenerationParams,
    stream: bool,
    include_usage: bool,
    /// Report log-probabilities, with this many alternatives each.
    logprobs: Option<usize>,
}

fn parse_common(f: &Fields, chat: bool) -> ApiResult<Common> {
    if let Some(n) = f.int("n")?
        && n != 1
    {
        return Err(OpenAiError::invalid("n", format!("invalid n: {n}; only n=1 is supported")));
    }
    if let Some(b) = f.int("best_of")?
        && b != 1
    {
        return Err(OpenAiError::invalid("best_of", format!("invalid best_of: {b}; only best_of=1 is supported")));
    }
    let _ = f.string("user")?;
    let max_tokens = match f.uint("max_completion_tokens")? {
        Some(x) => Some(x),
        None => f.uint("max_tokens")?,
    };
    let mut sampling = SamplingParams { temperature: 1.0, ..Default::default() };
    if let Some(x) = f.f32("temperature")? {
        sampling.temperature = x;
    }
    if let Some(x) = f.f32("top_p")? {
        sampling.top_p = x;
    }
    if let Some(x) = f.int("top_k")? {
        // vLLM: -1 (or 0) turns it off.
        sampling.top_k = if x <= 0 { 0 } else { x as u32 };
    }
    if let Some(x) = f.f32("min_p")? {
        sampling.min_p = x;
    }
    if let Some(x) = f.f32("repetition_penalty")? {
        sampling.repetition_penalty = x;
    }
    if let Some(x) = f.f32("presence_penalty")? {
        sampling.presence_penalty = x;
    }
    if let Some(x) = f.f32("frequency_penalty")? {
        sampling.frequency_penalty = x;
    }
    if let Some(x) = f.int("seed")? {
        sampling.seed = Some(x as u64);
    }
    let logprobs = if chat {
        let on = f.bool("logprobs")?.unwrap_or(false);
        let top = f.uint("top_logprobs")?;
        if top.is_some() && !on {
            return Err(OpenAiError::invalid(
                "top_logprobs",
                "invalid top_logprobs: set logprobs to true to use top_logprobs",
            ));
        }
        on.then(|| top.unwrap_or(0) as usize)
    } else {
        f.uint("logprobs")?.map(|x| x as usize)
    };
    if let Some(top) = logprobs {
        if top > MAX_TOP_LOGPROBS {
            return Err(OpenAiError::invalid(
                if chat { "top_logprobs" } else { "logprobs" },
                format!("invalid top_logprobs: {top} (at most {MAX_TOP_LOGPROBS})"),
            ));
        }
        // The engine reports log-probabilities only when alternatives are asked for.
        sampling.top_logprobs = top.max(1);
    }
    let stop = f.strings("stop")?;
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o)
            .bool("include_usage")
            .map_err(|_| {
                OpenAiError::invalid("stream_options", "invalid stream_options: include_usage must be true or false")
            })?
            .unwrap_or(false),
        Some(v) => {
            return Err(OpenAiError::invalid(
                "stream_options",
                format!("invalid stream_options: expected an object, got {v}"),
            ));
        }
    };
    let params = GenerationParams { sampling, max_tokens: 0, stop, ignore_eos, ..Default::default() };
    Ok(Common { max_tokens: max_tokens.map(|x| x as usize), params, stream, include_usage, logprobs })
}

fn parse_messages(f: &Fields) -> ApiResult<Vec<ChatMessage>> {
    let Some(v) = f.get("messages") else {
        return Err(OpenAiError::invalid("messages", "invalid messages: missing (a list of {role, content} objects)"));
    };
    let Value::Array(list) = v else {
        return Err(OpenAiError::invalid("messages", format!("invalid messages: expected a list, got {v}")));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(OpenAiError::invalid("messages", format!("invalid messages: message {i} is not an object")));
        };
        let Some(Value::String(role)) = m.get("role") else {
            return Err(OpenAiError::invalid("messages", format!("invalid messages: message {i} has no role string")));
        };
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            // The content-parts form: concatenate the text parts.
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => s.push_str(t),
                        _ => {
                            return Err(OpenAiError::invalid(
                                "messages",
                                format!("invalid messages: message {i} has a content part that is not text"),
                            ));
                        }
                    }
                }
                s
            }
            Some(v) => {
                return Err(OpenAiError::invalid(
                    "messages",
                    format!("invalid messages: message {i} content must be a string, got {v}"),
                ));
            }
        };
        out.push(ChatMessage::new(role.clone(), content));
    }
    Ok(out)
}

fn parse_prompt(f: &Fields) -> ApiResult<String> {
    match f.get("prompt") {
        None => Err(OpenAiError::invalid("prompt", "invalid prompt: missing")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => Ok(a[0].as_str().unwrap_or_default().to_string()),
        Some(Value::Array(_)) => {
            Err(OpenAiError::invalid("prompt", "invalid prompt: only a string or a list of one string is supported"))
        }
        Some(v) => Err(OpenAiError::invalid("prompt", format!("invalid prompt: expected a string, got {v}"))),
    }
}

// ---------------------------------------------------------------------------------------------
// Responses.

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

fn piece(tok: &dyn Tokenizer, id: u32) -> String {
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
    let finish = finish_str(response.finish_reason);
    Ok(match req.endpoint {
        Endpoint::Chat => {
            let logprobs = req.logprobs.map(|top| chat_logprobs(tok, &response.logprobs, top)).unwrap_or(Value::Null);
            json!({
                "id": id, "object": "chat.completion", "created": created, "model": model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": response.text},
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
            tokenizer,
            endpoint: req.endpoint,
            include_usage: req.include_usage,
            logprobs: req.logprobs,
            id,
            created,
            model,
            offset: 0,
            started: false,
            finished: false,
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
        if !c.text.is_empty() || !logprobs.is_null() {
            let choice = if chat {
                json!({"index": 0, "delta": {"content": c.text}, "logprobs": logprobs, "finish_reason": null})
            } else {
                json!({"index": 0, "text": c.text, "logprobs": logprobs, "finish_reason": null})
            };
            out.push(self.chunk(json!([choice]), None));
        }
        if let Some(reason) = c.finish_reason {
            if reason == FinishReason::Error {
                out.push(engine_failed().body());
            } else {
                let choice = if chat {
                    json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_str(reason)})
                } else {
                    json!({"index": 0, "text": "", "logprobs": null, "finish_reason": finish_str(reason)})
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

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    fn chat(extra: Value) -> Map<String, Value> {
        let mut m = body(json!({"messages": [{"role": "user", "content": "hi"}]}));
        m.extend(body(extra));
        m
    }

    fn completion(extra: Value) -> Map<String, Value> {
        let mut m = body(json!({"prompt": "hi"}));
        m.extend(body(extra));
        m
    }

    /// Parse and resolve with no engine: a 100-token context and a 3-token prompt.
    fn full(endpoint: Endpoint, m: &Map<String, Value>) -> ApiResult<OpenAiRequest> {
        parse(endpoint, m)?.resolve(100, Some(3))
    }

    fn tiny_tokenizer() -> Arc<dyn Tokenizer> {
        let meta: crate::model::gguf::Metadata =
            crate::model::tiny::tokenizer_metadata().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        Arc::new(crate::tokenizer::HfTokenizer::from_gguf_metadata(&meta).unwrap())
    }

    #[track_caller]
    fn assert_invalid(r: ApiResult<impl std::fmt::Debug>, param: Option<&str>, needle: &str) {
        let e = r.unwrap_err();
        assert_eq!(e.kind, "invalid_request_error", "{e:?}");
        assert_eq!(e.param.as_deref(), param, "{e:?}");
        assert!(e.message.contains(needle), "{e:?} should mention {needle:?}");
        let b = e.body();
        assert_eq!(b["error"]["message"], e.message);
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert!(b["error"].get("code").is_some());
    }

    #[test]
    fn bodies_must_be_json_objects() {
        assert_invalid(parse_body(b"{\"messages\": ["), None, "not valid JSON");
        assert_invalid(parse_body(b"[1, 2]"), None, "must be a JSON object");
        assert_eq!(parse_body(b"{\"a\": 1}").unwrap()["a"], 1);
    }

    #[test]
    fn wrong_types_name_the_field() {
        let cases = [
            ("temperature", json!("hot"), "expected a number"),
            ("top_p", json!([]), "expected a number"),
            ("max_tokens", json!(1.5), "expected an integer"),
            ("max_tokens", json!(-5), "must not be negative"),
            ("max_completion_tokens", json!("8"), "expected an integer"),
            ("seed", json!("x"), "expected an integer"),
            ("stream", json!("yes"), "expected true or false"),
            ("stop", json!(7), "a string or a list of strings"),
            ("stop", json!(["a", 1]), "a string or a list of strings"),
            ("user", json!(3), "expected a string"),
            ("model", json!(3), "expected a string"),
            ("stream_options", json!(true), "expected an object"),
            ("logprobs", json!(1), "expected true or false"),
        ];
        for (field, value, needle) in cases {
            assert_invalid(full(Endpoint::Chat, &chat(json!({ field: value }))), Some(field), needle);
        }
        assert_invalid(
            full(Endpoint::Chat, &chat(json!({"stream_options": {"include_usage": 1}}))),
            Some("stream_options"),
            "include_usage",
        );
        assert_invalid(
            full(Endpoint::Completion, &completion(json!({"logprobs": true}))),
            Some("logprobs"),
            "expected an integer",
        );
        assert_invalid(requested_model(&chat(json!({"model": false}))), Some("model"), "expected a string");
        // null is absent.
        assert!(full(Endpoint::Chat, &chat(json!({"temperature": null, "stop": null}))).is_ok());
    }

    #[test]
    fn only_one_choice() {
        assert_invalid(full(Endpoint::Chat, &chat(json!({"n": 2}))), Some("n"), "only n=1");
        assert_invalid(
            full(Endpoint::Completion, &completion(json!({"best_of": 3}))),
            Some("best_of"),
            "only best_of=1",
        );
        assert!(full(Endpoint::Chat, &chat(json!({"n": 1}))).is_ok());
    }

    #[test]
    fn logprob_options() {
        assert_invalid(
            full(Endpoint::Chat, &chat(json!({"top_logprobs": 2}))),
            Some("top_logprobs"),
            "set logprobs to true",
        );
        assert_invalid(
            full(Endpoint::Chat, &chat(json!({"logprobs": true, "top_logprobs": 21}))),
            Some("top_logprobs"),
            "at most 20",
        );
        assert_invalid(
            full(Endpoint::Completion, &completion(json!({"logprobs": 21}))),
            Some("logprobs"),
            "at most 20",
        );
        let r = full(Endpoint::Chat, &chat(json!({"logprobs": true}))).unwrap();
        assert_eq!(r.logprobs, Some(0));
        assert_eq!(r.request.params.sampling.top_logprobs, 1, "the engine needs at least one alternative");
        let r = full(Endpoint::Chat, &chat(json!({"logprobs": true, "top_logprobs": 5}))).unwrap();
        assert_eq!((r.logprobs, r.request.params.sampling.top_logprobs), (Some(5), 5));
        assert_eq!(full(Endpoint::Chat, &chat(json!({"logprobs": false}))).unwrap().logprobs, None);
        assert_eq!(full(Endpoint::Completion, &completion(json!({"logprobs": 3}))).unwrap().logprobs, Some(3));
    }

    #[test]
    fn bad_messages() {
        let cases = [
            (json!({}), "missing"),
            (json!({"messages": "hi"}), "expected a list"),
            (json!({"messages": [1]}), "message 0 is not an object"),
            (json!({"messages": [{"content": "hi"}]}), "message 0 has no role string"),
            (json!({"messages": [{"role": "user", "content": 5}]}), "content must be a string"),
            (json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), "not text"),
            // Found by the engine's validation.
            (json!({"messages": []}), "there are no messages"),
            (json!({"messages": [{"role": "wizard", "content": "hi"}]}), "unknown role"),
        ];
        for (b, needle) in cases {
            assert_invalid(full(Endpoint::Chat, &body(b)), Some("messages"), needle);
        }
        let parts = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, {"role": "assistant"}]});
        let r = full(Endpoint::Chat, &body(parts)).unwrap();
        assert_eq!(r.request.prompt, Prompt::Chat(vec![ChatMessage::user("ab"), ChatMessage::new("assistant", "")]));
    }

    #[test]
    fn bad_prompts() {
        assert_invalid(full(Endpoint::Completion, &body(json!({}))), Some("prompt"), "missing");
        assert_invalid(full(Endpoint::Completion, &body(json!({"prompt": 5}))), Some("prompt"), "expected a string");
        assert_invalid(
            full(Endpoint::Completion, &body(json!({"prompt": ["a", "b"]}))),
            Some("prompt"),
            "list of one string",
        );
        assert_invalid(full(Endpoint::Completion, &body(json!({"prompt": ""}))), Some("prompt"), "empty");
        assert_invalid(full(Endpoint::Completion, &completion(json!({"echo": true}))), Some("echo"), "not supported");
        let r = full(Endpoint::Completion, &body(json!({"prompt": ["once"]}))).unwrap();
        assert_eq!(r.request.prompt, Prompt::Text("once".into()));
    }

    #[test]
    fn the_first_error_is_stable() {
        // The model's type, then the messages, then the rest.
        let m = body(json!({"model": 1, "messages": "x", "n": 2}));
        assert_eq!(parse(Endpoint::Chat, &m).unwrap_err().param.as_deref(), Some("model"));
        let m = body(json!({"messages": "x", "n": 2}));
        assert_eq!(parse(Endpoint::Chat, &m).unwrap_err().param.as_deref(), Some("messages"));
    }

    #[test]
    fn fields_and_defaults() {
        let r = full(
            Endpoint::Chat,
            &chat(json!({
                "model": "m", "temperature": 0, "top_p": 0.5, "top_k": -1, "min_p": 0.1, "seed": 7,
                "stop": "x", "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
                "max_completion_tokens": 9, "max_tokens": 99,
            })),
        )
        .unwrap();
        assert_eq!(r.endpoint, Endpoint::Chat);
        assert_eq!(r.model.as_deref(), Some("m"));
        assert!(r.stream && r.include_usage);
        let p = &r.request.params;
        assert_eq!(p.max_tokens, 9, "max_completion_tokens wins");
        assert_eq!(
            (p.sampling.temperature, p.sampling.top_p, p.sampling.top_k, p.sampling.min_p, p.sampling.seed),
            (0.0, 0.5, 0, 0.1, Some(7))
        );
        assert_eq!(p.stop, vec!["x".to_string()]);
        assert!(p.ignore_eos);

        let r = full(Endpoint::Completion, &completion(json!({}))).unwrap();
        assert_eq!(r.request.params.sampling.temperature, 1.0, "OpenAI's default temperature");
        assert!(!r.stream && !r.include_usage && r.model.is_none() && r.logprobs.is_none());
        // The default max_tokens: the rest of the context, capped.
        let p = || parse(Endpoint::Completion, &completion(json!({}))).unwrap();
        assert_eq!(p().resolve(100, Some(3)).unwrap().request.params.max_tokens, 97);
        assert_eq!(p().resolve(10_000, Some(3)).unwrap().request.params.max_tokens, DEFAULT_MAX_TOKENS_CAP);
        assert_eq!(p().resolve(100, Some(100)).unwrap().request.params.max_tokens, 1);
        assert_eq!(p().resolve(100, None).unwrap().request.params.max_tokens, 1);
        // max_tokens 0 is refused by validation, naming the field.
        assert_invalid(
            full(Endpoint::Completion, &completion(json!({"max_tokens": 0}))),
            Some("max_tokens"),
            "at least 1",
        );
        assert_invalid(
            full(Endpoint::Completion, &completion(json!({"temperature": -1}))),
            Some("temperature"),
            "temperature",
        );
    }

    #[test]
    fn engine_errors_keep_their_kind() {
        let e = OpenAiError::from_engine(WeftError::Unsupported("invalid top_p: 2 (must be in (0, 1])".into()));
        assert_eq!((e.kind, e.param.as_deref()), ("invalid_request_error", Some("top_p")));
        let e = OpenAiError::from_engine(WeftError::Unsupported("invalid request: nothing to do".into()));
        assert_eq!((e.kind, e.param.as_deref()), ("invalid_request_error", None));
        let e = OpenAiError::from_engine(WeftError::Unsupported("the engine was shut down".into()));
        assert_eq!(e.kind, "service_unavailable");
        let e = OpenAiError::from_engine(WeftError::Readback("lost".into()));
        assert_eq!(e.kind, "internal_error");
        assert_eq!(e.to_string(), e.message);
        assert_eq!(
            e.body(),
            json!({"error": {"message": e.message, "type": "internal_error", "param": null, "code": null}})
        );
    }

    #[test]
    fn ids_are_unique_and_prefixed() {
        let a = request_id(Endpoint::Chat);
        let b = request_id(Endpoint::Chat);
        assert!(a.starts_with("chatcmpl-") && a != b, "{a} {b}");
        assert!(request_id(Endpoint::Completion).starts_with("cmpl-"));
        assert!(unix_now() > 1_600_000_000);
    }

    fn lp(token: u32) -> TokenLogprob {
        TokenLogprob { token, logprob: -0.5, top: vec![(token, -0.5), (token + 1, -1.5), (token + 2, -2.5)] }
    }

    fn response(finish_reason: FinishReason) -> InferenceResponse {
        let usage = Usage { prompt_tokens: 3, completion_tokens: 2, cached_prompt_tokens: 1 };
        InferenceResponse {
            text: "ab".into(),
            token_ids: vec![66, 67],
            logprobs: vec![lp(66), lp(67)],
            finish_reason,
            usage,
        }
    }

    #[test]
    fn whole_responses() {
        let tok = tiny_tokenizer();
        let req = full(Endpoint::Chat, &chat(json!({"logprobs": true, "top_logprobs": 2}))).unwrap();
        let v = response_json_with(tok.as_ref(), &req, "chatcmpl-1", 5, "tiny", &response(FinishReason::Eos)).unwrap();
        assert_eq!(
            (v["id"].as_str(), v["object"].as_str(), v["created"].as_u64(), v["model"].as_str()),
            (Some("chatcmpl-1"), Some("chat.completion"), Some(5), Some("tiny"))
        );
        let c = &v["choices"][0];
        assert_eq!(c["message"], json!({"role": "assistant", "content": "ab"}));
        assert_eq!(c["finish_reason"], "stop");
        let first = &c["logprobs"]["content"][0];
        assert_eq!(first["token"].as_str().unwrap(), piece(tok.as_ref(), 66));
        assert_eq!(first["top_logprobs"].as_array().unwrap().len(), 2);
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}})
        );

        let req = full(Endpoint::Completion, &completion(json!({"logprobs": 1}))).unwrap();
        let v = response_json_with(tok.as_ref(), &req, "cmpl-1", 5, "tiny", &response(FinishReason::Length)).unwrap();
        assert_eq!(v["object"], "text_completion");
        let c = &v["choices"][0];
        assert_eq!((c["text"].as_str(), c["finish_reason"].as_str()), (Some("ab"), Some("length")));
        let l = &c["logprobs"];
        let len0 = piece(tok.as_ref(), 66).len();
        assert_eq!(l["text_offset"], json!([0, len0]));
        assert_eq!(l["top_logprobs"][0].as_object().unwrap().len(), 1);
        let req = full(Endpoint::Completion, &completion(json!({}))).unwrap();
        assert!(response_json_with(tok.as_ref(), &req, "cmpl-1", 5, "tiny", &response(FinishReason::Stop)).unwrap()["choices"][0]["logprobs"].is_null());

        let e =
            response_json_with(tok.as_ref(), &req, "cmpl-1", 5, "tiny", &response(FinishReason::Error)).unwrap_err();
        assert_eq!(e.kind, "internal_error");
    }

    fn chunk(text: &str, finish_reason: Option<FinishReason>) -> StreamChunk {
        let usage = finish_reason.map(|_| Usage { prompt_tokens: 3, completion_tokens: 2, cached_prompt_tokens: 0 });
        StreamChunk { text: text.into(), token_ids: vec![66], logprobs: vec![lp(66)], finish_reason, usage }
    }

    #[test]
    fn streamed_chat_chunks() {
        let req =
            full(Endpoint::Chat, &chat(json!({"stream": true, "stream_options": {"include_usage": true}}))).unwrap();
        let mut s = ChunkShaper::with_tokenizer(tiny_tokenizer(), &req, "chatcmpl-1".into(), 5, "tiny".into());
        let out = s.shape(Ok(chunk("a", None)));
        assert_eq!(out.len(), 2, "the role first: {out:?}");
        assert_eq!(out[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(out[0]["object"], "chat.completion.chunk");
        assert_eq!(
            out[1]["choices"][0],
            json!({"index": 0, "delta": {"content": "a"}, "logprobs": null, "finish_reason": null})
        );
        assert!(!s.finished());
        // An empty chunk without log-probabilities sends nothing.
        assert!(s.shape(Ok(chunk("", None))).is_empty());
        let out = s.shape(Ok(chunk("b", Some(FinishReason::Stop))));
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(out[1]["choices"][0], json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"}));
        assert!(out[1].get("usage").is_none());
        assert_eq!(out[2]["choices"], json!([]));
        assert_eq!(out[2]["usage"]["total_tokens"], 5);
        assert!(s.finished());
        assert!(s.shape(Ok(chunk("c", None))).is_empty(), "nothing after the finish");
    }

    #[test]
    fn streamed_completion_chunks() {
        let tok = tiny_tokenizer();
        let req = full(Endpoint::Completion, &completion(json!({"stream": true, "logprobs": 2}))).unwrap();
        let mut s = ChunkShaper::with_tokenizer(tok.clone(), &req, "cmpl-1".into(), 5, "tiny".into());
        assert!(s.start().is_empty(), "completions have no role chunk");
        let out = s.shape(Ok(chunk("", None)));
        assert_eq!(out.len(), 1, "log-probabilities alone make a chunk");
        assert_eq!(out[0]["object"], "text_completion");
        assert_eq!(out[0]["choices"][0]["logprobs"]["text_offset"], json!([0]));
        let out = s.shape(Ok(chunk("b", Some(FinishReason::Eos))));
        assert_eq!(
            out[0]["choices"][0]["logprobs"]["text_offset"],
            json!([piece(tok.as_ref(), 66).len()]),
            "offsets run on across chunks"
        );
        assert_eq!(out[1]["choices"][0], json!({"index": 0, "text": "", "logprobs": null, "finish_reason": "stop"}));
        assert_eq!(out.len(), 2, "no usage chunk unless asked");
        assert!(s.finished());
    }

    #[test]
    fn streamed_errors() {
        let req = full(Endpoint::Chat, &chat(json!({"stream": true}))).unwrap();
        let mut s = ChunkShaper::with_tokenizer(tiny_tokenizer(), &req, "chatcmpl-1".into(), 5, "tiny".into());
        assert_eq!(s.start().len(), 1);
        assert!(s.start().is_empty(), "the role is sent once");
        let out = s.shape(Err(WeftError::Unsupported("the engine was shut down".into())));
        assert_eq!(out, vec![OpenAiError::unavailable("the engine was shut down").body()]);
        assert!(s.finished());

        let mut s = ChunkShaper::with_tokenizer(tiny_tokenizer(), &req, "chatcmpl-1".into(), 5, "tiny".into());
        let out = s.shape(Ok(chunk("", Some(FinishReason::Error))));
        assert_eq!(out.last().unwrap()["error"]["type"], "internal_error");
        assert!(s.finished());
    }

    /// Against a tiny engine on the GPU: the default max_tokens, and a request end to end.
    #[test]
    fn against_a_tiny_engine() {
        use crate::engine::EngineConfig;
        use crate::gpu::{GpuOptions, GpuTensorFactory};
        use futures::StreamExt;

        let Some(ctx) = crate::gpu::open_or_skip(GpuOptions::default()).unwrap() else { return };
        let f = GpuTensorFactory::new(ctx);
        let c = crate::model::tiny::tiny_config();
        let w = crate::model::tiny::random_weights(&c, 21, crate::DType::Q8_0);
        let files = crate::model::load::ModelFiles::from_gguf_bytes(
            "tiny.gguf",
            crate::model::tiny::gguf_bytes(&c, &w, crate::DType::Q8_0),
        )
        .unwrap();
        let exec = files.executor(&f, crate::kv::KvCacheConfig { block_size: 4, num_blocks: 64 }).unwrap();
        let config = EngineConfig { max_model_len: 64, ..EngineConfig::default() };
        let engine = ContinuousBatchEngine::new_plan_runtime(
            config,
            files.tokenizer.clone(),
            Arc::new(crate::sampling::GpuSampler),
            Arc::new(exec),
            Arc::new(f.clone()),
        )
        .unwrap();

        let b = completion(json!({"prompt": "abc"}));
        let n = prompt_tokens(engine.tokenizer().as_ref(), &Prompt::Text("abc".into())).unwrap();
        let max_len = engine.config().max_model_len;
        let r = parse_request(&engine, Endpoint::Completion, &b).unwrap();
        assert_eq!(r.request.params.max_tokens, (max_len - n).min(DEFAULT_MAX_TOKENS_CAP));
        let r = parse_request(&engine, Endpoint::Chat, &chat(json!({}))).unwrap();
        assert!(r.request.params.max_tokens < max_len - n, "the chat template's tokens count");
        assert_invalid(parse_request(&engine, Endpoint::Chat, &chat(json!({"n": 3}))), Some("n"), "only n=1");

        let b = chat(
            json!({"max_tokens": 3, "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 2, "stream": true}),
        );
        let r = parse_request(&engine, Endpoint::Chat, &b).unwrap();
        let whole = crate::rt::block_on(engine.infer(r.request.clone())).unwrap();
        let v = response_json(&engine, &r, "chatcmpl-1", 5, "tiny", &whole).unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["choices"][0]["logprobs"]["content"].as_array().unwrap().len(), 3);
        assert_eq!(v["usage"]["completion_tokens"], 3);

        let mut shaper = ChunkShaper::new(engine.clone(), &r, "chatcmpl-2".into(), 5, "tiny".into());
        let mut stream = Box::pin(engine.infer_stream(r.request.clone()).unwrap());
        let mut chunks = shaper.start();
        while !shaper.finished() {
            let Some(item) = crate::rt::block_on(stream.next()) else { break };
            chunks.extend(shaper.shape(item));
        }
        assert!(shaper.finished());
        let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(text, whole.text, "streamed and whole agree");
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
    }
}
