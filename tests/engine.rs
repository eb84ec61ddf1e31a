//! The continuous-batching engine on a tiny random model (fast on lavapipe): batched output
//! equals each request run alone (with and without logit biases), preemption under a small KV
//! pool, the prefix cache, cancellation, stop strings, bad requests and shutdown.

use std::sync::Arc;

use futures::StreamExt;
use weft::DType;
use weft::engine::request::{FinishReason, GenerationParams, InferenceRequest, InferenceResponse, Prompt};
use weft::engine::{ContinuousBatchEngine, EngineConfig};
use weft::gpu::{GpuOptions, GpuTensorFactory};
use weft::kv::KvCacheConfig;
use weft::model::load::ModelFiles;
use weft::model::tiny;
use weft::sampling::{GpuSampler, LogitBias, SamplingParams};

fn factory() -> Option<GpuTensorFactory> {
    weft::gpu::open_or_skip(GpuOptions::default()).unwrap().map(GpuTensorFactory::new)
}

/// A tiny model engine with `num_blocks` KV blocks of 4 tokens.
fn engine(f: &GpuTensorFactory, num_blocks: usize, config: EngineConfig) -> ContinuousBatchEngine {
    let c = tiny::tiny_config();
    let w = tiny::random_weights(&c, 21, DType::Q8_0);
    let files = ModelFiles::from_gguf_bytes("tiny.gguf", tiny::gguf_bytes(&c, &w, DType::Q8_0)).unwrap();
    engine_of(f, files, num_blocks, config)
}

/// An engine of `files`' model with `num_blocks` KV blocks of 4 tokens.
fn engine_of(
    f: &GpuTensorFactory,
    files: ModelFiles,
    num_blocks: usize,
    config: EngineConfig,
) -> ContinuousBatchEngine {
    let exec = files.executor(f, KvCacheConfig::new(4, num_blocks)).unwrap();
    ContinuousBatchEngine::new_plan_runtime(
        config,
        files.tokenizer.clone(),
        Arc::new(GpuSampler),
        Arc::new(exec),
        Arc::new(f.clone()),
    )
    .unwrap()
}

fn greedy(prompt: &str, max_tokens: usize) -> InferenceRequest {
    let params = GenerationParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Default::default()
    };
    InferenceRequest::new(Prompt::Text(prompt.into()), params)
}

/// 32 requests of different prompt lengths and max_tokens.
fn workload() -> Vec<InferenceRequest> {
    (0..32)
        .map(|i| {
            let prompt: String = (0..(i * 7 % 23 + 1)).map(|j| char::from(b'a' + ((i * 3 + j) % 26) as u8)).collect();
            let mut r = greedy(&prompt, i % 9 + 3);
            if i % 4 == 1 {
                // Seeded sampling must also be independent of the batch.
                r.params.sampling =
                    SamplingParams { temperature: 0.9, top_p: 0.95, seed: Some(i as u64), ..Default::default() };
            }
            if i % 4 == 2 {
                // And penalties, which read the sequence's own history.
                r.params.sampling = SamplingParams {
                    repetition_penalty: 1.3,
                    presence_penalty: 0.5,
                    frequency_penalty: 0.5,
                    ..SamplingParams::greedy()
                };
            }
            r
        })
        .collect()
}

fn alone(f: &GpuTensorFactory, requests: &[InferenceRequest]) -> Vec<InferenceResponse> {
    let e = engine(f, 256, EngineConfig::default());
    requests.iter().map(|r| weft::rt::block_on(e.infer(r.clone())).unwrap()).collect()
}

/// Submit everything from 4 threads at once against a running loop.
fn together(e: &ContinuousBatchEngine, requests: &[InferenceRequest]) -> Vec<InferenceResponse> {
    e.start_loop().unwrap();
    let chunks: Vec<Vec<(usize, InferenceRequest)>> =
        (0..4).map(|t| requests.iter().cloned().enumerate().filter(|(i, _)| i % 4 == t).collect()).collect();
    let mut out: Vec<Option<InferenceResponse>> = vec![None; requests.len()];
    std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let e = e.clone();
                s.spawn(move || {
                    let futures: Vec<_> = chunk
                        .into_iter()
                        .map(|(i, r)| {
                            let e = e.clone();
                            async move { (i, e.infer(r).await.unwrap()) }
                        })
                        .collect();
                    weft::rt::block_on(futures::future::join_all(futures))
                })
            })
            .collect();
        for h in handles {
            for (i, r) in h.join().unwrap() {
                out[i] = Some(r);
            }
        }
    });
    out.into_iter().map(Option::unwrap).collect()
}

#[test]
fn batched_requests_equal_requests_run_alone() {
    let Some(f) = factory() else { return };
    let requests = workload();
    let started = std::time::Instant::now();
    let want = alone(&f, &requests);
    let alone_seconds = started.elapsed().as_secs_f64();
    let e = engine(&f, 256, EngineConfig::default());
    let started = std::time::Instant::now();
    let got = together(&e, &requests);
    let batch_seconds = started.elapsed().as_secs_f64();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.token_ids, w.token_ids, "request {i}");
        assert_eq!(g.text, w.text, "request {i}");
        assert_eq!(g.finish_reason, FinishReason::Length);
        assert_eq!(g.usage.completion_tokens, requests[i].params.max_tokens.unwrap());
    }
    let tokens: usize = want.iter().map(|r| r.token_ids.len()).sum();
    eprintln!(
        "{tokens} tokens: one at a time {:.1} tokens/s, 32 concurrent {:.1} tokens/s",
        tokens as f64 / alone_seconds,
        tokens as f64 / batch_seconds
    );
    let m = e.metrics();
    assert_eq!(m.requests_submitted, 32);
    assert_eq!(m.requests_finished.get("length"), Some(&32));
    assert_eq!(m.generation_tokens as usize, tokens);
    assert_eq!(m.time_to_first_token.count, 32);
    assert!(m.inter_token_latency.count > 0 && m.steps > 0);
    e.shutdown();
}

#[test]
fn a_tiny_kv_pool_preempts_and_still_gives_identical_outputs() {
    let Some(f) = factory() else { return };
    let requests = workload();
    let want = alone(&f, &requests);
    // 12 blocks of 4 tokens: a handful of sequences at a time, so the longest ones get preempted.
    let e = engine(&f, 12, EngineConfig { enable_prefix_cache: false, ..Default::default() });
    let got = together(&e, &requests);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.token_ids, w.token_ids, "request {i}");
    }
    let m = e.metrics();
    assert!(m.preemptions > 0, "the pool was meant to be too small");
    assert_eq!(m.kv.used_blocks, 0);
    eprintln!("preemptions: {}", m.preemptions);
    e.shutdown();
}

/// A step budget the device cannot meet (a nanosecond) holds every step to the fewest tokens
/// (`MIN_STEP_TOKENS`): long prompts are prefilled in chunks of that size, beside decodes, and
/// every token comes out as without the limit. A budget that is not a number of seconds is
/// refused.
#[test]
fn a_step_budget_chunks_long_prompts_and_changes_no_token() {
    use weft::engine::step_budget::MIN_STEP_TOKENS;
    let Some(f) = factory() else { return };
    let requests: Vec<InferenceRequest> = (0..6)
        .map(|i| {
            let prompt: String = (0..(40 + i * 13)).map(|j| char::from(b'a' + ((i * 5 + j) % 26) as u8)).collect();
            greedy(&prompt, 6)
        })
        .collect();
    let want = alone(&f, &requests);
    let e = engine(&f, 256, EngineConfig { max_step_seconds: Some(1e-9), ..Default::default() });
    let got = together(&e, &requests);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.token_ids, w.token_ids, "request {i}");
    }
    let steps = e.take_step_records();
    let widest = steps.iter().map(|s| s.num_tokens).max().unwrap();
    assert_eq!(widest, MIN_STEP_TOKENS, "the widest of {} steps", steps.len());
    e.shutdown();
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let c = tiny::tiny_config();
        let w = tiny::random_weights(&c, 21, DType::Q8_0);
        let files = ModelFiles::from_gguf_bytes("tiny.gguf", tiny::gguf_bytes(&c, &w, DType::Q8_0)).unwrap();
        let exec = files.executor(&f, KvCacheConfig::new(4, 16)).unwrap();
        let err = ContinuousBatchEngine::new_plan_runtime(
            EngineConfig { max_step_seconds: Some(bad), ..Default::default() },
            files.tokenizer.clone(),
            Arc::new(GpuSampler),
            Arc::new(exec),
            Arc::new(f.clone()),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("max_step_seconds must be a number of seconds (0 for no limit)"), "{err}");
    }
}

#[test]
fn a_shared_prefix_hits_the_cache_and_changes_nothing() {
    let Some(f) = factory() else { return };
    let system = "You are a careful assistant. Answer briefly and precisely. ".repeat(2);
    let requests: Vec<InferenceRequest> = (0..6).map(|i| greedy(&format!("{system}Question {i}?"), 4)).collect();
    let want = alone(&f, &requests);
    let e = engine(&f, 256, EngineConfig::default());
    let first = weft::rt::block_on(e.infer(requests[0].clone())).unwrap();
    assert_eq!(first.token_ids, want[0].token_ids);
    assert_eq!(e.prefix_cache_hits(), 0);
    for (r, w) in requests.iter().zip(&want).skip(1) {
        let got = weft::rt::block_on(e.infer(r.clone())).unwrap();
        assert_eq!(got.token_ids, w.token_ids);
        assert!(got.usage.cached_prompt_tokens > 0, "{:?}", got.usage);
    }
    let stats = e.prefix_cache_stats();
    assert!(stats.hits >= 5 * (system.len() / 4 - 1) as u64, "{stats:?}");
    // Under pressure the cache gives way: a pool of 40 blocks serves many distinct prompts.
    let small = engine(&f, 40, EngineConfig::default());
    for i in 0..12 {
        let r = greedy(&format!("{i} distinct prompt number {i} with enough text to fill blocks"), 4);
        assert_eq!(weft::rt::block_on(small.infer(r)).unwrap().finish_reason, FinishReason::Length);
    }
    assert!(small.prefix_cache_stats().evictions > 0);
}

/// A burst of requests that share a prefix new to the cache, sent while the engine is busy (so
/// they reach one step together): the scheduler admits one of them and holds the others back
/// until its shared blocks are computed, then they take those blocks from the cache. Outputs
/// are those of each request alone, and only one request computes the shared prefix.
#[test]
fn a_burst_sharing_a_new_prefix_computes_it_once() {
    let Some(f) = factory() else { return };
    let system = "Shared instructions that every request of the burst begins with. ".repeat(2);
    let requests: Vec<InferenceRequest> = (0..6).map(|i| greedy(&format!("{system}Ask {i}."), 3)).collect();
    let want = alone(&f, &requests);
    let e = engine(&f, 256, EngineConfig::default());
    e.start_loop().unwrap();
    let busy = e.infer_stream(greedy("something else entirely", 40)).unwrap();
    weft::rt::block_on(async {
        let mut busy = Box::pin(busy);
        busy.next().await.unwrap().unwrap();
        let got = futures::future::join_all(requests.iter().map(|r| e.infer(r.clone()))).await;
        let shared_tokens = e.tokenizer().encode(&system, false).unwrap().len();
        let mut from_cache = 0;
        for (got, want) in got.into_iter().zip(&want) {
            let got = got.unwrap();
            assert_eq!(got.token_ids, want.token_ids);
            if got.usage.cached_prompt_tokens >= (shared_tokens - 1) / 4 * 4 {
                from_cache += 1;
            }
        }
        assert_eq!(from_cache, requests.len() - 1, "all but one take the shared blocks from the cache");
        while busy.next().await.is_some() {}
    });
}

#[test]
fn dropped_streams_free_their_blocks_and_the_rest_finish() {
    let Some(f) = factory() else { return };
    let e = engine(&f, 256, EngineConfig { enable_prefix_cache: false, ..Default::default() });
    let requests: Vec<InferenceRequest> = workload().iter().map(|r| greedy_like(r, 40)).collect();
    let want = alone(&f, &requests);
    let e2 = e.clone();
    weft::rt::block_on(async move {
        let mut streams: Vec<_> = requests.iter().map(|r| Box::pin(e2.infer_stream(r.clone()).unwrap())).collect();
        // Read one chunk from each, then drop the odd ones.
        let mut firsts = Vec::new();
        for s in &mut streams {
            firsts.push(s.next().await.unwrap().unwrap().token_ids);
        }
        let kept: Vec<_> = streams.into_iter().zip(firsts).enumerate().filter(|(i, _)| i % 2 == 0).collect();
        for (i, (mut s, mut tokens)) in kept {
            while let Some(chunk) = s.next().await {
                tokens.extend(chunk.unwrap().token_ids);
            }
            assert_eq!(tokens, want[i].token_ids, "request {i}");
        }
    });
    // The dropped requests are noticed at the next step; run steps until nothing is left.
    while weft::rt::block_on(e.step()).unwrap() {}
    let usage = e.kv_usage();
    assert_eq!(usage.used_blocks, 0, "{usage:?}");
    assert_eq!(usage.free_blocks + usage.cached_blocks, usage.total_blocks);
    assert_eq!(e.metrics().requests_finished.get("cancelled"), Some(&16));
}

fn greedy_like(r: &InferenceRequest, max_tokens: usize) -> InferenceRequest {
    let mut r = r.clone();
    r.params.max_tokens = Some(max_tokens);
    r
}

#[test]
fn stop_strings_across_token_boundaries_never_leak() {
    let Some(f) = factory() else { return };
    let e = engine(&f, 256, EngineConfig::default());
    let base = weft::rt::block_on(e.infer(greedy("stop test prompt", 24))).unwrap();
    let text = base.text.clone();
    // A stop string made of the end of one token's text and the start of a later one.
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 8, "tiny model text too short: {text:?}");
    let stop: String = chars[4..7].iter().collect();
    let cut = text.find(&stop).unwrap();
    let mut r = greedy("stop test prompt", 24);
    r.params.stop = vec![stop.clone()];
    let got = weft::rt::block_on(e.infer(r)).unwrap();
    assert_eq!(got.finish_reason, FinishReason::Stop);
    assert_eq!(got.text, text[..cut], "stop {stop:?} in {text:?}");
    // Streaming never shows any of it either.
    let mut r = greedy("stop test prompt", 24);
    r.params.stop = vec![stop.clone()];
    let streamed: String = weft::rt::block_on(async {
        let s = e.infer_stream(r).unwrap();
        s.map(|c| c.unwrap().text).collect::<Vec<_>>().await.concat()
    });
    assert_eq!(streamed, text[..cut]);
    // A stop token id.
    let mut r = greedy("stop test prompt", 24);
    r.params.stop_token_ids = vec![base.token_ids[3]];
    let got = weft::rt::block_on(e.infer(r)).unwrap();
    assert_eq!(got.finish_reason, FinishReason::Stop);
    assert_eq!(got.token_ids.last(), Some(&base.token_ids[3]));
}

#[test]
fn bad_requests_are_refused_while_others_continue() {
    let Some(f) = factory() else { return };
    let e = engine(&f, 256, EngineConfig { max_model_len: 64, ..Default::default() });
    e.start_loop().unwrap();
    let good = greedy("a good request", 10);
    let want = alone(&f, std::slice::from_ref(&good));
    let running = {
        let e = e.clone();
        let good = good.clone();
        std::thread::spawn(move || weft::rt::block_on(e.infer(good)).unwrap())
    };
    let bad = |f: &dyn Fn(&mut InferenceRequest), field: &str| {
        let mut r = greedy("hello", 4);
        f(&mut r);
        let Err(err) = weft::rt::block_on(e.infer(r)) else { panic!("{field}: must be refused") };
        let err = err.to_string();
        assert!(err.contains(field), "{err}");
    };
    bad(&|r| r.params.sampling.temperature = -1.0, "temperature");
    bad(&|r| r.params.sampling.top_p = 0.0, "top_p");
    bad(&|r| r.params.max_tokens = Some(0), "max_tokens");
    bad(&|r| r.prompt = Prompt::Text("x".repeat(100)), "prompt");
    bad(&|r| r.params.max_tokens = Some(63), "max_tokens");
    bad(&|r| r.prompt = Prompt::Tokens(vec![1, 2, 100_000]), "outside the vocabulary");
    bad(&|r| r.prompt = Prompt::Chat(vec![]), "messages");
    bad(&|r| r.params.stop_token_ids = vec![3, 100_000], "stop_token_ids");
    assert_eq!(running.join().unwrap().token_ids, want[0].token_ids);
    assert_eq!(e.metrics().requests_rejected, 8);
    e.shutdown();
}

#[test]
fn shutdown_cancels_what_is_in_flight_and_refuses_the_rest() {
    let Some(f) = factory() else { return };
    let e = engine(&f, 256, EngineConfig::default());
    let (_, mut a) = e.submit(greedy("first", 100)).unwrap();
    let (_, mut b) = e.submit(greedy("second", 100)).unwrap();
    weft::rt::block_on(e.step()).unwrap();
    e.shutdown();
    for rx in [&mut a, &mut b] {
        let chunks: Vec<_> = weft::rt::block_on(rx.collect::<Vec<_>>());
        let last = chunks.last().unwrap().as_ref().unwrap();
        assert_eq!(last.finish_reason, Some(FinishReason::Cancelled));
    }
    let err = weft::rt::block_on(e.infer(greedy("late", 4))).err().unwrap().to_string();
    assert!(err.contains("engine is shut down"), "{err}");
    assert_eq!(e.kv_usage().used_blocks, 0);
}

/// A lost device (a driver reset, the GPU removed; here destroyed on purpose) ends the
/// requests in flight with an error that says so and what to do, the engine's health check
/// reports it, later requests fail the same way, and no KV block stays taken.
#[test]
fn a_lost_device_ends_the_requests_in_flight_and_fails_the_health_check() {
    use weft::engine::api::InferenceEngine;
    let Some(ctx) = weft::gpu::open_or_skip(GpuOptions::default()).unwrap() else { return };
    let f = GpuTensorFactory::new(ctx.clone());
    let e = engine(&f, 256, EngineConfig::default());
    let (_, mut a) = e.submit(greedy("first", 100)).unwrap();
    let (_, mut b) = e.submit(greedy("second", 100)).unwrap();
    weft::rt::block_on(e.step()).unwrap();
    assert!(weft::rt::block_on(e.health_check()).healthy);
    ctx.destroy_device();
    let err = weft::rt::block_on(e.step()).unwrap_err().to_string();
    assert!(err.contains("was lost") && err.contains("restart weft"), "{err}");
    for rx in [&mut a, &mut b] {
        let chunks: Vec<_> = weft::rt::block_on(rx.collect::<Vec<_>>());
        let error = chunks.iter().find_map(|c| c.as_ref().err()).map(|e| e.to_string());
        assert!(error.as_deref().is_some_and(|e| e.contains("was lost")), "{chunks:?}");
        let last = chunks.last().unwrap().as_ref().unwrap();
        assert_eq!(last.finish_reason, Some(FinishReason::Error));
    }
    let health = weft::rt::block_on(e.health_check());
    assert!(!health.healthy && health.detail.contains("was lost"), "{health:?}");
    let late = weft::rt::block_on(e.infer(greedy("late", 4))).err().unwrap().to_string();
    assert!(late.contains("was lost"), "{late}");
    assert_eq!(e.kv_usage().used_blocks, 0);
}

#[test]
fn penalties_discourage_repeats() {
    let Some(f) = factory() else { return };
    let e = engine(&f, 256, EngineConfig::default());
    let plain = weft::rt::block_on(e.infer(greedy("aaaa", 24))).unwrap();
    let mut r = greedy("aaaa", 24);
    r.params.sampling.presence_penalty = 2.0;
    r.params.sampling.frequency_penalty = 2.0;
    r.params.sampling.repetition_penalty = 2.0;
    let penalized = weft::rt::block_on(e.infer(r)).unwrap();
    let distinct = |t: &[u32]| t.iter().collect::<std::collections::BTreeSet<_>>().len();
    assert_ne!(plain.token_ids, penalized.token_ids);
    assert!(
        distinct(&penalized.token_ids) > distinct(&plain.token_ids),
        "{:?} vs {:?}",
        penalized.token_ids,
        plain.token_ids
    );
}

/// `logit_bias` changes its own request's tokens only: run in one batch with the workload, the
/// workload's tokens are those it gives alone, a biased request gives what it gives alone, and
/// the biases do what they say (+100 forces a token, -100 bans the tokens greedy picked).
#[test]
fn a_logit_bias_changes_its_own_request_only() {
    let Some(f) = factory() else { return };
    let plain: Vec<InferenceRequest> = workload().into_iter().take(12).collect();
    let unbiased = alone(&f, &plain);
    let with_bias = |i: usize, pairs: Vec<(u32, f32)>| {
        let mut r = plain[i].clone();
        r.params.sampling.logit_bias = LogitBias::new(pairs);
        r
    };
    let forced = (0..260).find(|t| !unbiased[0].token_ids.contains(t)).unwrap();
    let greedy_picks: std::collections::BTreeSet<u32> = unbiased[4].token_ids.iter().copied().collect();
    let banned: Vec<(u32, f32)> = greedy_picks.iter().map(|&t| (t, -100.0)).collect();
    // Moderate biases on many tokens, on a sampled request and on a penalised one, and -10 on
    // the tokens each picked unbiased (the tiny random model is sure of few tokens).
    let moderate = |i: usize| {
        let mut pairs: std::collections::BTreeMap<u32, f32> =
            (0..260).step_by(3).map(|t| (t, (t % 11) as f32 - 5.0)).collect();
        pairs.extend(unbiased[i].token_ids.iter().map(|&t| (t, -10.0)));
        pairs.into_iter().collect::<Vec<_>>()
    };
    let biased = vec![
        with_bias(0, vec![(forced, 100.0)]),
        with_bias(4, banned),
        with_bias(1, moderate(1)),
        with_bias(2, moderate(2)),
    ];
    let biased_alone = alone(&f, &biased);
    assert!(biased_alone[0].token_ids.iter().all(|&t| t == forced), "{:?}", biased_alone[0].token_ids);
    assert!(biased_alone[1].token_ids.iter().all(|t| !greedy_picks.contains(t)));
    assert_ne!(biased_alone[2].token_ids, unbiased[1].token_ids, "the bias moved the seeded draws");
    assert_ne!(biased_alone[3].token_ids, unbiased[2].token_ids, "the bias moved the penalised request");

    let e = engine(&f, 256, EngineConfig::default());
    let everything: Vec<InferenceRequest> = plain.iter().chain(&biased).cloned().collect();
    let got = together(&e, &everything);
    for (i, (g, w)) in got.iter().zip(unbiased.iter().chain(&biased_alone)).enumerate() {
        assert_eq!(g.token_ids, w.token_ids, "request {i}");
    }
    e.shutdown();
}

#[test]
fn chat_prompts_use_the_model_template() {
    let Some(f) = factory() else { return };
    let e = engine(&f, 256, EngineConfig::default());
    let messages = vec![weft::tokenizer::ChatMessage::user("hi")];
    let chat = InferenceRequest::new(
        Prompt::Chat(messages),
        GenerationParams {
            sampling: SamplingParams::greedy(),
            max_tokens: Some(3),
            ignore_eos: true,
            ..Default::default()
        },
    );
    let text = InferenceRequest::new(
        Prompt::Text("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n".into()),
        chat.params.clone(),
    );
    let a = weft::rt::block_on(e.infer(chat)).unwrap();
    let b = weft::rt::block_on(e.infer(text)).unwrap();
    assert_eq!(a.token_ids, b.token_ids);
    assert_eq!(a.usage.prompt_tokens, b.usage.prompt_tokens);
}

#[test]
fn the_seed_constructors_check_their_parts() {
    use weft::engine::{RecurrentStateManager, SpeculationConfig};
    use weft::kv::{KvCacheManager, RecurrentStateConfig};
    let Some(f) = factory() else { return };
    let c = tiny::tiny_config();
    let w = tiny::random_weights(&c, 21, DType::Q8_0);
    let files = ModelFiles::from_gguf_bytes("tiny.gguf", tiny::gguf_bytes(&c, &w, DType::Q8_0)).unwrap();
    let exec: Arc<dyn weft::step::ModelExecutor> = Arc::new(files.executor(&f, KvCacheConfig::new(4, 32)).unwrap());
    let tok = files.tokenizer.clone();
    let parts = || {
        (
            EngineConfig::default(),
            tok.clone(),
            Arc::new(GpuSampler) as Arc<dyn weft::sampling::Sampler>,
            exec.clone(),
            Arc::new(f.clone()) as Arc<dyn weft::tensor::TensorFactory>,
        )
    };

    // A KV manager that does not describe the executor's pool is refused.
    let (config, t, s, e, tf) = parts();
    let err =
        ContinuousBatchEngine::new(config, t, s, KvCacheManager::new(16, 4, true), e, tf).err().unwrap().to_string();
    assert!(err.contains("16 blocks of 4 tokens but the executor's pool has 32 blocks of 4"), "{err}");

    // Speculation with a draft model: both or neither (tests/spec.rs checks the rest).
    let (config, t, s, e, tf) = parts();
    let err = ContinuousBatchEngine::new_with_speculation(
        config,
        t,
        s,
        KvCacheManager::new(32, 4, true),
        e.clone(),
        tf,
        Some(e),
        None,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("both a draft executor and a speculation config, or neither"), "{err}");
    let (config, t, s, e, tf) = parts();
    let spec = SpeculationConfig { num_speculative_tokens: 4, ..Default::default() };
    let drafting = ContinuousBatchEngine::new_with_speculation(
        config,
        t,
        s,
        KvCacheManager::new(32, 4, true),
        e.clone(),
        tf,
        Some(e),
        Some(spec),
    )
    .unwrap();
    assert_eq!(drafting.speculation().map(|c| c.num_speculative_tokens), Some(4));

    // A state manager for a model without recurrent layers is refused.
    let (config, t, s, e, tf) = parts();
    let slots =
        RecurrentStateConfig { num_slots: 4, num_snapshot_slots: 0, slot_size_bytes: 1024, scan_chunk_tokens: 1 };
    let err = ContinuousBatchEngine::new_with_speculation_and_recurrent_state_manager(
        config,
        t,
        s,
        KvCacheManager::new(32, 4, true),
        e,
        tf,
        None,
        None,
        Some(RecurrentStateManager::new(slots)),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("no recurrent layers"), "{err}");

    // A model with recurrent layers: speculation is refused with the reason, a manager of
    // another size is refused, and without one the engine makes its own and reports its slots.
    let (config, t, s, e, tf) = parts();
    let recurrent: Arc<dyn weft::step::ModelExecutor> = Arc::new(WithStateSlots(e, slots));
    let err = ContinuousBatchEngine::new_with_speculation(
        config,
        t,
        s,
        KvCacheManager::new(32, 4, true),
        recurrent.clone(),
        tf,
        Some(recurrent.clone()),
        Some(SpeculationConfig { num_speculative_tokens: 2, ..Default::default() }),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("speculative decoding is not supported for recurrent models yet"), "{err}");
    let (config, t, s, _, tf) = parts();
    let err = ContinuousBatchEngine::new_with_speculation_and_recurrent_state_manager(
        config,
        t,
        s,
        KvCacheManager::new(32, 4, true),
        recurrent.clone(),
        tf,
        None,
        None,
        Some(RecurrentStateManager::new(RecurrentStateConfig { num_slots: 8, ..slots })),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("8 slots (and 0 snapshots) of 1024 bytes, scanned in chunks of 1 positions, but the executor's pool has 4 slots (and 0 snapshots)"),
        "{err}"
    );
    let (config, t, s, _, tf) = parts();
    let engine = ContinuousBatchEngine::new_plan_runtime(config, t, s, recurrent, tf).unwrap();
    assert!(!engine.config().enable_prefix_cache, "a KV prefix hit cannot restore a recurrent state");
    let usage = engine.state_usage().unwrap();
    assert_eq!((usage.total_slots, usage.free_slots), (4, 4));
    let snapshot = weft::engine::api::InferenceEngine::admission_snapshot(&engine);
    assert_eq!(snapshot.available_state_slots, Some(4));

    // Neither: a working engine, equal to new_plan_runtime's.
    let (config, t, s, e, tf) = parts();
    let engine = ContinuousBatchEngine::new_with_speculation_and_recurrent_state_manager(
        config,
        t,
        s,
        KvCacheManager::new(32, 4, true),
        e,
        tf,
        None,
        None,
        None,
    )
    .unwrap();
    let a = weft::rt::block_on(engine.infer(greedy("seed api", 5))).unwrap();
    let b = weft::rt::block_on(self::engine(&f, 32, EngineConfig::default()).infer(greedy("seed api", 5))).unwrap();
    assert_eq!(a.token_ids, b.token_ids);
    assert!(weft::rt::block_on(weft::engine::api::InferenceEngine::health_check(&engine)).healthy);
}

/// An executor that claims a recurrent-state pool: enough to test the engine's construction.
struct WithStateSlots(Arc<dyn weft::step::ModelExecutor>, weft::kv::RecurrentStateConfig);

impl weft::step::ModelExecutor for WithStateSlots {
    fn execute<'a>(
        &'a self,
        batch: &'a weft::step::StepBatch,
    ) -> weft::rt::BoxFuture<'a, weft::Result<weft::step::StepOutput>> {
        self.0.execute(batch)
    }
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn max_context(&self) -> usize {
        self.0.max_context()
    }
    fn kv_config(&self) -> KvCacheConfig {
        self.0.kv_config()
    }
    fn state_config(&self) -> Option<weft::kv::RecurrentStateConfig> {
        Some(self.1)
    }
    fn health_check(&self) -> weft::rt::BoxFuture<'_, weft::Result<()>> {
        self.0.health_check()
    }
}

/// DESIGN.md principle 2: nothing is created in a warm step. The first run of a workload grows
/// the executor's workspace and fills its bind-group cache; the same shapes again (other
/// prompts of the same lengths, prefill chunks, decodes alone and batched) create no buffer,
/// texture or bind group.
#[test]
fn a_warm_step_creates_nothing() {
    let Some(f) = factory() else { return };
    let e = engine(&f, 256, EngineConfig { max_num_batched_tokens: 16, ..Default::default() });
    warm_steps_create_nothing(&f, &e);
}

/// The same with experts: the routing and every (token, slot) row live in buffers made for
/// the largest step.
#[test]
fn a_warm_mixture_of_experts_step_creates_nothing() {
    let Some(f) = factory() else { return };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3moe/model.gguf");
    let files = ModelFiles::open(&path).unwrap();
    let e = engine_of(&f, files, 256, EngineConfig { max_num_batched_tokens: 16, ..Default::default() });
    warm_steps_create_nothing(&f, &e);
}

/// Five requests of different lengths, then one alone, twice over: the second round's steps
/// create no GPU object.
fn warm_steps_create_nothing(f: &GpuTensorFactory, e: &ContinuousBatchEngine) {
    let run = |first: u8| {
        let prompts: Vec<String> =
            (0..5).map(|i| (0..3 + 4 * i).map(|j| char::from(first + ((i + j) % 13) as u8)).collect()).collect();
        let mut streams: Vec<_> = prompts.iter().map(|p| e.submit(greedy(p, 6)).unwrap().1).collect();
        let mut steps = 0;
        while weft::rt::block_on(e.step()).unwrap() {
            steps += 1;
        }
        for s in &mut streams {
            let chunks: Vec<_> = weft::rt::block_on(s.collect::<Vec<_>>());
            assert_eq!(chunks.last().unwrap().as_ref().unwrap().finish_reason, Some(FinishReason::Length));
        }
        // And one request alone: single-row steps.
        let lone = weft::rt::block_on(e.infer(greedy(&prompts[1], 5))).unwrap();
        assert_eq!(lone.usage.completion_tokens, 5);
        steps
    };
    let cold = f.context().creations();
    let steps = run(b'a');
    let warm = f.context().creations();
    assert!(warm.buffers > cold.buffers && warm.bind_groups > cold.bind_groups, "the first run creates the workspace");
    let steps_again = run(b'n');
    assert_eq!(steps, steps_again, "the same shapes");
    assert_eq!(f.context().creations(), warm, "{steps_again} warm steps created GPU objects");
}

/// A builder of the tiny random model (Q8_0).
fn tiny_builder() -> weft::EngineBuilder {
    let c = tiny::tiny_config();
    let w = tiny::random_weights(&c, 21, DType::Q8_0);
    weft::EngineBuilder::from_gguf_bytes("tiny.gguf", tiny::gguf_bytes(&c, &w, DType::Q8_0)).unwrap()
}

/// The builder warms the executor up: the kernels of a lone decode, of a few sequences decoding
/// together and of a prefill chunk are compiled while the engine is built (in a browser, about
/// half a second each), so serving those steps compiles nothing more.
#[test]
fn the_builder_compiles_what_serving_dispatches() {
    let Some(f) = factory() else { return };
    let builder = tiny_builder();
    let config = EngineConfig { max_num_batched_tokens: 16, max_num_seqs: 8, ..Default::default() };
    let before = f.context().creations().pipelines;
    let e = builder.config(config).kv_memory_bytes(1 << 20).build_on(f.context().clone()).unwrap();
    let built = f.context().creations().pipelines;
    assert!(built > before, "building compiled nothing");
    // A prompt longer than one step's budget (prefill chunks), then decodes alone.
    let lone = weft::rt::block_on(e.infer(greedy("a prompt of a few more tokens than sixteen", 4))).unwrap();
    assert_eq!(lone.usage.completion_tokens, 4);
    // Three, four and (more than the warm-up ran together) eight sequences decoding together.
    for n in [3, 4, 8] {
        let mut streams: Vec<_> = (0..n).map(|i| e.submit(greedy(&"xyz"[..i % 3 + 1], 3)).unwrap().1).collect();
        while weft::rt::block_on(e.step()).unwrap() {}
        for s in &mut streams {
            let chunks: Vec<_> = weft::rt::block_on(s.collect::<Vec<_>>());
            assert_eq!(chunks.last().unwrap().as_ref().unwrap().finish_reason, Some(FinishReason::Length));
        }
    }
    assert_eq!(f.context().creations().pipelines, built, "serving compiled kernels the warm-up missed");
}

/// The builder makes the workspace for a full step (the whole token budget, a sampled row per
/// sequence): a prefill longer than the warm-up's does not grow it, which would leave the
/// smaller one's memory behind in the allocator.
#[test]
fn the_workspace_is_made_for_a_full_step() {
    let Some(f) = factory() else { return };
    let builder = tiny_builder();
    let config = EngineConfig { max_num_batched_tokens: 128, max_num_seqs: 2, ..Default::default() };
    let e = builder.config(config).kv_memory_bytes(1 << 20).build_on(f.context().clone()).unwrap();
    let buffers = f.context().creations().buffers;
    let out = weft::rt::block_on(e.infer(greedy(&"x".repeat(120), 2))).unwrap();
    assert!(
        out.usage.prompt_tokens > 64,
        "{} prompt tokens: no longer than the warm-up's prefill",
        out.usage.prompt_tokens
    );
    // A workspace is some 30 buffers; serving makes only its step arenas' timestamp and readback
    // buffers.
    let made = f.context().creations().buffers - buffers;
    assert!(made <= 4, "serving made {made} buffers: the workspace grew");
}

/// The workspace has room for every sequence's whole logit bias: biased requests decoding
/// together, each biasing (nearly) the most tokens allowed, do not grow it.
#[test]
fn logit_biases_fit_the_workspace_made_by_the_builder() {
    let Some(f) = factory() else { return };
    let config = EngineConfig { max_num_batched_tokens: 64, max_num_seqs: 4, ..Default::default() };
    let e = tiny_builder().config(config).kv_memory_bytes(1 << 20).build_on(f.context().clone()).unwrap();
    let buffers = f.context().creations().buffers;
    // Every token of the tiny vocabulary: 260 of the 300 allowed.
    let bias = LogitBias::new((0..260).map(|t| (t, 0.5)));
    let mut streams: Vec<_> = (0..4)
        .map(|i| {
            let mut r = greedy(&"abcd"[..i + 1], 3);
            r.params.sampling.logit_bias = bias.clone();
            e.submit(r).unwrap().1
        })
        .collect();
    while weft::rt::block_on(e.step()).unwrap() {}
    for s in &mut streams {
        let chunks: Vec<_> = weft::rt::block_on(s.collect::<Vec<_>>());
        assert_eq!(chunks.last().unwrap().as_ref().unwrap().finish_reason, Some(FinishReason::Length));
    }
    let made = f.context().creations().buffers - buffers;
    assert!(made <= 4, "serving made {made} buffers: the workspace grew");
}

/// In the baseline family, which splits long contexts (split-K attention and its merge), a
/// context past the split threshold also compiles nothing the build did not.
#[test]
fn the_builder_compiles_the_long_context_kernels() {
    let options = GpuOptions { kernels: Some(weft::gpu::KernelFamily::Baseline), ..Default::default() };
    let Some(f) = weft::gpu::open_or_skip(options).unwrap().map(GpuTensorFactory::new) else { return };
    let builder = tiny_builder();
    let config = EngineConfig { max_num_batched_tokens: 64, max_num_seqs: 4, ..Default::default() };
    let e = builder.config(config).kv_memory_bytes(1 << 20).build_on(f.context().clone()).unwrap();
    let built = f.context().creations().pipelines;
    let long = "x".repeat(weft::gpu::kernels::paged::SPLIT_MIN_POSITIONS + 40);
    let out = weft::rt::block_on(e.infer(greedy(&long, 3))).unwrap();
    assert_eq!(out.usage.completion_tokens, 3);
    assert_eq!(f.context().creations().pipelines, built, "a long context compiled kernels the warm-up missed");
}

/// `kv_cache_dtype(F16)` fits twice the blocks in the same KV memory, serves with the kernels
/// the warm-up compiled for it, and gives the f32 cache's greedy tokens on this prompt (the
/// rounding moves logits by about 1e-3; the tiny model's top tokens are further apart); a
/// cache of another type is refused when the engine is built.
#[test]
fn an_f16_kv_cache_holds_twice_the_blocks() {
    let Some(f) = factory() else { return };
    let c = tiny::tiny_config();
    let w = tiny::random_weights(&c, 21, DType::Q8_0);
    let bytes = tiny::gguf_bytes(&c, &w, DType::Q8_0);
    let config = EngineConfig { max_num_batched_tokens: 16, max_num_seqs: 4, ..Default::default() };
    let build = |dtype| {
        weft::EngineBuilder::from_gguf_bytes("tiny.gguf", bytes.clone())
            .unwrap()
            .config(config.clone())
            .kv_memory_bytes(1 << 20)
            .kv_cache_dtype(dtype)
            .build_on(f.context().clone())
    };
    let (full, half) = (build(DType::F32).unwrap(), build(DType::F16).unwrap());
    assert_eq!(half.kv_usage().total_blocks, 2 * full.kv_usage().total_blocks);
    let compiled = f.context().creations().pipelines;
    let prompt = "a prompt of a few more tokens than sixteen";
    let want = weft::rt::block_on(full.infer(greedy(prompt, 8))).unwrap();
    let got = weft::rt::block_on(half.infer(greedy(prompt, 8))).unwrap();
    assert_eq!(got.usage.completion_tokens, 8);
    assert_eq!(got.text, want.text);
    assert_eq!(f.context().creations().pipelines, compiled, "serving compiled kernels the warm-up missed");
    let err = build(DType::Q8_0).err().expect("a Q8_0 cache is refused").to_string();
    assert!(err.contains("f32 or f16"), "{err}");
}

/// Built with defaults, the KV pool follows the device: f16 where it has shader-f16 (lavapipe
/// has), f32 elsewhere; on a CPU driver such as lavapipe the modest pool `gpu::memory` keeps
/// there (256 MiB: far more than one sequence of the tiny model's 2048 tokens), on a GPU the
/// share the weights leave. `plan_kv` says the same before anything is uploaded.
#[test]
fn a_default_kv_pool_follows_the_device() {
    let Some(f) = factory() else { return };
    let before = f.context().creations().bytes;
    let engine = tiny_builder().build_on(f.context().clone()).unwrap();
    let made = f.context().creations().bytes - before;
    let kv = weft::step::ModelExecutor::kv_config(engine.executor().as_ref());
    let plan = f.context().plan();
    let dtype = if plan.features.shader_f16 { DType::F16 } else { DType::F32 };
    assert_eq!(kv.dtype, dtype);
    let c = tiny::tiny_config();
    let block_bytes = weft::kv::KvCacheConfig::block_bytes(16, c.kv_token_values(), dtype);
    if plan.cpu_adapter() {
        assert_eq!(kv.num_blocks, weft::gpu::CPU_DRIVER_KV_BYTES as usize / block_bytes);
    }
    let planned = tiny_builder().plan_kv(f.context()).unwrap();
    assert_eq!((planned.config.dtype, planned.max_model_len), (dtype, 2048));
    // The weights counted as uploaded, or estimated from the file: within a block or two.
    assert!(planned.config.num_blocks.abs_diff(kv.num_blocks) * block_bytes <= 64 << 10, "{planned:?} vs {kv:?}");
    assert!(planned.describe().starts_with(&format!("KV cache: {} tokens of ", planned.num_tokens())));
    // What the build made (weights, pool, the warm-up's workspace) is within what the plan
    // set aside: the workspace's estimate covers what warming up created.
    let pool = (kv.num_blocks * block_bytes) as u64;
    assert!(made <= planned.weights_bytes + pool + planned.other_bytes, "{made} bytes made for {planned:?}");
    // An explicit dtype wins.
    let f32s = tiny_builder().kv_cache_dtype(DType::F32).plan_kv(f.context()).unwrap();
    assert_eq!(f32s.config.dtype, DType::F32);
}

/// As vLLM does, a build whose KV cache cannot hold one sequence of max_model_len is refused,
/// saying how many tokens fit and what to do; a utilization outside (0, 1] too.
#[test]
fn a_kv_cache_shorter_than_max_model_len_is_refused() {
    let Some(f) = factory() else { return };
    // 256 KiB of f16 hold 1024 tokens of the tiny model (256 bytes a token), whose context is 2048.
    let build = |b: weft::EngineBuilder| b.build_on(f.context().clone()).err().expect("refused").to_string();
    let err = build(tiny_builder().kv_memory_bytes(256 << 10).kv_cache_dtype(DType::F16));
    assert!(err.contains("max_model_len 2048 does not fit the KV cache, which holds 1024 tokens"), "{err}");
    assert!(err.contains("lower max_model_len (--max-model-len) to 1024 or less"), "{err}");
    assert!(err.contains("give the KV cache more memory (--kv-memory)"), "{err}");
    assert!(!err.contains("--kv-cache-dtype f16"), "already f16: {err}");
    // In f32, half the tokens; f16 is one of the ways out.
    let err = build(tiny_builder().kv_memory_bytes(256 << 10).kv_cache_dtype(DType::F32));
    assert!(err.contains("which holds 512 tokens") && err.contains("--kv-cache-dtype f16"), "{err}");
    // Asking for less fits.
    let config = EngineConfig { max_model_len: 1024, ..Default::default() };
    tiny_builder()
        .config(config)
        .kv_memory_bytes(256 << 10)
        .kv_cache_dtype(DType::F16)
        .build_on(f.context().clone())
        .unwrap();
    let err = build(tiny_builder().gpu_memory_utilization(1.5));
    assert!(err.contains("gpu_memory_utilization 1.5 is not a fraction"), "{err}");
}

/// A KV pool whose layers would not fit one binding is refused at build, naming the layer size:
/// a quarter of the memory here (2 layers, K and V), f16 or not.
#[test]
fn kv_layers_larger_than_a_binding_are_refused() {
    let options = GpuOptions { max_binding_bytes: Some(1 << 20), ..Default::default() };
    let Some(f) = weft::gpu::open_or_skip(options).unwrap().map(GpuTensorFactory::new) else { return };
    let c = tiny::tiny_config();
    let w = tiny::random_weights(&c, 21, DType::Q8_0);
    let bytes = tiny::gguf_bytes(&c, &w, DType::Q8_0);
    let build = |memory: usize| {
        weft::EngineBuilder::from_gguf_bytes("tiny.gguf", bytes.clone())
            .unwrap()
            .kv_memory_bytes(memory)
            .kv_cache_dtype(DType::F16)
            .build_on(f.context().clone())
    };
    let err = build(6 << 20).err().expect("1.5 MiB layers over 1 MiB bindings").to_string();
    assert!(err.contains("need 1572864-byte layers, more than this device binds at once"), "{err}");
    build(4 << 20).expect("1 MiB layers fit");
}
