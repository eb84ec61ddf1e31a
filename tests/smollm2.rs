//! The default model beyond its fidelity (which tests/real_models.rs checks with the other real
//! models): the one-line builder and the engine traits, a second tokenizer fixture, and the
//! weight formats the browser compiles for.

use std::path::Path;

use serde_json::Value;
use weft::model::load::ModelFiles;
use weft::sampling::SamplingParams;
use weft::tokenizer::Tokenizer;

const MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

fn model() -> Option<ModelFiles> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL);
    if !path.exists() {
        assert!(
            std::env::var("WEFT_REQUIRE_MODEL").as_deref() != Ok("1"),
            "{MODEL} is missing: run cargo xtask fetch-model"
        );
        eprintln!("skipping: {MODEL} is missing (cargo xtask fetch-model)");
        return None;
    }
    Some(ModelFiles::open(&path).unwrap())
}

fn fixtures() -> Vec<Value> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2/model.json"))
        .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["prompts"].as_array().unwrap().clone()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The one-line builder and the engine traits, on the default model: the engine's greedy
/// tokens are the reference's.
#[test]
fn the_engine_builder_serves_the_default_model() {
    use weft::EngineBuilder;
    use weft::engine::api::{EngineStatus, LlmInferenceEngine};
    use weft::engine::request::{GenerationParams, InferenceRequest, Prompt};
    if model().is_none() {
        return;
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL);
    let engine = match weft::rt::block_on(EngineBuilder::from_model(&path).unwrap().kv_memory_bytes(8 << 20).build()) {
        Ok(e) => e,
        Err(e @ weft::WeftError::NoAdapter { .. }) if std::env::var("WEFT_REQUIRE_GPU").as_deref() != Ok("1") => {
            return eprintln!("skipping: {e}");
        }
        Err(e) => panic!("{e}"),
    };
    let engine: std::sync::Arc<dyn LlmInferenceEngine> = std::sync::Arc::new(engine);
    let p = &fixtures()[0];
    let params = GenerationParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(6),
        ignore_eos: true,
        ..Default::default()
    };
    let response =
        weft::rt::block_on(engine.infer(InferenceRequest::new(Prompt::Tokens(ids(&p["prompt_ids"])), params))).unwrap();
    assert_eq!(response.token_ids, ids(&p["greedy_ids"])[..6]);
    assert!(response.text.contains("Paris"), "{}", response.text);
    assert!(weft::rt::block_on(engine.health_check()).healthy);
    assert_eq!(engine.status(), EngineStatus::Running { background_loop: false });
    let admission = engine.admission_snapshot();
    assert_eq!((admission.running, admission.waiting), (0, 0));
    assert!(engine.lora_metrics_snapshot().is_none());
    assert_eq!(engine.cache_metrics_snapshot().kv.used_blocks, 0);
    engine.shutdown();
    assert!(!weft::rt::block_on(engine.health_check()).healthy);
    assert_eq!(engine.status(), EngineStatus::ShutDown);
}

/// A second, independent tokenizer fixture (tools/make_fixtures.py: transformers' GGUF tokenizer
/// with SmolLM2's digit-splitting pre-tokenizer restored, cross-checked against llama.cpp):
/// every string encodes to the reference ids and decodes back where the reference does.
#[test]
fn tokenizer_matches_the_transformers_fixture() {
    let Some(files) = model() else { return };
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2/tokenizer_hf.json"))
            .unwrap();
    let fixture: Value = serde_json::from_str(&text).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 300);
    for case in cases {
        let s = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(files.tokenizer.encode(s, false).unwrap(), want, "{s:?}");
        if case["roundtrip"].as_bool().unwrap() {
            assert_eq!(files.tokenizer.decode(&want, false).unwrap(), s);
        }
    }
}
