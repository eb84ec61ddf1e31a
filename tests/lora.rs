//! Multi-LoRA against outside truth: `tests/fixtures/lora/` (`tools/make_lora_fixtures.py`) holds
//! a tiny random Llama and three PEFT adapters of ranks 4, 8 and 6 (one with rsLoRA, one
//! targeting only q, v and down), with peft's last-position logits and greedy tokens for each
//! adapter and for the base model.
//!
//! - Each adapter alone: last-position logits within 1e-4 of peft's (both f32 over two layers
//!   of width 64, differing only in summation order, about 1e-6; a missing delta or a wrong
//!   scale moves them by 1e-2 or more), and 10 greedy tokens equal, a divergence tolerated only
//!   after a reference near-tie (top-1/top-2 margin below 1e-3).
//! - Mixed: 8 sequences over the three adapters and the base model in one batch give each
//!   sequence the tokens and the very logits bits it gets alone (batch invariance).
//! - llama.cpp's GGUF checkpoint and GGUF adapters (q and k rows permuted for interleaved RoPE)
//!   in every pairing with the Hugging Face ones: the same numbers (leaving B's q and k rows
//!   unpermuted over the GGUF checkpoint moves the logits by 0.1).
//! - The engine: 8 requests over three adapters and the base model, and again with fewer slots
//!   than adapters (evicted and reloaded), give peft's tokens and leak no block or slot; the
//!   prefix cache never shares a prompt's blocks across adapters; warm steps create nothing.
//! - Phi-3 (`tests/fixtures/lora_phi3/`, same tool): its checkpoints and peft's adapter fuse
//!   q, k, v into `qkv_proj` and gate, up into `gate_up_proj` (llama.cpp: `attn_qkv`,
//!   `ffn_up`); the fused adapter, PEFT or GGUF, over either checkpoint runs peft's numbers
//!   within the same 1e-4.
//! - Gemma 3 (`tests/fixtures/lora_gemma3/`): an adapter on all seven projections of a tiny
//!   Gemma 3 (norms after attention and MLP, GeGLU, sliding layers), peft's numbers.
//! - OLMo 2 and Granite 4.0-H (`tests/fixtures/lora_olmo2/`, `lora_granite_hybrid/`): an
//!   adapter from peft and from llama.cpp's converter, each over its checkpoint, within 1e-4.
//! - The default model itself (`models/SmolLM2-135M-Instruct.Q4_1.gguf`, whose llama.cpp q/k
//!   rows are permuted) with two PEFT adapters (`tests/fixtures/lora_smollm2/`, peft over
//!   transformers' f32 dequantization of the same GGUF): the base and both adapters in one
//!   batch give peft's top-20 logits within 1e-3 (the bound of `tests/real_models.rs` for this
//!   model in f32, whose measured gap is ~3e-5) and its 16 greedy tokens up to a near-tie
//!   (margin below 0.01).
//! - Adapters that do not fit the base model are refused, naming what does not fit.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use weft::engine::api::InferenceEngine;
use weft::engine::request::{GenerationParams, InferenceRequest, Prompt};
use weft::engine::{ContinuousBatchEngine, EngineConfig};
use weft::gpu::{GpuOptions, GpuTensorFactory};
use weft::kv::KvCacheConfig;
use weft::lora::{LoraAdapter, LoraShape};
use weft::model::executor::GpuExecutor;
use weft::model::load::ModelFiles;
use weft::sampling::SamplingParams;
use weft::step::{LoraLoad, ModelExecutor, SeqStep, StepBatch};
use weft::{EngineBuilder, WeftError};

const BLOCK: usize = 16;
const ADAPTERS: [&str; 3] = ["alpha", "beta", "gamma"];
const MAX_RANK: usize = 8;

/// The Llama fixture's `path`.
fn fixture(path: &str) -> PathBuf {
    fixture_of("lora", path)
}

/// `path` in the fixture directory `family` (`lora`: Llama, `lora_phi3`: Phi-3).
fn fixture_of(family: &str, path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(family).join(path)
}

fn expected() -> Value {
    expected_of("lora")
}

fn expected_of(family: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture_of(family, "expected.json")).unwrap()).unwrap()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
}

fn factory() -> Option<GpuTensorFactory> {
    weft::gpu::open_or_skip(GpuOptions::default()).unwrap().map(GpuTensorFactory::new)
}

fn shape(exec: &GpuExecutor) -> LoraShape {
    exec.lora_config().unwrap().shape
}

/// The base model with a pool of `max_loras` slots.
fn executor(f: &GpuTensorFactory, max_loras: usize) -> GpuExecutor {
    executor_of(f, "lora", "hf", max_loras)
}

/// `family`'s base model from `checkpoint` (the Hugging Face directory or llama.cpp's GGUF).
fn executor_of(f: &GpuTensorFactory, family: &str, checkpoint: &str, max_loras: usize) -> GpuExecutor {
    let files = ModelFiles::open(&fixture_of(family, checkpoint)).unwrap();
    files.executor(f, KvCacheConfig::new(BLOCK, 256)).unwrap().with_lora(max_loras, MAX_RANK).unwrap()
}

fn adapter(exec: &GpuExecutor, name: &str) -> Arc<LoraAdapter> {
    adapter_of(exec, "lora", name)
}

fn adapter_of(exec: &GpuExecutor, family: &str, name: &str) -> Arc<LoraAdapter> {
    Arc::new(LoraAdapter::open(name, &fixture_of(family, name), &shape(exec), MAX_RANK).unwrap())
}

/// Sequence `i`'s step: `tokens` at `start_pos` in its own run of 8 blocks, with `slot`.
fn step(i: usize, tokens: &[u32], start_pos: usize, slot: Option<u32>) -> SeqStep {
    let num_blocks = (start_pos + tokens.len()).div_ceil(BLOCK);
    SeqStep {
        id: i as u64,
        tokens: tokens.to_vec(),
        start_pos,
        block_table: (0..num_blocks as u32).map(|b| i as u32 * 8 + b).collect(),
        num_logits: 1,
        lora_slot: slot,
        ..Default::default()
    }
}

/// Greedy decoding of `prompts` together, each with its slot: every step's logits per sequence.
fn greedy(
    exec: &GpuExecutor,
    prompts: &[(Vec<u32>, Option<u32>)],
    loads: Vec<LoraLoad>,
    steps: usize,
) -> Vec<Vec<Vec<f32>>> {
    let mut tokens: Vec<Vec<u32>> = prompts.iter().map(|(p, _)| p.clone()).collect();
    let mut out = vec![Vec::new(); prompts.len()];
    let mut lora_loads = loads;
    for n in 0..=steps {
        let seqs = tokens
            .iter()
            .zip(prompts)
            .enumerate()
            .map(|(i, (t, (_, slot)))| {
                let start = if n == 0 { 0 } else { t.len() - 1 };
                // A hybrid's recurrent layers carry each sequence's state in its own slot
                // (a prefill at position 0 starts it from zero).
                let state_slot = exec.state_config().map(|_| i as u32);
                SeqStep { state_slot, ..step(i, &t[start..], start, *slot) }
            })
            .collect();
        let batch = StepBatch { seqs, lora_loads: std::mem::take(&mut lora_loads), ..Default::default() };
        let logits = weft::rt::block_on(exec.logits(&batch)).unwrap();
        for (i, l) in logits.into_iter().enumerate() {
            tokens[i].push(argmax(&l));
            out[i].push(l);
        }
    }
    out
}

#[test]
fn each_adapter_matches_peft() {
    let Some(f) = factory() else { return };
    let exec = executor(&f, 3);
    let loads: Vec<LoraLoad> = ADAPTERS
        .iter()
        .enumerate()
        .map(|(s, name)| LoraLoad { slot: s as u32, adapter: adapter(&exec, name) })
        .collect();
    let mut loads = Some(loads);
    for (model, slot) in [("base", None), ("alpha", Some(0)), ("beta", Some(1)), ("gamma", Some(2))] {
        check_peft_alone(&exec, &expected(), model, slot, loads.take().unwrap_or_default());
    }
}

/// llama.cpp's GGUF adapters (B's q and k rows permuted as the base's were) over either
/// checkpoint, and a PEFT adapter over the GGUF checkpoint: each pairing runs peft's numbers.
#[test]
fn gguf_adapters_and_checkpoints_in_every_pairing_match_peft() {
    let Some(f) = factory() else { return };
    for (checkpoint, file, model) in
        [("model.gguf", "alpha", "alpha"), ("model.gguf", "alpha.gguf", "alpha"), ("hf", "beta.gguf", "beta")]
    {
        let exec = executor_of(&f, "lora", checkpoint, 1);
        eprintln!("{checkpoint} with {file}:");
        let loads = vec![LoraLoad { slot: 0, adapter: adapter(&exec, file) }];
        check_peft_alone(&exec, &expected(), model, Some(0), loads);
    }
}

/// Phi-3's fused adapter (`qkv_proj`, `gate_up_proj`; llama.cpp's `attn_qkv`, `ffn_up`), from
/// peft's files and from llama.cpp's GGUF, over either checkpoint: peft's numbers, the base
/// model's too.
#[test]
fn fused_phi3_adapters_match_peft_over_either_checkpoint() {
    let Some(f) = factory() else { return };
    let e = expected_of("lora_phi3");
    for (checkpoint, file) in
        [("hf", "delta"), ("model.gguf", "delta.gguf"), ("model.gguf", "delta"), ("hf", "delta.gguf")]
    {
        let exec = executor_of(&f, "lora_phi3", checkpoint, 1);
        eprintln!("phi3 {checkpoint} with {file}:");
        check_peft_alone(&exec, &e, "base", None, Vec::new());
        let loads = vec![LoraLoad { slot: 0, adapter: adapter_of(&exec, "lora_phi3", file) }];
        check_peft_alone(&exec, &e, "delta", Some(0), loads);
    }
}

/// Gemma 3 takes adapters on q, k, v, o, gate, up and down like Llama.
#[test]
fn gemma3_adapter_matches_peft() {
    let Some(f) = factory() else { return };
    let e = expected_of("lora_gemma3");
    let exec = executor_of(&f, "lora_gemma3", "hf", 1);
    check_peft_alone(&exec, &e, "base", None, Vec::new());
    let loads = vec![LoraLoad { slot: 0, adapter: adapter_of(&exec, "lora_gemma3", "epsilon") }];
    check_peft_alone(&exec, &e, "epsilon", Some(0), loads);
}

/// OLMo 2 (norms after attention and MLP, q/k norms over whole projections) and Granite 4.0-H
/// (adapters on its attention layer and on every layer's fused `input_linear`, beside Mamba2
/// mixers that take none): PEFT over the Hugging Face checkpoint, llama.cpp's GGUF adapter over
/// the GGUF one (q and k rows permuted for Granite).
#[test]
fn olmo2_and_granite_hybrid_adapters_match_peft() {
    let Some(f) = factory() else { return };
    for (family, adapter) in [("lora_olmo2", "zeta"), ("lora_granite_hybrid", "eta")] {
        let e = expected_of(family);
        for (checkpoint, file) in [("hf", adapter.to_string()), ("model.gguf", format!("{adapter}.gguf"))] {
            let exec = executor_of(&f, family, checkpoint, 1);
            eprintln!("{family} {checkpoint} with {file}:");
            check_peft_alone(&exec, &e, "base", None, Vec::new());
            let loads = vec![LoraLoad { slot: 0, adapter: adapter_of(&exec, family, &file) }];
            check_peft_alone(&exec, &e, adapter, Some(0), loads);
        }
    }
}

/// The real default model with two adapters and without, all in one batch, against peft.
#[test]
fn adapters_on_the_default_model_match_peft_in_one_batch() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        assert!(std::env::var("WEFT_REQUIRE_MODEL").as_deref() != Ok("1"), "{} is missing", path.display());
        return eprintln!("skipping: {} is missing (cargo xtask fetch-model)", path.display());
    }
    let Some(f) = factory() else { return };
    let exec = ModelFiles::open(&path)
        .unwrap()
        .executor(&f, KvCacheConfig::new(BLOCK, 64))
        .unwrap()
        .with_lora(2, MAX_RANK)
        .unwrap();
    let e = expected_of("lora_smollm2");
    let models = [("base", None), ("sql", Some(0)), ("chat", Some(1))];
    let loads = vec![
        LoraLoad { slot: 0, adapter: adapter_of(&exec, "lora_smollm2", "sql") },
        LoraLoad { slot: 1, adapter: adapter_of(&exec, "lora_smollm2", "chat") },
    ];
    let mut runs = Vec::new();
    for (model, slot) in models {
        for p in e["models"][model]["prompts"].as_array().unwrap() {
            runs.push((model, p, (u32s(&p["prompt_ids"]), slot)));
        }
    }
    let inputs: Vec<_> = runs.iter().map(|(_, _, run)| run.clone()).collect();
    let got = greedy(&exec, &inputs, loads, 15);
    for ((model, p, _), logits) in runs.iter().zip(&got) {
        let top = u32s(&p["top_ids"]);
        let diff = top
            .iter()
            .zip(f32s(&p["top_logits"]))
            .map(|(&id, want)| (logits[0][id as usize] - want).abs())
            .fold(0f32, f32::max);
        eprintln!("{model}: largest top-20 logit difference {diff:e}");
        assert!(diff < 1e-3, "{model}: top-20 logits differ from peft's by {diff}");
        let (want, margins) = (u32s(&p["greedy_ids"]), f32s(&p["greedy_margins"]));
        for (n, l) in logits.iter().enumerate().take(want.len()) {
            if argmax(l) != want[n] {
                assert!(margins[n] < 0.01, "{model}: token {n} is {}, peft says {}", argmax(l), want[n]);
                break;
            }
        }
    }
}

/// `model`'s prompts together on `exec` with `slot` (after `loads`), against peft's `e`.
fn check_peft_alone(exec: &GpuExecutor, e: &Value, model: &str, slot: Option<u32>, loads: Vec<LoraLoad>) {
    let prompts = e["models"][model]["prompts"].as_array().unwrap();
    let runs: Vec<(Vec<u32>, Option<u32>)> = prompts.iter().map(|p| (u32s(&p["prompt_ids"]), slot)).collect();
    let got = greedy(exec, &runs, loads, 9);
    let mut worst = 0f32;
    for (i, p) in prompts.iter().enumerate() {
        let want = f32s(&p["last_logits"]);
        let diff = got[i][0].iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        worst = worst.max(diff);
        assert!(diff < 1e-4, "{model}: prompt {i}: last-position logits differ by {diff}");
        let (want, margins) = (u32s(&p["greedy_ids"]), f32s(&p["greedy_margins"]));
        for (n, l) in got[i].iter().enumerate().take(want.len()) {
            if argmax(l) != want[n] {
                assert!(margins[n] < 1e-3, "{model}: prompt {i} token {n} is {}, peft says {}", argmax(l), want[n]);
                break;
            }
        }
    }
    eprintln!("{model}: largest last-position logit difference {worst:e}");
}

#[test]
fn a_mixed_batch_gives_each_sequence_its_tokens_alone() {
    let Some(f) = factory() else { return };
    let exec = executor(&f, 3);
    let loads: Vec<LoraLoad> = ADAPTERS
        .iter()
        .enumerate()
        .map(|(s, name)| LoraLoad { slot: s as u32, adapter: adapter(&exec, name) })
        .collect();
    let prompts = expected()["models"]["base"]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| u32s(&p["prompt_ids"]))
        .collect::<Vec<_>>();
    let slots = [None, Some(0), Some(1), Some(2)];
    let runs: Vec<(Vec<u32>, Option<u32>)> = (0..8).map(|i| (prompts[i % 3].clone(), slots[i % 4])).collect();
    let mixed = greedy(&exec, &runs, loads, 6);
    for (i, run) in runs.iter().enumerate() {
        let alone = greedy(&exec, std::slice::from_ref(run), Vec::new(), 6);
        assert_eq!(mixed[i], alone[0], "sequence {i} (slot {:?}) in the mixed batch", run.1);
    }
}

#[test]
fn adapters_that_do_not_fit_are_refused_by_name() {
    let shape = LoraShape::llama(2, 64, 64, 32, 96);
    let err = |dir: &str, shape: &LoraShape, max_rank: usize| {
        LoraAdapter::from_peft_dir(dir, &fixture(dir), shape, max_rank).unwrap_err().to_string()
    };
    assert!(LoraAdapter::from_peft_dir("alpha", &fixture("alpha"), &shape, 8).is_ok());
    let e = err("beta", &shape, 4);
    assert!(e.contains("rank r = 8") && e.contains("1..=4"), "{e}");
    let e = err("alpha", &LoraShape::llama(2, 48, 64, 32, 96), 8);
    assert!(e.contains("lora_") && e.contains("has shape") && e.contains("48"), "{e}");
    let e = err("alpha", &LoraShape::llama(1, 64, 64, 32, 96), 8);
    assert!(e.contains("layers.1.") && e.contains("1 layers"), "{e}");
    let e = LoraAdapter::from_peft_dir("none", &fixture("missing"), &shape, 8).unwrap_err().to_string();
    assert!(e.contains("adapter_config.json"), "{e}");
}

/// An engine over the fixture's base model serving the three adapters from `max_loras` slots.
fn engine(max_loras: usize) -> Option<ContinuousBatchEngine> {
    factory()?;
    let mut b = EngineBuilder::from_model(fixture("hf")).unwrap().lora(max_loras, MAX_RANK);
    for name in ADAPTERS {
        b = b.lora_module(name, fixture(name));
    }
    let config =
        EngineConfig { max_num_seqs: 8, max_num_batched_tokens: 256, max_model_len: 128, ..Default::default() };
    Some(weft::rt::block_on(b.config(config).kv_memory_bytes(4 << 20).build()).unwrap())
}

fn request(prompt: &[u32], model: &str) -> InferenceRequest {
    let params = GenerationParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(10),
        ignore_eos: true,
        ..Default::default()
    };
    let mut r = InferenceRequest::new(Prompt::Tokens(prompt.to_vec()), params);
    r.lora = (model != "base").then(|| model.to_string());
    r
}

/// peft's greedy tokens for `model` on prompt `p`, up to the first near-tie.
fn peft_tokens(model: &str, p: usize) -> Vec<u32> {
    let e = expected();
    let prompt = &e["models"][model]["prompts"][p];
    let (ids, margins) = (u32s(&prompt["greedy_ids"]), f32s(&prompt["greedy_margins"]));
    let sure = margins.iter().position(|&m| m < 1e-3).unwrap_or(ids.len());
    ids[..sure].to_vec()
}

fn prompt(p: usize) -> Vec<u32> {
    u32s(&expected()["models"]["base"]["prompts"][p]["prompt_ids"])
}

/// The 8 requests of the mixed tests: three prompts over the base model and the three adapters.
fn mixed() -> Vec<(usize, &'static str)> {
    let models = ["base", "alpha", "beta", "gamma"];
    (0..8).map(|i| (i % 3, models[i % 4])).collect()
}

fn run_together(e: &ContinuousBatchEngine, runs: &[(usize, &str)]) -> Vec<Vec<u32>> {
    e.start_loop().unwrap();
    let futures = runs.iter().map(|&(p, model)| e.infer(request(&prompt(p), model)));
    weft::rt::block_on(futures::future::join_all(futures)).into_iter().map(|r| r.unwrap().token_ids).collect()
}

fn check_peft(runs: &[(usize, &str)], got: &[Vec<u32>]) {
    for (&(p, model), tokens) in runs.iter().zip(got) {
        let want = peft_tokens(model, p);
        assert_eq!(tokens[..want.len()], want, "{model} on prompt {p}");
    }
}

/// No KV block held, no request left, at most `max_loras` adapters resident.
fn check_nothing_leaked(e: &ContinuousBatchEngine, max_loras: usize) {
    let kv = e.cache_metrics_snapshot().kv;
    assert_eq!(kv.used_blocks, 0, "{kv:?}");
    let m = e.lora_metrics_snapshot().unwrap();
    assert!(m.running.is_empty() && m.waiting.is_empty(), "{m:?}");
    assert!(m.adapters_loaded <= max_loras && m.max_loras == max_loras, "{m:?}");
}

#[test]
fn eight_requests_over_three_adapters_and_the_base_share_steps_and_match_peft() {
    let Some(e) = engine(3) else { return };
    let runs = mixed();
    check_peft(&runs, &run_together(&e, &runs));
    check_nothing_leaked(&e, 3);
    let m = e.lora_metrics_snapshot().unwrap();
    assert_eq!((m.adapters_registered, m.loads, m.evictions, m.requests_with_adapter), (3, 3, 0, 6), "{m:?}");
    e.shutdown();
}

#[test]
fn more_adapters_than_slots_evict_and_reload_with_the_same_tokens() {
    let Some(e) = engine(1) else { return };
    let runs = mixed();
    check_peft(&runs, &run_together(&e, &runs));
    check_nothing_leaked(&e, 1);
    let m = e.lora_metrics_snapshot().unwrap();
    assert!(m.loads >= 3 && m.evictions >= 2, "each adapter loaded, two evicted for the next: {m:?}");
    // One prompt computed under the base model, then under each adapter in turn: its cached
    // blocks are never shared across adapters.
    for model in ["base", "alpha", "beta", "gamma", "alpha"] {
        check_peft(&[(2, model)], &run_together(&e, &[(2, model)]));
    }
    check_nothing_leaked(&e, 1);
    let again = e.lora_metrics_snapshot().unwrap();
    assert!(again.loads >= m.loads + 4 && again.evictions >= m.evictions + 3, "{again:?}");
    e.shutdown();
}

#[test]
fn an_unknown_adapter_is_refused_naming_the_model_field() {
    let Some(e) = engine(1) else { return };
    let err = e.submit(request(&prompt(0), "delta")).unwrap_err();
    assert!(matches!(&err, WeftError::InvalidRequest { field: Some(f), .. } if f == "model"), "{err}");
    assert!(e.add_lora_path("alpha", &fixture("alpha")).is_err(), "a name is served once");
    e.remove_lora("gamma").unwrap();
    assert_eq!(e.lora_names(), ["alpha", "beta"]);
    e.shutdown();
}

/// Warm LoRA steps create nothing (loading an adapter into a slot is queued writes) and compile
/// nothing the builder's warm-up did not, evictions included.
#[test]
fn warm_lora_steps_create_and_compile_nothing() {
    let Some(f) = factory() else { return };
    let mut b = EngineBuilder::from_model(fixture("hf")).unwrap().lora(2, MAX_RANK);
    for name in ADAPTERS {
        b = b.lora_module(name, fixture(name));
    }
    let config = EngineConfig { max_num_seqs: 8, max_num_batched_tokens: 64, max_model_len: 128, ..Default::default() };
    let e = b.config(config).kv_memory_bytes(4 << 20).build_on(f.context().clone()).unwrap();
    let built = f.context().creations().pipelines;
    let run = || {
        let mut streams: Vec<_> =
            mixed().iter().map(|&(p, model)| e.submit(request(&prompt(p), model)).unwrap().1).collect();
        while weft::rt::block_on(e.step()).unwrap() {}
        for s in &mut streams {
            let chunks: Vec<_> = weft::rt::block_on(futures::StreamExt::collect::<Vec<_>>(s));
            assert!(chunks.last().unwrap().as_ref().unwrap().finish_reason.is_some());
        }
    };
    run();
    let warm = f.context().creations();
    assert_eq!(warm.pipelines, built, "serving compiled kernels the warm-up missed");
    let evictions = e.lora_metrics_snapshot().unwrap().evictions;
    run();
    assert!(e.lora_metrics_snapshot().unwrap().evictions > evictions, "the second run evicts too");
    assert_eq!(f.context().creations(), warm, "warm LoRA steps created GPU objects");
}
