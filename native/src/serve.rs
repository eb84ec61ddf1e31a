//! `weft serve`: an OpenAI-compatible HTTP server (axum + tokio) over one engine.
//!
//! The socket is bound first and the model loads in the background: until it is ready every
//! endpoint but `/metrics` answers 503. Requests map onto `InferenceRequest`s; streaming
//! responses are the engine's stream turned into server-sent events, so a client that goes away
//! drops the stream, which cancels the request and frees its KV blocks at the next step.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use serde_json::{Map, Value, json};
use weft::engine::api::{EngineBuilder, InferenceEngine, LlmInferenceEngine};
use weft::engine::{ContinuousBatchEngine, EngineConfig};
use weft::engine::metrics::{EngineMetrics, Histogram};
use weft::engine::request::{FinishReason, GenerationParams, InferenceRequest, Prompt, StreamChunk, TokenLogprob, Usage};
use weft::sampling::SamplingParams;
use weft::tokenizer::ChatMessage;
use weft::{Result, WeftError};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// `max_tokens` when a request names none: the rest of the context, at most this many.
pub const DEFAULT_MAX_TOKENS_CAP: usize = 256;
/// Requests are refused (503 + Retry-After) while more than this many times `max_num_seqs`
/// requests wait.
pub const WAITING_FACTOR: usize = 4;

pub struct Options {
    pub model: Option<PathBuf>,
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    pub kv_memory_bytes: usize,
    pub enable_prefix_cache: bool,
}

/// Parse "256MiB", "1GiB", "512MB", "1048576" into bytes.
pub fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("{s:?} is not a size (e.g. 256MiB)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown size unit {other:?} in {s:?} (B, KiB, MiB, GiB, KB, MB, GB)")),
    };
    Ok((value * mult) as usize)
}

enum Loading {
    Loading,
    Failed(String),
}

struct AppState {
    engine: OnceLock<ContinuousBatchEngine>,
    loading: Mutex<Loading>,
    model_id: String,
    model_path: String,
    api_key: Option<String>,
    created: u64,
}

type Shared = Arc<AppState>;

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn request_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{prefix}-{:x}{:04x}", t as u64, n & 0xffff)
}

// ---------------------------------------------------------------------------------------------
// Errors in OpenAI's shape.

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
    retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after: None }
    }
    fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError { param: Some(param.to_string()), ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message) }
    }
    fn bad_body(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
    fn unavailable(message: impl Into<String>) -> Self {
        ApiError { retry_after: Some(1), ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", message) }
    }
    fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }

    /// An engine error: validation errors ("invalid <field>: ...") are the caller's fault.
    fn from_engine(e: WeftError) -> Self {
        match &e {
            WeftError::Unsupported(m) if m.starts_with("invalid ") => {
                let field = m["invalid ".len()..].split(':').next().unwrap_or("").trim().to_string();
                let field = if field == "request" { None } else { Some(field) };
                ApiError { param: field, ..Self::bad_body(m.clone()) }
            }
            WeftError::Unsupported(m) if m.contains("shut down") => Self::unavailable(m.clone()),
            _ => Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

type ApiResult<T> = std::result::Result<T, ApiError>;

// ---------------------------------------------------------------------------------------------
// Reading request fields: every known field is type-checked and named in the error.

struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn get(&self, k: &str) -> Option<&'a Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }
    fn f32(&self, k: &str) -> ApiResult<Option<f32>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_f64().map(|x| Some(x as f32)).ok_or_else(|| ApiError::bad(k, format!("invalid {k}: expected a number, got {v}"))),
        }
    }
    fn int(&self, k: &str) -> ApiResult<Option<i64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_i64().map(Some).ok_or_else(|| ApiError::bad(k, format!("invalid {k}: expected an integer, got {v}"))),
        }
    }
    fn uint(&self, k: &str) -> ApiResult<Option<u64>> {
        match self.int(k)? {
            Some(x) if x < 0 => Err(ApiError::bad(k, format!("invalid {k}: {x} (must not be negative)"))),
            x => Ok(x.map(|x| x as u64)),
        }
    }
    fn bool(&self, k: &str) -> ApiResult<Option<bool>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| ApiError::bad(k, format!("invalid {k}: expected true or false, got {v}"))),
        }
    }
    fn string(&self, k: &str) -> ApiResult<Option<&'a str>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| ApiError::bad(k, format!("invalid {k}: expected a string, got {v}"))),
        }
    }
    /// A string or a list of strings.
    fn strings(&self, k: &str) -> ApiResult<Vec<String>> {
        match self.get(k) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_string).ok_or_else(|| ApiError::bad(k, format!("invalid {k}: expected a string or a list of strings"))))
                .collect(),
            Some(v) => Err(ApiError::bad(k, format!("invalid {k}: expected a string or a list of strings, got {v}"))),
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

fn parse_body(body: std::result::Result<Bytes, BytesRejection>) -> ApiResult<Map<String, Value>> {
    let bytes = body.map_err(|r| {
        let status = r.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(status, "invalid_request_error", format!("the request body is larger than {MAX_BODY_BYTES} bytes"))
        } else {
            ApiError::new(status, "invalid_request_error", r.body_text())
        }
    })?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_body("the request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_body(format!("the request body is not valid JSON: {e}"))),
    }
}

fn parse_common(f: &Fields, chat: bool) -> ApiResult<Common> {
    if let Some(n) = f.int("n")?
        && n != 1
    {
        return Err(ApiError::bad("n", format!("invalid n: {n}; only n=1 is supported")));
    }
    if let Some(b) = f.int("best_of")?
        && b != 1
    {
        return Err(ApiError::bad("best_of", format!("invalid best_of: {b}; only best_of=1 is supported")));
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
            return Err(ApiError::bad("top_logprobs", "invalid top_logprobs: set logprobs to true to use top_logprobs"));
        }
        on.then(|| top.unwrap_or(0) as usize)
    } else {
        f.uint("logprobs")?.map(|x| x as usize)
    };
    if let Some(top) = logprobs {
        if top > 20 {
            return Err(ApiError::bad(if chat { "top_logprobs" } else { "logprobs" }, format!("invalid top_logprobs: {top} (at most 20)")));
        }
        // The engine reports log-probabilities only when alternatives are asked for.
        sampling.top_logprobs = top.max(1);
    }
    let stop = f.strings("stop")?;
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o).bool("include_usage").map_err(|_| ApiError::bad("stream_options", "invalid stream_options: include_usage must be true or false"))?.unwrap_or(false),
        Some(v) => return Err(ApiError::bad("stream_options", format!("invalid stream_options: expected an object, got {v}"))),
    };
    let params = GenerationParams { sampling, max_tokens: 0, stop, ignore_eos, ..Default::default() };
    Ok(Common { max_tokens: max_tokens.map(|x| x as usize), params, stream, include_usage, logprobs })
}

fn parse_messages(f: &Fields) -> ApiResult<Vec<ChatMessage>> {
    let Some(v) = f.get("messages") else {
        return Err(ApiError::bad("messages", "invalid messages: missing (a list of {role, content} objects)"));
    };
    let Value::Array(list) = v else {
        return Err(ApiError::bad("messages", format!("invalid messages: expected a list, got {v}")));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(ApiError::bad("messages", format!("invalid messages: message {i} is not an object")));
        };
        let Some(Value::String(role)) = m.get("role") else {
            return Err(ApiError::bad("messages", format!("invalid messages: message {i} has no role string")));
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
                        _ => return Err(ApiError::bad("messages", format!("invalid messages: message {i} has a content part that is not text"))),
                    }
                }
                s
            }
            Some(v) => return Err(ApiError::bad("messages", format!("invalid messages: message {i} content must be a string, got {v}"))),
        };
        out.push(ChatMessage::new(role.clone(), content));
    }
    Ok(out)
}

fn parse_prompt(f: &Fields) -> ApiResult<String> {
    match f.get("prompt") {
        None => Err(ApiError::bad("prompt", "invalid prompt: missing")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => Ok(a[0].as_str().unwrap_or_default().to_string()),
        Some(Value::Array(_)) => Err(ApiError::bad("prompt", "invalid prompt: only a string or a list of one string is supported")),
        Some(v) => Err(ApiError::bad("prompt", format!("invalid prompt: expected a string, got {v}"))),
    }
}

// ---------------------------------------------------------------------------------------------
// Handlers.

fn ready(state: &AppState) -> ApiResult<&ContinuousBatchEngine> {
    if let Some(e) = state.engine.get() {
        return Ok(e);
    }
    match &*state.loading.lock().unwrap_or_else(|p| p.into_inner()) {
        Loading::Loading => Err(ApiError::unavailable("the model is still loading")),
        Loading::Failed(e) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", format!("the model failed to load: {e}"))),
    }
}

fn check_model(state: &AppState, f: &Fields) -> ApiResult<()> {
    match f.string("model")? {
        None => Ok(()),
        Some(m) if m == state.model_id || m == state.model_path => Ok(()),
        Some(m) => Err(ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", format!("The model `{m}` does not exist; this server serves `{}`", state.model_id))
        }),
    }
}

fn check_queue(engine: &ContinuousBatchEngine) -> ApiResult<()> {
    let a = engine.admission_snapshot();
    let limit = WAITING_FACTOR * a.max_num_seqs;
    if a.waiting >= limit {
        return Err(ApiError::unavailable(format!("the server is overloaded: {} requests are waiting (limit {limit}); retry later", a.waiting)));
    }
    Ok(())
}

/// The prompt's length in tokens, as the engine will count it (None if it cannot be counted).
fn prompt_tokens(engine: &ContinuousBatchEngine, prompt: &Prompt) -> Option<usize> {
    let tok = engine.tokenizer();
    match prompt {
        Prompt::Text(t) => tok.encode(t, true).ok().map(|v| v.len()),
        Prompt::Tokens(t) => Some(t.len()),
        Prompt::Chat(m) => {
            let text = tok.chat_template()?.render(m, true).ok()?;
            tok.encode(&text, false).ok().map(|v| v.len())
        }
    }
}

fn build_request(engine: &ContinuousBatchEngine, prompt: Prompt, mut common: Common) -> ApiResult<(InferenceRequest, Common)> {
    common.params.max_tokens = match common.max_tokens {
        Some(x) => x,
        None => {
            let max_len = engine.config().max_model_len;
            match prompt_tokens(engine, &prompt) {
                // The rest of the context, capped; a prompt over the context is the engine's to refuse.
                Some(n) if n < max_len => (max_len - n).min(DEFAULT_MAX_TOKENS_CAP),
                _ => 1,
            }
        }
    };
    let request = InferenceRequest::new(prompt, common.params.clone());
    request.validate().map_err(ApiError::from_engine)?;
    Ok((request, common))
}

fn finish_str(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop | FinishReason::Eos => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "abort",
        FinishReason::Error => "error",
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
    })
}

fn piece(engine: &ContinuousBatchEngine, id: u32) -> String {
    engine.tokenizer().decode(&[id], false).unwrap_or_default()
}

fn chat_logprobs(engine: &ContinuousBatchEngine, lps: &[TokenLogprob], top: usize) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let t = piece(engine, l.token);
            let tops: Vec<Value> = l.top.iter().take(top).map(|(id, lp)| {
                let s = piece(engine, *id);
                json!({"token": s, "logprob": lp, "bytes": s.as_bytes()})
            }).collect();
            json!({"token": t, "logprob": l.logprob, "bytes": t.as_bytes(), "top_logprobs": tops})
        })
        .collect();
    json!({ "content": content })
}

fn completion_logprobs(engine: &ContinuousBatchEngine, lps: &[TokenLogprob], top: usize, offset: &mut usize) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for l in lps {
        let t = piece(engine, l.token);
        offsets.push(*offset);
        *offset += t.len();
        tokens.push(t);
        token_logprobs.push(l.logprob);
        let m: Map<String, Value> = l.top.iter().take(top).map(|(id, lp)| (piece(engine, *id), json!(lp))).collect();
        tops.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets})
}

async fn chat_completions(State(state): State<Shared>, body: std::result::Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let map = parse_body(body)?;
    let f = Fields(&map);
    let engine = ready(&state)?.clone();
    check_model(&state, &f)?;
    let messages = parse_messages(&f)?;
    let common = parse_common(&f, true)?;
    let (request, common) = build_request(&engine, Prompt::Chat(messages), common)?;
    check_queue(&engine)?;
    generate(state, engine, request, common, true).await
}

async fn completions(State(state): State<Shared>, body: std::result::Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let map = parse_body(body)?;
    let f = Fields(&map);
    let engine = ready(&state)?.clone();
    check_model(&state, &f)?;
    let prompt = parse_prompt(&f)?;
    if f.bool("echo")?.unwrap_or(false) {
        return Err(ApiError::bad("echo", "invalid echo: echo is not supported"));
    }
    let common = parse_common(&f, false)?;
    let (request, common) = build_request(&engine, Prompt::Text(prompt), common)?;
    check_queue(&engine)?;
    generate(state, engine, request, common, false).await
}

async fn generate(state: Shared, engine: ContinuousBatchEngine, request: InferenceRequest, common: Common, chat: bool) -> ApiResult<Response> {
    let id = request_id(if chat { "chatcmpl" } else { "cmpl" });
    let created = now_secs();
    let model = state.model_id.clone();
    if common.stream {
        let stream = LlmInferenceEngine::infer_stream(&engine, request).map_err(ApiError::from_engine)?;
        let sse = SseState {
            engine: engine.clone(),
            stream: Some(stream),
            pending: VecDeque::new(),
            id,
            created,
            model,
            chat,
            include_usage: common.include_usage,
            logprobs: common.logprobs,
            offset: 0,
            started: false,
        };
        let events = futures::stream::unfold(sse, |mut s| async move {
            loop {
                if let Some(e) = s.pending.pop_front() {
                    return Some((Ok::<Event, std::convert::Infallible>(e), s));
                }
                s.stream.as_ref()?;
                s.next_events().await;
            }
        });
        return Ok(Sse::new(events).into_response());
    }
    let response = LlmInferenceEngine::infer(&engine, request).await.map_err(ApiError::from_engine)?;
    if response.finish_reason == FinishReason::Error {
        return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", "the request failed in the engine"));
    }
    let finish = finish_str(response.finish_reason);
    let body = if chat {
        let logprobs = common.logprobs.map(|top| chat_logprobs(&engine, &response.logprobs, top)).unwrap_or(Value::Null);
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
    } else {
        let logprobs = common.logprobs.map(|top| completion_logprobs(&engine, &response.logprobs, top, &mut 0)).unwrap_or(Value::Null);
        json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": response.text, "logprobs": logprobs, "finish_reason": finish}],
            "usage": usage_json(&response.usage),
        })
    };
    Ok(Json(body).into_response())
}

/// The state of one streamed response: the engine's stream and the events not yet sent.
struct SseState {
    engine: ContinuousBatchEngine,
    stream: Option<weft::rt::BoxStream<'static, Result<StreamChunk>>>,
    pending: VecDeque<Event>,
    id: String,
    created: u64,
    model: String,
    chat: bool,
    include_usage: bool,
    logprobs: Option<usize>,
    offset: usize,
    started: bool,
}

impl SseState {
    fn chunk(&self, choices: Value, usage: Option<&Usage>) -> Event {
        let object = if self.chat { "chat.completion.chunk" } else { "text_completion" };
        let mut v = json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = usage_json(u);
        }
        Event::default().data(v.to_string())
    }

    fn done(&mut self) {
        self.pending.push_back(Event::default().data("[DONE]"));
        self.stream = None;
    }

    /// Wait for the engine's next chunk and queue the events it makes.
    async fn next_events(&mut self) {
        if self.chat && !self.started {
            self.started = true;
            let e = self.chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]), None);
            self.pending.push_back(e);
            return;
        }
        let Some(stream) = self.stream.as_mut() else { return };
        match stream.next().await {
            None => self.done(),
            Some(Err(e)) => {
                let err = ApiError::from_engine(e);
                self.pending.push_back(Event::default().data(err.body().to_string()));
                self.done();
            }
            Some(Ok(c)) => {
                let logprobs = match self.logprobs {
                    Some(top) if !c.logprobs.is_empty() => {
                        if self.chat {
                            chat_logprobs(&self.engine, &c.logprobs, top)
                        } else {
                            completion_logprobs(&self.engine, &c.logprobs, top, &mut self.offset)
                        }
                    }
                    _ => Value::Null,
                };
                if !c.text.is_empty() || !logprobs.is_null() {
                    let choice = if self.chat {
                        json!({"index": 0, "delta": {"content": c.text}, "logprobs": logprobs, "finish_reason": null})
                    } else {
                        json!({"index": 0, "text": c.text, "logprobs": logprobs, "finish_reason": null})
                    };
                    let e = self.chunk(json!([choice]), None);
                    self.pending.push_back(e);
                }
                if let Some(reason) = c.finish_reason {
                    if reason == FinishReason::Error {
                        let err = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", "the request failed in the engine");
                        self.pending.push_back(Event::default().data(err.body().to_string()));
                    } else {
                        let choice = if self.chat {
                            json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_str(reason)})
                        } else {
                            json!({"index": 0, "text": "", "logprobs": null, "finish_reason": finish_str(reason)})
                        };
                        let e = self.chunk(json!([choice]), None);
                        self.pending.push_back(e);
                        if self.include_usage {
                            let e = self.chunk(json!([]), Some(&c.usage.unwrap_or_default()));
                            self.pending.push_back(e);
                        }
                    }
                    self.done();
                }
            }
        }
    }
}

async fn models(State(state): State<Shared>) -> ApiResult<Response> {
    let engine = ready(&state)?;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": state.model_id, "object": "model", "created": state.created, "owned_by": "weft",
            "max_model_len": engine.config().max_model_len,
        }],
    }))
    .into_response())
}

async fn health(State(state): State<Shared>) -> Response {
    let engine = match ready(&state) {
        Ok(e) => e.clone(),
        Err(e) => {
            let status = if e.message.contains("failed") { "failed" } else { "loading" };
            let mut r = (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": status, "detail": e.message}))).into_response();
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1));
            return r;
        }
    };
    let report = engine.health_check().await;
    let a = engine.admission_snapshot();
    let body = json!({
        "status": if report.healthy { "ok" } else { "unhealthy" },
        "detail": report.detail,
        "model": state.model_id,
        "admission": {
            "max_num_seqs": a.max_num_seqs, "max_num_batched_tokens": a.max_num_batched_tokens,
            "max_model_len": a.max_model_len, "waiting": a.waiting, "running": a.running,
            "prefilling": a.prefilling, "decoding": a.decoding, "available_blocks": a.available_blocks,
        },
    });
    let status = if report.healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}

async fn metrics(State(state): State<Shared>) -> Response {
    let m = state.engine.get().map(|e| e.metrics()).unwrap_or_default();
    let loaded = state.engine.get().is_some();
    let mut text = String::new();
    let result = encode_metrics(&mut text, &m, loaded);
    match result {
        Ok(()) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response(),
        Err(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", "could not encode the metrics").into_response(),
    }
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found_error", format!("no route for {} {}", req.method(), req.uri().path()))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", format!("{} is not allowed on {}", req.method(), req.uri().path()))
}

async fn require_key(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if given.map(str::trim) != Some(key.as_str()) {
            let message = if given.is_none() { "missing API key: send Authorization: Bearer <key>" } else { "invalid API key" };
            return ApiError { code: Some("invalid_api_key"), ..ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", message) }.into_response();
        }
    }
    next.run(req).await
}

// ---------------------------------------------------------------------------------------------
// Prometheus text, through prometheus-client's encoder.

/// One metric family from a snapshot.
struct Snap<'a, F: Fn(MetricEncoder) -> std::fmt::Result>(&'a F, MetricType);

impl<F: Fn(MetricEncoder) -> std::fmt::Result> std::fmt::Debug for Snap<'_, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("snapshot")
    }
}

impl<F: Fn(MetricEncoder) -> std::fmt::Result> EncodeMetric for Snap<'_, F> {
    fn encode(&self, encoder: MetricEncoder) -> std::fmt::Result {
        (self.0)(encoder)
    }
    fn metric_type(&self) -> MetricType {
        self.1
    }
}

fn histogram_buckets(h: &Histogram) -> Vec<(f64, u64)> {
    // The encoder accumulates, so hand it per-bucket counts.
    let mut out = Vec::with_capacity(h.bounds.len() + 1);
    let mut prev = 0;
    for (b, c) in h.bounds.iter().zip(&h.cumulative_counts) {
        out.push((*b, c - prev));
        prev = *c;
    }
    out.push((f64::INFINITY, h.count - prev));
    out
}

fn encode_metrics(out: &mut String, m: &EngineMetrics, loaded: bool) -> std::fmt::Result {
    let mut registry = prometheus_client::registry::Registry::with_prefix("weft");
    #[derive(Debug)]
    struct Collect(EngineMetrics, bool);
    impl prometheus_client::collector::Collector for Collect {
        fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
            let m = &self.0;
            let counter = |enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64| -> std::fmt::Result {
                let f = move |mut e: MetricEncoder| e.encode_counter::<NoLabelSet, _, u64>(&v, None);
                let s = Snap(&f, MetricType::Counter);
                s.encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
            };
            let gauge = |enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64| -> std::fmt::Result {
                let f = move |mut e: MetricEncoder| e.encode_gauge(&v);
                let s = Snap(&f, MetricType::Gauge);
                s.encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
            };
            let histogram = |enc: &mut DescriptorEncoder, name: &str, help: &str, h: &Histogram| -> std::fmt::Result {
                let buckets = histogram_buckets(h);
                let f = |mut e: MetricEncoder| e.encode_histogram::<NoLabelSet>(h.sum, h.count, &buckets, None);
                let s = Snap(&f, MetricType::Histogram);
                s.encode(enc.encode_descriptor(name, help, None, MetricType::Histogram)?)
            };
            gauge(&mut enc, "model_loaded", "1 once the model is loaded and requests are served", self.1 as i64)?;
            {
                let mut fam = enc.encode_descriptor("requests_finished", "Requests finished, by finish reason", None, MetricType::Counter)?;
                for reason in ["stop", "length", "eos", "cancelled", "error"] {
                    let v = m.requests_finished.get(reason).copied().unwrap_or(0);
                    let labels = [("finished_reason", reason)];
                    fam.encode_family(&labels)?.encode_counter::<NoLabelSet, _, u64>(&v, None)?;
                }
            }
            counter(&mut enc, "requests_submitted", "Requests accepted by the engine", m.requests_submitted)?;
            counter(&mut enc, "requests_rejected", "Requests the engine refused at submission", m.requests_rejected)?;
            counter(&mut enc, "prompt_tokens", "Prompt tokens of accepted requests", m.prompt_tokens)?;
            counter(&mut enc, "generation_tokens", "Tokens generated", m.generation_tokens)?;
            counter(&mut enc, "engine_steps", "Engine steps run", m.steps)?;
            counter(&mut enc, "preemptions", "Sequences preempted for lack of KV blocks", m.preemptions)?;
            histogram(&mut enc, "time_to_first_token_seconds", "Time from submission to the first generated token", &m.time_to_first_token)?;
            histogram(&mut enc, "inter_token_latency_seconds", "Time between consecutive generated tokens", &m.inter_token_latency)?;
            histogram(&mut enc, "e2e_request_latency_seconds", "Time from submission to the end of a request", &m.end_to_end_latency)?;
            histogram(&mut enc, "request_queue_time_seconds", "Time from submission to the first step", &m.queue_time)?;
            gauge(&mut enc, "num_requests_running", "Requests being stepped", m.running as i64)?;
            gauge(&mut enc, "num_requests_waiting", "Requests waiting for a slot", m.waiting as i64)?;
            gauge(&mut enc, "kv_blocks_total", "KV cache blocks in the pool", m.kv.total_blocks as i64)?;
            gauge(&mut enc, "kv_blocks_used", "KV cache blocks held by live sequences", m.kv.used_blocks as i64)?;
            gauge(&mut enc, "kv_blocks_free", "KV cache blocks never used or released", m.kv.free_blocks as i64)?;
            gauge(&mut enc, "kv_blocks_cached", "KV cache blocks held only by the prefix cache", m.kv.cached_blocks as i64)?;
            counter(&mut enc, "prefix_cache_hits", "Blocks found in the prefix cache at admission", m.prefix_cache.hits)?;
            counter(&mut enc, "prefix_cache_misses", "Blocks looked up in the prefix cache and not found", m.prefix_cache.misses)?;
            counter(&mut enc, "prefix_cache_evictions", "Cached blocks evicted", m.prefix_cache.evictions)?;
            Ok(())
        }
    }
    registry.register_collector(Box::new(Collect(m.clone(), loaded)));
    prometheus_client::encoding::text::encode(out, &registry)
}

// ---------------------------------------------------------------------------------------------
// The server.

pub fn run(opts: Options) -> Result<()> {
    let path = crate::generate::model_path(opts.model.clone())?;
    let model_id = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string());
    let state = Arc::new(AppState {
        engine: OnceLock::new(),
        loading: Mutex::new(Loading::Loading),
        model_id,
        model_path: path.display().to_string(),
        api_key: opts.api_key.clone(),
        created: now_secs(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| WeftError::Unsupported(format!("could not start the async runtime: {e}")))?;
    runtime.block_on(serve(opts, path, state))
}

async fn serve(opts: Options, path: PathBuf, state: Shared) -> Result<()> {
    let addr: SocketAddr = format!("{}:{}", opts.host, opts.port)
        .parse()
        .or_else(|_| std::net::ToSocketAddrs::to_socket_addrs(&(opts.host.as_str(), opts.port)).map_err(|e| e.to_string()).and_then(|mut a| a.next().ok_or_else(|| "no address".to_string())))
        .map_err(|e| WeftError::Unsupported(format!("invalid --host {}: {e}", opts.host)))?;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| WeftError::Unsupported(format!("could not listen on {addr}: {e}")))?;
    let local = listener.local_addr().map_err(|e| WeftError::Unsupported(e.to_string()))?;
    eprintln!("weft serve: listening on http://{local} (loading {})", path.display());

    let config = EngineConfig {
        max_num_seqs: opts.max_num_seqs,
        max_num_batched_tokens: opts.max_num_batched_tokens,
        max_model_len: opts.max_model_len,
        enable_prefix_cache: opts.enable_prefix_cache,
    };
    let loader = state.clone();
    let kv = opts.kv_memory_bytes;
    tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        // Reading and uploading the weights blocks: off the async workers, driven by weft's own shim.
        let progress = crate::progress::loading(path.display().to_string());
        let built = EngineBuilder::from_model(&path)
            .and_then(|b| weft::rt::block_on(b.config(config).kv_memory_bytes(kv).on_progress(progress).build()))
            .and_then(|e| e.start_loop().map(|()| e));
        match built {
            Ok(engine) => {
                let a = engine.admission_snapshot();
                let _ = loader.engine.set(engine);
                eprintln!(
                    "weft serve: model {} ready in {:.1}s (max_model_len {}, max_num_seqs {}, {} KV blocks free)",
                    loader.model_id,
                    started.elapsed().as_secs_f64(),
                    a.max_model_len,
                    a.max_num_seqs,
                    a.available_blocks
                );
            }
            Err(e) => {
                eprintln!("weft serve: error: the model failed to load: {e}");
                *loader.loading.lock().unwrap_or_else(|p| p.into_inner()) = Loading::Failed(e.to_string());
                // A server without its model serves nobody: exit so a supervisor sees it.
                std::process::exit(1);
            }
        }
    });

    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| WeftError::Unsupported(format!("the server failed: {e}")))
}
