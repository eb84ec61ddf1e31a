//! weft in the browser: the engine behind a small wasm-bindgen API that `weft-worker.js` drives
//! from a Web Worker (see web/www/ for the JavaScript side and the demo page).
//!
//! A [`WebEngine`] owns one `ContinuousBatchEngine` on the page's WebGPU device. Requests come in
//! as OpenAI request bodies and go out as OpenAI response or chunk objects, through the same
//! `weft::openai` code the native server uses, so both doors accept and produce the same JSON.
//! The engine's loop runs as a task on the worker's event loop; every live request joins each
//! step's batch, so concurrent `create` calls are served together.
//!
//! **Invariant:** every `create` that returns without throwing ends with exactly one `"[DONE]"`
//! event, whether the request finished, failed, was aborted or the engine was disposed.
#![cfg(target_arch = "wasm32")]

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use futures::StreamExt;
use js_sys::{Function, Reflect};
use serde_json::{Value, json};
use wasm_bindgen::prelude::*;
use weft::EngineBuilder;
use weft::engine::{ContinuousBatchEngine, Drafter, EngineConfig, SpeculationConfig};
use weft::gpu::{GpuContext, GpuOptions, KernelFamily};
use weft::lora::LoraAdapter;
use weft::model::gguf::ReadAt;
use weft::openai::{ChunkShaper, Endpoint, OpenAiError, ReasoningParser};

#[wasm_bindgen(start)]
fn start() {
    // A Rust panic then reaches the console with its message instead of "unreachable".
    console_error_panic_hook::set_once();
}

/// A model file that loading reads in slices, never whole in WebAssembly memory: the GGUF
/// reader takes its header, metadata and tensor infos in windows of a MiB, then each weight 16
/// MiB at a time as it is uploaded (so the heap holds a slice, whatever the largest tensor).
#[wasm_bindgen]
pub struct ModelFile {
    reader: Box<dyn ReadAt>,
}

#[wasm_bindgen]
impl ModelFile {
    /// A file of `size` bytes that `read(offset, length)` reads synchronously, returning a
    /// Uint8Array of exactly those bytes: in a worker, `FileReaderSync` over a Blob (a picked
    /// file, an OPFS file, a Cache API entry, a download gathered as a Blob).
    #[wasm_bindgen(constructor)]
    pub fn new(size: f64, read: Function) -> Result<ModelFile, JsError> {
        if !(size.is_finite() && size >= 0.0 && size.fract() == 0.0) {
            return Err(JsError::new(&format!("a model file's size must be a whole number of bytes, not {size}")));
        }
        Ok(ModelFile { reader: Box::new(JsReader { size_bytes: size as u64, read }) })
    }

    /// The file's size in bytes.
    #[wasm_bindgen(getter)]
    pub fn length(&self) -> f64 {
        self.reader.len_bytes() as f64
    }
}

impl ModelFile {
    /// Bytes already in Rust (tests, tools), read through the same reader interface.
    pub fn from_vec(bytes: Vec<u8>) -> ModelFile {
        ModelFile { reader: Box::new(Bytes(bytes)) }
    }
}

/// The most bytes one call of a [`JsReader`]'s function reads: each call makes a JavaScript
/// buffer of that size besides the tensor's own memory.
const JS_READ_BYTES: usize = 16 << 20;

/// A file JavaScript reads (see [`ModelFile::new`]).
struct JsReader {
    size_bytes: u64,
    read: Function,
}

impl ReadAt for JsReader {
    fn len_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        for (i, part) in buf.chunks_mut(JS_READ_BYTES).enumerate() {
            let at = offset + (i * JS_READ_BYTES) as u64;
            let got = self
                .read
                .call2(&JsValue::NULL, &(at as f64).into(), &(part.len() as f64).into())
                .map_err(|e| format!("the reader threw: {}", js_text(&e)))?;
            let bytes =
                got.dyn_into::<js_sys::Uint8Array>().map_err(|_| "the reader returned no Uint8Array".to_string())?;
            if bytes.length() as usize != part.len() {
                return Err(format!("the reader returned {} bytes at byte {at}, not {}", bytes.length(), part.len()));
            }
            bytes.copy_to(part);
        }
        Ok(())
    }
}

/// A file held in memory (tests).
struct Bytes(Vec<u8>);

impl ReadAt for Bytes {
    fn len_bytes(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        let start = offset as usize;
        buf.copy_from_slice(&self.0[start..start + buf.len()]);
        Ok(())
    }
}

/// The text of a thrown JavaScript value (an Error's message, a string, anything else).
fn js_text(e: &JsValue) -> String {
    match e.dyn_ref::<js_sys::Error>() {
        Some(error) => String::from(error.message()),
        None => e.as_string().unwrap_or_else(|| format!("{e:?}")),
    }
}

/// A running sha256 of a download, fed chunk by chunk as it arrives (the browser's own digest,
/// `crypto.subtle`, takes one whole buffer); a chunk is in WebAssembly memory only while hashed.
#[wasm_bindgen]
pub struct Sha256 {
    hasher: sha2::Sha256,
}

#[wasm_bindgen]
impl Sha256 {
    #[wasm_bindgen(constructor)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Sha256 {
        use sha2::Digest;
        Sha256 { hasher: sha2::Sha256::new() }
    }

    pub fn update(&mut self, chunk: &[u8]) {
        use sha2::Digest;
        self.hasher.update(chunk);
    }

    /// The digest of the bytes so far, in lowercase hex.
    pub fn hex(&self) -> String {
        use sha2::Digest;
        self.hasher.clone().finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Bytes of this instance's WebAssembly memory: what the engine's heap has grown to. A memory
/// never shrinks, so after a load this is the load's peak.
#[wasm_bindgen(js_name = wasmMemoryBytes)]
pub fn wasm_memory_bytes() -> f64 {
    (std::arch::wasm32::memory_size::<0>() * 65536) as f64
}

/// The engine and what the page asks about it.
#[wasm_bindgen]
pub struct WebEngine {
    engine: ContinuousBatchEngine,
    ctx: Arc<GpuContext>,
    model: Value,
    /// Live requests by the id the caller gave them (one engine request per choice), for
    /// `abort`.
    live: Rc<RefCell<HashMap<String, Vec<u64>>>>,
    /// How chat answers separate a thinking model's reasoning (chosen from the model).
    reasoning: Option<ReasoningParser>,
}

/// Engine limits a page may set; anything not given keeps a browser-sized default.
struct LoadOptions {
    /// `kvMemoryMiB`; `None`: sized to the device as natively (`gpuMemoryUtilization`).
    kv_memory_bytes: Option<usize>,
    /// `gpuMemoryUtilization`: the fraction of the device's memory to use in all (vLLM's
    /// `gpu_memory_utilization`). A browser reports no memory size, so it is of the largest
    /// buffer the device allows, and the pool holds at most `maxNumSeqs` sequences of
    /// `maxModelLen` (see `weft::gpu::memory`).
    gpu_memory_utilization: f64,
    config: EngineConfig,
    /// Speculative decoding by prompt lookup (`specNgram`, `specTokens`).
    speculation: Option<SpeculationConfig>,
    /// A kernel family forced instead of the adapter's own choice (`kernels`), as
    /// `WEFT_KERNELS` forces one natively.
    kernels: Option<KernelFamily>,
    /// What the KV cache holds (`kvCacheDtype`: "f32", or "f16" for twice the tokens); `None`:
    /// f16 where the device has shader-f16, else f32.
    kv_dtype: Option<weft::DType>,
    /// The LoRA pool (`maxLoras`, `maxLoraRank`); `None`: no adapters.
    lora: Option<(usize, usize)>,
}

impl LoadOptions {
    fn from_js(options: &JsValue) -> Result<LoadOptions, JsError> {
        // A tab shares the GPU with everything else on the machine: modest defaults.
        let mut o = LoadOptions {
            kv_memory_bytes: None,
            gpu_memory_utilization: weft::gpu::DEFAULT_GPU_MEMORY_UTILIZATION,
            config: EngineConfig {
                max_num_seqs: 16,
                max_num_batched_tokens: 256,
                max_model_len: 2048,
                enable_prefix_cache: true,
                ..EngineConfig::default()
            },
            speculation: None,
            kernels: None,
            kv_dtype: None,
            lora: None,
        };
        if options.is_undefined() || options.is_null() {
            return Ok(o);
        }
        let number = |key: &str| -> Result<Option<usize>, JsError> {
            let v = Reflect::get(options, &key.into()).map_err(|_| JsError::new(&format!("invalid option {key}")))?;
            if v.is_undefined() || v.is_null() {
                return Ok(None);
            }
            match v.as_f64() {
                Some(x) if x >= 1.0 && x.fract() == 0.0 => Ok(Some(x as usize)),
                _ => Err(JsError::new(&format!("invalid option {key}: expected a positive whole number"))),
            }
        };
        if let Some(mib) = number("kvMemoryMiB")? {
            o.kv_memory_bytes = Some(mib << 20);
        }
        let utilization = Reflect::get(options, &"gpuMemoryUtilization".into())
            .map_err(|_| JsError::new("invalid option gpuMemoryUtilization"))?;
        match utilization.as_f64() {
            Some(u) if u > 0.0 && u <= 1.0 => o.gpu_memory_utilization = u,
            None if utilization.is_undefined() || utilization.is_null() => {}
            _ => {
                return Err(JsError::new(
                    "invalid option gpuMemoryUtilization: expected a number above 0 and at most 1",
                ));
            }
        }
        if let Some(x) = number("maxNumSeqs")? {
            o.config.max_num_seqs = x;
        }
        if let Some(x) = number("maxNumBatchedTokens")? {
            o.config.max_num_batched_tokens = x;
        }
        if let Some(x) = number("maxModelLen")? {
            o.config.max_model_len = x;
        }
        match (number("maxLoras")?, number("maxLoraRank")?) {
            (None, None) => {}
            (slots, rank) => {
                o.lora = Some((
                    slots.unwrap_or(weft::builder::DEFAULT_MAX_LORAS),
                    rank.unwrap_or(weft::builder::DEFAULT_MAX_LORA_RANK),
                ))
            }
        }
        let spec_ngram =
            Reflect::get(options, &"specNgram".into()).map_err(|_| JsError::new("invalid option specNgram"))?;
        let spec_tokens = number("specTokens")?;
        match spec_ngram.as_bool() {
            Some(true) => {
                let k = spec_tokens.unwrap_or(SpeculationConfig::default().num_speculative_tokens);
                let config = SpeculationConfig {
                    num_speculative_tokens: k,
                    drafter: Drafter::prompt_lookup(),
                    ..Default::default()
                };
                config.validate().map_err(|e| JsError::new(&format!("invalid option specTokens: {e}")))?;
                o.speculation = Some(config);
            }
            Some(false) => {}
            None if spec_ngram.is_undefined() || spec_ngram.is_null() => {}
            None => return Err(JsError::new("invalid option specNgram: expected true or false")),
        }
        let kernels = Reflect::get(options, &"kernels".into()).map_err(|_| JsError::new("invalid option kernels"))?;
        if let Some(name) = kernels.as_string() {
            o.kernels =
                Some(KernelFamily::parse(&name).map_err(|e| JsError::new(&format!("invalid option kernels: {e}")))?);
        } else if !kernels.is_undefined() && !kernels.is_null() {
            return Err(JsError::new("invalid option kernels: expected \"baseline\", \"cpu\" or \"subgroup\""));
        }
        let kv_dtype =
            Reflect::get(options, &"kvCacheDtype".into()).map_err(|_| JsError::new("invalid option kvCacheDtype"))?;
        match kv_dtype.as_string().as_deref() {
            Some("f32") => o.kv_dtype = Some(weft::DType::F32),
            Some("f16") => o.kv_dtype = Some(weft::DType::F16),
            None if kv_dtype.is_undefined() || kv_dtype.is_null() => {}
            _ => return Err(JsError::new("invalid option kvCacheDtype: expected \"f32\" or \"f16\"")),
        }
        if spec_tokens.is_some() && o.speculation.is_none() {
            return Err(JsError::new(
                "invalid option specTokens: it sets how many tokens specNgram drafts; add specNgram: true",
            ));
        }
        Ok(o)
    }
}

#[wasm_bindgen]
impl WebEngine {
    /// Open the WebGPU device, parse the GGUF `model`, upload the weights, compile the kernels
    /// serving dispatches, calling `on_progress("upload", layers done, layers in all)` on the way; then
    /// start the loop.
    pub async fn load(
        model: ModelFile,
        name: String,
        options: JsValue,
        on_progress: Option<Function>,
    ) -> Result<WebEngine, JsError> {
        let options = LoadOptions::from_js(&options)?;
        let builder = EngineBuilder::from_gguf_reader(&name, model.reader).map_err(js)?;
        let c = builder.model_config();
        let mut model = json!({
            "name": name,
            "architecture": c.architecture,
            "layers": c.num_layers,
            "hidden": c.hidden_size,
            "vocab": c.vocab_size,
            "contextLength": c.max_position_embeddings,
        });
        let ctx = GpuContext::new(GpuOptions { kernels: options.kernels, ..Default::default() }).await.map_err(js)?;
        let mut builder = builder.config(options.config).gpu_memory_utilization(options.gpu_memory_utilization);
        if let Some(bytes) = options.kv_memory_bytes {
            builder = builder.kv_memory_bytes(bytes);
        }
        if let Some(dtype) = options.kv_dtype {
            builder = builder.kv_cache_dtype(dtype);
        }
        if let Some((slots, rank)) = options.lora {
            builder = builder.lora(slots, rank);
        }
        if let Some(spec) = options.speculation {
            model["speculation"] = json!({"drafter": "promptLookup", "specTokens": spec.num_speculative_tokens});
            builder = builder.speculation(spec);
        }
        if let Some(f) = on_progress {
            builder = builder.on_progress(move |done, total| {
                let _ = f.call3(&JsValue::NULL, &"upload".into(), &(done as f64).into(), &(total as f64).into());
            });
        }
        // Building compiles the kernels serving dispatches (EngineBuilder warms the executor
        // up): the first request does not wait for the compiler, and a shader the browser
        // rejects fails the load. Only those kernels: SwiftShader takes about half a second a
        // kernel, and the variants of a model's weight formats number over a hundred.
        let engine = ctx
            .with_error_scope("compiling the model's kernels", || builder.build_on(ctx.clone()))
            .await
            .map_err(js)?;
        model["hasChatTemplate"] = json!(engine.tokenizer().chat_template().is_some());
        model["maxModelLen"] = json!(engine.config().max_model_len);
        let kv = engine.executor().kv_config();
        model["kvTokens"] = json!(kv.num_blocks * kv.block_size);
        model["kvCacheDtype"] = json!(kv.dtype.name().to_ascii_lowercase());
        // What loading compiled: on a CPU adapter (SwiftShader) each kernel takes seconds, so
        // this count is most of the load's time there.
        model["kernels"] = json!(ctx.creations().pipelines);
        engine.start_loop().map_err(js)?;
        let reasoning = ReasoningParser::detect(engine.tokenizer().as_ref());
        model["reasoningParser"] = json!(reasoning.map(|p| p.family.name));
        Ok(WebEngine { engine, ctx, model, live: Rc::default(), reasoning })
    }

    /// The WebGPU adapter: name, backend, optional features and the limits that matter here.
    #[wasm_bindgen(js_name = adapterInfo)]
    pub fn adapter_info(&self) -> JsValue {
        let info = self.ctx.adapter_info();
        let f = self.ctx.features();
        let l = self.ctx.limits();
        to_js(&json!({
            "name": info.name,
            "vendor": info.vendor,
            "device": info.device,
            "backend": format!("{:?}", info.backend),
            "driver": info.driver,
            "driverInfo": info.driver_info,
            "shaderF16": f.shader_f16,
            "subgroups": f.subgroups,
            "subgroupMinSize": f.subgroup_min_size,
            "subgroupMaxSize": f.subgroup_max_size,
            "timestampQuery": f.timestamp_query,
            "kernels": self.ctx.kernel_family().name(),
            "limits": {
                "maxStorageBufferBindingSize": l.max_storage_buffer_binding_size,
                "maxBufferSize": l.max_buffer_size,
                "maxComputeInvocationsPerWorkgroup": l.max_compute_invocations_per_workgroup,
                "maxComputeWorkgroupStorageSize": l.max_compute_workgroup_storage_size,
                "maxStorageBuffersPerShaderStage": l.max_storage_buffers_per_shader_stage,
            },
        }))
    }

    /// The model: name, architecture, layers, hidden size, vocabulary, context, chat template,
    /// and the LoRA adapters served (`loras`).
    #[wasm_bindgen(js_name = modelInfo)]
    pub fn model_info(&self) -> JsValue {
        let mut model = self.model.clone();
        model["loras"] = json!(self.engine.lora_names());
        to_js(&model)
    }

    /// Serve a LoRA adapter as `name` (a request's `model` then selects it): a PEFT adapter
    /// (`config` the text of its adapter_config.json, `bytes` its adapter_model.safetensors) or,
    /// without `config`, a llama.cpp GGUF LoRA file. Throws, saying why, when the engine was
    /// loaded without `maxLoras`, the name is taken or the adapter does not fit the model.
    #[wasm_bindgen(js_name = addLora)]
    pub fn add_lora(&self, name: &str, config: Option<String>, bytes: Vec<u8>) -> Result<(), JsError> {
        let pool = self.engine.lora_config().ok_or_else(|| {
            JsError::new("this engine serves no LoRA adapters: load it with maxLoras (and maxLoraRank)")
        })?;
        let adapter = match config {
            Some(config) => LoraAdapter::from_peft_bytes(name, &config, &bytes, &pool.shape, pool.max_rank),
            None => weft::model::gguf::GgufFile::from_bytes(name, bytes)
                .and_then(|gguf| LoraAdapter::from_gguf(name, &gguf, &pool.shape, pool.max_rank)),
        };
        self.engine.add_lora(adapter.map_err(js)?).map_err(js)
    }

    /// Stop serving the adapter `name` (refused while requests for it run).
    #[wasm_bindgen(js_name = removeLora)]
    pub fn remove_lora(&self, name: &str) -> Result<(), JsError> {
        self.engine.remove_lora(name).map_err(js)
    }

    /// Start an OpenAI request: `kind` is "chat" (chat/completions) or "completion"
    /// (completions), `body` the request's JSON text, `id` the response's id. An invalid
    /// request throws an Error with OpenAI's `type`, `param` and `code`. Otherwise `on_event`
    /// receives each chunk object as JSON text (or, without `stream`, the whole response), an
    /// `{"error": …}` object if generation fails, and finally `"[DONE]"`.
    pub fn create(&self, kind: &str, body: &str, id: String, on_event: Function) -> Result<(), JsValue> {
        let endpoint = match kind {
            "chat" => Endpoint::Chat,
            "completion" => Endpoint::Completion,
            other => {
                return Err(js_error(&OpenAiError::invalid_body(format!(
                    "unknown request kind {other:?}; use \"chat\" or \"completion\""
                ))));
            }
        };
        if self.live.borrow().contains_key(&id) {
            return Err(js_error(&OpenAiError::invalid_body(format!("a request with id {id:?} is already running"))));
        }
        let map = weft::openai::parse_body(body.as_bytes()).map_err(|e| js_error(&e))?;
        let mut req = weft::openai::parse(endpoint, &map).map_err(|e| js_error(&e))?;
        // A `model` naming an adapter selects it; any other name is the page's label for the
        // base model.
        req.request.lora = req.model.clone().filter(|m| self.engine.lora_names().contains(m));
        req.apply_reasoning(self.engine.tokenizer().as_ref(), self.reasoning.as_ref()).map_err(|e| js_error(&e))?;
        // Each choice is its own engine request; their chunks interleave, tagged by choice.
        let mut seqs = Vec::with_capacity(req.n);
        let mut streams = Vec::with_capacity(req.n);
        for (i, r) in req.choice_requests().into_iter().enumerate() {
            match self.engine.infer_stream_with_id(r) {
                Ok((seq, stream)) => {
                    seqs.push(seq);
                    streams.push(stream.map(move |item| (i, item)).boxed_local());
                }
                Err(e) => {
                    for seq in seqs {
                        self.engine.cancel(seq);
                    }
                    return Err(js_error(&OpenAiError::from_engine(e)));
                }
            }
        }
        self.live.borrow_mut().insert(id.clone(), seqs);
        let engine = self.engine.clone();
        let live = self.live.clone();
        let base = self.model["name"].as_str().unwrap_or_default().to_string();
        let model = req.request.lora.clone().unwrap_or(base);
        let created = weft::openai::unix_now();
        let emit = move |text: &str| {
            let _ = on_event.call1(&JsValue::NULL, &JsValue::from_str(text));
        };
        wasm_bindgen_futures::spawn_local(async move {
            if req.stream {
                let mut stream = futures::stream::select_all(streams);
                let mut shaper = ChunkShaper::new(engine, &req, id.clone(), created, model);
                for chunk in shaper.start() {
                    emit(&chunk.to_string());
                }
                while let Some((choice, item)) = stream.next().await {
                    for chunk in shaper.shape_choice(choice, item) {
                        emit(&chunk.to_string());
                    }
                    if shaper.finished() {
                        break;
                    }
                }
            } else {
                let mut responses = Vec::with_capacity(streams.len());
                let mut failed = None;
                for stream in streams {
                    let mut stream = stream.map(|(_, item)| item);
                    match weft::engine::collect_response(&mut stream).await {
                        Ok(r) => responses.push(r),
                        Err(e) => {
                            failed = Some(OpenAiError::from_engine(e));
                            break;
                        }
                    }
                }
                let tok = engine.tokenizer().clone();
                let result = match failed {
                    Some(e) => Err(e),
                    None => weft::openai::response_json_with(tok.as_ref(), &req, &id, created, &model, &responses),
                };
                emit(&result.unwrap_or_else(|e| e.body()).to_string());
            }
            live.borrow_mut().remove(&id);
            emit("[DONE]");
        });
        Ok(())
    }

    /// Stop request `id`: it ends with finish_reason "abort". False if it is not running.
    pub fn abort(&self, id: &str) -> bool {
        let seqs = self.live.borrow().get(id).cloned().unwrap_or_default();
        seqs.into_iter().fold(false, |any, seq| self.engine.cancel(seq) | any)
    }

    /// Requests running or queued right now.
    #[wasm_bindgen(js_name = liveRequests)]
    pub fn live_requests(&self) -> usize {
        self.live.borrow().len()
    }

    /// Whether the engine can still serve, as `{healthy, detail}`: a small round trip to the
    /// GPU, and the reason when not (the device was lost, e.g. the browser's GPU process
    /// crashed or reset it, and every request then running ended with that error; the engine
    /// was disposed; the last step failed).
    pub fn health(&self) -> js_sys::Promise {
        use weft::engine::api::InferenceEngine;
        let engine = self.engine.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let report = InferenceEngine::health_check(&engine).await;
            Ok(to_js(&json!({"healthy": report.healthy, "detail": report.detail})))
        })
    }

    /// End every request (each gets its final chunk and "[DONE]") and refuse new ones; the GPU
    /// memory goes when the last handle is freed.
    pub fn dispose(&self) {
        self.engine.shutdown();
    }
}

/// A load error as JavaScript sees it: an Error with weft's message.
fn js(e: weft::WeftError) -> JsError {
    JsError::new(&e.to_string())
}

fn to_js(v: &Value) -> JsValue {
    js_sys::JSON::parse(&v.to_string()).unwrap_or(JsValue::NULL)
}

/// An Error whose message is OpenAI's, with its `type`, `param` and `code` as properties.
fn js_error(e: &OpenAiError) -> JsValue {
    let error = js_sys::Error::new(&e.message);
    let set = |k: &str, v: JsValue| {
        let _ = Reflect::set(&error, &k.into(), &v);
    };
    set("type", e.kind.into());
    set("param", e.param.as_deref().map_or(JsValue::NULL, JsValue::from_str));
    set("code", e.code.map_or(JsValue::NULL, JsValue::from_str));
    error.into()
}
