//! The Llama forward pass on the browser's WebGPU (SwiftShader in CI) against the plain CPU one
//! (`weft::cpu::llama`), on tiny random models in every weight format: the same check as the
//! native tests/model.rs, because browsers compile WGSL with their own compiler (Tint) and run it
//! with their own robustness rules.
//!
//! Tolerance: logits agree within 1e-4 · max|logit|, as natively (see tests/model.rs for why).
//!
//! A recurrent model too: the tiny dense Granite 4.0-H of `tests/fixtures/granite_hybrid/`
//! (Mamba2 and attention layers; made by transformers, converted by llama.cpp) serves four
//! streams at once and gives transformers' greedy tokens, as the native tests/recurrent.rs does.
#![cfg(target_arch = "wasm32")]

use futures::StreamExt;
use serde_json::Value;
use wasm_bindgen_test::*;
use weft::engine::request::{GenerationParams, InferenceRequest, Prompt};
use weft::gpu::{GpuContext, GpuOptions, GpuTensorFactory};
use weft::kv::KvCacheConfig;
use weft::model::arch;
use weft::model::config::ModelConfig;
use weft::model::executor::GpuExecutor;
use weft::model::gguf::GgufFile;
use weft::model::load::GgufWeights;
use weft::model::tiny;
use weft::sampling::SamplingParams;
use weft::step::{SeqStep, StepBatch};
use weft::tensor::TensorFactory;
use weft::{DType, EngineBuilder};

wasm_bindgen_test_configure!(run_in_dedicated_worker);

fn worst_error(got: &[f32], want: &[f32]) -> (f32, f32) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    (worst, scale)
}

/// Two sequences in one step (one prefilling in chunks across blocks, one decoding), then the
/// next chunks: the errors of every checked position.
async fn compare(f: &GpuTensorFactory, config: &ModelConfig, dtype: DType, num_blocks: usize) -> Vec<String> {
    let w = tiny::random_weights(config, 7, dtype);
    let gguf = GgufFile::from_bytes("tiny.gguf", tiny::gguf_bytes(config, &w, dtype)).unwrap();
    let loaded = ModelConfig::from_gguf(&gguf).unwrap();
    let model = arch::load(loaded, &GgufWeights { gguf: &gguf }, f, &mut |_, _| {}).unwrap();
    let exec = GpuExecutor::new(f.clone(), model, KvCacheConfig::new(4, num_blocks)).unwrap();
    let a: Vec<u32> = vec![5, 17, 250, 3, 3, 99, 0, 42, 7];
    let b: Vec<u32> = vec![1, 2, 3, 4, 5, 6];
    let want_a = weft::cpu::llama::forward(config, &w, &a);
    let want_b = weft::cpu::llama::forward(config, &w, &b);
    let (table_a, table_b) = (vec![10, 3, 7], vec![20, 21]);
    let seq = |tokens: &[u32], start: usize, table: &Vec<u32>| SeqStep {
        tokens: tokens.to_vec(),
        start_pos: start,
        block_table: table.clone(),
        num_logits: 1,
        ..Default::default()
    };
    let step = |seqs: Vec<SeqStep>| StepBatch { seqs, ..Default::default() };
    let mut failures = Vec::new();
    let mut check = |what: String, got: &[f32], want: &[f32]| {
        let (worst, scale) = worst_error(got, want);
        if worst.is_nan() || worst > 1e-4 * scale {
            failures.push(format!("{dtype} {what}: max error {worst} vs max |logit| {scale}"));
        }
    };
    let out = exec.logits(&step(vec![seq(&a[..3], 0, &table_a), seq(&b[..5], 0, &table_b)])).await.unwrap();
    check("a[..3]".into(), &out[0], &want_a[2]);
    check("b[..5]".into(), &out[1], &want_b[4]);
    let out = exec.logits(&step(vec![seq(&a[3..8], 3, &table_a), seq(&b[5..], 5, &table_b)])).await.unwrap();
    check("a[..8]".into(), &out[0], &want_a[7]);
    check("b[..6]".into(), &out[1], &want_b[5]);
    failures
}

#[wasm_bindgen_test]
async fn tiny_models_match_the_cpu_in_every_weight_format() {
    let f = GpuTensorFactory::new(GpuContext::new(GpuOptions::default()).await.unwrap());
    let mut failures = Vec::new();
    // Formats whose blocks do not fit the tiny model's rows would fall back to one of these
    // (tiny::storage_dtype); the kernel tests cover them on their own.
    let c = tiny::tiny_config();
    for dtype in DType::WEIGHTS.into_iter().filter(|&d| tiny::storage_dtype(d, c.hidden_size) == d) {
        failures.extend(compare(&f, &c, dtype, 64).await);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// With storage bindings capped at 32 KiB the embedding table (which is also the tied head) is
/// split by rows over several buffers (3 in F32, 2 in F16), as on a device whose binding limit is below a
/// tensor's size; the logits must not change.
#[wasm_bindgen_test]
async fn split_weights_match_the_cpu() {
    let options = GpuOptions { max_binding_bytes: Some(32 << 10), ..Default::default() };
    let f = GpuTensorFactory::new(GpuContext::new(options).await.unwrap());
    // 512 positions: the RoPE table (which rope_kv_write binds whole) is exactly 32 KiB.
    let c = ModelConfig { max_position_embeddings: 512, ..tiny::tiny_config() };
    let table = f.upload_f32(&[c.vocab_size, c.hidden_size], &vec![0.0; c.vocab_size * c.hidden_size]).unwrap();
    assert_eq!(table.parts().len(), 3, "an F32 embedding table splits in three");
    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::F16] {
        // 64 blocks of 4 tokens: one layer's K (or V) is exactly 32 KiB too.
        failures.extend(compare(&f, &c, dtype, 64).await);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Four greedy streams at once through the engine (its loop a task of this worker): the
/// fixture's three prompts and the first again, all in one step's batch from the start, their
/// prefills scanned in chunks of 4 (the SSD form; the default chunk is longer than these
/// prompts); each gives the 12 tokens transformers chose (native lavapipe gives them too;
/// every margin between the best and second logit is above 9e-4, the logits agree within 1e-6).
#[wasm_bindgen_test]
async fn a_hybrid_recurrent_model_streams_four_at_once_like_native() {
    let fixture: Value =
        serde_json::from_str(include_str!("../../tests/fixtures/granite_hybrid/expected.json")).unwrap();
    let gguf = include_bytes!("../../tests/fixtures/granite_hybrid/model.gguf").to_vec();
    let engine = EngineBuilder::from_gguf_bytes("granite_hybrid.gguf", gguf)
        .unwrap()
        .kv_memory_bytes(1 << 20)
        .state_memory_bytes(1 << 20)
        .scan_chunk_rows(Some(4))
        .build()
        .await
        .unwrap();
    engine.start_loop().unwrap();
    let prompts = fixture["prompts"].as_array().unwrap();
    let ids = |v: &Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let cases: Vec<&Value> = prompts.iter().chain(prompts.first()).collect();
    let streams: Vec<_> = cases
        .iter()
        .map(|p| {
            let params = GenerationParams {
                sampling: SamplingParams::greedy(),
                max_tokens: Some(12),
                ignore_eos: true,
                ..Default::default()
            };
            engine.infer_stream(InferenceRequest::new(Prompt::Tokens(ids(&p["prompt_ids"])), params)).unwrap()
        })
        .collect();
    let got = futures::future::join_all(streams.into_iter().map(|s| {
        s.fold(Vec::new(), |mut tokens: Vec<u32>, chunk| async move {
            tokens.extend(chunk.unwrap().token_ids);
            tokens
        })
    }))
    .await;
    for (i, (tokens, p)) in got.iter().zip(&cases).enumerate() {
        assert_eq!(*tokens, ids(&p["greedy_ids"]), "stream {i}");
    }
    assert_eq!(engine.state_usage().unwrap().used_slots, 0, "every state slot is back");
    engine.shutdown();
}
