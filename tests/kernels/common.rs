//! Shared helpers: one device per test binary, seeded random data, tolerance checks.

use std::sync::{Arc, OnceLock};

use weft::DType;
use weft::gpu::{GpuContext, GpuOptions, GpuTensor, GpuTensorFactory, KernelFamily};
use weft::tensor::TensorFactory;

/// Unit roundoff of f32.
pub const U: f64 = 1.0 / (1u64 << 24) as f64;

fn open(options: GpuOptions) -> Option<GpuTensorFactory> {
    weft::gpu::open_or_skip(options).unwrap().map(GpuTensorFactory::new)
}

/// The device all tests share, or `None` (test skipped) where there is no adapter.
pub fn gpu() -> Option<&'static GpuTensorFactory> {
    static GPU: OnceLock<Option<GpuTensorFactory>> = OnceLock::new();
    GPU.get_or_init(|| open(GpuOptions::default())).as_ref()
}

/// A second device whose storage bindings are capped at 1 MiB, so modest tensors split.
pub fn gpu_with_tiny_bindings() -> Option<&'static GpuTensorFactory> {
    static GPU: OnceLock<Option<GpuTensorFactory>> = OnceLock::new();
    GPU.get_or_init(|| open(GpuOptions { max_binding_bytes: Some(1 << 20), ..Default::default() })).as_ref()
}

/// A device whose kernel family is forced (each family is tested on lavapipe).
pub fn gpu_with_family(family: KernelFamily) -> Option<&'static GpuTensorFactory> {
    static BASELINE: OnceLock<Option<GpuTensorFactory>> = OnceLock::new();
    static CPU: OnceLock<Option<GpuTensorFactory>> = OnceLock::new();
    static SUBGROUP: OnceLock<Option<GpuTensorFactory>> = OnceLock::new();
    let cell = match family {
        KernelFamily::Baseline => &BASELINE,
        KernelFamily::Cpu => &CPU,
        KernelFamily::Subgroup => &SUBGROUP,
    };
    cell.get_or_init(|| open(GpuOptions { kernels: Some(family), ..Default::default() })).as_ref()
}

/// Which of a GPU family's two matmuls a device runs at every batch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKind {
    /// Row-parallel (matmul_rows, matmul_subgroup's GEMV tiles), as for decode.
    Gemv,
    /// Tiled (matmul_tiled, matmul_subgroup's GEMM tile), as for prefill.
    Gemm,
}

/// A device of `family` (baseline or subgroup) whose matmuls all run as `kind`, whatever M.
pub fn gpu_with_matmul(family: KernelFamily, kind: MatmulKind) -> Option<&'static GpuTensorFactory> {
    static DEVICES: [OnceLock<Option<GpuTensorFactory>>; 4] = [const { OnceLock::new() }; 4];
    let i = usize::from(family == KernelFamily::Subgroup) * 2 + usize::from(kind == MatmulKind::Gemm);
    let gemm_min_rows = if kind == MatmulKind::Gemm { 1 } else { usize::MAX };
    DEVICES[i]
        .get_or_init(|| {
            open(GpuOptions { kernels: Some(family), gemm_min_rows: Some(gemm_min_rows), ..Default::default() })
        })
        .as_ref()
}

/// A CPU-family device whose matmul tiles are sized for `threads` driver threads (its own
/// device: every call opens one).
pub fn gpu_with_cpu_threads(threads: usize) -> Option<GpuTensorFactory> {
    open(GpuOptions { kernels: Some(KernelFamily::Cpu), cpu_threads: Some(threads), ..Default::default() })
}

/// One way a weight kernel can run: a kernel family, weights in a texture or a buffer, and (for
/// matmul) activations read through uniform windows or from a storage buffer.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    pub family: KernelFamily,
    pub texture_weights: bool,
    pub window_x: bool,
}

impl Setup {
    pub fn factory(&self) -> Option<&'static GpuTensorFactory> {
        gpu_with_family(self.family)
    }

    pub fn name(&self) -> String {
        let w = if self.texture_weights { "texture" } else { "buffer" };
        let x = if self.window_x { "windows" } else { "storage" };
        format!("{} kernels, weights in a {w}, x from {x}", self.family.name())
    }

    pub fn weights(&self, f: &GpuTensorFactory, shape: &[usize], dtype: DType, bytes: &[u8]) -> GpuTensor {
        let t = if self.texture_weights { f.upload_weight(shape, dtype, bytes) } else { f.upload(shape, dtype, bytes) };
        let t = t.unwrap();
        assert!(t.parts().iter().all(|p| p.in_texture() == self.texture_weights), "{}", self.name());
        t
    }

    pub fn x(&self, f: &GpuTensorFactory, shape: &[usize], values: &[f32]) -> GpuTensor {
        if self.window_x { f.upload_activations(shape, values) } else { f.upload_f32(shape, values) }.unwrap()
    }
}

/// Every setup the library dispatches: the baseline (buffers only), the CPU-driver family with
/// each combination of weight and activation source, and the subgroup family (buffers only).
/// Each family's matmuls sum an output in a fixed order of their own: compare bits within a
/// family only.
pub fn setups() -> Vec<Setup> {
    let mut out = vec![Setup { family: KernelFamily::Baseline, texture_weights: false, window_x: false }];
    for texture_weights in [false, true] {
        for window_x in [false, true] {
            out.push(Setup { family: KernelFamily::Cpu, texture_weights, window_x });
        }
    }
    out.push(Setup { family: KernelFamily::Subgroup, texture_weights: false, window_x: false });
    out
}

pub fn ctx(f: &GpuTensorFactory) -> &Arc<GpuContext> {
    f.context()
}

/// Deterministic pseudo-random values in [-scale, scale) (xorshift; tests need no rand crate).
pub fn random(len: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Weights as the GPU will see them: the encoded bytes and their exact f32 decoding.
pub fn weights(dtype: DType, len: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let bytes = weft::quant::quantize(dtype, &random(len, seed, 1.0)).unwrap();
    let decoded = weft::quant::dequantize(dtype, &bytes).unwrap();
    (bytes, decoded)
}

/// Byte offsets of the f16 scale fields of each block format (ggml-common.h); Q8_K's f32 scale
/// and MXFP4's E8M0 exponent are at 0.
fn scale_fields(dtype: DType) -> &'static [usize] {
    match dtype {
        DType::Q4_0
        | DType::Q5_0
        | DType::Q8_0
        | DType::IQ4_NL
        | DType::IQ4_XS
        | DType::IQ2_XS
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ2_S => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::Q6_K => &[208],
        _ => &[],
    }
}

/// Random but valid blocks of a quantized format and their CPU decoding: random bytes, except
/// that every scale field holds a finite value of a sane size. Every other bit pattern (codes,
/// packed sub-block scales and mins) is valid, so these cover layouts an encoder never emits.
pub fn random_blocks(dtype: DType, len: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let num_blocks = len / dtype.block_elems();
    let noise = random(num_blocks * dtype.block_bytes(), seed, 1.0);
    let mut bytes: Vec<u8> = noise.iter().map(|v| (v.to_bits() >> 7) as u8).collect();
    let scales = random(num_blocks * 2, seed + 1, 0.1);
    for (b, block) in bytes.chunks_exact_mut(dtype.block_bytes()).enumerate() {
        if dtype == DType::Q8_K {
            block[..4].copy_from_slice(&scales[2 * b].to_le_bytes());
        }
        if dtype == DType::MXFP4 {
            // An E8M0 exponent: a scale of 2^-14 .. 2^-2, as the f16 scales above.
            block[0] = 114 + (block[0] % 13);
        }
        for (f, &at) in scale_fields(dtype).iter().enumerate() {
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(scales[2 * b + f]).to_le_bytes());
        }
    }
    let decoded = weft::quant::dequantize(dtype, &bytes).unwrap();
    assert!(decoded.iter().all(|v| v.is_finite()), "{dtype}");
    (bytes, decoded)
}

/// Assert |got - want| <= bound[i] elementwise, naming the first offender.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], bound: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(g) - f64::from(w)).abs();
        assert!(err <= bound(i), "{what}: element {i}: gpu {g} vs cpu {w} (error {err:e} > bound {:e})", bound(i));
    }
}

pub fn run(f: &GpuTensorFactory, rec: &weft::gpu::Recording) {
    weft::rt::block_on(f.context().submit(rec)).unwrap();
}

pub fn read_f32(f: &GpuTensorFactory, t: &weft::gpu::GpuTensor) -> Vec<f32> {
    weft::rt::block_on(f.download_f32(t)).unwrap()
}

pub fn read_u32(f: &GpuTensorFactory, t: &weft::gpu::GpuTensor) -> Vec<u32> {
    weft::rt::block_on(f.download_u32(t)).unwrap()
}
