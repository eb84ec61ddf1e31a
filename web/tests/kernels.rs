//! The kernels a Llama step uses, on the browser's WebGPU against the plain CPU references: a
//! browser compiles WGSL with its own compiler (Tint) and runs it with its own robustness rules,
//! so each kernel is checked here too, on one shape that is not a multiple of its workgroup.
//!
//! Tolerance: 1e-4 relative to the largest |value| of the reference. The native tests in
//! tests/kernels/ hold each kernel to its derived f32 bound (a few hundred ulp at these sizes,
//! under 1e-4); this catches a wrongly compiled kernel, whose errors are of order one.
#![cfg(target_arch = "wasm32")]

use wasm_bindgen_test::*;
use weft::DType;
use weft::gpu::kernels::elementwise::{add, silu_mul};
use weft::gpu::kernels::embedding::embedding;
use weft::gpu::kernels::matmul::matmul;
use weft::gpu::kernels::reduce::{rms_norm, softmax};
use weft::gpu::{GpuContext, GpuOptions, GpuTensor, GpuTensorFactory, Recording};
use weft::model::tiny::random_values;
use weft::tensor::TensorFactory;

wasm_bindgen_test_configure!(run_in_dedicated_worker);

async fn factory() -> GpuTensorFactory {
    GpuTensorFactory::new(GpuContext::new(GpuOptions::default()).await.unwrap())
}

async fn run_and_read(f: &GpuTensorFactory, rec: &Recording, out: &GpuTensor) -> Vec<f32> {
    f.context().submit(rec).await.unwrap();
    f.download_f32(out).await.unwrap()
}

fn check(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (i, worst) = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold((0, 0f32), |m, (i, e)| if e > m.1 { (i, e) } else { m });
    assert!(worst <= 1e-4 * scale, "{what}: element {i}: gpu {} vs cpu {} (max |ref| {scale})", got[i], want[i]);
}

#[wasm_bindgen_test]
async fn matmul_in_every_weight_format() {
    let f = factory().await;
    for dtype in DType::WEIGHTS {
        // The super-block formats need rows of whole 256-element blocks (an odd number of them
        // starts every other row of the 2-byte-aligned ones mid-word).
        let shapes: &[(usize, usize, usize)] =
            if dtype.block_elems() == 256 { &[(1, 256, 67), (5, 768, 13)] } else { &[(1, 64, 67), (5, 96, 130)] };
        for &(m, k, n) in shapes {
            check_matmul(&f, dtype, m, k, n).await;
        }
    }
}

/// `matmul` of random (m, k) x and (n, k) weights in `dtype` against `cpu::matmul`.
async fn check_matmul(f: &GpuTensorFactory, dtype: DType, m: usize, k: usize, n: usize) {
    let x = random_values(m * k, 1, 1.0);
    let w_bytes = weft::quant::quantize(dtype, &random_values(n * k, 2, 1.0)).unwrap();
    let w = weft::quant::dequantize(dtype, &w_bytes).unwrap();
    let (xt, wt, yt) = (
        f.upload_f32(&[m, k], &x).unwrap(),
        f.upload(&[n, k], dtype, &w_bytes).unwrap(),
        f.zeros(&[m, n], DType::F32).unwrap(),
    );
    let mut rec = Recording::new();
    matmul(f.context(), &mut rec, &xt, &wt, &yt).unwrap();
    let what = format!("matmul {dtype} m={m} k={k} n={n}");
    check(&what, &run_and_read(f, &rec, &yt).await, &weft::cpu::matmul(&x, &w, m, k, n));
}

#[wasm_bindgen_test]
async fn embedding_in_every_weight_format() {
    let f = factory().await;
    let rows = 50usize;
    let ids: Vec<u32> = vec![3, 49, 0, 17, 3];
    for dtype in DType::WEIGHTS {
        let k = dtype.block_elems().max(64);
        let bytes = weft::quant::quantize(dtype, &random_values(rows * k, 3, 1.0)).unwrap();
        let table = weft::quant::dequantize(dtype, &bytes).unwrap();
        let (tt, it, ot) = (
            f.upload(&[rows, k], dtype, &bytes).unwrap(),
            f.upload_u32(&[ids.len()], &ids).unwrap(),
            f.zeros(&[ids.len(), k], DType::F32).unwrap(),
        );
        let mut rec = Recording::new();
        embedding(f.context(), &mut rec, &tt, &it, &ot).unwrap();
        check(
            &format!("embedding {dtype}"),
            &run_and_read(&f, &rec, &ot).await,
            &weft::cpu::embedding(&table, k, &ids),
        );
    }
}

#[wasm_bindgen_test]
async fn norms_and_elementwise() {
    let f = factory().await;
    let (rows, n) = (3usize, 576usize);
    let x = random_values(rows * n, 4, 3.0);
    let w = random_values(n, 5, 1.5);
    let (xt, wt, yt) = (
        f.upload_f32(&[rows, n], &x).unwrap(),
        f.upload_f32(&[n], &w).unwrap(),
        f.zeros(&[rows, n], DType::F32).unwrap(),
    );
    let mut rec = Recording::new();
    rms_norm(f.context(), &mut rec, &xt, &wt, &yt, 1e-5).unwrap();
    check("rms_norm", &run_and_read(&f, &rec, &yt).await, &weft::cpu::rms_norm(&x, &w, 1e-5));

    let mut rec = Recording::new();
    softmax(f.context(), &mut rec, &xt).unwrap();
    check("softmax", &run_and_read(&f, &rec, &xt).await, &weft::cpu::softmax(&x, n));

    let (gate, up) = (random_values(1000, 6, 4.0), random_values(1000, 7, 2.0));
    // Four rows of 250: gate and up side by side in each row, as the fused projection writes them.
    let gate_up: Vec<f32> =
        (0..4).flat_map(|r| gate[r * 250..(r + 1) * 250].iter().chain(&up[r * 250..(r + 1) * 250]).copied()).collect();
    let (gu, o) = (f.upload_f32(&[4, 500], &gate_up).unwrap(), f.zeros(&[4, 250], DType::F32).unwrap());
    let mut rec = Recording::new();
    silu_mul(f.context(), &mut rec, &gu, &o).unwrap();
    check("silu_mul", &run_and_read(&f, &rec, &o).await, &weft::cpu::silu_mul(&gate, &up));
    let (g, u) = (f.upload_f32(&[1000], &gate).unwrap(), f.upload_f32(&[1000], &up).unwrap());

    let mut rec = Recording::new();
    add(f.context(), &mut rec, &g, &u).unwrap();
    let want: Vec<f32> = gate.iter().zip(&up).map(|(a, b)| a + b).collect();
    check("add", &run_and_read(&f, &rec, &g).await, &want);
}

/// The chunked (SSD) scan of Mamba2 layers against the CPU's token-by-token recurrence: one
/// sequence of three chunks of 4 rows from position 0, then its state continued by a second
/// dispatch of one chunk. Tolerance as above (the native test derives 1e-4 of |y| + 1).
#[wasm_bindgen_test]
async fn ssd_scan_matches_the_recurrence() {
    use weft::gpu::kernels::ssm::{NO_SLOT, SEQ_STATE_COLS, ScanShape, ScanWeights, SeqStates, SsdChunks, SsdScratch};
    let f = factory().await;
    let shape = ScanShape { num_heads: 4, head_dim: 8, state_size: 16, num_groups: 2 };
    let dims = weft::cpu::ssm::ScanDims { num_heads: 4, head_dim: 8, state_size: 16, num_groups: 2 };
    let (q, inner, width, state_len) = (4usize, 32usize, 32 + 2 * 2 * 16, 32 * 16);
    let a: Vec<f32> = random_values(4, 31, 1.0).iter().map(|v| -(v.abs() + 0.2)).collect();
    let (d, bias) = (random_values(4, 32, 1.0), random_values(4, 33, 1.0));
    let (at, dt_, bt) =
        (f.upload_f32(&[4], &a).unwrap(), f.upload_f32(&[4], &d).unwrap(), f.upload_f32(&[4], &bias).unwrap());
    let w = ScanWeights { a: &at, d: &dt_, dt_bias: &bt };
    let state = f.zeros(&[1, 4, 8, 16], DType::F32).unwrap();
    let scratch = SsdScratch::new(&f, shape, 3, q).unwrap();
    let mut cpu_state = vec![0.0; state_len];
    for (rows, start) in [(3 * q, 0), (q, 3 * q)] {
        let xbc = random_values(rows * width, 40 + start as u64, 1.0);
        let raw = random_values(rows * 4, 50 + start as u64, 3.0);
        let (xt, rt, yt) = (
            f.upload_f32(&[rows, width], &xbc).unwrap(),
            f.upload_f32(&[rows, 4], &raw).unwrap(),
            f.zeros(&[rows, inner], DType::F32).unwrap(),
        );
        let firsts: Vec<u32> = (0..rows / q).map(|c| (c * q) as u32).collect();
        let chunks_t = f.upload_u32(&[firsts.len()], &firsts).unwrap();
        let runs_t =
            f.upload_u32(&[1, SEQ_STATE_COLS], &[0, firsts.len() as u32, 0, start as u32, 0, NO_SLOT]).unwrap();
        let chunks = SsdChunks {
            chunks: &chunks_t,
            num_chunks: firsts.len(),
            rows_per_chunk: q,
            runs: SeqStates { seqs: &runs_t, num_seqs: 1 },
        };
        let mut rec = Recording::new();
        weft::gpu::kernels::ssm::ssd_scan(
            f.context(),
            &mut rec,
            shape,
            &xt,
            &rt,
            0,
            &w,
            &chunks,
            &scratch,
            &state,
            &yt,
        )
        .unwrap();
        let got = run_and_read(&f, &rec, &yt).await;
        let want = weft::cpu::ssm::ssm_scan(dims, &xbc, &raw, &a, &d, &bias, &mut cpu_state);
        check(&format!("ssd_scan rows {start}.."), &got, &want);
        check("ssd_scan state", &f.download_f32(&state).await.unwrap(), &cpu_state);
    }
}

/// The baseline family, which a browser on a real GPU runs (this fallback adapter runs the CPU
/// family): Tint accepts every one of its variants, and its workgroup-tiled matmul (40 rows,
/// past the plan's `gemm_min_rows`) compiles and matches the CPU.
#[wasm_bindgen_test]
async fn the_baseline_family_compiles_and_its_tiled_matmul_matches() {
    use weft::gpu::KernelFamily;
    let options = GpuOptions { kernels: Some(KernelFamily::Baseline), ..Default::default() };
    let f = GpuTensorFactory::new(GpuContext::new(options).await.unwrap());
    let n = f.context().check_shaders(&weft::quant::DType::WEIGHTS).await.unwrap();
    assert!(f.context().own_shader_variants().iter().any(|v| v.kernel == "matmul_tiled"), "{n} variants");
    let (m, k, n) = (40usize, 96usize, 70usize);
    assert!(m >= f.context().plan().gemm_min_rows);
    for dtype in [DType::Q4_1, DType::Q8_0, DType::F16] {
        check_matmul(&f, dtype, m, k, n).await;
    }
}

/// The browser's WGSL compiler (Tint), which rejects some things naga accepts (uniformity,
/// literal ranges), accepts every shader variant. (Compiling each into a pipeline would take
/// SwiftShader about half a second a variant; the tests above compile the ones they run.)
#[wasm_bindgen_test]
async fn tint_accepts_every_shader() {
    let f = factory().await;
    let t0 = js_sys::Date::now();
    let n = f.context().check_shaders(&weft::quant::DType::WEIGHTS).await.unwrap();
    assert!(n >= 15, "only {n} variants");
    wasm_bindgen_test::console_log!("{n} shader variants checked in {:.0} ms", js_sys::Date::now() - t0);
}
