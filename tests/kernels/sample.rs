//! The GPU sampler against `cpu::sample`: greedy, temperature, top-k, top-p, min-p and their
//! combinations, plus log-probabilities and top-n lists.
//!
//! Thresholds are exact on the CPU and found by bisection on the GPU, and the running sums are
//! f32 there; so a draw `u` within 1e-4 of a token boundary may legitimately land on the
//! neighbour. Such draws are counted, not failed; everything else must pick the same token.
//! Log-probabilities: f32 log-sum-exp over the vocabulary, within 1e-4 absolute, for rows that
//! ask for them (top_logprobs > 0); the others report 0.
//! The bisections run over the tokens at or above a floor, gathered in workgroup memory, where
//! they fit (top-k up to 256, top-p alone where the largest tokens hold its mass, or a
//! 1000-token vocabulary), and over the whole row where they do not (top-k 300, or top-p 0.99
//! at temperature 2, over 49152 tokens): the cases below take both ways.

use weft::DType;
use weft::gpu::Recording;
use weft::gpu::kernels::sample::{OUT_PER_ROW, SETTINGS_PER_ROW, sample};
use weft::model::sampler::{read_sampled, settings_row};
use weft::sampling::{SamplerRng, SamplingParams};
use weft::tensor::TensorFactory;

use crate::common::*;

fn cases() -> Vec<SamplingParams> {
    let p = |temperature, top_k, top_p, min_p, top_logprobs| SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        top_logprobs,
        ..Default::default()
    };
    vec![
        p(0.0, 0, 1.0, 0.0, 5),
        p(0.0, 0, 1.0, 0.0, 0),
        p(1.0, 0, 1.0, 0.0, 0),
        p(0.7, 40, 1.0, 0.0, 3),
        p(1.0, 0, 0.9, 0.0, 0),
        p(0.8, 50, 0.95, 0.0, 20),
        p(1.3, 0, 1.0, 0.05, 1),
        p(1.0, 1, 1.0, 0.0, 0),
        p(2.0, 5, 0.5, 0.1, 2),
        p(1.0, 300, 1.0, 0.0, 0),
        p(2.0, 0, 0.99, 0.0, 0),
    ]
}

#[test]
fn sampling_matches_cpu() {
    let Some(f) = gpu() else { return };
    for vocab in [1000, 49152] {
        let mut rows = Vec::new();
        let mut rng = SamplerRng::new(vocab as u64);
        for (c, params) in cases().into_iter().enumerate() {
            for draw in 0..6 {
                rows.push((params.clone(), rng.next_uniform(), random(vocab, (c * 10 + draw) as u64 + 1, 6.0)));
            }
        }
        let logits: Vec<f32> = rows.iter().flat_map(|(_, _, l)| l.iter().copied()).collect();
        let settings: Vec<u32> = rows.iter().flat_map(|(p, u, _)| settings_row(p, *u)).collect();
        let lt = f.upload_f32(&[rows.len(), vocab], &logits).unwrap();
        let st = f.upload_u32(&[rows.len(), SETTINGS_PER_ROW], &settings).unwrap();
        let out = f.zeros(&[rows.len(), OUT_PER_ROW], DType::U32).unwrap();
        let mut rec = Recording::new();
        sample(ctx(f), &mut rec, &lt, &st, &out).unwrap();
        run(f, &rec);
        let got = read_u32(f, &out);
        let mut near_boundary = 0;
        for (r, (p, u, l)) in rows.iter().enumerate() {
            let s = read_sampled(&got[r * OUT_PER_ROW..(r + 1) * OUT_PER_ROW], p.top_logprobs);
            let (want, lo, hi) = weft::cpu::sample(l, p.temperature, p.top_k as usize, p.top_p, p.min_p, *u);
            if s.token != want {
                let margin = (f64::from(*u) - lo).abs().min((f64::from(*u) - hi).abs());
                assert!(margin < 1e-4, "vocab {vocab} row {r} {p:?} u={u}: gpu {} cpu {want}", s.token);
                near_boundary += 1;
            }
            let lsm = weft::cpu::log_softmax(l);
            if p.top_logprobs > 0 {
                assert!((f64::from(s.logprob) - lsm[s.token as usize]).abs() < 1e-4, "logprob of row {r}");
            } else {
                assert_eq!(got[r * OUT_PER_ROW + 1], 0, "row {r} asked for no logprob, so none is worked out");
            }
            let mut order: Vec<usize> = (0..vocab).collect();
            order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
            for (n, &(id, lp)) in s.top_logprobs.iter().enumerate() {
                assert_eq!(id as usize, order[n], "top {n} of row {r}");
                assert!((f64::from(lp) - lsm[id as usize]).abs() < 1e-4);
            }
        }
        assert!(near_boundary <= 1, "{near_boundary} draws landed next to the CPU's token");
    }
}

#[test]
fn top_k_one_and_greedy_agree_with_argmax() {
    let Some(f) = gpu() else { return };
    let vocab = 5000;
    let l = random(vocab, 99, 3.0);
    let rows = [SamplingParams::greedy(), SamplingParams { top_k: 1, ..Default::default() }];
    let settings: Vec<u32> = rows.iter().flat_map(|p| settings_row(p, 0.999)).collect();
    let lt = f.upload_f32(&[2, vocab], &[l.clone(), l.clone()].concat()).unwrap();
    let st = f.upload_u32(&[2, SETTINGS_PER_ROW], &settings).unwrap();
    let out = f.zeros(&[2, OUT_PER_ROW], DType::U32).unwrap();
    let mut rec = Recording::new();
    sample(ctx(f), &mut rec, &lt, &st, &out).unwrap();
    run(f, &rec);
    let got = read_u32(f, &out);
    let best = weft::cpu::argmax(&l, vocab)[0];
    assert_eq!((got[0], got[OUT_PER_ROW]), (best, best));
}

/// Biases and penalties against `cpu::penalize`. One addition, one division or multiplication
/// and one subtraction per logit: WGSL's division may be off by 2.5 ULP, so 4 ULP of the result
/// (and of the biased logit it divides, which may be larger).
#[test]
fn penalties_match_cpu() {
    use weft::gpu::kernels::penalize::{ENTRY_WORDS, UNSEEN, penalize};
    let Some(f) = gpu() else { return };
    let (rows, vocab) = (3, 1000);
    let logits = random(rows * vocab, 5, 4.0);
    let penalties: Vec<f32> = vec![1.3, 0.0, 0.0, 1.0, 0.5, 0.25, 0.8, -0.5, 1.5];
    let history: Vec<(Vec<u32>, Vec<u32>)> = (0..rows)
        .map(|r| {
            (
                (0..40).map(|i| (i * 37 + r * 11) as u32 % 1000).collect(),
                (0..30).map(|i| (i * i + r) as u32 % 97).collect(),
            )
        })
        .collect();
    let mut entries = Vec::new();
    for (r, (prompt, output)) in history.iter().enumerate() {
        let seen = weft::sampling::penalty_entries(prompt, output);
        // Every third token seen is biased too; then a few tokens only biased.
        for (i, &(token, count)) in seen.iter().enumerate() {
            let bias: f32 = if i % 3 == 0 { 2.5 - i as f32 } else { 0.0 };
            entries.extend([r as u32, token, count, bias.to_bits()]);
        }
        for token in (500..1000u32).step_by(37 + r) {
            entries.extend([r as u32, token, UNSEEN, (-(token as f32) / 10.0).to_bits()]);
        }
    }
    let mut want = logits.clone();
    weft::cpu::penalize(&mut want, vocab, &entries, &penalties, UNSEEN);
    let lt = f.upload_f32(&[rows, vocab], &logits).unwrap();
    let et = f.upload_u32(&[entries.len() / ENTRY_WORDS, ENTRY_WORDS], &entries).unwrap();
    let pt = f.upload_f32(&[rows, 3], &penalties).unwrap();
    let mut rec = Recording::new();
    penalize(ctx(f), &mut rec, &lt, &et, &pt).unwrap();
    run(f, &rec);
    let bound = |i: usize| 4.0 * U * f64::from(want[i].abs().max(logits[i].abs() + 100.0)) * 2.0 + 1e-30;
    assert_close("penalize", &read_f32(f, &lt), &want, bound);
    assert!(want.iter().zip(&logits).filter(|(w, l)| w != l).count() > 100, "the entries change logits");
}
