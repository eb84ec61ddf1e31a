//! Real models from `cargo xtask fetch-model` against outside truth: fixtures written by
//! `tools/make_model_fixtures.py` from Hugging Face transformers running the exactly-dequantized
//! GGUF in f32 (tests/smollm2.rs does the same for the default model, with more prompts).
//!
//! Per prompt: the tokenizer gives the reference ids (and the chat template the reference
//! text); the last prompt position's top-20 logits agree within [`LOGIT_TOLERANCE`]; greedy
//! tokens equal the reference's, a divergence tolerated only right after a step whose reference
//! top-1/top-2 margin is below 0.01 (a near-tie), after which that prompt is no longer compared.
//!
//! Cost: CI runs the first prompt of each model (`cargo xtask test` fetches the models and sets
//! WEFT_REQUIRE_MODEL=1, so a missing one fails); `cargo xtask test --full` sets WEFT_FULL=1 and
//! runs every prompt. Without the model (and without WEFT_REQUIRE_MODEL) the test skips.

use std::path::Path;

use serde_json::Value;
use weft::gpu::{GpuOptions, GpuTensorFactory};
use weft::kv::KvCacheConfig;
use weft::model::load::ModelFiles;
use weft::sampling::{RowDraw, SampleSpec, SamplingParams};
use weft::step::{ModelExecutor, SeqStep, StepBatch};
use weft::tokenizer::{ChatMessage, Tokenizer};

/// Largest |weft - transformers| allowed on a top-20 logit. Both compute in f32 from the same
/// dequantized weights but sum in other orders over 24 layers; lavapipe's largest difference is
/// printed by the test (a wrong layer, position or decoder moves logits by 0.1 or more).
const LOGIT_TOLERANCE: f32 = 2e-2;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn check_model(name: &str, file: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("models").join(file);
    if !path.exists() {
        assert!(
            std::env::var("WEFT_REQUIRE_MODEL").as_deref() != Ok("1"),
            "models/{file} is missing: run cargo xtask fetch-model {name}"
        );
        return eprintln!("skipping: models/{file} is missing (cargo xtask fetch-model {name})");
    }
    let Some(ctx) = weft::gpu::open_or_skip(GpuOptions::default()).unwrap() else { return };
    let text = std::fs::read_to_string(root.join("tests/fixtures").join(name).join("model.json")).unwrap();
    let fixture: Value = serde_json::from_str(&text).unwrap();
    let mut prompts = fixture["prompts"].as_array().unwrap().clone();
    if std::env::var("WEFT_FULL").as_deref() != Ok("1") {
        prompts.truncate(1);
    }
    let files = ModelFiles::open(&path).unwrap();
    let tok = files.tokenizer.clone();
    for p in &prompts {
        let pname = p["name"].as_str().unwrap();
        if p["kind"] == "chat" {
            let messages: Vec<ChatMessage> = serde_json::from_value(p["messages"].clone()).unwrap();
            let rendered = tok.chat_template().unwrap().render(&messages, true).unwrap();
            assert_eq!(rendered, p["text"].as_str().unwrap(), "{name} {pname}: chat template");
        }
        let got = tok.encode(p["text"].as_str().unwrap(), false).unwrap();
        assert_eq!(got, ids(&p["prompt_ids"]), "{name} {pname}: prompt ids");
    }

    let steps = fixture["meta"]["steps"].as_u64().unwrap() as usize;
    const BLOCK: usize = 16;
    let blocks: Vec<usize> =
        prompts.iter().map(|p| (p["prompt_ids"].as_array().unwrap().len() + steps).div_ceil(BLOCK)).collect();
    let factory = GpuTensorFactory::new(ctx);
    let exec = files.executor(&factory, KvCacheConfig { block_size: BLOCK, num_blocks: blocks.iter().sum() }).unwrap();
    let mut next = 0u32;
    let seqs = prompts
        .iter()
        .zip(&blocks)
        .map(|(p, &n)| {
            next += n as u32;
            SeqStep {
                id: 0,
                tokens: ids(&p["prompt_ids"]),
                start_pos: 0,
                block_table: (next - n as u32..next).collect(),
                num_logits: 1,
                ..Default::default()
            }
        })
        .collect();
    let mut batch = StepBatch { seqs, ..Default::default() };
    let started = std::time::Instant::now();
    let logits = weft::rt::block_on(exec.logits(&batch)).unwrap();
    eprintln!("{name}: prefill of {} tokens in {:.1} s", batch.num_batched_tokens(), started.elapsed().as_secs_f64());
    let mut worst = 0f32;
    for (p, l) in prompts.iter().zip(&logits) {
        for pair in p["last_logits_top"].as_array().unwrap() {
            let (id, want) = (pair[0].as_u64().unwrap() as usize, pair[1].as_f64().unwrap() as f32);
            let err = (l[id] - want).abs();
            worst = worst.max(err);
            assert!(
                err <= LOGIT_TOLERANCE,
                "{name} {}: logit of {id}: weft {} vs transformers {want}",
                p["name"],
                l[id]
            );
        }
    }
    eprintln!("{name}: largest top-20 logit difference {worst:.5}");

    let mut generated: Vec<Vec<u32>> = logits.iter().map(|l| vec![weft::cpu::argmax(l, l.len())[0]]).collect();
    let greedy = SampleSpec { params: SamplingParams::greedy(), rows: vec![RowDraw::default()] };
    let started = std::time::Instant::now();
    for _ in 1..steps {
        for (seq, so_far) in batch.seqs.iter_mut().zip(&generated) {
            seq.start_pos += seq.tokens.len();
            seq.tokens = vec![*so_far.last().unwrap()];
            seq.sampling = Some(greedy.clone());
        }
        let out = weft::rt::block_on(exec.execute(&batch)).unwrap();
        for (so_far, s) in generated.iter_mut().zip(out.samples) {
            so_far.push(s[0].token);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("{name}: {} decode steps of {} sequences in {seconds:.1} s", steps - 1, prompts.len());
    for (p, got) in prompts.iter().zip(&generated) {
        let want = ids(&p["greedy_ids"]);
        let margins: Vec<f64> = p["greedy_margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect();
        if let Some(step) = (0..steps).find(|&i| got[i] != want[i]) {
            assert!(
                margins[step] < 0.01,
                "{name} {}: token {step} is {} but transformers gives {} with a margin of {} (text so far {:?})",
                p["name"],
                got[step],
                want[step],
                margins[step],
                tok.decode(&got[..step], false).unwrap()
            );
            eprintln!("{name} {}: diverged at a near-tie at token {step}", p["name"]);
        }
    }
}

#[test]
fn qwen2_5_coder_0_5b_matches_transformers() {
    check_model("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct.gguf");
}

#[test]
fn gemma_3_270m_matches_transformers() {
    check_model("gemma-3-270m", "gemma-3-270m-q4_k_m.gguf");
}
