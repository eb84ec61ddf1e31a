//! Gemma 3n's kernels (altup_predict, altup_correct, magnitude_match, gaussian_topk) against
//! `weft::cpu::gemma3n`. Streams are laid out as the model holds them: n streams of a capacity
//! larger than the step's tokens, so each kernel must find stream j at row j · capacity.

use weft::DType;
use weft::gpu::Recording;
use weft::gpu::kernels::altup::{MAGNITUDE_MIN_SQUARE, altup_correct, altup_predict, gaussian_topk, magnitude_match};
use weft::tensor::TensorFactory;

use crate::common::*;

/// n streams of `tokens` rows each, placed at rows j · capacity of one (n · capacity, hidden)
/// buffer (the rest zero).
fn stacked(streams: &[Vec<f32>], capacity: usize, hidden: usize) -> Vec<f32> {
    let mut all = vec![0.0; streams.len() * capacity * hidden];
    for (j, s) in streams.iter().enumerate() {
        all[j * capacity * hidden..j * capacity * hidden + s.len()].copy_from_slice(s);
    }
    all
}

/// Stream j's first `tokens` rows out of a stacked buffer.
fn unstack(all: &[f32], n: usize, capacity: usize, tokens: usize, hidden: usize) -> Vec<Vec<f32>> {
    (0..n).map(|j| all[j * capacity * hidden..(j * capacity + tokens) * hidden].to_vec()).collect()
}

/// Tolerance: each coefficient is a sum of n f32 products (n·u relative to Σ|w·m|), and each
/// output adds n products of a coefficient and a stream, then the stream itself: (2n + 2)·u
/// relative to Σ_k Σ_m |w·m|·|s_k| + |s_j|, checked with a factor 2.
#[test]
fn altup_predict_matches_cpu() {
    let Some(f) = gpu() else { return };
    for &(n, tokens, capacity, hidden) in &[(4, 1, 3, 64), (4, 5, 7, 300), (2, 3, 3, 17)] {
        let streams: Vec<Vec<f32>> = (0..n).map(|j| random(tokens * hidden, 10 + j as u64, 3.0)).collect();
        let modal = random(tokens * n, 5, 1.0);
        let coefs = random(n * n * n, 6, 0.5);
        let st = f.upload_f32(&[n * capacity, hidden], &stacked(&streams, capacity, hidden)).unwrap();
        let mt = f.upload_f32(&[tokens, n], &modal).unwrap();
        let ct = f.upload_f32(&[n * n, n], &coefs).unwrap();
        let out = f.zeros(&[n * capacity, hidden], DType::F32).unwrap();
        let mut rec = Recording::new();
        altup_predict(ctx(f), &mut rec, &st, &mt, &ct, &out).unwrap();
        run(f, &rec);
        let want = weft::cpu::gemma3n::altup_predict(&streams, &modal, &coefs, hidden);
        let got = unstack(&read_f32(f, &out), n, capacity, tokens, hidden);
        for j in 0..n {
            assert_close(&format!("altup_predict n {n} tokens {tokens} stream {j}"), &got[j], &want[j], |i| {
                let t = i / hidden;
                let size: f64 = (0..n)
                    .map(|k| {
                        let c: f64 =
                            (0..n).map(|m| f64::from((coefs[(j * n + k) * n + m] * modal[t * n + m]).abs())).sum();
                        c * f64::from(streams[k][i].abs())
                    })
                    .sum::<f64>()
                    + f64::from(streams[j][i].abs());
                2.0 * (2 * n + 2) as f64 * U * size + 1e-30
            });
        }
    }
    // Streams too short for the step's tokens are refused.
    let st = f.zeros(&[8, 4], DType::F32).unwrap();
    let mt = f.zeros(&[3, 4], DType::F32).unwrap();
    let ct = f.zeros(&[16, 4], DType::F32).unwrap();
    let err = altup_predict(ctx(f), &mut Recording::new(), &st, &mt, &ct, &st).unwrap_err();
    assert!(err.to_string().contains("4 streams of at least 3 tokens"), "{err}");
}

/// Tolerance: the coefficient is a sum of n products plus 1 ((n + 1)·u relative to
/// 1 + Σ|w·m|), the innovation one subtraction, then a multiply-add: (n + 4)·u relative to
/// (1 + Σ|w·m|)·(|a| + |p_a|) + |p_j|, checked with a factor 2; the scaled stream one multiply
/// more.
#[test]
fn altup_correct_matches_cpu() {
    let Some(f) = gpu() else { return };
    for &(n, tokens, capacity, hidden, active) in &[(4, 1, 2, 64, 0), (4, 6, 6, 300, 2), (3, 2, 5, 17, 1)] {
        let pred: Vec<Vec<f32>> = (0..n).map(|j| random(tokens * hidden, 20 + j as u64, 3.0)).collect();
        let activated = random(tokens * hidden, 30, 3.0);
        let modal = random(tokens * n, 31, 1.0);
        let coefs = random(n * n, 32, 0.5);
        let out_scale = random(hidden, 33, 2.0);
        let pt = f.upload_f32(&[n * capacity, hidden], &stacked(&pred, capacity, hidden)).unwrap();
        let at = f.upload_f32(&[tokens, hidden], &activated).unwrap();
        let mt = f.upload_f32(&[tokens, n], &modal).unwrap();
        let ct = f.upload_f32(&[n, n], &coefs).unwrap();
        let scale_t = f.upload_f32(&[hidden], &out_scale).unwrap();
        let out = f.zeros(&[n * capacity, hidden], DType::F32).unwrap();
        let scaled = f.zeros(&[tokens, hidden], DType::F32).unwrap();
        let mut rec = Recording::new();
        altup_correct(ctx(f), &mut rec, &pt, &at, &mt, &ct, &scale_t, active, &out, &scaled).unwrap();
        run(f, &rec);
        let (want, want_scaled) =
            weft::cpu::gemma3n::altup_correct(&pred, &activated, &modal, &coefs, &out_scale, active);
        let got = unstack(&read_f32(f, &out), n, capacity, tokens, hidden);
        let size = |j: usize, i: usize| {
            let t = i / hidden;
            let c: f64 = 1.0 + (0..n).map(|m| f64::from((coefs[j * n + m] * modal[t * n + m]).abs())).sum::<f64>();
            c * f64::from(activated[i].abs() + pred[active][i].abs()) + f64::from(pred[j][i].abs())
        };
        for j in 0..n {
            assert_close(&format!("altup_correct n {n} stream {j}"), &got[j], &want[j], |i| {
                2.0 * (n + 4) as f64 * U * size(j, i) + 1e-30
            });
        }
        assert_close(&format!("altup_correct n {n} scaled"), &read_f32(f, &scaled), &want_scaled, |i| {
            2.0 * (n + 5) as f64 * U * size(active, i) * f64::from(out_scale[i % hidden].abs()) + 1e-30
        });
        let err =
            altup_correct(ctx(f), &mut Recording::new(), &pt, &at, &mt, &ct, &scale_t, n, &out, &scaled).unwrap_err();
        assert!(err.to_string().contains(&format!("active stream {n} of {n}")), "{err}");
    }
}

/// Tolerance: each mean square takes about n/64 additions then 6 tree levels ((n/64 + 6)·u
/// relative), each square root halves that and adds one rounding, then a divide and a
/// multiply: (n/64 + 12)·u relative, checked with a factor 2. A row of zeros (below the
/// floor) is scaled by rms(target) / sqrt(1e-5) times 0, staying 0, not NaN.
#[test]
fn magnitude_match_matches_cpu() {
    let Some(f) = gpu() else { return };
    for &(rows, n) in &[(1, 7), (3, 64), (2, 2048)] {
        let mut x = random(rows * n, n as u64, 0.5);
        x[..n].fill(0.0);
        let target = random(rows * n, n as u64 + 1, 4.0);
        let (xt, tt) = (f.upload_f32(&[rows, n], &x).unwrap(), f.upload_f32(&[rows, n], &target).unwrap());
        let mut rec = Recording::new();
        magnitude_match(ctx(f), &mut rec, &xt, &tt).unwrap();
        run(f, &rec);
        let want = weft::cpu::gemma3n::magnitude_match(&x, &target, n, MAGNITUDE_MIN_SQUARE);
        let rel = 2.0 * (n as f64 / 64.0 + 12.0) * U;
        assert_close(&format!("magnitude_match {rows}x{n}"), &read_f32(f, &xt), &want, |i| {
            rel * f64::from(want[i].abs()) + 1e-30
        });
    }
    let (a, b) = (f.zeros(&[2, 4], DType::F32).unwrap(), f.zeros(&[2, 5], DType::F32).unwrap());
    let err = magnitude_match(ctx(f), &mut Recording::new(), &a, &b).unwrap_err();
    assert!(err.to_string().contains("target must be F32 of shape [2, 4]"), "{err}");
}

/// Over the first `cols` of each row only (the gate beside the up projection, which must stay
/// as it was). Tolerance: the cutoff's error is the mean's ((cols/64 + 6)·u·max|x|) plus the
/// multiplier times the standard deviation's ((cols/64 + 8)·u relative to it, past the mean's
/// error moving each centred value), and the subtraction one rounding of |x - cutoff|; checked
/// with a factor 2 against the f64 oracle. A value within that of the cutoff may land on
/// either side of 0, as the bound allows.
#[test]
fn gaussian_topk_matches_cpu() {
    let Some(f) = gpu() else { return };
    let multiplier = 1.644_853_6f32;
    for &(rows, cols, stride) in &[(1, 7, 14), (3, 96, 192), (2, 2048, 4096)] {
        let x: Vec<f32> = random(rows * stride, cols as u64, 3.0).iter().map(|v| v + 1.0).collect();
        let xt = f.upload_f32(&[rows, stride], &x).unwrap();
        let mut rec = Recording::new();
        gaussian_topk(ctx(f), &mut rec, &xt, cols, multiplier).unwrap();
        run(f, &rec);
        let gates: Vec<f32> = x.chunks(stride).flat_map(|r| r[..cols].to_vec()).collect();
        let cut = weft::cpu::gemma3n::gaussian_topk(&gates, cols, multiplier);
        let want: Vec<f32> = x
            .chunks(stride)
            .zip(cut.chunks(cols))
            .flat_map(|(r, c)| c.iter().chain(&r[cols..]).copied().collect::<Vec<_>>())
            .collect();
        let got = read_f32(f, &xt);
        let max = x.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let rel = (cols as f64 / 64.0 + 8.0) * U;
        assert_close(&format!("gaussian_topk {rows}x{cols} of {stride}"), &got, &want, |i| {
            if i % stride >= cols {
                return 0.0;
            }
            2.0 * (rel * max * (1.0 + f64::from(multiplier)) + U * f64::from(want[i].abs())) + 1e-30
        });
        let zeros = got.chunks(stride).flat_map(|r| r[..cols].to_vec()).filter(|&v| v == 0.0).count();
        assert!(zeros * 2 > rows * cols, "{zeros} of {} gate values cut: most should be", rows * cols);
    }
    let xt = f.zeros(&[2, 8], DType::F32).unwrap();
    let err = gaussian_topk(ctx(f), &mut Recording::new(), &xt, 9, multiplier).unwrap_err();
    assert!(err.to_string().contains("9 columns of rows 8 wide"), "{err}");
}
