//! matmul against `cpu::matmul` for every weight format, every kernel setup (family, weight
//! and activation source) and shapes that are not multiples of the tiles, with more rows than
//! one uniform window holds.
//!
//! Tolerance: the GPU sums k products in f32 where the reference sums in f64. Decoding is exact
//! (an f16 scale times a small integer fits f32's mantissa; Q4_1 adds its offset with one
//! rounding), so the error is that of an f32 dot product: at most (k + 2)·u·Σ|x·w| by the
//! standard bound, checked with a factor 2 for the in-block partial sums.

use weft::DType;
use weft::gpu::kernels::elementwise::{gelu_mul, silu_mul};
use weft::gpu::kernels::matmul::{matmul, matmul_gated};
use weft::gpu::{CpuDriver, Epilogue, KernelFamily, Recording, matmul_tile};
use weft::tensor::TensorFactory;

use crate::common::*;

const SHAPES: &[(usize, usize, usize)] =
    &[(1, 64, 1), (1, 576, 100), (3, 96, 65), (17, 256, 130), (64, 128, 67), (70, 1536, 9)];

/// Shapes for the 256-element super-block formats: an odd number of super-blocks per row (so
/// the 2-byte-aligned formats start every other row mid-word), and more rows than one uniform
/// window holds.
const SUPER_BLOCK_SHAPES: &[(usize, usize, usize)] = &[(1, 256, 1), (3, 768, 65), (17, 256, 130), (70, 1536, 9)];

/// Every setup against the CPU, and every setup of a family bit-identical to the family's first:
/// a family folds each output in one fixed order, whatever the tile or source (each family in
/// its own order, so across families only the CPU bound holds).
fn check(dtype: DType) {
    let shapes = if dtype.block_elems() == 256 { SUPER_BLOCK_SHAPES } else { SHAPES };
    for (case, &(m, k, n)) in shapes.iter().enumerate() {
        let x = random(m * k, case as u64 + 1, 1.0);
        let (w_bytes, w) = weights(dtype, n * k, case as u64 + 100);
        let want = weft::cpu::matmul(&x, &w, m, k, n);
        let mut first: Vec<(KernelFamily, Vec<f32>)> = Vec::new();
        for setup in setups() {
            let Some(f) = setup.factory() else { continue };
            let xt = setup.x(f, &[m, k], &x);
            let wt = setup.weights(f, &[n, k], dtype, &w_bytes);
            let yt = f.zeros(&[m, n], DType::F32).unwrap();
            let mut rec = Recording::new();
            matmul(ctx(f), &mut rec, &xt, &wt, &yt).unwrap();
            run(f, &rec);
            let got = read_f32(f, &yt);
            let what = format!("{dtype} m={m} k={k} n={n}, {}", setup.name());
            assert_close(&what, &got, &want, |i| {
                let (r, c) = (i / n, i % n);
                let magnitude: f64 = (0..k).map(|p| f64::from(x[r * k + p] * w[c * k + p]).abs()).sum();
                2.0 * (k as f64 + 2.0) * U * magnitude + 1e-30
            });
            match first.iter().find(|(family, _)| *family == setup.family) {
                None => first.push((setup.family, got)),
                Some((_, first)) => assert!(
                    first.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: bits differ from the family's first setup"
                ),
            }
        }
    }
}

#[test]
fn f32_matches_cpu() {
    check(DType::F32);
}

#[test]
fn f16_matches_cpu() {
    check(DType::F16);
}

#[test]
fn bf16_matches_cpu() {
    check(DType::BF16);
}

#[test]
fn q8_0_matches_cpu() {
    check(DType::Q8_0);
}

#[test]
fn q4_0_matches_cpu() {
    check(DType::Q4_0);
}

#[test]
fn q4_1_matches_cpu() {
    check(DType::Q4_1);
}

#[test]
fn q5_0_matches_cpu() {
    check(DType::Q5_0);
}

#[test]
fn q5_1_matches_cpu() {
    check(DType::Q5_1);
}

#[test]
fn q2_k_matches_cpu() {
    check(DType::Q2_K);
}

#[test]
fn q3_k_matches_cpu() {
    check(DType::Q3_K);
}

#[test]
fn q4_k_matches_cpu() {
    check(DType::Q4_K);
}

#[test]
fn q5_k_matches_cpu() {
    check(DType::Q5_K);
}

#[test]
fn q6_k_matches_cpu() {
    check(DType::Q6_K);
}

#[test]
fn q8_k_matches_cpu() {
    check(DType::Q8_K);
}

#[test]
fn iq4_nl_matches_cpu() {
    check(DType::IQ4_NL);
}

#[test]
fn iq4_xs_matches_cpu() {
    check(DType::IQ4_XS);
}

#[test]
fn mxfp4_matches_cpu() {
    check(DType::MXFP4);
}

#[test]
fn iq2_xs_matches_cpu() {
    check(DType::IQ2_XS);
}

#[test]
fn iq3_xxs_matches_cpu() {
    check(DType::IQ3_XXS);
}

#[test]
fn iq3_s_matches_cpu() {
    check(DType::IQ3_S);
}

#[test]
fn iq2_s_matches_cpu() {
    check(DType::IQ2_S);
}

#[test]
fn k_must_be_whole_blocks() {
    let Some(f) = gpu() else { return };
    let x = f.zeros(&[2, 45], DType::F32).unwrap();
    let w = f.zeros(&[8, 45], DType::F32).unwrap();
    let y = f.zeros(&[2, 8], DType::F32).unwrap();
    let err = matmul(ctx(f), &mut Recording::new(), &x, &w, &y).unwrap_err();
    assert!(err.to_string().contains("k = 45") && err.to_string().contains("multiple of 32"), "{err}");
}

#[test]
fn mismatched_shapes_are_errors() {
    let Some(f) = gpu() else { return };
    let x = f.zeros(&[2, 64], DType::F32).unwrap();
    let w = f.zeros(&[8, 32], DType::Q8_0).unwrap();
    let y = f.zeros(&[2, 8], DType::F32).unwrap();
    let err = matmul(ctx(f), &mut Recording::new(), &x, &w, &y).unwrap_err();
    assert!(err.to_string().contains("x must be F32 of shape [_, 32]"), "{err}");
    let w = f.zeros(&[8, 64], DType::Q8_0).unwrap();
    let y = f.zeros(&[3, 8], DType::F32).unwrap();
    let err = matmul(ctx(f), &mut Recording::new(), &x, &w, &y).unwrap_err();
    assert!(err.to_string().contains("y must be F32 of shape [2, 8]"), "{err}");
}

#[test]
fn quantized_rows_must_be_whole_blocks() {
    let Some(f) = gpu() else { return };
    let err = f.zeros(&[4, 48], DType::Q4_0).unwrap_err();
    assert!(err.to_string().contains("blocks of 32"), "{err}");
    let err = f.zeros(&[4, 288], DType::Q6_K).unwrap_err();
    assert!(err.to_string().contains("Q6_K stores blocks of 256"), "{err}");
}

/// A tall matrix shaped like an LM head (few columns, many rows) against the CPU in every
/// setup, and each row bit-identical alone and in a batch.
#[test]
fn a_tall_matrix_matches_cpu_and_rows_do_not_depend_on_the_batch() {
    let (m, k, n) = (13, 576, 300);
    for dtype in [DType::Q8_0, DType::Q4_1, DType::F16] {
        let x = random(m * k, 31, 1.0);
        let (w_bytes, w) = weights(dtype, n * k, 32);
        let want = weft::cpu::matmul(&x, &w, m, k, n);
        for setup in setups() {
            let Some(f) = setup.factory() else { continue };
            let wt = setup.weights(f, &[n, k], dtype, &w_bytes);
            let run_rows = |x: &[f32], rows: usize| {
                let xt = setup.x(f, &[rows, k], x);
                let yt = f.zeros(&[rows, n], DType::F32).unwrap();
                let mut rec = Recording::new();
                matmul(ctx(f), &mut rec, &xt, &wt, &yt).unwrap();
                run(f, &rec);
                read_f32(f, &yt)
            };
            let got = run_rows(&x, m);
            let what = format!("tall {dtype}, {}", setup.name());
            assert_close(&what, &got, &want, |i| {
                let (r, c) = (i / n, i % n);
                let magnitude: f64 = (0..k).map(|p| f64::from(x[r * k + p] * w[c * k + p]).abs()).sum();
                2.0 * (k as f64 + 2.0) * U * magnitude + 1e-30
            });
            for r in [0, 1, 2, 5, 12] {
                let alone = run_rows(&x[r * k..(r + 1) * k], 1);
                let same = alone.iter().zip(&got[r * n..(r + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{what}: row {r} differs alone vs in a batch of {m}");
            }
            // Batches of 1, 4 and 13 rows take different tiles.
            let four = run_rows(&x[..4 * k], 4);
            let same = four.iter().zip(&got[..4 * n]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{what}: rows differ in a batch of 4 vs {m}");
        }
    }
}

/// The CPU family's tile fits a narrow output to the driver's threads and keeps 16 weight rows
/// per lane where workgroups are plentiful (the default model's shapes, at 16 lanes).
#[test]
fn the_cpu_tile_fits_the_output_to_the_threads() {
    let tile = |m, n, epilogue, threads| {
        matmul_tile(m, n, usize::MAX, epilogue, CpuDriver { lanes: 16, threads: Some(threads) })
    };
    let none = Epilogue::None;
    // Attention's output (576 wide): 2 workgroups of 18 rows on 2 threads, not 3 of 16;
    // 3 of 12 on 4; 5 of 8 on 16.
    assert_eq!(tile(1, 576, none, 2), [16, 18, 1]);
    assert_eq!(tile(24, 576, none, 2), [16, 18, 8]);
    assert_eq!(tile(1, 576, none, 4), [16, 12, 1]);
    assert_eq!(tile(1, 576, none, 16), [16, 8, 1]);
    // Q, K and V (960), the gated MLP (1536 outputs, two weight rows each), the LM head.
    assert_eq!(tile(16, 960, none, 2), [16, 16, 8]);
    assert_eq!(tile(16, 1536, Epilogue::SiluMul, 2), [16, 8, 8]);
    assert_eq!(tile(1, 49152, none, 2), [16, 16, 1]);
    assert_eq!(tile(1, 49152, none, 16), [16, 16, 1]);
    // m picks the tile only through rows per lane (1, 4 or 8), so the engine's warm-up of
    // one batch size each compiles every tile serving dispatches.
    for (n, threads) in [(576, 2), (960, 2), (576, 4), (300, 16)] {
        for (m, like) in [(2, 1), (5, 4), (7, 4), (9, 8), (16, 8), (100, 8)] {
            assert_eq!(tile(m, n, none, threads), tile(like, n, none, threads), "m = {m}, n = {n}");
        }
    }
    // A uniform window of 10 rows (k = 1536) takes 8 rows a dispatch: one workgroup down.
    let windowed = matmul_tile(64, 576, 10, none, CpuDriver { lanes: 16, threads: Some(2) });
    assert_eq!(windowed, [16, 18, 8]);
}

/// In a browser (the driver's threads unknown) the CPU tile is one of few, each compiled at
/// load: 8 weight rows per lane at every width (4 outputs of 2 rows, gated), at most 4 rows of x.
#[test]
fn the_browser_cpu_tile_is_one_of_few() {
    let tile = |m, n, epilogue| matmul_tile(m, n, usize::MAX, epilogue, CpuDriver { lanes: 8, threads: None });
    let none = Epilogue::None;
    assert_eq!(tile(1, 576, none), [8, 8, 1]);
    assert_eq!(tile(4, 576, none), [8, 8, 4]);
    assert_eq!(tile(100, 576, none), [8, 8, 4]);
    assert_eq!(tile(1, 192, none), [8, 8, 1]);
    assert_eq!(tile(16, 64, none), [8, 8, 4]);
    assert_eq!(tile(16, 1536, Epilogue::SiluMul), [8, 4, 4]);
    assert_eq!(tile(1, 256, Epilogue::GeluMul), [8, 4, 1]);
    assert_eq!(tile(1, 49152, none), [8, 8, 1]);
    assert_eq!(tile(1, 49152, none), tile(1, 64, none), "one width whatever the output's");
}

/// Every width of the CPU tile against the CPU, and bit-identical to every other: devices
/// sized for 1 to 16 driver threads pick every width for these shapes.
#[test]
fn every_cpu_tile_width_matches_cpu() {
    let k = 256;
    let mut widths = std::collections::BTreeSet::new();
    let mut first: Vec<((usize, usize), Vec<f32>)> = Vec::new();
    for threads in [1, 2, 4, 16] {
        let Some(f) = gpu_with_cpu_threads(threads) else { return };
        for (case, &(m, n)) in [(1, 576), (3, 300), (9, 576), (2, 2000)].iter().enumerate() {
            let x = random(m * k, case as u64 + 60, 1.0);
            let (w_bytes, w) = weights(DType::Q4_1, n * k, case as u64 + 70);
            let want = weft::cpu::matmul(&x, &w, m, k, n);
            let (xt, wt) =
                (f.upload_activations(&[m, k], &x).unwrap(), f.upload_weight(&[n, k], DType::Q4_1, &w_bytes).unwrap());
            let yt = f.zeros(&[m, n], DType::F32).unwrap();
            let mut rec = Recording::new();
            matmul(ctx(&f), &mut rec, &xt, &wt, &yt).unwrap();
            run(&f, &rec);
            let got = read_f32(&f, &yt);
            let tile = matmul_tile(m, n, usize::MAX, Epilogue::None, ctx(&f).cpu_driver());
            widths.insert(tile[1]);
            let what = format!("m={m} n={n} on {threads} threads, tile {tile:?}");
            assert_close(&what, &got, &want, |i| {
                let (r, c) = (i / n, i % n);
                let magnitude: f64 = (0..k).map(|p| f64::from(x[r * k + p] * w[c * k + p]).abs()).sum();
                2.0 * (k as f64 + 2.0) * U * magnitude + 1e-30
            });
            match first.iter().find(|(shape, _)| *shape == (m, n)) {
                None => first.push(((m, n), got)),
                Some((_, first)) => {
                    assert!(first.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: bits differ")
                }
            }
        }
    }
    assert_eq!(widths.into_iter().collect::<Vec<_>>(), [8, 12, 16, 18], "widths reached");
}

/// The gated matmul (an MLP's gate and up projections with its SwiGLU or GeGLU applied as the
/// sums are written) gives bit for bit what the matmul into (m, 2n) followed by `silu_mul` /
/// `gelu_mul` gives, in every setup of every family, at each tile's batch sizes; the baseline
/// family refuses it from its tiled matmul's 32 rows, and every family refuses a weight split
/// over parts and a gate of `Epilogue::None`.
#[test]
fn the_gated_matmul_equals_matmul_then_the_gate() {
    let (k, n) = (256, 70);
    for dtype in [DType::Q8_0, DType::Q4_1, DType::Q4_K, DType::F16] {
        let (w_bytes, _) = weights(dtype, 2 * n * k, 41);
        for (m, epilogue) in
            [(1, Epilogue::SiluMul), (3, Epilogue::GeluMul), (8, Epilogue::SiluMul), (17, Epilogue::GeluMul)]
        {
            let x = random(m * k, m as u64 + 40, 1.0);
            for setup in setups() {
                let Some(f) = setup.factory() else { continue };
                let (xt, wt) = (setup.x(f, &[m, k], &x), setup.weights(f, &[2 * n, k], dtype, &w_bytes));
                let (gate_up, want, got) = (
                    f.zeros(&[m, 2 * n], DType::F32).unwrap(),
                    f.zeros(&[m, n], DType::F32).unwrap(),
                    f.zeros(&[m, n], DType::F32).unwrap(),
                );
                let mut rec = Recording::new();
                matmul(ctx(f), &mut rec, &xt, &wt, &gate_up).unwrap();
                match epilogue {
                    Epilogue::SiluMul => silu_mul(ctx(f), &mut rec, &gate_up, &want).unwrap(),
                    _ => gelu_mul(ctx(f), &mut rec, &gate_up, &want).unwrap(),
                }
                matmul_gated(ctx(f), &mut rec, &xt, &wt, &got, epilogue).unwrap();
                run(f, &rec);
                let (want, got) = (read_f32(f, &want), read_f32(f, &got));
                assert!(got.iter().any(|v| *v != 0.0), "{dtype} m={m}: nothing written");
                let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{dtype} m={m} {epilogue:?}, {}: the gated matmul differs from matmul then the gate",
                    setup.name()
                );
            }
        }
    }
    if let Some(f) = gpu_with_family(KernelFamily::Baseline) {
        let m = ctx(f).plan().gemm_min_rows;
        let (x, w, y) = (
            f.upload_f32(&[m, k], &vec![0.5; m * k]).unwrap(),
            f.upload_weight(&[2 * n, k], DType::F32, &vec![0; 2 * n * k * 4]).unwrap(),
            f.zeros(&[m, n], DType::F32).unwrap(),
        );
        let err = matmul_gated(ctx(f), &mut Recording::new(), &x, &w, &y, Epilogue::SiluMul).unwrap_err().to_string();
        assert!(err.contains(&format!("baseline kernel family gates {m} rows")) && err.contains("silu_mul"), "{err}");
        let err = matmul_gated(ctx(f), &mut Recording::new(), &x, &w, &y, Epilogue::None).unwrap_err().to_string();
        assert!(err.contains("needs a gate"), "{err}");
    }
    // 1.2 MB of weights over bindings of 1 MiB: two parts.
    let wide = 600;
    if let Some(f) = gpu_with_tiny_bindings().filter(|f| ctx(f).kernel_family() == KernelFamily::Cpu) {
        let (x, y) = (f.upload_f32(&[1, k], &vec![0.5; k]).unwrap(), f.zeros(&[1, wide], DType::F32).unwrap());
        let w = f.upload_weight(&[2 * wide, k], DType::F32, &vec![0; 2 * wide * k * 4]).unwrap();
        assert!(w.parts().len() > 1);
        let err = matmul_gated(ctx(f), &mut Recording::new(), &x, &w, &y, Epilogue::SiluMul).unwrap_err().to_string();
        assert!(err.contains("w must be one part of gate rows then up rows"), "{err}");
    }
}

/// The GPU families' two matmuls, row-parallel (decode) and tiled (prefill), each forced at every
/// batch size: every format at M = 1, 7, 64 and 512 against the CPU (the bound of `check`), and
/// the two bit-identical, so that the batch size from which a family tiles (a per-adapter
/// table) changes no bits (DESIGN.md principle 3). n = 40 ends in part tiles of both kernels;
/// k = 4 row chunks of the baseline (k = 2 super-blocks).
#[test]
fn gemv_and_gemm_match_the_cpu_and_each_other_at_every_batch_size() {
    for dtype in DType::WEIGHTS {
        let (k, n) = (if dtype.block_elems() == 256 { 512 } else { 128 }, 40);
        let (w_bytes, w) = weights(dtype, n * k, 77);
        for m in [1, 7, 64, 512] {
            let x = random(m * k, m as u64 + 78, 1.0);
            let want = weft::cpu::matmul(&x, &w, m, k, n);
            for family in [KernelFamily::Baseline, KernelFamily::Subgroup] {
                let mut got = Vec::new();
                for kind in [MatmulKind::Gemv, MatmulKind::Gemm] {
                    let Some(f) = gpu_with_matmul(family, kind) else { return };
                    let (xt, wt) = (f.upload_f32(&[m, k], &x).unwrap(), f.upload(&[n, k], dtype, &w_bytes).unwrap());
                    let yt = f.zeros(&[m, n], DType::F32).unwrap();
                    let mut rec = Recording::new();
                    matmul(ctx(f), &mut rec, &xt, &wt, &yt).unwrap();
                    run(f, &rec);
                    let y = read_f32(f, &yt);
                    assert_close(&format!("{dtype} m={m} {family:?} {kind:?}"), &y, &want, |i| {
                        let (r, c) = (i / n, i % n);
                        let magnitude: f64 = (0..k).map(|p| f64::from(x[r * k + p] * w[c * k + p]).abs()).sum();
                        2.0 * (k as f64 + 2.0) * U * magnitude + 1e-30
                    });
                    got.push(y);
                }
                let same = got[0].iter().zip(&got[1]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{dtype} m={m} {family:?}: the tiled matmul's bits differ from the row-parallel one's");
            }
        }
    }
}
