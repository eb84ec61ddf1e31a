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
    // f32 K and V, the reference's values exactly (the default on a device with shader-f16 is
    // f16); 8 MiB hold 176 tokens of them, so the context is held to 128.
    let config = weft::engine::EngineConfig { max_model_len: 128, ..Default::default() };
    let builder = EngineBuilder::from_model(&path)
        .unwrap()
        .config(config)
        .kv_memory_bytes(8 << 20)
        .kv_cache_dtype(weft::DType::F32);
    let engine = match weft::rt::block_on(builder.build()) {
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

/// Loading leaves none of the file resident in this process: each layer's pages are dropped
/// once uploaded (`WeightSource::release_pages`), so loading peaks at the GPU copy plus about
/// a layer of the file, not the whole model twice (on a CPU driver the GPU copy is host memory
/// too). Reads the mapping's resident size from /proc/self/smaps, so Linux only.
#[cfg(target_os = "linux")]
#[test]
fn loading_drops_the_file_pages_it_uploaded() {
    use weft::model::gguf::GgufFile;
    use weft::model::load::GgufWeights;
    if model().is_none() {
        return;
    }
    let Some(ctx) = weft::gpu::open_or_skip(weft::gpu::GpuOptions::default()).unwrap() else { return };
    let factory = weft::gpu::GpuTensorFactory::new(ctx);
    let gguf = GgufFile::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL)).unwrap();
    let config = weft::model::config::ModelConfig::from_gguf(&gguf).unwrap();
    let data: usize = gguf.tensors.iter().map(|t| t.size_bytes() as usize).sum();
    let inside = gguf.tensor_bytes(&gguf.tensors[0]).unwrap().as_ptr() as usize;
    // The measure sees the mapping: reading every tensor makes it resident.
    let checksum: u64 =
        gguf.tensors.iter().map(|t| gguf.tensor_bytes(t).unwrap().iter().map(|&b| u64::from(b)).sum::<u64>()).sum();
    assert!(resident_bytes(inside) >= data * 9 / 10, "{} of {data} bytes resident", resident_bytes(inside));
    let mut most = 0;
    let model = weft::model::arch::load(config, &GgufWeights { gguf: &gguf }, &factory, &mut |_, _| {
        most = most.max(resident_bytes(inside));
    })
    .unwrap();
    drop(model);
    const SLACK: usize = 1 << 20;
    assert!(most <= SLACK, "{most} bytes of the file resident between layers");
    assert!(resident_bytes(inside) <= SLACK, "{} bytes of the file resident after loading", resident_bytes(inside));
    // Dropped pages read back unchanged.
    let again: u64 =
        gguf.tensors.iter().map(|t| gguf.tensor_bytes(t).unwrap().iter().map(|&b| u64::from(b)).sum::<u64>()).sum();
    assert_eq!(again, checksum);
}

/// The resident bytes (smaps `Rss`) of this process's mapping that holds `address`.
#[cfg(target_os = "linux")]
fn resident_bytes(address: usize) -> usize {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16)) else {
                continue;
            };
            inside = (start..end).contains(&address);
        } else if inside && first == "Rss:" {
            return fields.next().unwrap().parse::<usize>().unwrap() * 1024;
        }
    }
    panic!("no mapping holds {address:#x}")
}
