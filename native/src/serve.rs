//! `weft serve`: an OpenAI-compatible HTTP server (axum + tokio) over one engine.
//!
//! The socket is bound first and the model loads in the background: until it is ready every
//! endpoint but `/metrics` answers 503. The protocol itself (reading requests, shaping responses
//! and chunks) is `weft::openai`; this file adds HTTP: status codes, SSE framing, the API key,
//! routing, metrics and loading. Streaming responses are the engine's stream turned into
//! server-sent events, so a client that goes away drops the stream, which cancels the request
//! and frees its KV blocks at the next step.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

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
use weft::EngineBuilder;
use weft::engine::api::{InferenceEngine, LlmInferenceEngine};
use weft::engine::{ContinuousBatchEngine, EngineConfig};
use weft::engine::metrics::{EngineMetrics, Histogram};
use weft::engine::request::StreamChunk;
use weft::openai::{ChunkShaper, Endpoint, OpenAiError, OpenAiRequest};
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
            ApiError::new(status, "invalid_request_error", format!("the request body is larger than {MAX_BODY_BYTES} bytes"))
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
        Loading::Failed(e) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", format!("the model failed to load: {e}"))),
    }
}

fn check_model(state: &AppState, body: &Map<String, Value>) -> ApiResult<()> {
    match weft::openai::requested_model(body)? {
        None => Ok(()),
        Some(m) if m == state.model_id || m == state.model_path => Ok(()),
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
        return Err(ApiError::unavailable(format!("the server is overloaded: {} requests are waiting (limit {limit}); retry later", a.waiting)));
    }
    Ok(())
}

async fn chat_completions(State(state): State<Shared>, body: std::result::Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    handle(state, body, Endpoint::Chat).await
}

async fn completions(State(state): State<Shared>, body: std::result::Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    handle(state, body, Endpoint::Completion).await
}

/// One completion request: body, readiness, model, fields, queue, then generation.
async fn handle(state: Shared, body: std::result::Result<Bytes, BytesRejection>, endpoint: Endpoint) -> ApiResult<Response> {
    let map = parse_body(body)?;
    let engine = ready(&state)?.clone();
    check_model(&state, &map)?;
    let req = weft::openai::parse(endpoint, &map)?;
    check_queue(&engine)?;
    generate(state, engine, req).await
}

async fn generate(state: Shared, engine: ContinuousBatchEngine, req: OpenAiRequest) -> ApiResult<Response> {
    let id = weft::openai::request_id(req.endpoint);
    let created = weft::openai::unix_now();
    let model = state.model_id.clone();
    if req.stream {
        let stream = LlmInferenceEngine::infer_stream(&engine, req.request.clone()).map_err(OpenAiError::from_engine)?;
        let mut shaper = ChunkShaper::new(engine, &req, id, created, model);
        // Chat's role chunk goes out at once, before the first token is ready.
        let pending = shaper.start().into_iter().map(|v| Event::default().data(v.to_string())).collect();
        let sse = SseState { shaper, stream: Some(stream), pending };
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
    let response = LlmInferenceEngine::infer(&engine, req.request.clone()).await.map_err(OpenAiError::from_engine)?;
    let body = weft::openai::response_json(&engine, &req, &id, created, &model, &response)?;
    Ok(Json(body).into_response())
}

/// The state of one streamed response: the engine's stream and the events not yet sent.
struct SseState {
    shaper: ChunkShaper,
    stream: Option<weft::rt::BoxStream<'static, Result<StreamChunk>>>,
    pending: VecDeque<Event>,
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
            Some(item) => {
                for v in self.shaper.shape(item) {
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
            let status = if e.error.message.contains("failed") { "failed" } else { "loading" };
            let mut r = (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": status, "detail": e.error.message}))).into_response();
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
            let mut e = ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", message);
            e.error.code = Some("invalid_api_key");
            return e.into_response();
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
            histogram(&mut enc, "token_mask_seconds", "Host time computing structured output's token masks, per step", &m.token_mask_time)?;
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
        created: weft::openai::unix_now(),
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
