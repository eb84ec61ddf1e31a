//! rms_norm, add_layer_norm, pool_rows, softmax and argmax against the CPU, with rows shorter
//! and longer than the 64-invocation workgroup.

use weft::DType;
use weft::gpu::Recording;
use weft::gpu::kernels::elementwise::add;
use weft::gpu::kernels::reduce::{add_layer_norm, add_rms_norm, argmax, pool_rows, rms_norm, softmax};
use weft::tensor::TensorFactory;

use crate::common::*;

const SHAPES: &[(usize, usize)] = &[(1, 7), (3, 64), (5, 576), (2, 4099)];

/// Tolerance: each invocation adds about n/64 squares, then 6 tree levels; inverseSqrt is within
/// 2 ULP; then two multiplies. That is (n/64 + 12)·u relative, checked with a factor 2.
#[test]
fn rms_norm_matches_cpu() {
    let Some(f) = gpu() else { return };
    for &(rows, n) in SHAPES {
        let x = random(rows * n, n as u64, 3.0);
        let w = random(n, 7, 1.5);
        let (xt, wt, yt) = (
            f.upload_f32(&[rows, n], &x).unwrap(),
            f.upload_f32(&[n], &w).unwrap(),
            f.zeros(&[rows, n], DType::F32).unwrap(),
        );
        let mut rec = Recording::new();
        rms_norm(ctx(f), &mut rec, &xt, &wt, &yt, 1e-5).unwrap();
        run(f, &rec);
        let want = weft::cpu::rms_norm(&x, &w, 1e-5);
        let rel = 2.0 * (n as f64 / 64.0 + 12.0) * U;
        assert_close(&format!("rms_norm {rows}x{n}"), &read_f32(f, &yt), &want, |i| {
            rel * f64::from(want[i].abs()) + 1e-30
        });
    }
}

/// Tolerance: the row's sum and its squared deviations each take about n/64 additions, then 6
/// tree levels; the mean's error, (n/64 + 6)·u·max|x|, moves every centred value, which the
/// scale (1/σ) and the weight multiply; inverseSqrt is within 2 ULP, then a multiply-add. That
/// is (n/64 + 12)·u relative to |y - bias| plus the mean's error times scale·|weight|, twice.
/// x carries an offset of 5 so that centring matters; the residual x comes back as x + delta.
#[test]
fn add_layer_norm_matches_cpu() {
    let Some(f) = gpu() else { return };
    for &(rows, n) in SHAPES {
        let x: Vec<f32> = random(rows * n, n as u64, 3.0).iter().map(|v| v + 5.0).collect();
        let delta = random(rows * n, n as u64 + 1, 2.0);
        let (w, b) = (random(n, 7, 1.5), random(n, 8, 0.5));
        let (xt, dt, wt, bt, yt) = (
            f.upload_f32(&[rows, n], &x).unwrap(),
            f.upload_f32(&[rows, n], &delta).unwrap(),
            f.upload_f32(&[n], &w).unwrap(),
            f.upload_f32(&[n], &b).unwrap(),
            f.zeros(&[rows, n], DType::F32).unwrap(),
        );
        let mut rec = Recording::new();
        add_layer_norm(ctx(f), &mut rec, &xt, &dt, &wt, &bt, &yt, 1e-12).unwrap();
        run(f, &rec);
        let sum: Vec<f32> = x.iter().zip(&delta).map(|(a, b)| a + b).collect();
        assert_eq!(read_f32(f, &xt), sum, "x += delta, each sum one f32 addition");
        let want = weft::cpu::layer_norm(&sum, &w, &b, 1e-12);
        let rel = (n as f64 / 64.0 + 12.0) * U;
        let bound = |i: usize| {
            let row = &sum[i / n * n..(i / n + 1) * n];
            let max = row.iter().fold(0f64, |m, &v| m.max(f64::from(v.abs())));
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
            let sd = (row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
            let centred = f64::from((want[i] - b[i % n]).abs());
            2.0 * (rel * centred + (n as f64 / 64.0 + 6.0) * U * max / sd * f64::from(w[i % n].abs())) + 1e-30
        };
        assert_close(&format!("add_layer_norm {rows}x{n}"), &read_f32(f, &yt), &want, bound);
    }
    let xt = f.zeros(&[2, 8], DType::F32).unwrap();
    let w = f.zeros(&[8], DType::F32).unwrap();
    let short = f.zeros(&[7], DType::F32).unwrap();
    let err = add_layer_norm(ctx(f), &mut Recording::new(), &xt, &xt, &w, &short, &xt, 1e-5).unwrap_err();
    assert!(err.to_string().contains("bias"), "{err}");
}

/// Pooling: each output the mean of its span of rows, summed down the column in row order;
/// the error is at most (count + 1)·u of the mean of |x| over the span. A span of one row (CLS,
/// last token) copies it bit for bit.
#[test]
fn pool_rows_matches_cpu() {
    let Some(f) = gpu() else { return };
    for cols in [64, 384, 1000] {
        let rows = 40;
        let x = random(rows * cols, cols as u64, 3.0);
        let spans = [(0, 40), (0, 1), (39, 1), (5, 17), (22, 18), (7, 1)];
        let flat: Vec<u32> = spans.iter().flat_map(|&(a, c)| [a as u32, c as u32]).collect();
        let (xt, st, ot) = (
            f.upload_f32(&[rows, cols], &x).unwrap(),
            f.upload_u32(&[spans.len(), 2], &flat).unwrap(),
            f.zeros(&[spans.len(), cols], DType::F32).unwrap(),
        );
        let mut rec = Recording::new();
        pool_rows(ctx(f), &mut rec, &xt, &st, &ot).unwrap();
        run(f, &rec);
        let got = read_f32(f, &ot);
        let want = weft::cpu::pool_rows(&x, cols, &spans);
        assert_close(&format!("pool_rows of {cols} columns"), &got, &want, |i| {
            let (first, count) = spans[i / cols];
            let mean_abs =
                (first..first + count).map(|r| f64::from(x[r * cols + i % cols].abs())).sum::<f64>() / count as f64;
            (count as f64 + 1.0) * U * mean_abs + 1e-30
        });
        for (o, &(first, count)) in spans.iter().enumerate() {
            if count == 1 {
                assert!(got[o * cols..(o + 1) * cols] == x[first * cols..(first + 1) * cols], "one row is a copy");
            }
        }
    }
    let xt = f.zeros(&[4, 8], DType::F32).unwrap();
    let (st, ot) = (f.zeros(&[2, 2], DType::U32).unwrap(), f.zeros(&[3, 8], DType::F32).unwrap());
    let err = pool_rows(ctx(f), &mut Recording::new(), &xt, &st, &ot).unwrap_err();
    assert!(err.to_string().contains("spans"), "{err}");
}

/// Per-head RMSNorm of the query and key heads of fused qkv rows, in place: the same tolerance
/// as rms_norm over head_dim elements; the value heads come back untouched, bit for bit.
#[test]
fn head_rms_norm_matches_cpu() {
    use weft::gpu::kernels::paged::QkvLayout;
    use weft::gpu::kernels::reduce::head_rms_norm;
    let Some(f) = gpu() else { return };
    for (tokens, heads, kv_heads, hd) in [(1, 4, 1, 256), (5, 4, 2, 64), (3, 14, 2, 64), (2, 2, 2, 96)] {
        let layout = QkvLayout { num_heads: heads, num_kv_heads: kv_heads, head_dim: hd };
        let stride = layout.row_stride();
        let x = random(tokens * stride, hd as u64, 3.0);
        let (qw, kw) = (random(hd, 21, 1.5), random(hd, 22, 1.5));
        let xt = f.upload_f32(&[tokens, stride], &x).unwrap();
        let (qt, kt) = (f.upload_f32(&[hd], &qw).unwrap(), f.upload_f32(&[hd], &kw).unwrap());
        let mut rec = Recording::new();
        head_rms_norm(ctx(f), &mut rec, &xt, layout, &qt, &kt, 1e-6).unwrap();
        run(f, &rec);
        let got = read_f32(f, &xt);
        let want = weft::cpu::head_rms_norm(&x, heads, kv_heads, &qw, &kw, 1e-6);
        let rel = 2.0 * (hd as f64 / 64.0 + 12.0) * U;
        assert_close(&format!("head_rms_norm {tokens}x{heads}+{kv_heads}x{hd}"), &got, &want, |i| {
            rel * f64::from(want[i].abs()) + 1e-30
        });
        for t in 0..tokens {
            let v = t * stride + (heads + kv_heads) * hd..(t + 1) * stride;
            assert!(got[v.clone()] == x[v], "value heads of token {t} changed");
        }
    }
    let layout = QkvLayout { num_heads: 2, num_kv_heads: 1, head_dim: 32 };
    let xt = f.zeros(&[2, 128], DType::F32).unwrap();
    let w = f.zeros(&[48], DType::F32).unwrap();
    let err = head_rms_norm(ctx(f), &mut Recording::new(), &xt, layout, &w, &w, 1e-6).unwrap_err();
    assert!(err.to_string().contains("q_weight has 48 values"), "{err}");
    let xt = f.zeros(&[2, 100], DType::F32).unwrap();
    let w = f.zeros(&[32], DType::F32).unwrap();
    let err = head_rms_norm(ctx(f), &mut Recording::new(), &xt, layout, &w, &w, 1e-6).unwrap_err();
    assert!(err.to_string().contains("qkv must be F32 of shape [_, 128]"), "{err}");
}

/// RMSNorm of the whole query and key projections (OLMo 2's q_norm / k_norm, weights as wide as
/// all the query or key heads), in place: the tolerance of rms_norm over that width; the value
/// heads come back untouched, bit for bit.
#[test]
fn head_rms_norm_of_whole_projections_matches_cpu() {
    use weft::gpu::kernels::paged::QkvLayout;
    use weft::gpu::kernels::reduce::head_rms_norm;
    let Some(f) = gpu() else { return };
    for (tokens, heads, kv_heads, hd) in [(1, 4, 2, 16), (3, 8, 8, 64), (2, 32, 8, 128)] {
        let layout = QkvLayout { num_heads: heads, num_kv_heads: kv_heads, head_dim: hd };
        let stride = layout.row_stride();
        let x = random(tokens * stride, hd as u64 + 7, 3.0);
        let (qw, kw) = (random(heads * hd, 23, 1.5), random(kv_heads * hd, 24, 1.5));
        let xt = f.upload_f32(&[tokens, stride], &x).unwrap();
        let qt = f.upload_f32(&[heads * hd], &qw).unwrap();
        let kt = f.upload_f32(&[kv_heads * hd], &kw).unwrap();
        let mut rec = Recording::new();
        head_rms_norm(ctx(f), &mut rec, &xt, layout, &qt, &kt, 1e-6).unwrap();
        run(f, &rec);
        let got = read_f32(f, &xt);
        let want = weft::cpu::qk_rms_norm(&x, heads, kv_heads, hd, &qw, &kw, 1e-6);
        let rel = 2.0 * ((heads * hd) as f64 / 64.0 + 12.0) * U;
        assert_close(&format!("whole-projection norm {tokens}x{heads}+{kv_heads}x{hd}"), &got, &want, |i| {
            rel * f64::from(want[i].abs()) + 1e-30
        });
        for t in 0..tokens {
            let v = t * stride + (heads + kv_heads) * hd..(t + 1) * stride;
            assert!(got[v.clone()] == x[v], "value heads of token {t} changed");
        }
    }
}

/// The fused residual connection and norm computes exactly what `add` then `rms_norm` do: the
/// same additions, the same reduction.
#[test]
fn add_rms_norm_equals_add_then_rms_norm_bit_for_bit() {
    let Some(f) = gpu() else { return };
    for &(rows, n) in SHAPES {
        let x = random(rows * n, n as u64, 3.0);
        let d = random(rows * n, n as u64 + 9, 1.0);
        let w = random(n, 7, 1.5);
        let wt = f.upload_f32(&[n], &w).unwrap();
        let (xa, da, ya) = (
            f.upload_f32(&[rows, n], &x).unwrap(),
            f.upload_f32(&[rows, n], &d).unwrap(),
            f.zeros(&[rows, n], DType::F32).unwrap(),
        );
        let (xb, db, yb) = (
            f.upload_f32(&[rows, n], &x).unwrap(),
            f.upload_f32(&[rows, n], &d).unwrap(),
            f.zeros(&[rows, n], DType::F32).unwrap(),
        );
        let mut rec = Recording::new();
        add_rms_norm(ctx(f), &mut rec, &xa, &da, &wt, &ya, 1e-5).unwrap();
        add(ctx(f), &mut rec, &xb, &db).unwrap();
        rms_norm(ctx(f), &mut rec, &xb, &wt, &yb, 1e-5).unwrap();
        run(f, &rec);
        assert!(read_f32(f, &xa) == read_f32(f, &xb), "{rows}x{n}: the residual stream");
        assert!(read_f32(f, &ya) == read_f32(f, &yb), "{rows}x{n}: the normalised rows");
    }
}

/// Tolerance: exp of x - max in [-16, 0] is within 3 + 2·16 = 35 ULP, the row sum adds about
/// n/64 + 6 roundings, the final multiply one more: (n/64 + 42)·u relative, factor 2 margin.
#[test]
fn softmax_matches_cpu() {
    let Some(f) = gpu() else { return };
    for &(rows, n) in SHAPES {
        let x = random(rows * n, n as u64 + 1, 8.0);
        let xt = f.upload_f32(&[rows, n], &x).unwrap();
        let mut rec = Recording::new();
        softmax(ctx(f), &mut rec, &xt).unwrap();
        run(f, &rec);
        let want = weft::cpu::softmax(&x, n);
        let rel = 2.0 * (n as f64 / 64.0 + 42.0) * U;
        assert_close(&format!("softmax {rows}x{n}"), &read_f32(f, &xt), &want, |i| rel * f64::from(want[i]) + 1e-30);
    }
}

#[test]
fn argmax_matches_cpu_and_breaks_ties_low() {
    let Some(f) = gpu() else { return };
    for &(rows, n) in SHAPES.iter().chain(&[(4, 49152)]) {
        let mut x = random(rows * n, n as u64 + 2, 1.0);
        // Plant ties: the maximum appears twice in each row; the lower index must win.
        for r in 0..rows {
            let (a, b) = (n / 3 + r % 2, n - 1);
            x[r * n + a] = 2.0;
            x[r * n + b] = 2.0;
        }
        x[0] = f32::NAN; // a NaN never wins
        let xt = f.upload_f32(&[rows, n], &x).unwrap();
        let out = f.zeros(&[rows], DType::U32).unwrap();
        let mut rec = Recording::new();
        argmax(ctx(f), &mut rec, &xt, &out).unwrap();
        run(f, &rec);
        assert_eq!(read_u32(f, &out), weft::cpu::argmax(&x, n), "argmax {rows}x{n}");
    }
}

/// RMSNorm of one part's heads of fused qkv rows, in place (Gemma 4's q_norm alone, its
/// weightless v_norm as a weight of ones): each head as `cpu::rms_norm` over head_dim, within
/// rms_norm's tolerance; every other column comes back bit for bit.
#[test]
fn qkv_part_rms_norm_matches_cpu() {
    use weft::gpu::kernels::paged::QkvLayout;
    use weft::gpu::kernels::reduce::{QkvPart, qkv_part_rms_norm};
    let Some(f) = gpu() else { return };
    for (tokens, heads, kv_heads, hd) in [(1, 4, 1, 256), (5, 4, 2, 16), (3, 8, 1, 32)] {
        let layout = QkvLayout { num_heads: heads, num_kv_heads: kv_heads, head_dim: hd };
        let stride = layout.row_stride();
        let x = random(tokens * stride, hd as u64 + 3, 3.0);
        let w = random(hd, 25, 1.5);
        for (part, first, count) in
            [(QkvPart::Query, 0, heads), (QkvPart::Key, heads, kv_heads), (QkvPart::Value, heads + kv_heads, kv_heads)]
        {
            let xt = f.upload_f32(&[tokens, stride], &x).unwrap();
            let wt = f.upload_f32(&[hd], &w).unwrap();
            let mut rec = Recording::new();
            qkv_part_rms_norm(ctx(f), &mut rec, &xt, layout, part, &wt, 1e-6).unwrap();
            run(f, &rec);
            let got = read_f32(f, &xt);
            let mut want = x.clone();
            for t in 0..tokens {
                let cols = t * stride + first * hd..t * stride + (first + count) * hd;
                want[cols.clone()].copy_from_slice(&weft::cpu::rms_norm(&x[cols], &w, 1e-6));
            }
            let rel = 2.0 * (hd as f64 / 64.0 + 12.0) * U;
            let name = format!("{part:?} heads of {tokens}x{heads}+{kv_heads}x{hd}");
            assert_close(&name, &got, &want, |i| rel * f64::from(want[i].abs()) + 1e-30);
            let untouched = (0..got.len()).filter(|&i| {
                let c = i % stride;
                c < first * hd || c >= (first + count) * hd
            });
            assert!(untouched.into_iter().all(|i| got[i].to_bits() == x[i].to_bits()), "{name}: other columns changed");
        }
    }
    let layout = QkvLayout { num_heads: 2, num_kv_heads: 1, head_dim: 32 };
    let xt = f.zeros(&[2, 128], DType::F32).unwrap();
    let w = f.zeros(&[48], DType::F32).unwrap();
    let err = qkv_part_rms_norm(ctx(f), &mut Recording::new(), &xt, layout, QkvPart::Value, &w, 1e-6).unwrap_err();
    assert!(err.to_string().contains("weight must be F32 of shape [32]"), "{err}");
}
