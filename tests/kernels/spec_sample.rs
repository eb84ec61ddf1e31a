//! The rejection-sampling kernel of speculative decoding against `cpu::filtered_probs` and
//! `cpu::spec_verify`, and a statistical check that its output is distributed as the target's
//! p whatever the draft's q (and that the check catches a broken rule).
//!
//! Like the sampler's test, thresholds are found by bisection and sums are f32 on the GPU, so
//! a draw within 1e-4 of a boundary may land on the neighbour: counted, not failed.

use weft::gpu::Recording;
use weft::gpu::kernels::sample::OUT_PER_ROW;
use weft::gpu::kernels::spec_sample::{SPEC_PER_ROW, spec_sample};
use weft::model::sampler::spec_row;
use weft::sampling::{DraftRow, SamplerRng, SamplingParams};
use weft::tensor::TensorFactory;

use crate::common::*;

fn params(temperature: f32, top_k: u32, top_p: f32, min_p: f32) -> SamplingParams {
    SamplingParams { temperature, top_k, top_p, min_p, ..Default::default() }
}

fn cases() -> Vec<SamplingParams> {
    vec![
        params(1.0, 0, 1.0, 0.0),
        params(0.7, 40, 1.0, 0.0),
        params(1.0, 0, 0.9, 0.0),
        params(0.8, 50, 0.95, 0.0),
        params(1.3, 0, 1.0, 0.05),
        params(2.0, 5, 0.5, 0.1),
        params(0.0, 0, 1.0, 0.0),
    ]
}

fn cpu_probs(logits: &[f32], p: &SamplingParams) -> Vec<f64> {
    weft::cpu::filtered_probs(logits, p.temperature, p.top_k as usize, p.top_p, p.min_p)
}

/// Draw from `q` with `u` by inverse CDF.
fn draw(q: &[f64], u: f32) -> u32 {
    let mut running = 0.0;
    for (i, &w) in q.iter().enumerate() {
        running += w;
        if running > f64::from(u) {
            return i as u32;
        }
    }
    q.iter().rposition(|&w| w > 0.0).unwrap_or(0) as u32
}

/// Run the kernel over `logits` (rows, vocab) with `spec` rows, the draft distributions
/// `probs` (slots, vocab) and sampler output rows filled with `sentinel`. Returns (probs, out).
fn run_spec(vocab: usize, logits: &[f32], spec: &[u32], probs: &[f32], sentinel: u32) -> (Vec<f32>, Vec<u32>) {
    let f = gpu().unwrap();
    let rows = logits.len() / vocab;
    let lt = f.upload_f32(&[rows, vocab], logits).unwrap();
    let st = f.upload_u32(&[spec.len() / SPEC_PER_ROW, SPEC_PER_ROW], spec).unwrap();
    let pt = f.upload_f32(&[probs.len() / vocab, vocab], probs).unwrap();
    let out = f.upload_u32(&[rows, OUT_PER_ROW], &vec![sentinel; rows * OUT_PER_ROW]).unwrap();
    let mut rec = Recording::new();
    spec_sample(ctx(f), &mut rec, &lt, &st, &pt, &out).unwrap();
    run(f, &rec);
    (read_f32(f, &pt), read_u32(f, &out))
}

#[test]
fn keep_rows_hold_the_samplers_distribution() {
    if gpu().is_none() {
        return;
    }
    let vocab = 1000;
    let cases = cases();
    let logits: Vec<f32> = (0..cases.len()).flat_map(|c| random(vocab, 40 + c as u64, 6.0)).collect();
    // Row c keeps its distribution in slot c.
    let spec: Vec<u32> = cases
        .iter()
        .enumerate()
        .flat_map(|(c, p)| spec_row(c as u32, p, 0.0, DraftRow::Keep { slot: c as u32 }))
        .collect();
    let (probs, out) = run_spec(vocab, &logits, &spec, &vec![-1.0; cases.len() * vocab], 7);
    assert!(out.iter().all(|&w| w == 7), "keep rows leave the sampler's output alone");
    for (c, p) in cases.iter().enumerate() {
        let want = cpu_probs(&logits[c * vocab..(c + 1) * vocab], p);
        for (i, &w) in want.iter().enumerate() {
            let got = f64::from(probs[c * vocab + i]);
            assert!((got - w).abs() <= 1e-6 + 1e-4 * w, "{p:?} token {i}: gpu {got} cpu {w}");
        }
    }
}

#[test]
fn verify_rows_follow_the_cpu_rule() {
    if gpu().is_none() {
        return;
    }
    let vocab = 1000;
    let mut rng = SamplerRng::new(11);
    let (mut logits, mut spec, mut probs, mut want) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (c, p) in cases().iter().enumerate() {
        for repeat in 0..8 {
            let row = logits.len() / vocab;
            let l = random(vocab, 100 + (c * 8 + repeat) as u64, 6.0);
            // The draft's q: a different temperature and filter over nearby logits.
            let near: Vec<f32> = l.iter().zip(random(vocab, 900 + row as u64, 1.5)).map(|(a, b)| a + b).collect();
            let q = cpu_probs(&near, &params(1.2, if repeat % 2 == 0 { 0 } else { 20 }, 1.0, 0.0));
            let d = draw(&q, rng.next_uniform());
            let (ua, ur) = (rng.next_uniform(), rng.next_uniform());
            // Half the rows report their token's log-probability.
            let p = &SamplingParams { top_logprobs: (repeat / 2) % 2, ..p.clone() };
            spec.extend(spec_row(
                row as u32,
                p,
                ur,
                DraftRow::Verify { slot: row as u32, token: d, accept_uniform: ua },
            ));
            probs.extend(q.iter().map(|&x| x as f32));
            want.push((p.clone(), l.clone(), q, d, ua, ur));
            logits.extend(l);
        }
    }
    // One more logit row that nothing verifies: its output stays as the sampler left it.
    logits.extend(random(vocab, 5, 6.0));
    let (_, out) = run_spec(vocab, &logits, &spec, &probs, 0xdead);
    let mut near_boundary = 0;
    let mut rejected = 0;
    for (row, (p, l, q, d, ua, ur)) in want.iter().enumerate() {
        let pp = cpu_probs(l, p);
        let (token, lo, hi) = weft::cpu::spec_verify(&pp, q, *d, *ua, *ur);
        let got = out[row * OUT_PER_ROW];
        rejected += usize::from(token != *d);
        if got != token {
            let accept_margin = (f64::from(*ua) * q[*d as usize] - pp[*d as usize]).abs();
            let draw_margin = (f64::from(*ur) - lo).abs().min((f64::from(*ur) - hi).abs());
            assert!(accept_margin < 1e-5 || draw_margin < 1e-4, "row {row} {p:?}: gpu {got} cpu {token} (draft {d})");
            near_boundary += 1;
        }
        assert_ne!(pp[got as usize], 0.0, "row {row}: the token is outside the target's kept set");
        let lsm = weft::cpu::log_softmax(l);
        let logprob = f32::from_bits(out[row * OUT_PER_ROW + 1]);
        if p.top_logprobs > 0 {
            assert!((f64::from(logprob) - lsm[got as usize]).abs() < 1e-4, "logprob of row {row}");
        } else {
            assert_eq!(logprob, 0.0, "row {row} reports no log-probability");
        }
        assert_eq!(out[row * OUT_PER_ROW + 2], 0xdead, "top log-probabilities stay the sampler's");
    }
    assert!(
        rejected > 5 && rejected < want.len() - 5,
        "{rejected} of {} rejected: both paths must be exercised",
        want.len()
    );
    assert!(near_boundary <= 2, "{near_boundary} rows landed next to the CPU's token");
    assert!(out[want.len() * OUT_PER_ROW..].iter().all(|&w| w == 0xdead));
}

/// Pearson's chi-square statistic of `counts` against probabilities `p` (tokens with p = 0
/// must never occur), and its degrees of freedom.
fn chi_square(counts: &[u64], p: &[f64]) -> (f64, usize) {
    let n: u64 = counts.iter().sum();
    let mut stat = 0.0;
    let mut cells = 0;
    for (&c, &pi) in counts.iter().zip(p) {
        if pi == 0.0 {
            assert_eq!(c, 0, "a token the target never picks was picked");
            continue;
        }
        let expected = n as f64 * pi;
        stat += (c as f64 - expected).powi(2) / expected;
        cells += 1;
    }
    (stat, cells - 1)
}

/// The chi-square value exceeded with probability 1e-6 under the null hypothesis
/// (Wilson–Hilferty: accurate to a few percent for these degrees of freedom).
fn critical_value(df: usize) -> f64 {
    let z = 4.753; // the standard normal's 1 - 1e-6 quantile
    let k = df as f64;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// Draw `n` rows: drafts from `q_true`, verified against `q_told` (what the kernel is told the
/// draft drew from). Returns the histogram of the output tokens.
fn histogram(logits: &[f32], p: &SamplingParams, q_true: &[f64], q_told: &[f64], n: usize, seed: u64) -> Vec<u64> {
    let vocab = logits.len();
    let mut rng = SamplerRng::new(seed);
    let mut spec = Vec::with_capacity(n * SPEC_PER_ROW);
    for row in 0..n {
        let d = draw(q_true, rng.next_uniform());
        let (ua, ur) = (rng.next_uniform(), rng.next_uniform());
        spec.extend(spec_row(row as u32, p, ur, DraftRow::Verify { slot: 0, token: d, accept_uniform: ua }));
    }
    let all_logits: Vec<f32> = (0..n).flat_map(|_| logits.iter().copied()).collect();
    let told: Vec<f32> = q_told.iter().map(|&x| x as f32).collect();
    let (_, out) = run_spec(vocab, &all_logits, &spec, &told, 0);
    let mut counts = vec![0u64; vocab];
    for row in 0..n {
        counts[out[row * OUT_PER_ROW] as usize] += 1;
    }
    counts
}

/// The rule's promise: whatever the draft's q, the output is distributed as the target's p.
/// 3000 draws per case; the chi-square test rejects at 1e-6 (so a correct kernel fails it
/// about once in a million runs). The same test applied to a broken rule (the kernel told
/// q = p, so it keeps every draft and the output follows q) must reject, which shows that it
/// has the power to see a wrong rule.
#[test]
fn the_rule_gives_the_targets_distribution() {
    if gpu().is_none() {
        return;
    }
    let n = 3000;
    let logits = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 1.2];
    // q favours the tokens p does not, and has mass where top-k removes p's.
    let q_logits = [0.0, -1.0, 1.0, 1.5, 2.0, 2.5, 0.5, -0.5];
    for (case, p) in [params(1.0, 0, 1.0, 0.0), params(0.8, 5, 1.0, 0.0), params(1.0, 0, 0.8, 0.0)].iter().enumerate() {
        let pp = cpu_probs(&logits, p);
        let q = cpu_probs(&q_logits, &params(1.0, 0, 1.0, 0.0));
        let tv: f64 = pp.iter().zip(&q).map(|(a, b)| (a - b).abs()).sum::<f64>() / 2.0;
        assert!(tv > 0.3, "the case needs a draft far from the target (TV {tv})");
        let counts = histogram(&logits, p, &q, &q, n, 1 + case as u64);
        let (stat, df) = chi_square(&counts, &pp);
        assert!(
            stat < critical_value(df),
            "case {case} {p:?}: chi-square {stat:.1} >= {:.1} (df {df}); counts {counts:?} vs p {pp:?}",
            critical_value(df)
        );
        let (broken_stat, _) = chi_square(&histogram(&logits, p, &q, &pp, n, 100 + case as u64), &pp);
        assert!(broken_stat > critical_value(df), "case {case}: the broken rule went unnoticed ({broken_stat:.1})");
    }
}
