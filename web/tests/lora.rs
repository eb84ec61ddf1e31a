//! LoRA adapters in a real browser (headless Chromium on WebGPU): the tiny Llama of
//! `tests/fixtures/lora/` as llama.cpp's GGUF, one adapter added as a GGUF LoRA file and one as
//! a PEFT adapter's two files, and the base model and both adapters streamed at once, each
//! stream selected by its request's `model`; each text is peft's greedy tokens (up to the first
//! reference near-tie), as the model's own tokenizer spells them.
#![cfg(target_arch = "wasm32")]

use std::cell::RefCell;
use std::rc::Rc;

use futures::channel::oneshot;
use serde_json::{Value, json};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_test::*;
use weft::tokenizer::Tokenizer;
use weft_web::{ModelFile, WebEngine};

wasm_bindgen_test_configure!(run_in_dedicated_worker);

const MODEL: &[u8] = include_bytes!("../../tests/fixtures/lora/model.gguf");
const ALPHA_GGUF: &[u8] = include_bytes!("../../tests/fixtures/lora/alpha.gguf");
const BETA_CONFIG: &str = include_str!("../../tests/fixtures/lora/beta/adapter_config.json");
const BETA_SAFETENSORS: &[u8] = include_bytes!("../../tests/fixtures/lora/beta/adapter_model.safetensors");
const EXPECTED: &str = include_str!("../../tests/fixtures/lora/expected.json");

/// A stream's events, complete at "[DONE]".
struct Run {
    events: Rc<RefCell<Vec<String>>>,
    done: oneshot::Receiver<()>,
    _callback: Closure<dyn FnMut(String)>,
}

fn start(engine: &WebEngine, body: &Value, id: &str) -> Run {
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
    let f = callback.as_ref().unchecked_ref::<js_sys::Function>().clone();
    engine.create("completion", &body.to_string(), id.into(), f).expect("the request is accepted");
    Run { events, done, _callback: callback }
}

/// The streamed text and the model the chunks name.
async fn finish(run: Run) -> (String, String) {
    run.done.await.expect("the request reaches [DONE]");
    let events = run.events.borrow();
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    (text, chunks[0]["model"].as_str().unwrap_or_default().to_string())
}

#[wasm_bindgen_test]
async fn the_base_model_and_two_adapters_stream_at_once() {
    let options = js_sys::JSON::parse(r#"{"maxLoras": 2, "maxLoraRank": 8}"#).unwrap();
    let engine = WebEngine::load(ModelFile::from_vec(MODEL.to_vec()), "tiny-llama".into(), options, None)
        .await
        .map_err(JsValue::from)
        .expect("the model loads");
    engine.add_lora("alpha", None, ALPHA_GGUF.to_vec()).map_err(JsValue::from).expect("a GGUF LoRA");
    engine.add_lora("beta", Some(BETA_CONFIG.into()), BETA_SAFETENSORS.to_vec()).map_err(JsValue::from).expect("PEFT");
    let e = engine.add_lora("beta", Some(BETA_CONFIG.into()), BETA_SAFETENSORS.to_vec()).unwrap_err();
    assert!(JsValue::from(e).as_string().is_none_or(|m| !m.is_empty()), "a name is served once");
    let tokenizer = weft::model::load::ModelFiles::from_gguf_bytes("m", MODEL.to_vec()).unwrap().tokenizer;
    let expected: Value = serde_json::from_str(EXPECTED).unwrap();
    let ids = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<u32>>();
    let runs: Vec<(&str, &str)> = vec![("tiny-llama", "base"), ("alpha", "alpha"), ("beta", "beta")];
    let mut streams = Vec::new();
    for (i, (model, reference)) in runs.iter().enumerate() {
        let p = &expected["models"][reference]["prompts"][1];
        let body = json!({"model": model, "prompt": ids(&p["prompt_ids"]), "max_tokens": 10, "temperature": 0,
                          "stream": true, "ignore_eos": true});
        streams.push(start(&engine, &body, &format!("cmpl-{i}")));
    }
    for (run, (model, reference)) in streams.into_iter().zip(&runs) {
        let p = &expected["models"][reference]["prompts"][1];
        let margins: Vec<f64> = p["greedy_margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect();
        let sure = margins.iter().position(|&m| m < 1e-3).unwrap_or(margins.len());
        let want = tokenizer.decode(&ids(&p["greedy_ids"])[..sure], false).unwrap();
        let (text, named) = finish(run).await;
        assert!(text.starts_with(&want), "{model}: {text:?} does not start with peft's {want:?}");
        assert_eq!(&named, model);
    }
    engine.remove_lora("alpha").map_err(JsValue::from).expect("alpha is idle");
    engine.dispose();
}
