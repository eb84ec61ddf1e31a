//! Structured output's token masks (`token_mask`) against `cpu::token_mask`, and the sampler
//! on masked rows: whatever the settings (greedy, temperature, top-k, top-p, min-p), a masked
//! row only ever picks an allowed token, and the same one as the CPU sampler on the same
//! masked logits (up to draws within 1e-4 of a boundary, as in `sample.rs`).

use weft::DType;
use weft::gpu::Recording;
use weft::gpu::kernels::sample::{OUT_PER_ROW, SETTINGS_PER_ROW, sample};
use weft::gpu::kernels::token_mask::{MASKED_LOGIT, token_mask};
use weft::model::sampler::{read_sampled, settings_row};
use weft::sampling::{SamplerRng, SamplingParams};
use weft::tensor::TensorFactory;

use crate::common::*;

/// A mask allowing each token with probability 1 / `one_in`.
fn random_mask(vocab: usize, seed: u64, one_in: usize) -> Vec<u32> {
    let mut rng = SamplerRng::new(seed);
    let mut words = vec![0u32; vocab.div_ceil(32)];
    for t in 0..vocab {
        if rng.below(one_in) == 0 {
            words[t / 32] |= 1 << (t % 32);
        }
    }
    words[0] |= 1; // at least one token
    words
}

#[test]
fn masks_match_cpu_and_leave_other_rows_alone() {
    let Some(f) = gpu() else { return };
    let (rows, vocab) = (5, 1000);
    let logits = random(rows * vocab, 3, 5.0);
    let mask_rows = [1u32, 3];
    let masks: Vec<u32> = [random_mask(vocab, 1, 3), random_mask(vocab, 2, 50)].concat();
    let lt = f.upload_f32(&[rows, vocab], &logits).unwrap();
    let mt = f.upload_u32(&[2, vocab.div_ceil(32)], &masks).unwrap();
    let rt = f.upload_u32(&[2], &mask_rows).unwrap();
    let mut rec = Recording::new();
    token_mask(ctx(f), &mut rec, &lt, &mt, &rt).unwrap();
    run(f, &rec);
    let mut want = logits.clone();
    weft::cpu::token_mask(&mut want, vocab, &masks, &mask_rows, MASKED_LOGIT);
    assert_eq!(read_f32(f, &lt), want);
    assert_eq!(want[..vocab], logits[..vocab], "row 0 has no mask");
}

#[test]
fn token_mask_checks_its_operands() {
    let Some(f) = gpu() else { return };
    let lt = f.upload_f32(&[2, 100], &[0.0; 200]).unwrap();
    let mt = f.upload_u32(&[1, 3], &[0; 3]).unwrap();
    let rt = f.upload_u32(&[1], &[0]).unwrap();
    let err = token_mask(ctx(f), &mut Recording::new(), &lt, &mt, &rt).unwrap_err().to_string();
    assert!(err.contains("masks must be U32 of shape [_, 4]"), "{err}");
}

#[test]
fn masked_rows_only_pick_allowed_tokens() {
    let Some(f) = gpu() else { return };
    let vocab = 49152;
    let p =
        |temperature, top_k, top_p, min_p| SamplingParams { temperature, top_k, top_p, min_p, ..Default::default() };
    let cases =
        [p(0.0, 0, 1.0, 0.0), p(1.0, 0, 1.0, 0.0), p(0.7, 5, 1.0, 0.0), p(1.0, 0, 0.8, 0.0), p(1.5, 3, 0.9, 0.1)];
    let mut rng = SamplerRng::new(11);
    let (mut logits, mut masks, mut settings, mut params) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (c, case) in cases.iter().enumerate() {
        for draw in 0..4 {
            let seed = (c * 10 + draw) as u64;
            logits.extend(random(vocab, seed + 100, 8.0));
            masks.extend(random_mask(vocab, seed, if draw % 2 == 0 { 2000 } else { 20 }));
            let u = rng.next_uniform();
            settings.extend(settings_row(case, u));
            params.push((case.clone(), u));
        }
    }
    let rows = params.len();
    let mask_rows: Vec<u32> = (0..rows as u32).collect();
    let lt = f.upload_f32(&[rows, vocab], &logits).unwrap();
    let mt = f.upload_u32(&[rows, vocab.div_ceil(32)], &masks).unwrap();
    let rt = f.upload_u32(&[rows], &mask_rows).unwrap();
    let st = f.upload_u32(&[rows, SETTINGS_PER_ROW], &settings).unwrap();
    let out = f.zeros(&[rows, OUT_PER_ROW], DType::U32).unwrap();
    let mut rec = Recording::new();
    token_mask(ctx(f), &mut rec, &lt, &mt, &rt).unwrap();
    sample(ctx(f), &mut rec, &lt, &st, &out).unwrap();
    run(f, &rec);
    let got = read_u32(f, &out);
    let mut masked = logits.clone();
    weft::cpu::token_mask(&mut masked, vocab, &masks, &mask_rows, MASKED_LOGIT);
    let words = vocab.div_ceil(32);
    let mut near_boundary = 0;
    for (r, (p, u)) in params.iter().enumerate() {
        let s = read_sampled(&got[r * OUT_PER_ROW..(r + 1) * OUT_PER_ROW], 0);
        let mask = &masks[r * words..(r + 1) * words];
        assert!(mask[s.token as usize / 32] >> (s.token % 32) & 1 == 1, "row {r} {p:?} picked forbidden {}", s.token);
        let row = &masked[r * vocab..(r + 1) * vocab];
        let (want, lo, hi) = weft::cpu::sample(row, p.temperature, p.top_k as usize, p.top_p, p.min_p, *u);
        if s.token != want {
            let margin = (f64::from(*u) - lo).abs().min((f64::from(*u) - hi).abs());
            assert!(margin < 1e-4, "row {r} {p:?} u={u}: gpu {} cpu {want}", s.token);
            near_boundary += 1;
        }
    }
    assert!(near_boundary <= 1, "{near_boundary} draws landed next to the CPU's token");
}
