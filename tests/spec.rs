//! Speculative decoding in the engine, on tiny random models (fast on lavapipe): greedy output
//! identical to non-speculative greedy with the target as its own draft, with a different tiny
//! draft and with prompt lookup, alone and 16 at once; seeded sampling with prompt lookup
//! identical too; with a draft model, the distribution of a speculated token equal to the
//! target's, with and without logit biases (and the same check catching a broken rule); greedy
//! requests with logit biases identical too; stops, penalties and log-probabilities
//! as without speculation; every KV block back after requests finish, are cancelled while
//! steps run, or are preempted; and the constructor's refusals.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use weft::DType;
use weft::engine::request::{FinishReason, GenerationParams, InferenceRequest, InferenceResponse, Prompt};
use weft::engine::{ContinuousBatchEngine, Drafter, EngineConfig, SpeculationConfig};
use weft::gpu::{GpuOptions, GpuTensorFactory};
use weft::kv::{KvCacheConfig, KvCacheManager};
use weft::model::draft::DraftDistributions;
use weft::model::executor::GpuExecutor;
use weft::model::load::ModelFiles;
use weft::model::tiny;
use weft::sampling::{GpuSampler, LogitBias, SamplingParams};
use weft::step::{ModelExecutor, SeqStep, StepBatch};

fn factory() -> Option<GpuTensorFactory> {
    weft::gpu::open_or_skip(GpuOptions::default()).unwrap().map(GpuTensorFactory::new)
}

/// The target of every test: the tiny model with random weights from seed 21.
const TARGET: Weights = Weights { seed: 21, noise: 0.0 };

/// A tiny model's weights: random from `seed`, each value then scaled by a random factor in
/// [1 - noise, 1 + noise] (so a draft can be near the target without being it).
#[derive(Clone, Copy, Debug)]
struct Weights {
    seed: u64,
    noise: f32,
}

fn files(w: Weights) -> ModelFiles {
    let c = tiny::tiny_config();
    let mut tensors = tiny::random_weights(&c, w.seed, DType::Q8_0);
    if w.noise > 0.0 {
        for (name, values) in tensors.iter_mut() {
            let seed = name.bytes().fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
            let factors = tiny::random_values(values.len(), seed, w.noise);
            for (v, n) in values.iter_mut().zip(factors) {
                *v *= 1.0 + n;
            }
        }
    }
    ModelFiles::from_gguf_bytes("tiny.gguf", tiny::gguf_bytes(&c, &tensors, DType::Q8_0)).unwrap()
}

fn executor(f: &GpuTensorFactory, w: Weights, num_blocks: usize) -> GpuExecutor {
    files(w).executor(f, KvCacheConfig::new(4, num_blocks)).unwrap()
}

/// The draft of the distribution test.
const NEAR: Weights = Weights { seed: 21, noise: 0.3 };

/// How an engine drafts.
#[derive(Clone, Copy, Debug)]
enum Draft {
    None,
    /// The target's own weights as the draft.
    Same,
    /// Another tiny model (unrelated weights, same tokenizer).
    Random,
    /// The target's weights, perturbed: a draft that agrees often but not always.
    Near,
    Lookup,
}

fn engine(f: &GpuTensorFactory, num_blocks: usize, config: EngineConfig, draft: Draft) -> ContinuousBatchEngine {
    let spec = SpeculationConfig { max_batch_size: 64, ..SpeculationConfig::default() };
    engine_with(f, num_blocks, config, draft, spec)
}

fn engine_with(
    f: &GpuTensorFactory,
    num_blocks: usize,
    config: EngineConfig,
    draft: Draft,
    spec: SpeculationConfig,
) -> ContinuousBatchEngine {
    let mut target = executor(f, TARGET, num_blocks);
    let draft_weights = match draft {
        Draft::None => {
            let tok = files(TARGET).tokenizer.clone();
            let kv = KvCacheManager::new(num_blocks, 4, config.enable_prefix_cache);
            let (e, tf) = (Arc::new(target), Arc::new(f.clone()));
            return ContinuousBatchEngine::new(config, tok, Arc::new(GpuSampler), kv, e, tf).unwrap();
        }
        Draft::Lookup => None,
        Draft::Same => Some(TARGET),
        Draft::Random => Some(Weights { seed: 5, noise: 0.0 }),
        Draft::Near => Some(NEAR),
    };
    let (drafter_exec, spec): (Option<Arc<dyn ModelExecutor>>, _) = match draft_weights {
        Some(w) => {
            let mut d = executor(f, w, num_blocks);
            let slots = spec.max_batch_size * spec.num_speculative_tokens;
            let store = DraftDistributions::new(f, slots, target.vocab_size()).unwrap();
            target.share_draft_distributions(store.clone()).unwrap();
            d.share_draft_distributions(store).unwrap();
            (Some(shared(d)), SpeculationConfig { drafter: Drafter::DraftModel, ..spec })
        }
        None => (None, SpeculationConfig { drafter: Drafter::prompt_lookup(), ..spec }),
    };
    let kv = KvCacheManager::new(num_blocks, 4, config.enable_prefix_cache);
    ContinuousBatchEngine::new_with_speculation(
        config,
        files(TARGET).tokenizer.clone(),
        Arc::new(GpuSampler),
        kv,
        Arc::new(target),
        Arc::new(f.clone()),
        drafter_exec,
        Some(spec),
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

/// 16 greedy requests of different prompts and lengths; some with penalties, some reporting
/// log-probabilities.
fn workload() -> Vec<InferenceRequest> {
    (0..16)
        .map(|i| {
            let prompt: String =
                (0..(i * 5 % 17 + 2)).map(|j| char::from(b'a' + ((i * 7 + j * 3) % 26) as u8)).collect();
            let mut r = greedy(&format!("{prompt} {prompt}"), 10 + i % 7);
            if i % 4 == 1 {
                r.params.sampling.presence_penalty = 0.5;
                r.params.sampling.repetition_penalty = 1.2;
            }
            if i % 4 == 2 {
                r.params.sampling.top_logprobs = 2;
            }
            r
        })
        .collect()
}

fn alone(e: &ContinuousBatchEngine, requests: &[InferenceRequest]) -> Vec<InferenceResponse> {
    requests.iter().map(|r| weft::rt::block_on(e.infer(r.clone())).unwrap()).collect()
}

/// Submit every request, then collect them: the first collection steps for all at once.
fn together(e: &ContinuousBatchEngine, requests: &[InferenceRequest]) -> Vec<InferenceResponse> {
    let mut streams: Vec<_> = requests.iter().map(|r| Box::pin(e.infer_stream(r.clone()).unwrap())).collect();
    streams.iter_mut().map(|s| weft::rt::block_on(weft::engine::collect_response(s)).unwrap()).collect()
}

fn assert_same(got: &[InferenceResponse], want: &[InferenceResponse], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.token_ids, w.token_ids, "{what}: request {i}");
        assert_eq!(g.text, w.text, "{what}: request {i}");
        assert_eq!(g.finish_reason, w.finish_reason, "{what}: request {i}");
        assert_eq!(g.usage.completion_tokens, w.usage.completion_tokens, "{what}: request {i}");
        assert_eq!(g.logprobs.len(), w.logprobs.len(), "{what}: request {i}");
        for (a, b) in g.logprobs.iter().zip(&w.logprobs) {
            assert_eq!(a.token, b.token);
            assert!(
                (a.logprob - b.logprob).abs() < 1e-5,
                "{what}: request {i}: logprob {} vs {}",
                a.logprob,
                b.logprob
            );
            assert_eq!(a.top.iter().map(|t| t.0).collect::<Vec<_>>(), b.top.iter().map(|t| t.0).collect::<Vec<_>>());
        }
    }
}

#[test]
fn greedy_speculation_gives_the_tokens_of_plain_greedy() {
    let Some(f) = factory() else { return };
    let requests = workload();
    let want = alone(&engine(&f, 256, EngineConfig::default(), Draft::None), &requests);
    for draft in [Draft::Same, Draft::Random, Draft::Lookup] {
        let e = engine(&f, 256, EngineConfig::default(), draft);
        assert_same(&alone(&e, &requests), &want, &format!("{draft:?} alone"));
        let solo = e.metrics();
        let e = engine(&f, 256, EngineConfig::default(), draft);
        assert_same(&together(&e, &requests), &want, &format!("{draft:?}, 16 at once"));
        let m = e.metrics();
        eprintln!(
            "{draft:?}: alone {} drafted, {:.0}% accepted; together {} drafted, {:.0}% accepted, {:.2} tokens per verifying step",
            solo.spec_drafted_tokens,
            100.0 * solo.spec_acceptance_rate(),
            m.spec_drafted_tokens,
            100.0 * m.spec_acceptance_rate(),
            m.spec_mean_accepted_len()
        );
        assert!(m.spec_drafted_tokens > 0 && solo.spec_drafted_tokens > 0, "{draft:?} never drafted");
        assert!(m.steps * 2 < solo.steps, "{draft:?}: the 16 requests did not share steps");
        assert_eq!(m.generation_tokens, want.iter().map(|r| r.token_ids.len() as u64).sum::<u64>());
        if let Draft::Same = draft {
            // The same weights draft the same argmax: every draft is kept.
            assert!(m.spec_acceptance_rate() > 0.99 && solo.spec_acceptance_rate() > 0.99, "{m:?}");
            assert!(m.spec_mean_accepted_len() > 2.5, "{}", m.spec_mean_accepted_len());
        }
        assert_eq!(e.kv_usage().used_blocks, 0);
    }
}

#[test]
fn seeded_sampling_with_prompt_lookup_gives_the_same_tokens() {
    let Some(f) = factory() else { return };
    let requests: Vec<InferenceRequest> = workload()
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            r.params.sampling.temperature = 0.8;
            r.params.sampling.top_p = 0.9;
            r.params.sampling.seed = Some(i as u64);
            r.params.sampling.top_logprobs = 1;
            r.params.max_tokens = Some(24);
            r
        })
        .collect();
    let want = together(&engine(&f, 256, EngineConfig::default(), Draft::None), &requests);
    let e = engine(&f, 256, EngineConfig::default(), Draft::Lookup);
    assert_same(&together(&e, &requests), &want, "prompt lookup, sampled");
    assert!(e.metrics().spec_drafted_tokens > 0);
    // A draft model with sampled requests draws differently but must still finish cleanly.
    let e = engine(&f, 256, EngineConfig::default(), Draft::Random);
    for (g, w) in together(&e, &requests).iter().zip(&want) {
        assert_eq!(g.token_ids.len(), w.token_ids.len());
    }
    assert!(e.metrics().spec_drafted_tokens > 0);
}

#[test]
fn stops_end_a_request_inside_an_accepted_run() {
    let Some(f) = factory() else { return };
    let plain = engine(&f, 256, EngineConfig::default(), Draft::None);
    let spec = engine(&f, 256, EngineConfig::default(), Draft::Same);
    let base = weft::rt::block_on(plain.infer(greedy("stop test prompt", 24))).unwrap();
    let chars: Vec<char> = base.text.chars().collect();
    assert!(chars.len() >= 10, "{:?}", base.text);
    let mut requests = Vec::new();
    for at in [3, 6, 9] {
        let mut r = greedy("stop test prompt", 24);
        r.params.stop_token_ids = vec![base.token_ids[at]];
        requests.push(r);
        let mut r = greedy("stop test prompt", 24);
        r.params.stop = vec![chars[at..at + 2].iter().collect()];
        requests.push(r);
    }
    requests.push(greedy("stop test prompt", 7));
    let want = alone(&plain, &requests);
    assert!(want.iter().take(6).all(|r| r.finish_reason == FinishReason::Stop));
    assert_same(&alone(&spec, &requests), &want, "stops");
    assert!(spec.metrics().spec_mean_accepted_len() > 2.0, "runs long enough to hold a stop");
    assert_eq!(spec.kv_usage().used_blocks, 0);
}

#[test]
fn every_block_comes_back_after_preemption_and_cancellation() {
    let Some(f) = factory() else { return };
    let requests: Vec<InferenceRequest> = workload()
        .into_iter()
        .map(|mut r| {
            r.params.max_tokens = Some(20);
            r
        })
        .collect();
    let want = alone(&engine(&f, 256, EngineConfig::default(), Draft::None), &requests);
    for draft in [Draft::Random, Draft::Lookup] {
        // 20 blocks of 4 tokens: a few sequences at a time, so drafts are given up and
        // sequences preempted.
        let config = EngineConfig { enable_prefix_cache: false, ..Default::default() };
        let e = engine(&f, 20, config, draft);
        assert_same(&together(&e, &requests), &want, &format!("{draft:?} under preemption"));
        let m = e.metrics();
        assert!(m.preemptions > 0 && m.spec_drafted_tokens > 0, "{draft:?}: {m:?}");
        assert_eq!(m.kv.used_blocks, 0, "{draft:?}");

        // Cancel half the requests while the loop runs steps (drafting or verifying).
        let e = engine(&f, 256, EngineConfig::default(), draft);
        e.start_loop().unwrap();
        let e2 = e.clone();
        let requests = requests.clone();
        let cancelled = weft::rt::block_on(async move {
            let mut streams = Vec::new();
            for r in &requests {
                let (id, rx) = e2.submit(r.clone()).unwrap();
                streams.push((id, rx));
            }
            let mut cancelled = 0;
            for (i, (id, rx)) in streams.iter_mut().enumerate() {
                let first = rx.next().await;
                assert!(first.is_some());
                if i % 2 == 1 && e2.cancel(*id) {
                    cancelled += 1;
                }
            }
            for (_, rx) in &mut streams {
                while rx.next().await.is_some() {}
            }
            cancelled
        });
        assert!(cancelled > 0);
        let usage = e.kv_usage();
        assert_eq!(usage.used_blocks, 0, "{draft:?}: {usage:?}");
        assert_eq!(e.metrics().requests_finished.get("cancelled").copied().unwrap_or(0), cancelled);
        e.shutdown();
    }
}

/// The logits of the target (or draft) `exec` after each token sequence in `prompts`.
fn logits(exec: &GpuExecutor, prompts: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let seqs = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let blocks = p.len().div_ceil(4);
            let block_table = (i * 8..i * 8 + blocks).map(|b| b as u32).collect();
            SeqStep { id: i as u64, tokens: p.clone(), block_table, num_logits: 1, ..Default::default() }
        })
        .collect();
    weft::rt::block_on(exec.logits(&StepBatch { seqs, ..Default::default() })).unwrap()
}

/// Pearson's chi-square of `counts` against `expected` probabilities, with its degrees of
/// freedom. Cells expecting fewer than 5 observations are pooled into one (the statistic's
/// chi-square law needs that); the statistic is infinite when that pool expects none yet got some.
fn chi_square(counts: &HashMap<(u32, u32), u64>, expected: &HashMap<(u32, u32), f64>) -> (f64, usize) {
    let n = counts.values().sum::<u64>() as f64;
    let mut keys: Vec<_> = counts.keys().chain(expected.keys()).copied().collect();
    keys.sort();
    keys.dedup();
    let (mut stat, mut cells, mut pool_expected, mut pool_count) = (0.0, 0, 0.0, 0.0);
    for k in keys {
        let (e, c) = (n * expected.get(&k).copied().unwrap_or(0.0), counts.get(&k).copied().unwrap_or(0) as f64);
        if e >= 5.0 {
            stat += (c - e).powi(2) / e;
            cells += 1;
        } else {
            pool_expected += e;
            pool_count += c;
        }
    }
    if pool_count > 0.0 && pool_expected == 0.0 {
        return (f64::INFINITY, cells.max(1));
    }
    if pool_expected > 0.0 {
        stat += (pool_count - pool_expected).powi(2) / pool_expected;
        cells += 1;
    }
    (stat, cells.max(2) - 1)
}

/// The chi-square value exceeded with probability 1e-6 under the null (Wilson–Hilferty).
fn critical_value(df: usize) -> f64 {
    let k = df as f64;
    k * (1.0 - 2.0 / (9.0 * k) + 4.753 * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// Sampled requests with a draft model: the second generated token is a verifying row (one
/// drafted token fits before max_tokens 3), so the pair (first, second) must follow the
/// target's p(first) p(second | first). 1000 seeded requests, temperature 1.5 with top-k 4 (16
/// cells); the chi-square test rejects at 1e-6. The same counts against the distribution a
/// broken rule that keeps every draft would give, p(first) q(second | first), must be rejected:
/// the test can tell the two apart.
#[test]
fn a_speculated_token_follows_the_targets_distribution() {
    speculated_pairs_follow_the_target(LogitBias::default());
}

/// The same with a `logit_bias` on every token: the pairs follow the target's biased
/// distribution, and not the one a verifying row that forgot the bias would give (the first
/// token biased, the second from the unbiased p).
#[test]
fn a_speculated_token_follows_the_targets_biased_distribution() {
    speculated_pairs_follow_the_target(LogitBias::new((0..260).map(|t| (t, (t % 5) as f32 - 2.0))));
}

fn speculated_pairs_follow_the_target(bias: LogitBias) {
    let Some(f) = factory() else { return };
    let n = 1000;
    let prompt: Vec<u32> = b"a sampler".iter().map(|&b| u32::from(b)).collect();
    let sampling = SamplingParams { temperature: 1.5, top_k: 4, logit_bias: bias.clone(), ..Default::default() };
    let config = EngineConfig { max_num_seqs: 64, max_num_batched_tokens: 2048, ..Default::default() };
    let e = engine(&f, 512, config, Draft::Near);
    let requests: Vec<InferenceRequest> = (0..n)
        .map(|i| {
            let sampling = SamplingParams { seed: Some(1000 + i), ..sampling.clone() };
            let params = GenerationParams { sampling, max_tokens: Some(3), ignore_eos: true, ..Default::default() };
            InferenceRequest::new(Prompt::Tokens(prompt.clone()), params)
        })
        .collect();
    let mut counts: HashMap<(u32, u32), u64> = HashMap::new();
    for r in together(&e, &requests) {
        *counts.entry((r.token_ids[0], r.token_ids[1])).or_default() += 1;
    }
    let m = e.metrics();
    assert_eq!(m.spec_verify_steps, n, "every request verified its second token");
    assert!(m.spec_accepted_tokens > 0 && m.spec_accepted_tokens < n, "{m:?}: both outcomes must occur");

    // The exact distributions, from the target's and the draft's logits (biased on the CPU).
    let unbiased = |l: &[f32]| weft::cpu::filtered_probs(l, 1.5, 4, 1.0, 0.0);
    let filtered = |l: &[f32]| {
        let mut l = l.to_vec();
        for &(t, b) in bias.pairs() {
            l[t as usize] += b;
        }
        unbiased(&l)
    };
    let (target, draft) = (executor(&f, TARGET, 64), executor(&f, NEAR, 64));
    let first = filtered(&logits(&target, std::slice::from_ref(&prompt))[0]);
    let firsts: Vec<u32> = (0..first.len() as u32).filter(|&t| first[t as usize] > 0.0).collect();
    let continued: Vec<Vec<u32>> = firsts.iter().map(|&t| [prompt.clone(), vec![t]].concat()).collect();
    let (p_next, q_next) = (logits(&target, &continued), logits(&draft, &continued));
    let (mut p, mut broken, mut forgot_bias) = (HashMap::new(), HashMap::new(), HashMap::new());
    for (i, &t1) in firsts.iter().enumerate() {
        let (pn, qn, un) = (filtered(&p_next[i]), filtered(&q_next[i]), unbiased(&p_next[i]));
        for t2 in 0..pn.len() {
            p.insert((t1, t2 as u32), first[t1 as usize] * pn[t2]);
            broken.insert((t1, t2 as u32), first[t1 as usize] * qn[t2]);
            forgot_bias.insert((t1, t2 as u32), first[t1 as usize] * un[t2]);
        }
    }
    let (stat, df) = chi_square(&counts, &p);
    eprintln!(
        "{} of {n} drafts accepted; chi-square {stat:.1} (df {df}, 1e-6 critical value {:.1}); counts {counts:?}",
        m.spec_accepted_tokens,
        critical_value(df)
    );
    assert!(stat < critical_value(df), "the speculated token does not follow the target: {stat:.1} (df {df})");
    let (broken_stat, broken_df) = chi_square(&counts, &broken);
    assert!(
        broken_stat > critical_value(broken_df),
        "the test cannot tell the target from a rule that keeps every draft ({broken_stat:.1})"
    );
    if !bias.is_empty() {
        let (forgot_stat, forgot_df) = chi_square(&counts, &forgot_bias);
        assert!(
            forgot_stat > critical_value(forgot_df),
            "the test cannot tell the biased target from the unbiased one ({forgot_stat:.1})"
        );
    }
    assert_eq!(e.kv_usage().used_blocks, 0);
}

/// Greedy requests with logit biases give the tokens of the engine that does not speculate,
/// with the target as its own draft, another tiny draft and prompt lookup: every verifying
/// row is biased. The biases change the tokens (-10 on those each request picks unbiased).
#[test]
fn logit_biases_hold_under_speculation() {
    let Some(f) = factory() else { return };
    let plain = workload();
    let unbiased = together(&engine(&f, 256, EngineConfig::default(), Draft::None), &plain);
    let requests: Vec<InferenceRequest> = plain
        .iter()
        .zip(&unbiased)
        .map(|(r, u)| {
            let mut pairs: std::collections::BTreeMap<u32, f32> =
                (0..260).step_by(3).map(|t| (t, (t % 11) as f32 - 5.0)).collect();
            pairs.extend(u.token_ids.iter().map(|&t| (t, -10.0)));
            let mut r = r.clone();
            r.params.sampling.logit_bias = LogitBias::new(pairs);
            r
        })
        .collect();
    let want = together(&engine(&f, 256, EngineConfig::default(), Draft::None), &requests);
    let changed = want.iter().zip(&unbiased).filter(|(w, u)| w.token_ids != u.token_ids).count();
    assert_eq!(changed, requests.len(), "the biases change every request's tokens");
    for draft in [Draft::Same, Draft::Random, Draft::Lookup] {
        let e = engine(&f, 256, EngineConfig::default(), draft);
        assert_same(&together(&e, &requests), &want, &format!("{draft:?}, biased"));
        let m = e.metrics();
        assert!(m.spec_drafted_tokens > 0, "{draft:?} never drafted");
        if let Draft::Same = draft {
            // The draft is biased like the target, so it drafts what the target picks.
            assert!(m.spec_acceptance_rate() > 0.99, "{m:?}");
        }
    }
}

#[test]
fn the_constructor_refuses_what_cannot_work() {
    let Some(f) = factory() else { return };
    let tok = files(TARGET).tokenizer.clone();
    let target = shared(executor(&f, TARGET, 32));
    let build = |draft: Option<Arc<dyn ModelExecutor>>, spec: Option<SpeculationConfig>| {
        ContinuousBatchEngine::new_with_speculation(
            EngineConfig::default(),
            tok.clone(),
            Arc::new(GpuSampler),
            KvCacheManager::new(32, 4, true),
            target.clone(),
            Arc::new(f.clone()),
            draft,
            spec,
        )
    };
    let refusal = |draft, spec, what: &str| {
        let err = build(draft, spec).err().expect("must be refused").to_string();
        assert!(err.contains(what), "{err}");
    };
    let draft_model = || Some(SpeculationConfig::default());
    refusal(Some(target.clone()), None, "both a draft executor and a speculation config, or neither");
    refusal(None, draft_model(), "both a draft executor and a speculation config, or neither");
    refusal(
        Some(target.clone()),
        Some(SpeculationConfig::prompt_lookup()),
        "prompt lookup drafts from the sequence itself",
    );
    refusal(
        None,
        Some(SpeculationConfig { num_speculative_tokens: 0, ..SpeculationConfig::prompt_lookup() }),
        "num_speculative_tokens",
    );
    let other_pool = shared(executor(&f, TARGET, 16));
    refusal(
        Some(other_pool),
        draft_model(),
        "the draft executor's KV pool has 16 blocks of 4 tokens but the target's has 32",
    );
    refusal(
        Some(shared(OtherVocab(target.clone()))),
        draft_model(),
        "vocabulary has 300 tokens but the target's has 260",
    );
    // Prompt lookup alone, and a draft model, both build and generate.
    let lookup = build(None, Some(SpeculationConfig::prompt_lookup())).unwrap();
    let plain = engine(&f, 32, EngineConfig::default(), Draft::None);
    let want = weft::rt::block_on(plain.infer(greedy("seed api", 6))).unwrap().token_ids;
    assert_eq!(weft::rt::block_on(lookup.infer(greedy("seed api", 6))).unwrap().token_ids, want);
    let drafted = build(Some(shared(executor(&f, Weights { seed: 5, noise: 0.0 }, 32))), draft_model()).unwrap();
    assert_eq!(weft::rt::block_on(drafted.infer(greedy("seed api", 6))).unwrap().token_ids, want);
    assert!(drafted.speculation().is_some() && plain.speculation().is_none());
}

fn shared(e: impl ModelExecutor + 'static) -> Arc<dyn ModelExecutor> {
    Arc::new(e)
}

/// An executor that claims another vocabulary size.
struct OtherVocab(Arc<dyn ModelExecutor>);

impl ModelExecutor for OtherVocab {
    fn execute<'a>(&'a self, batch: &'a StepBatch) -> weft::rt::BoxFuture<'a, weft::Result<weft::step::StepOutput>> {
        self.0.execute(batch)
    }
    fn vocab_size(&self) -> usize {
        300
    }
    fn max_context(&self) -> usize {
        self.0.max_context()
    }
    fn kv_config(&self) -> KvCacheConfig {
        self.0.kv_config()
    }
    fn health_check(&self) -> weft::rt::BoxFuture<'_, weft::Result<()>> {
        self.0.health_check()
    }
}

/// The one real-model check (the default model is slow on lavapipe): SmolLM2 drafting for
/// itself through `EngineBuilder::draft_model` keeps every greedy draft and changes no token.
#[test]
fn the_default_model_as_its_own_draft_changes_no_token() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        assert!(std::env::var("WEFT_REQUIRE_MODEL").as_deref() != Ok("1"), "the default model is missing");
        return;
    }
    let Some(f) = factory() else { return };
    // The KV cache in the device's default dtype (f16 on lavapipe): 8 MiB hold 352 tokens of
    // it (176 of f32), so the context is held to 128.
    let config = EngineConfig { max_model_len: 128, ..Default::default() };
    let build = |b: weft::EngineBuilder| {
        b.config(config.clone()).kv_memory_bytes(8 << 20).build_on(f.context().clone()).unwrap()
    };
    // Four tokens: the first from the prefill, the other three from one verifying step.
    let request = greedy("The capital of France is", 4);
    let plain = build(weft::EngineBuilder::from_model(&path).unwrap());
    let want = weft::rt::block_on(plain.infer(request.clone())).unwrap();
    drop(plain);
    let spec = build(weft::EngineBuilder::from_model(&path).unwrap().draft_model(&path).unwrap());
    let got = weft::rt::block_on(spec.infer(request)).unwrap();
    assert_eq!(got.token_ids, want.token_ids, "{:?} vs {:?}", got.text, want.text);
    let m = spec.metrics();
    assert!(m.spec_drafted_tokens == 2 && m.spec_accepted_tokens == 2, "{m:?}");
}

/// A constraint that starts after a thinking model's end-of-reasoning token
/// (`GenerationParams::constraint_after`) under speculation, on the tiny Qwen3 drafting for
/// itself (greedy, so every draft is accepted until the grammar refuses one): drafted rows up
/// to the token stay free, those after it get the grammar's masks, and the tokens are those of
/// the engine that does not speculate. The stand-in for `</think>` is a token the free answer
/// writes (the random model never writes the real one).
#[test]
fn a_constraint_after_a_marker_under_speculation() {
    use weft::constraint::{Constraint, Grammar};
    let Some(f) = factory() else { return };
    let qwen3 = || ModelFiles::from_gguf_bytes("tiny-qwen3.gguf", tiny::qwen3_gguf(6, DType::Q8_0)).unwrap();
    let build = |speculate: bool| {
        let files = qwen3();
        let target = Arc::new(files.executor(&f, KvCacheConfig::new(4, 64)).unwrap());
        let kv = KvCacheManager::new(64, 4, false);
        let (tok, sampler, tf) = (files.tokenizer.clone(), Arc::new(GpuSampler), Arc::new(f.clone()));
        if !speculate {
            return ContinuousBatchEngine::new(EngineConfig::default(), tok, sampler, kv, target, tf).unwrap();
        }
        let draft = shared(qwen3().executor(&f, KvCacheConfig::new(4, 64)).unwrap());
        let spec =
            SpeculationConfig { drafter: Drafter::DraftModel, max_batch_size: 64, ..SpeculationConfig::default() };
        ContinuousBatchEngine::new_with_speculation(
            EngineConfig::default(),
            tok,
            sampler,
            kv,
            target,
            tf,
            Some(draft),
            Some(spec),
        )
        .unwrap()
    };
    let plain = build(false);
    let free = alone(&plain, &[greedy("hello", 12)]).remove(0);
    let first = (3..12).find(|&i| !free.token_ids[..i].contains(&free.token_ids[i])).expect("a new token");
    let end = free.token_ids[first];
    let mut r = greedy("hello", 40);
    r.params.constraint = Some(Constraint::new("response_format", Grammar::Regex("( one two){1,2} done".into())));
    r.params.constraint_after = Some(end);
    let want = alone(&plain, std::slice::from_ref(&r)).remove(0);
    assert_eq!(want.token_ids[..=first], free.token_ids[..=first], "free up to the marker");
    let tok = qwen3().tokenizer.clone();
    let answer = weft::tokenizer::Tokenizer::decode(tok.as_ref(), &want.token_ids[first + 1..], true).unwrap();
    let ok = [" one two done", " one two one two done"];
    assert!(ok.contains(&answer.as_str()), "{answer:?} must match ( one two){{1,2}} done");
    assert_eq!(want.finish_reason, FinishReason::Stop);
    let e = build(true);
    let got = alone(&e, std::slice::from_ref(&r));
    assert_same(&got, std::slice::from_ref(&want), "drafting for itself");
    let m = e.metrics();
    assert!(m.spec_drafted_tokens > 0 && m.spec_accepted_tokens > 0, "{m:?}");
}
