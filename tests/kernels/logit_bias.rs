//! `logit_bias` through the GPU sampler (`model::sampler`: a step's rows, their biases merged
//! with their penalty entries, `penalize`, `sample`) against the CPU sampler on logits biased on
//! the CPU: +100 forces a token greedy or sampled, -100 bans the greedy token, a moderate bias
//! moves seeded draws exactly as the biased softmax says, and rows without a bias, beside biased
//! ones, sample from their own logits untouched.
//!
//! As in `sample.rs`, a draw within 1e-4 of a token boundary may land on the neighbour: counted,
//! not failed.

use weft::gpu::Recording;
use weft::model::sampler::{self, SamplerBuffers, SamplerInputs};
use weft::sampling::{GpuSampler, LogitBias, Sampled, Sampler, SamplerRng, SamplingParams};
use weft::step::{SeqStep, StepBatch};
use weft::tensor::TensorFactory;

use crate::common::*;

const VOCAB: usize = 1000;

/// One sampled row: its logits and the parameters (with the bias) and history of its request.
struct Row {
    logits: Vec<f32>,
    params: SamplingParams,
    seed: u64,
    prompt: Vec<u32>,
}

fn row(seed: u64, params: SamplingParams) -> Row {
    Row { logits: random(VOCAB, seed + 1000, 6.0), params, seed, prompt: Vec::new() }
}

fn biased(params: SamplingParams, pairs: &[(u32, f32)]) -> SamplingParams {
    SamplingParams { logit_bias: LogitBias::new(pairs.iter().copied()), ..params }
}

fn sampled(temperature: f32, top_k: u32, top_p: f32) -> SamplingParams {
    SamplingParams { temperature, top_k, top_p, ..Default::default() }
}

/// Sample `rows` as one step on the GPU: each row is its own sequence with one logit row, its
/// draw the first of its seed's stream. Returns the samples and the logits the sampler saw.
fn sample_step(rows: &[Row]) -> (Vec<Sampled>, Vec<f32>) {
    let f = gpu().unwrap();
    let seqs = rows
        .iter()
        .enumerate()
        .map(|(i, r)| SeqStep {
            id: i as u64,
            tokens: vec![0],
            block_table: vec![0],
            num_logits: 1,
            sampling: Some(GpuSampler.prepare(&r.params, r.seed, &r.prompt, &[], &[])),
            ..Default::default()
        })
        .collect();
    let batch = StepBatch { seqs, num_batched_tokens: rows.len(), ..Default::default() };
    let inputs = SamplerInputs::of(&batch);
    let bufs = SamplerBuffers::new(f, rows.len(), inputs.num_entries(), VOCAB).unwrap();
    let logits: Vec<f32> = rows.iter().flat_map(|r| r.logits.iter().copied()).collect();
    let lt = f.upload_f32(&[rows.len(), VOCAB], &logits).unwrap();
    sampler::write(f, &inputs, &bufs, rows.len()).unwrap();
    let mut rec = Recording::new();
    sampler::record(ctx(f), &mut rec, &lt, &inputs, &bufs, None).unwrap();
    run(f, &rec);
    let out = sampler::read(&batch, &read_u32(f, &bufs.out(rows.len()).unwrap()));
    (out.samples.into_iter().flatten().collect(), read_f32(f, &lt))
}

/// The row's logits biased on the CPU.
fn cpu_biased(r: &Row) -> Vec<f32> {
    let mut l = r.logits.clone();
    for &(token, bias) in r.params.logit_bias.pairs() {
        l[token as usize] += bias;
    }
    l
}

/// Whether `token` is the CPU sampler's pick from `logits` under `p` with draw `u`; panics unless
/// it is or `u` lies within 1e-4 of the CPU's token boundaries (then false).
fn cpu_agrees(token: u32, logits: &[f32], p: &SamplingParams, u: f32, what: &str) -> bool {
    let (want, lo, hi) = weft::cpu::sample(logits, p.temperature, p.top_k as usize, p.top_p, p.min_p, u);
    if token != want {
        let margin = (f64::from(u) - lo).abs().min((f64::from(u) - hi).abs());
        assert!(margin < 1e-4, "{what} {p:?} u={u}: gpu {token} cpu {want}");
    }
    token == want
}

fn argmax(l: &[f32]) -> u32 {
    weft::cpu::argmax(l, l.len())[0]
}

/// The most unlikely token of a row.
fn argmin(l: &[f32]) -> u32 {
    (0..l.len()).min_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32
}

#[test]
fn plus_100_forces_and_minus_100_bans() {
    if gpu().is_none() {
        return;
    }
    let mut rows = Vec::new();
    // Force the least likely token, greedy and sampled under filters that would drop it.
    for (i, params) in
        [SamplingParams::greedy(), sampled(1.0, 0, 1.0), sampled(0.7, 40, 0.9), sampled(2.0, 5, 0.5)].iter().enumerate()
    {
        for draw in 0..4 {
            let mut r = row((i * 10 + draw) as u64, params.clone());
            r.params = biased(r.params, &[(argmin(&r.logits), 100.0)]);
            rows.push(r);
        }
    }
    // Ban the greedy token (and, in a second row, the two best).
    let mut r = row(77, SamplingParams::greedy());
    r.params = biased(r.params, &[(argmax(&r.logits), -100.0)]);
    rows.push(r);
    let mut r = row(78, SamplingParams::greedy());
    let mut order: Vec<u32> = (0..VOCAB as u32).collect();
    order.sort_by(|&a, &b| r.logits[b as usize].total_cmp(&r.logits[a as usize]));
    r.params = biased(r.params, &[(order[1], -100.0), (order[0], -100.0)]);
    rows.push(r);
    let (got, _) = sample_step(&rows);
    for (i, r) in rows.iter().take(16).enumerate() {
        assert_eq!(got[i].token, argmin(&r.logits), "row {i} {:?} is forced", r.params);
    }
    let banned = &rows[16];
    assert_ne!(got[16].token, argmax(&banned.logits));
    assert_eq!(got[16].token, argmax(&cpu_biased(banned)), "the second best");
    assert_eq!(got[17].token, order[2], "the third best");
}

#[test]
fn moderate_biases_move_seeded_draws_as_the_biased_softmax_does() {
    if gpu().is_none() {
        return;
    }
    // Each case's rows draw 8 times; half of a row's biases favour tokens near its top, half
    // push its best ones down, so the draws land elsewhere than unbiased ones would.
    let cases = [sampled(1.0, 0, 1.0), sampled(0.8, 40, 0.95), sampled(1.3, 0, 0.9), SamplingParams::greedy()];
    let mut rows = Vec::new();
    let mut plain = Vec::new();
    for (c, params) in cases.iter().enumerate() {
        for draw in 0..8u64 {
            let mut r = row(c as u64 * 100 + draw, SamplingParams { seed: Some(draw), ..params.clone() });
            let mut order: Vec<u32> = (0..VOCAB as u32).collect();
            order.sort_by(|&a, &b| r.logits[b as usize].total_cmp(&r.logits[a as usize]));
            let mut pairs: Vec<(u32, f32)> = order[..5].iter().map(|&t| (t, -3.0)).collect();
            pairs.extend(order[5..40].iter().step_by(3).map(|&t| (t, 2.0 + (t % 5) as f32 * 0.25)));
            r.params = biased(r.params, &pairs);
            plain.push(row(c as u64 * 100 + draw, params.clone()));
            rows.push(r);
        }
    }
    let (got, seen) = sample_step(&rows);
    let mut near_boundary = 0;
    let mut moved = 0;
    for (i, r) in rows.iter().enumerate() {
        let want_logits = cpu_biased(r);
        assert_eq!(seen[i * VOCAB..(i + 1) * VOCAB], want_logits[..], "row {i}: the biased logits");
        let u = SamplerRng::nth_uniform(r.seed, 0);
        near_boundary += usize::from(!cpu_agrees(got[i].token, &want_logits, &r.params, u, &format!("row {i}")));
        let q = &plain[i].params;
        let (unbiased, _, _) = weft::cpu::sample(&r.logits, q.temperature, q.top_k as usize, q.top_p, q.min_p, u);
        moved += usize::from(unbiased != got[i].token);
    }
    assert!(near_boundary <= 1, "{near_boundary} draws landed next to the CPU's token");
    assert!(moved >= rows.len() / 2, "only {moved} of {} draws moved: the bias did little", rows.len());
}

#[test]
fn rows_without_a_bias_are_untouched_beside_biased_ones() {
    if gpu().is_none() {
        return;
    }
    // Plain rows (the first of them) between biased ones, sampled or greedy, some with a
    // repetition penalty: the plain ones see exactly their own logits (penalised by a power of
    // two, exact on the CPU).
    let mut rows = Vec::new();
    for i in 0..8u64 {
        let params = if i % 4 < 2 { sampled(0.9, 0, 1.0) } else { SamplingParams::greedy() };
        let mut r = row(i / 2, SamplingParams { seed: Some(i), ..params });
        if i % 2 == 1 {
            let pairs: Vec<(u32, f32)> = (0..VOCAB as u32).step_by(7).map(|t| (t, 100.0 - (t % 200) as f32)).collect();
            r.params = biased(r.params, &pairs[..pairs.len().min(weft::sampling::MAX_LOGIT_BIAS)]);
        } else if i % 4 == 2 {
            r.params.repetition_penalty = 2.0;
            r.prompt = (0..50).collect();
        }
        rows.push(r);
    }
    let (got, seen) = sample_step(&rows);
    let mut near_boundary = 0;
    for (i, r) in rows.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        let mut want = r.logits.clone();
        for &t in &r.prompt {
            let l = &mut want[t as usize];
            *l = if *l > 0.0 { *l / 2.0 } else { *l * 2.0 };
        }
        assert_eq!(seen[i * VOCAB..(i + 1) * VOCAB], want[..], "row {i}: other rows' biases reached it");
        let u = SamplerRng::nth_uniform(r.seed, 0);
        near_boundary += usize::from(!cpu_agrees(got[i].token, &want, &r.params, u, &format!("row {i}")));
    }
    assert!(near_boundary <= 1, "{near_boundary} draws landed next to the CPU's token");
}

#[test]
fn a_token_both_biased_and_penalised_is_biased_first() {
    if gpu().is_none() {
        return;
    }
    // Repetition divides a positive logit: (l + b) / r, not l / r + b. Tokens 0..20 are in the
    // prompt; 10..30 are biased.
    let mut r = row(5, SamplingParams { repetition_penalty: 2.0, ..SamplingParams::greedy() });
    r.prompt = (0..20).collect();
    r.logits[..40].iter_mut().enumerate().for_each(|(t, l)| *l = t as f32 / 4.0 - 3.0);
    let pairs: Vec<(u32, f32)> = (10..30).map(|t| (t, 1.5)).collect();
    r.params = biased(r.params, &pairs);
    let (_, seen) = sample_step(&[r]);
    for (t, &got) in seen[..40].iter().enumerate() {
        let mut l = t as f32 / 4.0 - 3.0;
        if (10..30).contains(&t) {
            l += 1.5;
        }
        if t < 20 {
            l = if l > 0.0 { l / 2.0 } else { l * 2.0 };
        }
        assert_eq!(got, l, "token {t}");
    }
}
