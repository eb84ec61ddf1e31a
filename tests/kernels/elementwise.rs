//! silu_mul, gelu_mul, gelu_mul_at, softcap, scale and add against the CPU. Lengths straddle the 256-invocation
//! workgroup and, for add and scale, the 65535-workgroup fold into a second grid dimension.

use weft::DType;
use weft::gpu::Recording;
use weft::gpu::kernels::elementwise::{add, add_bias, gelu, gelu_mul, gelu_mul_at, scale, silu_mul, softcap};
use weft::tensor::TensorFactory;

use crate::common::*;

/// Tolerance: WGSL's exp is accurate to 3 + 2|x| ULP; with |x| <= 8 that is 19 ULP, followed by
/// an add, a divide and a multiply (one rounding each): 24·u relative.
#[test]
fn silu_mul_matches_cpu() {
    let Some(f) = gpu() else { return };
    for &(rows, cols) in &[(1, 1), (1, 255), (3, 257), (5, 1000)] {
        let gate = random(rows * cols, 1, 8.0);
        let up = random(rows * cols, 2, 2.0);
        // Gate and up side by side in each row, as the MLP's fused projection writes them.
        let gate_up: Vec<f32> = (0..rows)
            .flat_map(|r| gate[r * cols..(r + 1) * cols].iter().chain(&up[r * cols..(r + 1) * cols]).copied())
            .collect();
        let gu = f.upload_f32(&[rows, 2 * cols], &gate_up).unwrap();
        let o = f.zeros(&[rows, cols], DType::F32).unwrap();
        let mut rec = Recording::new();
        silu_mul(ctx(f), &mut rec, &gu, &o).unwrap();
        run(f, &rec);
        let want = weft::cpu::silu_mul(&gate, &up);
        assert_close(&format!("silu_mul {rows}x{cols}"), &read_f32(f, &o), &want, |i| {
            24.0 * U * f64::from(want[i].abs()) + 1e-30
        });
    }
}

/// Tolerance: WGSL's tanh is only bounded as sinh / cosh, i.e. through exp; with its argument
/// clamped to ±15 we allow 2⁻¹⁸ absolute error in tanh, which moves the output by at most
/// 0.5·|gate·up|·2⁻¹⁸; the polynomial, the products and the final multiply add 16·u relative.
/// Gates run to ±8, past where tanh saturates, and include the region near 0.
#[test]
fn gelu_mul_matches_cpu() {
    let Some(f) = gpu() else { return };
    for &(rows, cols) in &[(1, 1), (3, 257), (5, 1000)] {
        let gate = random(rows * cols, 11, 8.0);
        let up = random(rows * cols, 12, 2.0);
        let gate_up: Vec<f32> = (0..rows)
            .flat_map(|r| gate[r * cols..(r + 1) * cols].iter().chain(&up[r * cols..(r + 1) * cols]).copied())
            .collect();
        let gu = f.upload_f32(&[rows, 2 * cols], &gate_up).unwrap();
        let o = f.zeros(&[rows, cols], DType::F32).unwrap();
        let mut rec = Recording::new();
        gelu_mul(ctx(f), &mut rec, &gu, &o).unwrap();
        run(f, &rec);
        let want = weft::cpu::gelu_tanh_mul(&gate, &up);
        assert_close(&format!("gelu_mul {rows}x{cols}"), &read_f32(f, &o), &want, |i| {
            0.5 * f64::from((gate[i] * up[i]).abs()) / f64::from(1u32 << 18)
                + 16.0 * U * f64::from(want[i].abs())
                + 1e-30
        });
    }
    // A huge gate must not turn into NaN (tanh through an overflowing exp).
    let gu = f.upload_f32(&[1, 2], &[1e20, 1.0]).unwrap();
    let o = f.zeros(&[1, 1], DType::F32).unwrap();
    let mut rec = Recording::new();
    gelu_mul(ctx(f), &mut rec, &gu, &o).unwrap();
    run(f, &rec);
    assert_eq!(read_f32(f, &o), vec![1e20]);
}

/// Gemma 4's per-layer input gate, gelu_tanh(x) times a slice of wider rows, in place: the
/// tolerance of gelu_mul (the same shared formula); a slice past the rows is refused.
#[test]
fn gelu_mul_at_matches_cpu() {
    let Some(f) = gpu() else { return };
    for &(rows, cols, up_cols, up_col) in &[(1, 32, 96, 64), (3, 257, 600, 300), (5, 32, 32, 0)] {
        let gate = random(rows * cols, 13, 8.0);
        let up = random(rows * up_cols, 14, 2.0);
        let slice: Vec<f32> = (0..rows).flat_map(|r| up[r * up_cols + up_col..][..cols].iter().copied()).collect();
        let x = f.upload_f32(&[rows, cols], &gate).unwrap();
        let u = f.upload_f32(&[rows, up_cols], &up).unwrap();
        let mut rec = Recording::new();
        gelu_mul_at(ctx(f), &mut rec, &x, &u, up_col).unwrap();
        run(f, &rec);
        let want = weft::cpu::gelu_tanh_mul(&gate, &slice);
        assert_close(&format!("gelu_mul_at {rows}x{cols} at {up_col}"), &read_f32(f, &x), &want, |i| {
            0.5 * f64::from((gate[i] * slice[i]).abs()) / f64::from(1u32 << 18)
                + 16.0 * U * f64::from(want[i].abs())
                + 1e-30
        });
    }
    let x = f.zeros(&[2, 32], DType::F32).unwrap();
    let u = f.zeros(&[2, 64], DType::F32).unwrap();
    let err = gelu_mul_at(ctx(f), &mut Recording::new(), &x, &u, 40).unwrap_err();
    assert!(err.to_string().contains("columns 40..72"), "{err}");
}

/// cap · tanh(x / cap): tanh within 2⁻¹⁸ absolute (as gelu_mul allows, through exp), times
/// the cap, plus a few roundings; inputs far past the cap (and a huge one, which must not
/// become NaN) saturate at ±cap. A cap that is not positive is refused.
#[test]
fn softcap_matches_cpu() {
    let Some(f) = gpu() else { return };
    for (len, cap) in [(1, 30.0f32), (257, 5.0), (70000, 30.0)] {
        let x = random(len, len as u64 + 5, 4.0 * cap);
        let t = f.upload_f32(&[len], &x).unwrap();
        let mut rec = Recording::new();
        softcap(ctx(f), &mut rec, &t, cap).unwrap();
        run(f, &rec);
        let want = weft::cpu::softcap(&x, cap);
        assert_close(&format!("softcap {len} at {cap}"), &read_f32(f, &t), &want, |i| {
            f64::from(cap) / f64::from(1u32 << 18) + 8.0 * U * f64::from(want[i].abs()) + 1e-30
        });
    }
    let t = f.upload_f32(&[2], &[1e30, -1e30]).unwrap();
    let mut rec = Recording::new();
    softcap(ctx(f), &mut rec, &t, 30.0).unwrap();
    run(f, &rec);
    assert_eq!(read_f32(f, &t), vec![30.0, -30.0]);
    let err = softcap(ctx(f), &mut Recording::new(), &t, 0.0).unwrap_err();
    assert!(err.to_string().contains("must be positive"), "{err}");
}

/// The exact GELU from erf's 7.1.26 approximation (at most 1.5e-7 off), whose exp may err by a
/// few ULP on a GPU (8·u of its ≤ 1 product): erf is within 1.5e-7 + 8·u, which moves the
/// output by half that times |v|; the rest is 8·u relative. Inputs run to ±8, past where erf
/// saturates, and include the region near 0.
#[test]
fn gelu_matches_cpu() {
    let Some(f) = gpu() else { return };
    for len in [1, 257, 5000] {
        let x = random(len, len as u64, 8.0);
        let t = f.upload_f32(&[len], &x).unwrap();
        let mut rec = Recording::new();
        gelu(ctx(f), &mut rec, &t).unwrap();
        run(f, &rec);
        let want = weft::cpu::gelu(&x);
        assert_close(&format!("gelu of {len}"), &read_f32(f, &t), &want, |i| {
            0.5 * f64::from(x[i].abs()) * (1.5e-7 + 8.0 * U) + 8.0 * U * f64::from(want[i].abs()) + 1e-30
        });
    }
    let t = f.zeros(&[4], DType::U32).unwrap();
    assert!(gelu(ctx(f), &mut Recording::new(), &t).unwrap_err().to_string().contains("F32"));
}

/// One f32 product: the GPU matches the CPU bit for bit.
#[test]
fn scale_matches_cpu() {
    let Some(f) = gpu() else { return };
    for &len in &[3, 1000, 65535 * 256 + 300] {
        let a = random(len, 13, 1.0);
        let at = f.upload_f32(&[len], &a).unwrap();
        let mut rec = Recording::new();
        scale(ctx(f), &mut rec, &at, 25.298_221).unwrap();
        run(f, &rec);
        let want: Vec<f32> = a.iter().map(|x| x * 25.298_221).collect();
        assert!(read_f32(f, &at) == want, "scale len={len}");
    }
    let ids = f.zeros(&[4], DType::U32).unwrap();
    let err = scale(ctx(f), &mut Recording::new(), &ids, 2.0).unwrap_err();
    assert!(err.to_string().contains("x must be F32"), "{err}");
}

/// One f32 addition: exact up to one rounding, so the GPU must match the CPU's f32 sum bit for bit.
#[test]
fn add_matches_cpu() {
    let Some(f) = gpu() else { return };
    for &len in &[3, 256, 1000, 65535 * 256 + 300] {
        let a = random(len, 3, 1.0);
        let b = random(len, 4, 1.0);
        let (at, bt) = (f.upload_f32(&[len], &a).unwrap(), f.upload_f32(&[len], &b).unwrap());
        let mut rec = Recording::new();
        add(ctx(f), &mut rec, &at, &bt).unwrap();
        run(f, &rec);
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert!(read_f32(f, &at) == want, "add len={len} differs from the CPU sum");
    }
}

#[test]
fn add_bias_broadcasts_over_rows() {
    let Some(f) = gpu() else { return };
    let (rows, n) = (7, 67);
    let a = random(rows * n, 5, 1.0);
    let b = random(n, 6, 1.0);
    let (at, bt) = (f.upload_f32(&[rows, n], &a).unwrap(), f.upload_f32(&[n], &b).unwrap());
    let mut rec = Recording::new();
    add_bias(ctx(f), &mut rec, &at, &bt).unwrap();
    run(f, &rec);
    let want: Vec<f32> = a.iter().enumerate().map(|(i, x)| x + b[i % n]).collect();
    assert!(read_f32(f, &at) == want);
    let wrong = f.zeros(&[n + 1], DType::F32).unwrap();
    let err = add_bias(ctx(f), &mut Recording::new(), &at, &wrong).unwrap_err();
    assert!(err.to_string().contains("bias must be F32 of shape [67]"), "{err}");
}

#[test]
fn operands_of_different_shapes_are_errors() {
    let Some(f) = gpu() else { return };
    let a = f.zeros(&[4, 8], DType::F32).unwrap();
    let b = f.zeros(&[4, 9], DType::F32).unwrap();
    let err = add(ctx(f), &mut Recording::new(), &a, &b).unwrap_err();
    assert!(err.to_string().contains("delta must be F32 of shape [4, 8]"), "{err}");
}
