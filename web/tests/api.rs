//! The web crate's API in a real browser: headless Chromium on WebGPU (SwiftShader in CI),
//! driven by wasm-bindgen-test inside a dedicated worker, where the demo runs the engine too.
//! A tiny random model is written in the test itself and loaded from bytes.
#![cfg(target_arch = "wasm32")]

use std::cell::RefCell;
use std::rc::Rc;

use futures::channel::oneshot;
use serde_json::Value;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_test::*;
use weft::model::tiny::{gguf_bytes, random_weights, tiny_config};
use weft::quant::DType;
use weft_web::{ModelFile, WebEngine};

wasm_bindgen_test_configure!(run_in_dedicated_worker);

fn tiny_model() -> Vec<u8> {
    let c = tiny_config();
    gguf_bytes(&c, &random_weights(&c, 21, DType::Q8_0), DType::Q8_0)
}

async fn load_tiny() -> WebEngine {
    WebEngine::load(ModelFile::from_vec(tiny_model()), "tiny.gguf".into(), JsValue::UNDEFINED, None)
        .await
        .map_err(JsValue::from)
        .expect("the tiny model loads")
}

/// A request in flight: its events so far, and a receiver that fires at "[DONE]".
struct Run {
    events: Rc<RefCell<Vec<String>>>,
    done: oneshot::Receiver<()>,
    _callback: Closure<dyn FnMut(String)>,
}

impl Run {
    fn start(engine: &WebEngine, kind: &str, body: &Value, id: &str) -> Result<Run, JsValue> {
        let events = Rc::new(RefCell::new(Vec::new()));
        let (tx, done) = oneshot::channel();
        let mut tx = Some(tx);
        let seen = events.clone();
        let callback = Closure::<dyn FnMut(String)>::new(move |event: String| {
            if event == "[DONE]"
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(());
            }
            seen.borrow_mut().push(event);
        });
        engine.create(
            kind,
            &body.to_string(),
            id.into(),
            callback.as_ref().unchecked_ref::<js_sys::Function>().clone(),
        )?;
        Ok(Run { events, done, _callback: callback })
    }

    /// Every event, parsed, once the request is done ("[DONE]" itself left out).
    async fn finish(self) -> Vec<Value> {
        self.done.await.expect("the request reaches [DONE]");
        let events = self.events.borrow();
        assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1, "exactly one [DONE]: {events:?}");
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "[DONE] comes last");
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("events are JSON")).collect()
    }
}

fn chat(prompt: &str, max_tokens: usize, stream: bool) -> Value {
    serde_json::json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0, "stream": stream,
        "stream_options": if stream { serde_json::json!({"include_usage": true}) } else { Value::Null },
    })
}

fn streamed_text(chunks: &[Value]) -> String {
    chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect()
}

fn finish_reason(chunks: &[Value]) -> Option<String> {
    chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_string))
}

#[wasm_bindgen_test]
async fn loads_from_bytes_and_describes_itself() {
    let engine = load_tiny().await;
    let model: Value =
        serde_json::from_str(&js_sys::JSON::stringify(&engine.model_info()).unwrap().as_string().unwrap()).unwrap();
    assert_eq!(model["layers"], 2);
    assert_eq!(model["hasChatTemplate"], true);
    let adapter: Value =
        serde_json::from_str(&js_sys::JSON::stringify(&engine.adapter_info()).unwrap().as_string().unwrap()).unwrap();
    assert!(adapter["name"].as_str().is_some(), "adapter info has a name: {adapter}");
    assert!(adapter["limits"]["maxStorageBufferBindingSize"].as_u64().unwrap() > 0);
    assert!(["baseline", "cpu", "subgroup"].contains(&adapter["kernels"].as_str().unwrap_or("")), "{adapter}");
    // The KV cache sized to the device: f16 where it has shader-f16 (SwiftShader has not),
    // holding at least one sequence of maxModelLen.
    let dtype = if adapter["shaderF16"] == true { "f16" } else { "f32" };
    assert_eq!(model["kvCacheDtype"], dtype, "{model}");
    assert!(model["kvTokens"].as_u64().unwrap() >= model["maxModelLen"].as_u64().unwrap(), "{model}");
    engine.dispose();
}

/// The `kernels` option forces a kernel family, as `WEFT_KERNELS` does natively, and
/// `kvCacheDtype: "f16"` holds the KV cache in halves; an unknown family or cache type is
/// refused with a message naming the option and the choices.
#[wasm_bindgen_test]
async fn the_kernels_option_forces_a_family() {
    let options = |key: &str, value: &str| {
        let o = js_sys::Object::new();
        js_sys::Reflect::set(&o, &key.into(), &value.into()).unwrap();
        JsValue::from(o)
    };
    // The baseline kernels over an f16 KV cache (halves in storage buffers).
    let both = options("kernels", "baseline");
    js_sys::Reflect::set(&both, &"kvCacheDtype".into(), &"f16".into()).unwrap();
    let engine = WebEngine::load(ModelFile::from_vec(tiny_model()), "tiny.gguf".into(), both, None)
        .await
        .map_err(JsValue::from)
        .expect("the tiny model loads on the baseline kernels with an f16 KV cache");
    let adapter: Value =
        serde_json::from_str(&js_sys::JSON::stringify(&engine.adapter_info()).unwrap().as_string().unwrap()).unwrap();
    assert_eq!(adapter["kernels"], "baseline", "{adapter}");
    let text = Run::start(&engine, "chat", &chat("Hello", 3, false), "k1").unwrap().finish().await;
    assert_eq!(text[0]["usage"]["completion_tokens"], 3, "{text:?}");
    engine.dispose();
    // The adapter's own family over an f16 cache: on a CPU adapter (SwiftShader) the cpu
    // family's rgba16float storage textures.
    let engine =
        WebEngine::load(ModelFile::from_vec(tiny_model()), "tiny.gguf".into(), options("kvCacheDtype", "f16"), None)
            .await
            .map_err(JsValue::from)
            .expect("the tiny model loads with an f16 KV cache");
    let text = Run::start(&engine, "chat", &chat("Hello", 3, false), "k2").unwrap().finish().await;
    assert_eq!(text[0]["usage"]["completion_tokens"], 3, "{text:?}");
    engine.dispose();
    let err = WebEngine::load(ModelFile::from_vec(tiny_model()), "tiny.gguf".into(), options("kernels", "fast"), None)
        .await
        .err()
        .expect("an unknown family is refused");
    let message = js_sys::Error::from(JsValue::from(err)).message().as_string().unwrap();
    assert!(message.contains("invalid option kernels") && message.contains("baseline, cpu or subgroup"), "{message}");
    let err =
        WebEngine::load(ModelFile::from_vec(tiny_model()), "tiny.gguf".into(), options("kvCacheDtype", "q8"), None)
            .await
            .err()
            .expect("an unknown KV cache type is refused");
    let message = js_sys::Error::from(JsValue::from(err)).message().as_string().unwrap();
    assert!(message.contains("invalid option kvCacheDtype") && message.contains("\"f16\""), "{message}");
}

/// Four prompts at once stream OpenAI chunks, and each equals the same request run alone (the
/// engine is batch invariant and greedy decoding is deterministic, so the match is exact).
#[wasm_bindgen_test]
async fn concurrent_streams_equal_solo_runs() {
    let engine = load_tiny().await;
    let prompts = ["Hello", "The sky is", "1, 2, 3,", "Write a poem about rust"];
    let solo = {
        let mut texts = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let events = Run::start(&engine, "chat", &chat(p, 10, false), &format!("solo-{i}")).unwrap().finish().await;
            assert_eq!(events.len(), 1, "a non-streamed request gives one response object");
            let r = &events[0];
            assert_eq!(r["object"], "chat.completion");
            assert_eq!(r["choices"][0]["finish_reason"], "length");
            assert_eq!(r["usage"]["completion_tokens"], 10);
            texts.push(r["choices"][0]["message"]["content"].as_str().unwrap().to_string());
        }
        texts
    };
    let runs: Vec<Run> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Run::start(&engine, "chat", &chat(p, 10, true), &format!("together-{i}")).unwrap())
        .collect();
    assert_eq!(engine.live_requests(), 4);
    for (i, run) in runs.into_iter().enumerate() {
        let chunks = run.finish().await;
        assert_eq!(chunks[0]["object"], "chat.completion.chunk");
        assert_eq!(chunks[0]["id"], format!("together-{i}"));
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(finish_reason(&chunks).as_deref(), Some("length"));
        let usage = chunks.last().unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], 10, "the usage chunk comes last: {usage}");
        assert_eq!(streamed_text(&chunks), solo[i], "prompt {i} batched differs from alone");
    }
    assert_eq!(engine.live_requests(), 0);
    engine.dispose();
}

/// The load's error message for a model read through the JavaScript function `read`.
async fn load_error_through(read: &Closure<dyn Fn(f64, f64) -> JsValue>, size: usize) -> String {
    let file = ModelFile::new(size as f64, read.as_ref().unchecked_ref::<js_sys::Function>().clone())
        .map_err(JsValue::from)
        .expect("a whole size");
    let err = WebEngine::load(file, "read.gguf".into(), JsValue::UNDEFINED, None).await.err().expect("refused");
    js_sys::Error::from(JsValue::from(err)).message().as_string().unwrap()
}

/// A model read in slices by JavaScript: a reader that throws, or answers with the wrong bytes,
/// fails the load with a message naming the file and saying what the reader did.
#[wasm_bindgen_test]
async fn a_failing_javascript_reader_fails_the_load_saying_why() {
    let bytes = tiny_model();
    let len = bytes.len();
    let not_bytes = Closure::<dyn Fn(f64, f64) -> JsValue>::new(|_: f64, _: f64| JsValue::from_str("bytes"));
    let thrower = js_sys::Function::new_with_args("o, n", "throw new Error('the file went away')");
    let file = ModelFile::new(len as f64, thrower).map_err(JsValue::from).unwrap();
    let err = WebEngine::load(file, "read.gguf".into(), JsValue::UNDEFINED, None).await.err().expect("refused");
    let message = js_sys::Error::from(JsValue::from(err)).message().as_string().unwrap();
    assert!(message.starts_with("read.gguf: cannot read"), "{message}");
    assert!(message.contains("the reader threw: the file went away"), "{message}");
    // Not a Uint8Array.
    let message = load_error_through(&not_bytes, len).await;
    assert!(message.contains("the reader returned no Uint8Array"), "{message}");
    // One byte short of what was asked.
    let short = Closure::<dyn Fn(f64, f64) -> JsValue>::new(move |offset: f64, length: f64| -> JsValue {
        let start = offset as usize;
        js_sys::Uint8Array::from(&bytes[start..start + length as usize - 1]).into()
    });
    let message = load_error_through(&short, len).await;
    assert!(message.contains("the reader returned") && message.contains("bytes at byte 0, not"), "{message}");
    // A size that is no byte count.
    assert!(ModelFile::new(-1.0, js_sys::Function::new_no_args("")).is_err());
    assert!(ModelFile::new(0.5, js_sys::Function::new_no_args("")).is_err());
}

#[wasm_bindgen_test]
async fn malformed_models_are_refused_with_a_readable_error() {
    let junk = vec![0x42u8; 1024];
    let err = WebEngine::load(ModelFile::from_vec(junk), "junk.gguf".into(), JsValue::UNDEFINED, None)
        .await
        .err()
        .expect("junk is refused");
    let message = js_sys::Error::from(JsValue::from(err)).message().as_string().unwrap();
    assert!(message.contains("junk.gguf") && message.contains("GGUF"), "{message}");

    let mut cut = tiny_model();
    cut.truncate(cut.len() / 2);
    let err = WebEngine::load(ModelFile::from_vec(cut), "cut.gguf".into(), JsValue::UNDEFINED, None)
        .await
        .err()
        .expect("a truncated model is refused");
    let message = js_sys::Error::from(JsValue::from(err)).message().as_string().unwrap();
    assert!(message.contains("cut.gguf") && message.contains("end of the file"), "{message}");
}

#[wasm_bindgen_test]
async fn invalid_requests_throw_naming_the_field() {
    let engine = load_tiny().await;
    let mut body = chat("Hi", 4, true);
    body["temperature"] = (-1.0).into();
    let err = Run::start(&engine, "chat", &body, "bad").err().expect("a negative temperature is refused");
    assert_eq!(js_sys::Reflect::get(&err, &"param".into()).unwrap().as_string().as_deref(), Some("temperature"));
    assert_eq!(
        js_sys::Reflect::get(&err, &"type".into()).unwrap().as_string().as_deref(),
        Some("invalid_request_error")
    );
    let err =
        Run::start(&engine, "embeddings", &chat("Hi", 4, true), "bad-kind").err().expect("an unknown kind is refused");
    let message = js_sys::Error::from(err).message().as_string().unwrap();
    assert!(message.contains("embeddings"), "{message}");
    assert_eq!(engine.live_requests(), 0, "nothing refused stays live");
    engine.dispose();
}

/// Aborting a stream ends it with finish_reason "abort"; the other request is undisturbed.
#[wasm_bindgen_test]
async fn abort_ends_one_stream_and_spares_the_other() {
    let engine = load_tiny().await;
    let reference = Run::start(&engine, "chat", &chat("Keep going", 12, false), "reference").unwrap().finish().await;
    let mut long = chat("Count forever", 400, true);
    long["ignore_eos"] = true.into();
    let doomed = Run::start(&engine, "chat", &long, "doomed").unwrap();
    let survivor = Run::start(&engine, "chat", &chat("Keep going", 12, true), "survivor").unwrap();
    // Wait for the doomed stream's first content, then abort it.
    while !doomed.events.borrow().iter().any(|e| e.contains("\"content\"") && !e.contains("\"role\"")) {
        sleep_ms(5).await;
    }
    assert!(engine.abort("doomed"));
    let chunks = doomed.finish().await;
    assert_eq!(finish_reason(&chunks).as_deref(), Some("abort"));
    assert!(!engine.abort("doomed"), "a finished request cannot be aborted again");
    let survived = survivor.finish().await;
    assert_eq!(streamed_text(&survived), reference[0]["choices"][0]["message"]["content"].as_str().unwrap());
    engine.dispose();
}

async fn sleep_ms(ms: i32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        let global: web_sys_like::Global = js_sys::global().unchecked_into();
        global.set_timeout(&resolve, ms);
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

/// `setTimeout` on whatever global this runs in (a window or a worker).
mod web_sys_like {
    use wasm_bindgen::prelude::*;

    #[wasm_bindgen]
    extern "C" {
        pub type Global;
        #[wasm_bindgen(method, js_name = setTimeout)]
        pub fn set_timeout(this: &Global, handler: &js_sys::Function, ms: i32) -> i32;
    }
}

/// Sampling with penalties runs the sampler and penalty kernels in the browser: a seeded request
/// gives the same text alone and beside another request.
#[wasm_bindgen_test]
async fn seeded_sampling_with_penalties_is_reproducible() {
    let engine = load_tiny().await;
    let mut body = chat("Tell me a story", 12, true);
    body["temperature"] = 0.9.into();
    body["top_p"] = 0.9.into();
    body["seed"] = 7.into();
    body["presence_penalty"] = 0.5.into();
    body["frequency_penalty"] = 0.3.into();
    let alone = Run::start(&engine, "chat", &body, "alone").unwrap().finish().await;
    let neighbour = Run::start(&engine, "chat", &chat("Hello there", 12, true), "neighbour").unwrap();
    let together = Run::start(&engine, "chat", &body, "together").unwrap().finish().await;
    neighbour.finish().await;
    assert_eq!(finish_reason(&alone).as_deref(), Some("length"));
    assert!(!streamed_text(&alone).is_empty());
    assert_eq!(streamed_text(&together), streamed_text(&alone));
    engine.dispose();
}
