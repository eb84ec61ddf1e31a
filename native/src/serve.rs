//! `weft serve`: an OpenAI-compatible HTTP server (axum + tokio) over one engine.
//!
//! The socket is bound first and the model loads in the background: until it is ready every
//! endpoint but `/metrics` answers 503. The protocol itself (reading requests, shaping responses
//! and chunks) is `weft::openai`; this file adds HTTP: status codes, SSE framing, the API key,
//! routing, loading, readiness and the drain (`metrics.rs` writes `/metrics`). Streaming
//! responses are the engine's stream turned into server-sent events, so a client that goes away
//! drops the stream, which cancels the request and frees its KV blocks at the next step.
//! `/tokenize` and `/detokenize` are vLLM's (the protocol is `weft::openai::tokenize`).
//! `--chat-template FILE` replaces the model's chat template; `--cors-origin` lets web pages of
//! the given origins call the server (preflight answered here, before the API key is asked for);
//! `--reasoning-parser` picks how a thinking model's reasoning is separated (`weft::openai::
//! reasoning`). A request's `n` choices are `n` engine requests, their streams merged.
//!
//! Made to run as one of many stateless replicas behind a load balancer: `/health` is liveness
//! (the process and its GPU work), `/ready` is readiness (loaded and not draining). The first
//! SIGTERM or SIGINT starts the drain: `/ready` turns 503 so the balancer sends new work
//! elsewhere, new completions get 503 with Retry-After (a balancer that retries on 503 moves
//! them to another replica), and the requests in flight run to their end, at most
//! `--drain-timeout`; the rest are then cancelled (each ends with `finish_reason` "abort" and
//! its KV blocks are freed) and the process exits 0. A second signal exits at once.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio::sync::Notify;
use weft::EngineBuilder;
use weft::engine::api::{InferenceEngine, LlmInferenceEngine};
use weft::engine::request::StreamChunk;
use weft::engine::{ContinuousBatchEngine, EngineConfig};
use weft::openai::{ChunkShaper, Endpoint, OpenAiError, OpenAiRequest, ReasoningParser};
use weft::{Result, WeftError};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 4 << 20;
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
    pub kv: crate::generate::KvOptions,
    pub enable_prefix_cache: bool,
    /// The model's name in requests, responses and metrics [default: the file's stem].
    pub served_model_name: Option<String>,
    /// How long the requests in flight may take to finish once a drain starts.
    pub drain_timeout: Duration,
    /// A Jinja chat template file used instead of the model's own.
    pub chat_template: Option<PathBuf>,
    /// Origins whose web pages may call the server (`*`: any); empty: no CORS headers.
    pub cors_origins: Vec<String>,
    /// `--reasoning-parser`: a family of `weft::openai::reasoning::FAMILIES` or `none`;
    /// `None`: chosen from the model.
    pub reasoning_parser: Option<String>,
    /// `--pooling`: serve embeddings so pooled whatever the model's file says.
    pub pooling: Option<weft::model::config::Pooling>,
    pub speculation: crate::generate::Speculation,
    /// `--lora-modules name=path …`: PEFT adapters served under their names.
    pub lora_modules: Vec<(String, PathBuf)>,
    /// `--max-loras` and `--max-lora-rank`; either (or an adapter) turns adapters on, the other
    /// at vLLM's default.
    pub max_loras: Option<usize>,
    pub max_lora_rank: Option<usize>,
    /// Answer vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter (off by default, as in
    /// vLLM, where `VLLM_ALLOW_RUNTIME_LORA_UPDATING` turns them on).
    pub allow_runtime_lora_updating: bool,
}

/// `--lora-modules`: `name=path` (vLLM's form).
pub fn parse_lora_module(s: &str) -> std::result::Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => Ok((name.to_string(), PathBuf::from(path))),
        _ => Err(format!("{s:?} is not name=path (the adapter's name in requests, then its PEFT directory)")),
    }
}

/// `--pooling`: a `Pooling` weft knows.
pub fn parse_pooling(s: &str) -> std::result::Result<weft::model::config::Pooling, String> {
    weft::model::config::Pooling::parse(s).map_err(|e| e.to_string())
}

/// `--reasoning-parser`: one of vLLM's parser names weft knows, or `none`.
pub fn parse_reasoning_parser(s: &str) -> std::result::Result<String, String> {
    match s {
        "none" => Ok(s.to_string()),
        _ if weft::openai::reasoning::family(s).is_some() => Ok(s.to_string()),
        _ => Err(weft::openai::reasoning::unknown_parser(s)),
    }
}

/// `--cors-origin`: `*`, or an origin as browsers send it (`scheme://host[:port]`; one trailing
/// slash is dropped).
pub fn parse_origin(s: &str) -> std::result::Result<String, String> {
    let t = s.trim();
    if t == "*" {
        return Ok(t.to_string());
    }
    let t = t.strip_suffix('/').unwrap_or(t);
    let host = t.strip_prefix("http://").or_else(|| t.strip_prefix("https://"));
    let valid =
        host.is_some_and(|h| !h.is_empty() && !h.contains(['/', '?', '#', ' '])) && HeaderValue::from_str(t).is_ok();
    if valid {
        Ok(t.to_string())
    } else {
        Err(format!(
            "{s:?} is not an origin: give scheme://host[:port] as the page's address bar shows it \
             (e.g. http://localhost:5173), or * for any"
        ))
    }
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
    enable_prefix_cache: bool,
    /// Set by the first SIGTERM or SIGINT; never cleared.
    draining: AtomicBool,
    /// Completion requests between their arrival and the end of their response (a stream's last
    /// event); the drain waits for this to reach 0.
    in_flight: AtomicUsize,
    /// Woken when `in_flight` drops to 0.
    idle: Notify,
    /// `--cors-origin`: the origins (or `*`) whose pages may call; empty: no CORS.
    cors_origins: Vec<String>,
    /// How chat answers separate a thinking model's reasoning (set with the engine).
    reasoning: OnceLock<Option<ReasoningParser>>,
}

/// Counts one completion request in `AppState::in_flight` while it lives.
struct InFlight(Shared);

impl InFlight {
    fn new(state: &Shared) -> Self {
        state.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(state.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            // notify_one keeps a permit when nobody waits yet, so a drain that checks the count
            // and then waits cannot miss this.
            self.0.idle.notify_one();
        }
    }
}

type Shared = Arc<AppState>;

// ---------------------------------------------------------------------------------------------
// Errors: OpenAI's shape (`OpenAiError`) with an HTTP status.

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    error: OpenAiError,
    retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, error: OpenAiError::new(kind, message), retry_after: None }
    }
    fn unavailable(message: impl Into<String>) -> Self {
        OpenAiError::unavailable(message).into()
    }
}

/// The status of a protocol error: the caller's fault is 400, "not now" is 503 with a
/// Retry-After, anything else is ours (500).
impl From<OpenAiError> for ApiError {
    fn from(error: OpenAiError) -> Self {
        let (status, retry_after) = match error.kind {
            "invalid_request_error" => (StatusCode::BAD_REQUEST, None),
            "service_unavailable" => (StatusCode::SERVICE_UNAVAILABLE, Some(1)),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, None),
        };
        ApiError { status, error, retry_after }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.error.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

type ApiResult<T> = std::result::Result<T, ApiError>;

fn parse_body(body: std::result::Result<Bytes, BytesRejection>) -> ApiResult<Map<String, Value>> {
    let bytes = body.map_err(|r| {
        let status = r.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                status,
                "invalid_request_error",
                format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
            )
        } else {
            ApiError::new(status, "invalid_request_error", r.body_text())
        }
    })?;
    Ok(weft::openai::parse_body(&bytes)?)
}

// ---------------------------------------------------------------------------------------------
// Handlers.

fn ready(state: &AppState) -> ApiResult<&ContinuousBatchEngine> {
    if let Some(e) = state.engine.get() {
        return Ok(e);
    }
    match &*state.loading.lock().unwrap_or_else(|p| p.into_inner()) {
        Loading::Loading => Err(ApiError::unavailable("the model is still loading")),
        Loading::Failed(e) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            format!("the model failed to load: {e}"),
        )),
    }
}

/// The LoRA adapter the body's `model` names (`None`: the base model), or 404 for a model not
/// served.
fn check_model(
    state: &AppState,
    engine: &ContinuousBatchEngine,
    body: &Map<String, Value>,
) -> ApiResult<Option<String>> {
    match weft::openai::requested_model(body)? {
        None => Ok(None),
        Some(m) if m == state.model_id || m == state.model_path => Ok(None),
        Some(m) if engine.lora_names().iter().any(|n| n == m) => Ok(Some(m.to_string())),
        Some(m) => {
            let message = format!("The model `{m}` does not exist; this server serves `{}`", state.model_id);
            let error = OpenAiError { code: Some("model_not_found"), ..OpenAiError::invalid("model", message) };
            Err(ApiError { status: StatusCode::NOT_FOUND, error, retry_after: None })
        }
    }
}

fn check_queue(engine: &ContinuousBatchEngine) -> ApiResult<()> {
    let a = engine.admission_snapshot();
    let limit = WAITING_FACTOR * a.max_num_seqs;
    if a.waiting >= limit {
        return Err(ApiError::unavailable(format!(
            "the server is overloaded: {} requests are waiting (limit {limit}); retry later",
            a.waiting
        )));
    }
    Ok(())
}

async fn chat_completions(
    State(state): State<Shared>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    handle(state, body, Endpoint::Chat).await
}

async fn completions(
    State(state): State<Shared>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    handle(state, body, Endpoint::Completion).await
}

/// One completion request: drain, body, readiness, model, fields, queue, then generation.
async fn handle(
    state: Shared,
    body: std::result::Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> ApiResult<Response> {
    // Counted before the drain check: a drain that starts after the check waits for this one.
    let in_flight = InFlight::new(&state);
    if state.draining.load(Ordering::SeqCst) {
        return Err(ApiError::unavailable("the server is shutting down; retry on another replica"));
    }
    let map = parse_body(body)?;
    let engine = ready(&state)?.clone();
    let lora = check_model(&state, &engine, &map)?;
    let mut req = weft::openai::parse(endpoint, &map)?;
    req.request.lora = lora;
    let parser = state.reasoning.get().copied().flatten();
    req.apply_reasoning(engine.tokenizer().as_ref(), parser.as_ref())?;
    check_queue(&engine)?;
    generate(state, engine, req, in_flight).await
}

async fn generate(
    state: Shared,
    engine: ContinuousBatchEngine,
    req: OpenAiRequest,
    in_flight: InFlight,
) -> ApiResult<Response> {
    let id = weft::openai::request_id(req.endpoint);
    let created = weft::openai::unix_now();
    // An adapter's requests answer in its name, as vLLM's do.
    let model = req.request.lora.clone().unwrap_or_else(|| state.model_id.clone());
    if req.stream {
        // Each choice is its own engine request; their chunks interleave as they come, each
        // tagged with its choice.
        let mut streams = Vec::with_capacity(req.n);
        for (i, r) in req.choice_requests().into_iter().enumerate() {
            let s = LlmInferenceEngine::infer_stream(&engine, r).map_err(OpenAiError::from_engine)?;
            streams.push(s.map(move |item| (i, item)).boxed());
        }
        let stream = futures::stream::select_all(streams).boxed();
        let mut shaper = ChunkShaper::new(engine, &req, id, created, model);
        // Chat's role chunks go out at once, before the first token is ready.
        let pending = shaper.start().into_iter().map(|v| Event::default().data(v.to_string())).collect();
        let sse = SseState { shaper, stream: Some(stream), pending, _in_flight: in_flight };
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
    let choices = req.choice_requests().into_iter().map(|r| LlmInferenceEngine::infer(&engine, r));
    let responses = futures::future::try_join_all(choices).await.map_err(OpenAiError::from_engine)?;
    let body = weft::openai::response_json_with(engine.tokenizer().as_ref(), &req, &id, created, &model, &responses)?;
    Ok(Json(body).into_response())
}

/// The state of one streamed response: the engine's stream and the events not yet sent.
struct SseState {
    shaper: ChunkShaper,
    /// The choices' engine streams, merged: (choice, item).
    stream: Option<futures::stream::BoxStream<'static, (usize, Result<StreamChunk>)>>,
    pending: VecDeque<Event>,
    /// Held (for its `Drop`) until the response body ends or the client goes away.
    _in_flight: InFlight,
}

impl SseState {
    fn done(&mut self) {
        self.pending.push_back(Event::default().data("[DONE]"));
        self.stream = None;
    }

    /// Wait for the engine's next chunk and queue the events it makes.
    async fn next_events(&mut self) {
        let Some(stream) = self.stream.as_mut() else { return };
        match stream.next().await {
            None => self.done(),
            Some((choice, item)) => {
                for v in self.shaper.shape_choice(choice, item) {
                    self.pending.push_back(Event::default().data(v.to_string()));
                }
                if self.shaper.finished() {
                    self.done();
                }
            }
        }
    }
}

async fn models(State(state): State<Shared>) -> ApiResult<Response> {
    let engine = ready(&state)?;
    let max_model_len = engine.config().max_model_len;
    let mut data = vec![json!({
        "id": state.model_id, "object": "model", "created": state.created, "owned_by": "weft",
        "root": state.model_path, "parent": null, "max_model_len": max_model_len,
    })];
    // Each adapter as vLLM lists it: its own entry, its parent the base model.
    data.extend(engine.lora_names().into_iter().map(|name| {
        json!({
            "id": name, "object": "model", "created": state.created, "owned_by": "weft",
            "root": name, "parent": state.model_id, "max_model_len": max_model_len,
        })
    }));
    Ok(Json(json!({"object": "list", "data": data})).into_response())
}

/// OpenAI's `/v1/embeddings`: each input is one engine request, batched with everything else
/// in the engine's steps. A model that serves no embeddings answers 400 (the engine's refusal);
/// a model that is only an encoder does not exist in weft yet, so completions never need one.
async fn embeddings(
    State(state): State<Shared>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let in_flight = InFlight::new(&state);
    if state.draining.load(Ordering::SeqCst) {
        return Err(ApiError::unavailable("the server is shutting down; retry on another replica"));
    }
    let map = parse_body(body)?;
    let engine = ready(&state)?.clone();
    let lora = check_model(&state, &engine, &map)?;
    let req = weft::openai::parse_embeddings(&map)?;
    check_queue(&engine)?;
    let all = req.inputs.iter().map(|p| engine.embed(p.clone(), req.params, lora.as_deref()));
    let embeddings = futures::future::try_join_all(all).await.map_err(OpenAiError::from_engine)?;
    drop(in_flight);
    let model = lora.as_deref().unwrap_or(&state.model_id);
    Ok(Json(weft::openai::embeddings_json(&req, model, &embeddings)).into_response())
}

/// vLLM's `/tokenize`: a prompt or a conversation (rendered as a chat completion's) to token ids.
async fn tokenize(
    State(state): State<Shared>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let map = parse_body(body)?;
    let engine = ready(&state)?;
    check_model(&state, engine, &map)?;
    let v = weft::openai::tokenize(engine.tokenizer().as_ref(), engine.config().max_model_len, &map)?;
    Ok(Json(v).into_response())
}

/// A body's `lora_name` (and, with `path`, `lora_path`), as vLLM's LoRA endpoints take them.
fn lora_fields(map: &Map<String, Value>, path: bool) -> ApiResult<(String, Option<String>)> {
    let field = |name: &str| match map.get(name) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err(ApiError::from(OpenAiError::invalid(name, format!("{name} must be a non-empty string")))),
    };
    Ok((field("lora_name")?, if path { Some(field("lora_path")?) } else { None }))
}

/// vLLM's `/v1/load_lora_adapter`: serve the PEFT adapter at `lora_path` as `lora_name`. A
/// path that holds no adapter, or one that does not fit the model, is a 400 saying why.
async fn load_lora_adapter(
    State(state): State<Shared>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let map = parse_body(body)?;
    let engine = ready(&state)?.clone();
    let (name, path) = lora_fields(&map, true)?;
    if name == state.model_id {
        return Err(OpenAiError::invalid("lora_name", format!("{name:?} is the base model's name")).into());
    }
    let dir = PathBuf::from(path.unwrap_or_default());
    // Reading the adapter's files blocks: off the async workers.
    let added = tokio::task::spawn_blocking(move || engine.add_lora_path(&name, &dir).map(|()| name))
        .await
        .map_err(|e| ApiError::unavailable(format!("loading the adapter failed: {e}")))?;
    match added {
        Ok(name) => Ok(format!("Success: LoRA adapter '{name}' added successfully.").into_response()),
        Err(e) => Err(OpenAiError::invalid("lora_path", e.to_string()).into()),
    }
}

/// vLLM's `/v1/unload_lora_adapter`: stop serving `lora_name` (404 when it is not served, 400
/// while requests for it are queued or running).
async fn unload_lora_adapter(
    State(state): State<Shared>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let map = parse_body(body)?;
    let engine = ready(&state)?;
    let (name, _) = lora_fields(&map, false)?;
    match engine.remove_lora(&name) {
        Ok(()) => Ok(format!("Success: LoRA adapter '{name}' removed successfully.").into_response()),
        Err(e @ WeftError::InvalidRequest { .. }) => {
            let error =
                OpenAiError { code: Some("model_not_found"), ..OpenAiError::invalid("lora_name", e.to_string()) };
            Err(ApiError { status: StatusCode::NOT_FOUND, error, retry_after: None })
        }
        Err(e) => Err(OpenAiError::invalid("lora_name", e.to_string()).into()),
    }
}

/// vLLM's `/detokenize`: token ids to text.
async fn detokenize(
    State(state): State<Shared>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let map = parse_body(body)?;
    let engine = ready(&state)?;
    check_model(&state, engine, &map)?;
    Ok(Json(weft::openai::detokenize(engine.tokenizer().as_ref(), &map)?).into_response())
}

async fn health(State(state): State<Shared>) -> Response {
    let engine = match ready(&state) {
        Ok(e) => e.clone(),
        Err(e) => {
            let status = if e.error.message.contains("failed") { "failed" } else { "loading" };
            let mut r = (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": status, "detail": e.error.message})))
                .into_response();
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

/// Readiness: 200 once the model is loaded and until a drain starts; 503 (with why) otherwise.
/// A load balancer or Kubernetes sends new work only to ready replicas.
async fn ready_probe(State(state): State<Shared>) -> Response {
    let status = if state.draining.load(Ordering::SeqCst) {
        "draining"
    } else {
        match ready(&state) {
            Ok(_) => {
                return (StatusCode::OK, Json(json!({"status": "ready", "model": state.model_id}))).into_response();
            }
            Err(e) if e.error.message.contains("failed") => "failed",
            Err(_) => "loading",
        }
    };
    let in_flight = state.in_flight.load(Ordering::SeqCst);
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": status, "in_flight": in_flight}))).into_response()
}

async fn metrics(State(state): State<Shared>) -> Response {
    let engine = state.engine.get();
    let m = engine.map(|e| e.metrics()).unwrap_or_default();
    let live = engine.map(|e| {
        let s = e.scheduler_stats();
        crate::metrics::Live {
            model_name: state.model_id.clone(),
            running: s.running,
            waiting: s.waiting,
            preemptions: s.preemptions,
            kv: e.kv_usage(),
            prefix_cache: e.prefix_cache_stats(),
            block_size: e.executor().kv_config().block_size,
            kv_dtype: e.executor().kv_config().dtype,
            enable_prefix_cache: state.enable_prefix_cache,
            now_seconds: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
            lora: e.lora_metrics_snapshot(),
        }
    });
    let text = crate::metrics::render(&m, live.as_ref(), state.draining.load(Ordering::SeqCst));
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found_error",
        format!("no route for {} {}", req.method(), req.uri().path()),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

async fn require_key(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given.map(str::trim) != Some(key.as_str()) {
            let message =
                if given.is_none() { "missing API key: send Authorization: Bearer <key>" } else { "invalid API key" };
            let mut e = ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", message);
            e.error.code = Some("invalid_api_key");
            return e.into_response();
        }
    }
    next.run(req).await
}

/// CORS for `--cors-origin`: a preflight (`OPTIONS` with `Access-Control-Request-Method`) from
/// an allowed origin is answered here, before routing and the API key (browsers send no
/// credentials in it); other responses to an allowed origin get `Access-Control-Allow-Origin`.
/// Without `--cors-origin`, nothing changes.
async fn cors(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let origin = match req.headers().get(header::ORIGIN) {
        Some(o) if !state.cors_origins.is_empty() => o.clone(),
        _ => return next.run(req).await,
    };
    let any = state.cors_origins.iter().any(|o| o == "*");
    let allowed = any || state.cors_origins.iter().any(|o| o.as_bytes() == origin.as_bytes());
    let allow = |h: &mut HeaderMap| {
        if any {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
        } else {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
            h.append(header::VARY, HeaderValue::from_static("Origin"));
        }
    };
    if req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
        if !allowed {
            let shown = String::from_utf8_lossy(origin.as_bytes()).into_owned();
            let message = format!("the origin {shown} may not call this server; start it with --cors-origin {shown}");
            return ApiError::new(StatusCode::FORBIDDEN, "invalid_request_error", message).into_response();
        }
        let headers = req
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        allow(h);
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, OPTIONS"));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, headers);
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from(600));
        return r;
    }
    let mut r = next.run(req).await;
    if allowed {
        allow(r.headers_mut());
    } else if !any {
        // A cache must not hand this answer (without the header) to an allowed origin.
        r.headers_mut().append(header::VARY, HeaderValue::from_static("Origin"));
    }
    r
}

// ---------------------------------------------------------------------------------------------
// The server.

pub fn run(opts: Options) -> Result<()> {
    let path = crate::generate::model_path(opts.model.clone())?;
    // Read and checked before anything starts: a bad file is an error at once, not after loading.
    let chat_template = match &opts.chat_template {
        None => None,
        Some(file) => {
            let shown = file.display();
            let source = std::fs::read_to_string(file)
                .map_err(|e| WeftError::Unsupported(format!("cannot read --chat-template {shown}: {e}")))?;
            weft::tokenizer::ChatTemplate::new(&source, None, None)
                .map_err(|e| WeftError::Unsupported(format!("--chat-template {shown}: {e}")))?;
            Some(source)
        }
    };
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    let model_id = opts.served_model_name.clone().or(stem).unwrap_or_else(|| path.display().to_string());
    let state = Arc::new(AppState {
        engine: OnceLock::new(),
        loading: Mutex::new(Loading::Loading),
        model_id,
        model_path: path.display().to_string(),
        api_key: opts.api_key.clone(),
        created: weft::openai::unix_now(),
        enable_prefix_cache: opts.enable_prefix_cache,
        draining: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        idle: Notify::new(),
        cors_origins: opts.cors_origins.clone(),
        reasoning: OnceLock::new(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| WeftError::Unsupported(format!("could not start the async runtime: {e}")))?;
    let result = runtime.block_on(serve(opts, path, chat_template, state));
    // A model still loading (a drain can end first) must not hold the exit.
    runtime.shutdown_background();
    result
}

async fn serve(opts: Options, path: PathBuf, chat_template: Option<String>, state: Shared) -> Result<()> {
    // Before anything slow: a SIGTERM while the model loads drains (at once) instead of killing.
    let signals = Signals::new()?;
    let addr: SocketAddr = format!("{}:{}", opts.host, opts.port)
        .parse()
        .or_else(|_| {
            std::net::ToSocketAddrs::to_socket_addrs(&(opts.host.as_str(), opts.port))
                .map_err(|e| e.to_string())
                .and_then(|mut a| a.next().ok_or_else(|| "no address".to_string()))
        })
        .map_err(|e| WeftError::Unsupported(format!("invalid --host {}: {e}", opts.host)))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| WeftError::Unsupported(format!("could not listen on {addr}: {e}")))?;
    let local = listener.local_addr().map_err(|e| WeftError::Unsupported(e.to_string()))?;
    eprintln!("weft serve: listening on http://{local} (loading {})", path.display());

    let config = EngineConfig {
        max_num_seqs: opts.max_num_seqs,
        max_num_batched_tokens: opts.max_num_batched_tokens,
        max_model_len: opts.max_model_len,
        enable_prefix_cache: opts.enable_prefix_cache,
        ..EngineConfig::default()
    };
    let loader = state.clone();
    let kv = opts.kv.clone();
    let speculation = opts.speculation.clone();
    let reasoning_parser = opts.reasoning_parser.clone();
    let lora_modules = opts.lora_modules.clone();
    let wants_lora = opts.max_loras.is_some() || opts.max_lora_rank.is_some() || opts.allow_runtime_lora_updating;
    let lora = (wants_lora || !lora_modules.is_empty()).then(|| {
        (
            opts.max_loras.unwrap_or(weft::builder::DEFAULT_MAX_LORAS),
            opts.max_lora_rank.unwrap_or(weft::builder::DEFAULT_MAX_LORA_RANK),
        )
    });
    let pooling = opts.pooling;
    tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        // Reading and uploading the weights blocks: off the async workers, driven by weft's own shim.
        let progress = crate::progress::loading(path.display().to_string());
        let built = EngineBuilder::from_model(&path)
            .and_then(|b| speculation.apply(b))
            .map(|b| match lora {
                Some((slots, rank)) => {
                    lora_modules.iter().fold(b.lora(slots, rank), |b, (name, dir)| b.lora_module(name, dir))
                }
                None => b,
            })
            .map(|b| match pooling {
                Some(p) => b.pooling(p),
                None => b,
            })
            .and_then(|b| match &chat_template {
                Some(source) => b.chat_template(source),
                None => Ok(b),
            })
            .and_then(|b| weft::rt::block_on(kv.apply(b).config(config).on_progress(progress).build()))
            .and_then(|e| e.start_loop().map(|()| e))
            .and_then(|e| {
                let parser = ReasoningParser::resolve(reasoning_parser.as_deref(), e.tokenizer().as_ref())
                    .map_err(|why| WeftError::Unsupported(format!("--reasoning-parser: {why}")))?;
                Ok((e, parser))
            });
        match built {
            Ok((engine, parser)) => {
                let a = engine.admission_snapshot();
                let kv_config = engine.executor().kv_config();
                if let Some(p) = &parser {
                    eprintln!("weft serve: reasoning parser {} (reasoning_content)", p.family.name);
                }
                let _ = loader.reasoning.set(parser);
                let _ = loader.engine.set(engine);
                eprintln!(
                    "weft serve: model {} ready in {:.1}s (max_model_len {}, max_num_seqs {}, {} KV blocks free: {} \
                     tokens of {})",
                    loader.model_id,
                    started.elapsed().as_secs_f64(),
                    a.max_model_len,
                    a.max_num_seqs,
                    a.available_blocks,
                    a.available_blocks * kv_config.block_size,
                    kv_config.dtype.name().to_ascii_lowercase()
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
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize));
    // Routes that exist only when asked for: without the flag they are 404s, as in vLLM.
    let v1 = if opts.allow_runtime_lora_updating {
        v1.route("/v1/load_lora_adapter", post(load_lora_adapter))
            .route("/v1/unload_lora_adapter", post(unload_lora_adapter))
    } else {
        v1
    };
    let v1 = v1.route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    let app = Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready_probe))
        .route("/metrics", get(metrics))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), cors))
        .with_state(state.clone());
    let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
    let drain_timeout = opts.drain_timeout;
    tokio::spawn(async move {
        drain(&state, signals, drain_timeout).await;
        let _ = drained_tx.send(());
        // The server now closes its connections; one that does not close must not hold the exit.
        tokio::time::sleep(Duration::from_secs(5)).await;
        eprintln!("weft serve: connections still open 5s after the drain; exiting");
        std::process::exit(0);
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = drained_rx.await;
        })
        .await
        .map_err(|e| WeftError::Unsupported(format!("the server failed: {e}")))
}

// ---------------------------------------------------------------------------------------------
// Signals and the drain.

/// SIGTERM and SIGINT (Ctrl-C alone where there are no Unix signals), registered once so that a
/// second signal is seen as such.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let listen = |kind: SignalKind| {
                signal(kind).map_err(|e| WeftError::Unsupported(format!("could not listen for signals: {e}")))
            };
            Ok(Signals { term: listen(SignalKind::terminate())?, int: listen(SignalKind::interrupt())? })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The next signal's name and the exit status a process killed by it would have.
    async fn next(&mut self) -> (&'static str, i32) {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => ("SIGTERM", 128 + 15),
                _ = self.int.recv() => ("SIGINT", 128 + 2),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            ("Ctrl-C", 130)
        }
    }
}

/// Wait for the first signal, then drain: refuse new requests, let those in flight finish until
/// `timeout`, cancel the rest. A second signal exits the process at once.
async fn drain(state: &AppState, mut signals: Signals, timeout: Duration) {
    let (name, _) = signals.next().await;
    let started = Instant::now();
    state.draining.store(true, Ordering::SeqCst);
    let in_flight = state.in_flight.load(Ordering::SeqCst);
    eprintln!(
        "weft serve: {name}: draining: not ready, new requests get 503; {in_flight} in flight may take up to {:.1}s",
        timeout.as_secs_f64()
    );
    tokio::spawn(async move {
        let (name, status) = signals.next().await;
        eprintln!("weft serve: {name} again: exiting now");
        std::process::exit(status);
    });
    let mut cancelled = 0;
    if !wait_idle(state, started + timeout).await {
        if let Some(engine) = state.engine.get() {
            let s = engine.scheduler_stats();
            cancelled = s.running + s.waiting;
            // Every live request ends with finish_reason "abort" and its blocks go back to the
            // pool; the engine refuses anything after.
            engine.shutdown();
        }
        // The cancelled streams send their last events now; a client that stopped reading gets
        // a few seconds, not forever.
        wait_idle(state, Instant::now() + Duration::from_secs(5)).await;
    }
    // What a last scrape of /metrics would show; after a drain, nothing runs and no block is held.
    let (kv, stats) = state.engine.get().map(|e| (e.kv_usage(), e.scheduler_stats())).unwrap_or_default();
    eprintln!(
        "weft serve: drained in {:.2}s: {in_flight} in flight at the signal, {cancelled} cancelled at the drain timeout; \
         at exit {} running, {} waiting, KV blocks in use {} of {}; exiting",
        started.elapsed().as_secs_f64(),
        stats.running,
        stats.waiting,
        kv.used_blocks,
        kv.total_blocks
    );
}

/// Wait until no completion request is in flight or `deadline` passes; true when none is.
async fn wait_idle(state: &AppState, deadline: Instant) -> bool {
    loop {
        if state.in_flight.load(Ordering::SeqCst) == 0 {
            return true;
        }
        if tokio::time::timeout_at(deadline.into(), state.idle.notified()).await.is_err() {
            return state.in_flight.load(Ordering::SeqCst) == 0;
        }
    }
}

/// Parse a duration in seconds ("30", "0.5").
/// `--gpu-memory-utilization`: a fraction above 0 and at most 1.
pub fn parse_utilization(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(u) if u > 0.0 && u <= 1.0 => Ok(u),
        _ => Err(format!("{s:?} is not a fraction of the GPU's memory; use a number above 0 and at most 1, e.g. 0.9")),
    }
}

/// `--kv-cache-dtype`: f32 or f16.
pub fn parse_kv_dtype(s: &str) -> std::result::Result<weft::DType, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(weft::DType::F32),
        "f16" | "float16" | "half" => Ok(weft::DType::F16),
        _ => Err(format!("{s:?} is not a KV cache type; use f32 or f16")),
    }
}

pub fn parse_seconds(s: &str) -> std::result::Result<Duration, String> {
    let seconds: f64 = s.trim().parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{s:?} is not a duration in seconds (0 or more)"))
}
