//! WGSL sources, the variants composed from them, and the cache of compiled compute pipelines.
//!
//! Kernels live in `shaders/*.wgsl`. A line `#include shared/NAME.wgsl` pastes a shared file
//! (includes nest). Three includes are chosen by the variant: `#include weight_format` pastes
//! `shaders/formats/<dtype>.wgsl` (the `w_block_at` decoder of one weight format), `#include
//! weight_source` pastes where the weight bytes are read from (a storage buffer, or the texture
//! CPU drivers read faster), and `#include x_source` where a matmul's activations come from (a
//! storage buffer, or 64 KiB uniform windows). Tile sizes are substituted for `{{WG}}`,
//! `{{TN}}` and `{{TM}}`. That is how one matmul source serves every format and adapter.
//!
//! Bind-group layouts are read from the composed WGSL's binding declarations
//! ([`binding_kinds`]), not written by hand; every uniform binding takes a dynamic offset, so a
//! kernel's parameters and a matmul's activation window move without new bind groups.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::{Result, WeftError};
use crate::quant::DType;

/// Every WGSL file, embedded so the library works in a browser without fetching them.
const SOURCES: &[(&str, &str)] = &[
    ("add.wgsl", include_str!("../../shaders/add.wgsl")),
    ("altup_correct.wgsl", include_str!("../../shaders/altup_correct.wgsl")),
    ("altup_predict.wgsl", include_str!("../../shaders/altup_predict.wgsl")),
    ("gaussian_topk.wgsl", include_str!("../../shaders/gaussian_topk.wgsl")),
    ("magnitude_match.wgsl", include_str!("../../shaders/magnitude_match.wgsl")),
    ("add_layer_norm.wgsl", include_str!("../../shaders/add_layer_norm.wgsl")),
    ("add_rms_norm.wgsl", include_str!("../../shaders/add_rms_norm.wgsl")),
    ("argmax.wgsl", include_str!("../../shaders/argmax.wgsl")),
    ("attention_merge.wgsl", include_str!("../../shaders/attention_merge.wgsl")),
    ("embedding.wgsl", include_str!("../../shaders/embedding.wgsl")),
    ("flash_attention.wgsl", include_str!("../../shaders/flash_attention.wgsl")),
    ("gelu.wgsl", include_str!("../../shaders/gelu.wgsl")),
    ("gate_mul.wgsl", include_str!("../../shaders/gate_mul.wgsl")),
    ("head_rms_norm.wgsl", include_str!("../../shaders/head_rms_norm.wgsl")),
    ("lora_expand.wgsl", include_str!("../../shaders/lora_expand.wgsl")),
    ("lora_shrink.wgsl", include_str!("../../shaders/lora_shrink.wgsl")),
    ("gated_rms_norm.wgsl", include_str!("../../shaders/gated_rms_norm.wgsl")),
    ("matmul.wgsl", include_str!("../../shaders/matmul.wgsl")),
    ("matmul_rows.wgsl", include_str!("../../shaders/matmul_rows.wgsl")),
    ("matmul_subgroup.wgsl", include_str!("../../shaders/matmul_subgroup.wgsl")),
    ("matmul_tiled.wgsl", include_str!("../../shaders/matmul_tiled.wgsl")),
    ("moe_combine.wgsl", include_str!("../../shaders/moe_combine.wgsl")),
    ("moe_group.wgsl", include_str!("../../shaders/moe_group.wgsl")),
    ("moe_matmul.wgsl", include_str!("../../shaders/moe_matmul.wgsl")),
    ("moe_matmul_grouped.wgsl", include_str!("../../shaders/moe_matmul_grouped.wgsl")),
    ("moe_route.wgsl", include_str!("../../shaders/moe_route.wgsl")),
    ("penalize.wgsl", include_str!("../../shaders/penalize.wgsl")),
    ("pool_rows.wgsl", include_str!("../../shaders/pool_rows.wgsl")),
    ("paged_attention.wgsl", include_str!("../../shaders/paged_attention.wgsl")),
    ("rms_norm.wgsl", include_str!("../../shaders/rms_norm.wgsl")),
    ("rope_kv_write.wgsl", include_str!("../../shaders/rope_kv_write.wgsl")),
    ("sample.wgsl", include_str!("../../shaders/sample.wgsl")),
    ("scale.wgsl", include_str!("../../shaders/scale.wgsl")),
    ("spec_sample.wgsl", include_str!("../../shaders/spec_sample.wgsl")),
    ("softmax.wgsl", include_str!("../../shaders/softmax.wgsl")),
    ("token_mask.wgsl", include_str!("../../shaders/token_mask.wgsl")),
    ("ssd_chunk_cb.wgsl", include_str!("../../shaders/ssd_chunk_cb.wgsl")),
    ("ssd_chunk_dt.wgsl", include_str!("../../shaders/ssd_chunk_dt.wgsl")),
    ("ssd_chunk_scan.wgsl", include_str!("../../shaders/ssd_chunk_scan.wgsl")),
    ("ssd_chunk_state.wgsl", include_str!("../../shaders/ssd_chunk_state.wgsl")),
    ("ssd_state_pass.wgsl", include_str!("../../shaders/ssd_state_pass.wgsl")),
    ("ssm_conv.wgsl", include_str!("../../shaders/ssm_conv.wgsl")),
    ("gated_delta_net.wgsl", include_str!("../../shaders/gated_delta_net.wgsl")),
    ("sigmoid_mul.wgsl", include_str!("../../shaders/sigmoid_mul.wgsl")),
    ("ssm_scan.wgsl", include_str!("../../shaders/ssm_scan.wgsl")),
    ("formats/bf16.wgsl", include_str!("../../shaders/formats/bf16.wgsl")),
    ("formats/f16.wgsl", include_str!("../../shaders/formats/f16.wgsl")),
    ("formats/f32.wgsl", include_str!("../../shaders/formats/f32.wgsl")),
    ("formats/iq2_s.wgsl", include_str!("../../shaders/formats/iq2_s.wgsl")),
    ("formats/iq2_xs.wgsl", include_str!("../../shaders/formats/iq2_xs.wgsl")),
    ("formats/iq3_s.wgsl", include_str!("../../shaders/formats/iq3_s.wgsl")),
    ("formats/iq3_xxs.wgsl", include_str!("../../shaders/formats/iq3_xxs.wgsl")),
    ("formats/iq4_nl.wgsl", include_str!("../../shaders/formats/iq4_nl.wgsl")),
    ("formats/iq4_xs.wgsl", include_str!("../../shaders/formats/iq4_xs.wgsl")),
    ("formats/mxfp4.wgsl", include_str!("../../shaders/formats/mxfp4.wgsl")),
    ("formats/q2_k.wgsl", include_str!("../../shaders/formats/q2_k.wgsl")),
    ("formats/q3_k.wgsl", include_str!("../../shaders/formats/q3_k.wgsl")),
    ("formats/q4_0.wgsl", include_str!("../../shaders/formats/q4_0.wgsl")),
    ("formats/q4_1.wgsl", include_str!("../../shaders/formats/q4_1.wgsl")),
    ("formats/q4_k.wgsl", include_str!("../../shaders/formats/q4_k.wgsl")),
    ("formats/q5_0.wgsl", include_str!("../../shaders/formats/q5_0.wgsl")),
    ("formats/q5_1.wgsl", include_str!("../../shaders/formats/q5_1.wgsl")),
    ("formats/q5_k.wgsl", include_str!("../../shaders/formats/q5_k.wgsl")),
    ("formats/q6_k.wgsl", include_str!("../../shaders/formats/q6_k.wgsl")),
    ("formats/q8_0.wgsl", include_str!("../../shaders/formats/q8_0.wgsl")),
    ("formats/q8_k.wgsl", include_str!("../../shaders/formats/q8_k.wgsl")),
    ("shared/attention_params.wgsl", include_str!("../../shaders/shared/attention_params.wgsl")),
    ("shared/attention_splits.wgsl", include_str!("../../shaders/shared/attention_splits.wgsl")),
    ("shared/epilogue_gelu_mul.wgsl", include_str!("../../shaders/shared/epilogue_gelu_mul.wgsl")),
    ("shared/epilogue_none.wgsl", include_str!("../../shaders/shared/epilogue_none.wgsl")),
    ("shared/epilogue_silu_mul.wgsl", include_str!("../../shaders/shared/epilogue_silu_mul.wgsl")),
    ("shared/epilogue_swiglu_oai.wgsl", include_str!("../../shaders/shared/epilogue_swiglu_oai.wgsl")),
    ("shared/glu.wgsl", include_str!("../../shaders/shared/glu.wgsl")),
    ("shared/block_fold.wgsl", include_str!("../../shaders/shared/block_fold.wgsl")),
    ("shared/block_recipe.wgsl", include_str!("../../shaders/shared/block_recipe.wgsl")),
    ("shared/block_words.wgsl", include_str!("../../shaders/shared/block_words.wgsl")),
    ("shared/k_scales.wgsl", include_str!("../../shaders/shared/k_scales.wgsl")),
    ("shared/sample_filter.wgsl", include_str!("../../shaders/shared/sample_filter.wgsl")),
    ("shared/iq4_grid.wgsl", include_str!("../../shaders/shared/iq4_grid.wgsl")),
    ("shared/iq_codebook.wgsl", include_str!("../../shaders/shared/iq_codebook.wgsl")),
    ("shared/matmul_io.wgsl", include_str!("../../shaders/shared/matmul_io.wgsl")),
    ("shared/moe_matmul_io.wgsl", include_str!("../../shaders/shared/moe_matmul_io.wgsl")),
    ("shared/kv_read_storage.wgsl", include_str!("../../shaders/shared/kv_read_storage.wgsl")),
    ("shared/kv_read_storage_f16.wgsl", include_str!("../../shaders/shared/kv_read_storage_f16.wgsl")),
    ("shared/kv_read_texture.wgsl", include_str!("../../shaders/shared/kv_read_texture.wgsl")),
    ("shared/kv_write_storage.wgsl", include_str!("../../shaders/shared/kv_write_storage.wgsl")),
    ("shared/kv_write_storage_f16.wgsl", include_str!("../../shaders/shared/kv_write_storage_f16.wgsl")),
    ("shared/kv_write_texture.wgsl", include_str!("../../shaders/shared/kv_write_texture.wgsl")),
    ("shared/row_norm.wgsl", include_str!("../../shaders/shared/row_norm.wgsl")),
    ("shared/row_sum.wgsl", include_str!("../../shaders/shared/row_sum.wgsl")),
    ("shared/softplus.wgsl", include_str!("../../shaders/shared/softplus.wgsl")),
    ("shared/ssd_params.wgsl", include_str!("../../shaders/shared/ssd_params.wgsl")),
    ("shared/weight_storage.wgsl", include_str!("../../shaders/shared/weight_storage.wgsl")),
    ("shared/weight_texture.wgsl", include_str!("../../shaders/shared/weight_texture.wgsl")),
    ("shared/x_block.wgsl", include_str!("../../shaders/shared/x_block.wgsl")),
    ("shared/x_storage.wgsl", include_str!("../../shaders/shared/x_storage.wgsl")),
    ("shared/x_uniform.wgsl", include_str!("../../shaders/shared/x_uniform.wgsl")),
];

/// Kernels that read weights (compiled once per weight format and weight source).
const WEIGHT_KERNELS: &[&str] =
    &["matmul", "matmul_rows", "matmul_subgroup", "matmul_tiled", "moe_matmul", "moe_matmul_grouped", "embedding"];

/// Kernels that use subgroup operations: only the subgroup family dispatches (and compiles) them.
pub const SUBGROUP_KERNELS: &[&str] = &["matmul_subgroup"];

/// Kernels that read or write the KV cache (compiled once per KV source).
const KV_KERNELS: &[&str] = &["flash_attention", "paged_attention", "rope_kv_write"];

/// Head sizes the attention kernel is compiled for up front (others compile on first use).
pub const HEAD_DIMS: &[u16] = &[16, 32, 64, 80, 96, 128, 256, 512];

/// Invocations of a `flash_attention` workgroup.
const FLASH_WG: u16 = 64;

/// The tile of `flash_attention` (the GPU families' attention) for heads of `head_dim`:
/// (invocations, keys a tile, query rows a workgroup). The keys a tile are part of a row's
/// bits (its online softmax steps once a tile), so they depend on the head size alone; the
/// rows only share each staged tile. About 8 KiB of keys (or values) and 4 KiB of queries at
/// every head size: within WebGPU's 16 KiB of workgroup memory up to 512, whose 4 keys and 2
/// rows take 12.2 KiB ([`flash_workgroup_bytes`]).
pub fn flash_tile(head_dim: usize) -> [u16; 3] {
    let hd = head_dim.max(4);
    let keys = (2048 / hd).clamp(1, 32) as u16;
    let rows = (1024 / hd).clamp(1, 32) as u16;
    [FLASH_WG, keys, rows]
}

/// Bytes of workgroup memory `flash_attention` declares at `head_dim`: the rows' queries, one
/// K or V tile (each key padded by a vec4, so that consecutive keys start in different banks)
/// and the rows' scores (f32), seven words a row and four more, each array rounded up to 16
/// bytes.
pub fn flash_workgroup_bytes(head_dim: usize) -> usize {
    let [_, keys, rows] = flash_tile(head_dim).map(usize::from);
    let arrays = [rows * head_dim, keys * (head_dim + 4), rows * keys].into_iter().chain([rows; 7]).chain([4]);
    arrays.map(|words| (4 * words).next_multiple_of(16)).sum()
}

/// The most query heads one workgroup of the CPU family's attention takes (sharing each K and V
/// load among them); the GPU families run flash attention instead.
pub const MAX_QUERY_HEADS: u16 = 4;

/// The most query heads a workgroup of the CPU family's attention takes at `head_dim`:
/// [`MAX_QUERY_HEADS`] up to 256, fewer past it, so that a lane's queries and outputs (2 · heads
/// · head_dim / 4 vec4 registers, unrolled) stay within what 4 heads of 256 take: 2 at 512.
/// Wider groups would only spill more, and take lavapipe longer to compile.
pub fn max_query_heads(head_dim: usize) -> u16 {
    (usize::from(MAX_QUERY_HEADS) * 256 / head_dim.max(1)).clamp(1, usize::from(MAX_QUERY_HEADS)) as u16
}

/// Query heads a workgroup of the CPU family's attention takes (its cache in textures), for
/// `heads` query heads of `head_dim` in groups of `group` per KV head over `tokens` query
/// tokens: the largest divisor of the group up to [`max_query_heads`] (each lane gathers its K
/// and V vec4s lane by lane there, and grouped heads share every gather), unless that leaves
/// fewer than two workgroups per thread of the driver (a lone sequence's decode): then one, so
/// every thread has heads to take; where the threads are unknown (a browser), as for one. The
/// GPU families' flash kernel takes rows instead (`flash_tile`).
/// Only those two counts, growing with `tokens`, so the shapes `GpuExecutor::warm_up` records
/// compile every variant serving dispatches.
pub fn attention_query_heads(
    heads: usize,
    group: usize,
    head_dim: usize,
    tokens: usize,
    threads: Option<usize>,
) -> u16 {
    let grouped = (1..=max_query_heads(head_dim)).rev().find(|&h| group.is_multiple_of(usize::from(h))).unwrap_or(1);
    let busy = heads / usize::from(grouped) * tokens >= 2 * threads.unwrap_or(1);
    if busy { grouped } else { 1 }
}

/// Every file under `shaders/` the library embeds (a tidy test checks none is missing).
pub fn embedded_shader_files() -> impl Iterator<Item = &'static str> {
    SOURCES.iter().map(|(path, _)| *path)
}

/// Where a weight kernel reads the weight bytes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightSource {
    /// A storage buffer: portable, and what GPUs want.
    Storage,
    /// The same bytes in an rgba32uint texture: CPU drivers fetch texels vectorized, where they
    /// load storage buffers lane by lane.
    Texture,
}

/// Where a matmul reads its activations from (and attention its queries).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XSource {
    /// A storage buffer: any number of rows in one dispatch.
    Storage,
    /// 64 KiB uniform windows of whole rows, one dispatch per window: a workgroup-uniform
    /// uniform load is one scalar load and a broadcast on CPU drivers.
    Uniform,
}

/// Where the KV cache lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvSource {
    /// Storage buffers: portable, and what GPUs want.
    Storage,
    /// rgba32float (rgba16float for an f16 cache) textures, read and written as storage
    /// textures: CPU drivers fetch texels vectorized.
    Texture,
}

/// What a matmul does with its sums as it writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// Writes each sum: `y = x · Wᵀ`.
    None,
    /// An MLP's SwiGLU: output c is silu(x · W[c]) · (x · W[n + c]), W holding gate then up.
    SiluMul,
    /// An MLP's GeGLU (tanh approximation), likewise.
    GeluMul,
    /// gpt-oss's clamped SwiGLU (llama.cpp's `swiglu_oai`): with g = min(gate, 7) and
    /// u = clamp(up, -7, 7), output c is g · σ(1.702 · g) · (u + 1). The experts' kernel only.
    SwigluOai,
}

impl Epilogue {
    /// Weight rows per output column.
    pub fn rows_per_output(self) -> usize {
        if self == Epilogue::None { 1 } else { 2 }
    }

    fn file(self) -> &'static str {
        match self {
            Epilogue::None => "shared/epilogue_none.wgsl",
            Epilogue::SiluMul => "shared/epilogue_silu_mul.wgsl",
            Epilogue::GeluMul => "shared/epilogue_gelu_mul.wgsl",
            Epilogue::SwigluOai => "shared/epilogue_swiglu_oai.wgsl",
        }
    }
}

/// What the experts' matmuls do with their sums: an expert's down projection writes them, its
/// gate and up projections gate them (`config::ExpertGate`'s three: Qwen3-MoE's and most
/// experts' SwiGLU, Gemma 4's GeGLU, gpt-oss's clamped SwiGLU; each epilogue costs every weight
/// format's variants in each family).
const MOE_EPILOGUES: [Epilogue; 4] = [Epilogue::None, Epilogue::SiluMul, Epilogue::GeluMul, Epilogue::SwigluOai];

/// Bytes of one uniform activation window (the core WebGPU uniform binding limit).
pub const X_WINDOW_BYTES: u64 = 65536;

/// One compilable shader: a kernel, and for the kernels that read weights the format, where
/// the weights and activations come from and the tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShaderVariant {
    pub kernel: &'static str,
    pub weight: Option<DType>,
    pub weights_in: WeightSource,
    pub x_in: XSource,
    /// (WG, TN, TM) of a matmul: invocations per workgroup, columns and rows per invocation.
    pub tile: [u16; 3],
    /// Where a KV kernel reads or writes the cache.
    pub kv_in: KvSource,
    /// Whether that cache holds halves (an f16 KV cache) instead of f32.
    pub kv_f16: bool,
    /// The head size attention is compiled for (0 for other kernels).
    pub head_dim: u16,
    /// Query heads one workgroup of attention takes, all sharing one KV head (0 for other
    /// kernels).
    pub query_heads: u16,
    /// What a matmul does with its sums as it writes them.
    pub epilogue: Epilogue,
}

impl ShaderVariant {
    /// A kernel with no variants.
    pub fn plain(kernel: &'static str) -> Self {
        ShaderVariant {
            kernel,
            weight: None,
            weights_in: WeightSource::Storage,
            x_in: XSource::Storage,
            tile: [0; 3],
            kv_in: KvSource::Storage,
            kv_f16: false,
            head_dim: 0,
            query_heads: 0,
            epilogue: Epilogue::None,
        }
    }

    /// A kernel that writes the KV cache in `source` (holding halves with `f16`).
    pub fn kv(kernel: &'static str, source: KvSource, f16: bool) -> Self {
        ShaderVariant { kv_in: source, kv_f16: f16, ..Self::plain(kernel) }
    }

    /// The GPU families' flash attention over a KV cache in storage buffers (of halves with
    /// `f16`), for heads of `head_dim`, in its tile ([`flash_tile`]).
    pub fn flash(f16: bool, head_dim: u16) -> Self {
        let tile = flash_tile(usize::from(head_dim));
        ShaderVariant { head_dim, tile, ..Self::kv("flash_attention", KvSource::Storage, f16) }
    }

    /// The CPU family's attention over the KV cache in `source`, for heads of `head_dim`,
    /// `query_heads` of them a workgroup.
    pub fn attention(source: KvSource, f16: bool, head_dim: u16, query_heads: u16) -> Self {
        ShaderVariant { head_dim, query_heads, ..Self::kv("paged_attention", source, f16) }
    }

    /// A kernel that reads weights of `dtype` from `source`.
    pub fn weights(kernel: &'static str, dtype: DType, source: WeightSource) -> Self {
        ShaderVariant { weight: Some(dtype), weights_in: source, ..Self::plain(kernel) }
    }
}

impl std::fmt::Display for ShaderVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kernel)?;
        if KV_KERNELS.contains(&self.kernel) {
            let source = if self.kv_in == KvSource::Texture { "texture" } else { "buffer" };
            let half = if self.kv_f16 { ",f16" } else { "" };
            return match (self.head_dim, self.query_heads) {
                (0, _) => write!(f, "[kv {source}{half}]"),
                (hd, qh) => {
                    let q = if self.x_in == XSource::Uniform { ",q-uniform" } else { "" };
                    let heads = if qh > 1 { format!(",{qh} heads") } else { String::new() };
                    write!(f, "[kv {source}{half},head {hd}{heads}{q}]")
                }
            };
        }
        if let Some(dtype) = self.weight {
            let source = if self.weights_in == WeightSource::Texture { ",texture" } else { "" };
            write!(f, "[{dtype}{source}")?;
            if self.tile != [0; 3] {
                let x = if self.x_in == XSource::Uniform { ",x-uniform" } else { "" };
                write!(f, "{x},{}x{}x{}", self.tile[0], self.tile[1], self.tile[2])?;
            }
            match self.epilogue {
                Epilogue::None => {}
                Epilogue::SiluMul => f.write_str(",silu_mul")?,
                Epilogue::GeluMul => f.write_str(",gelu_mul")?,
                Epilogue::SwigluOai => f.write_str(",swiglu_oai")?,
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

/// The SIMD widths in lanes of the CPU drivers weft tunes for: llvmpipe's 256-bit vectors
/// (its default) and its 512-bit ones (`LP_NATIVE_VECTOR_WIDTH=512`).
pub(crate) const CPU_LANES: [u16; 2] = [8, 16];

/// Weight rows a lane of the CPU family's matmul may own (TN · G): the widths its tile is
/// chosen from. 16 is the fastest where workgroups are plentiful; the others split a narrow
/// output into as many workgroups as the driver has threads.
pub(crate) const CPU_ROWS_PER_LANE: [u16; 4] = [8, 12, 16, 18];

/// Weight rows a lane of the CPU family's matmul owns in a browser (threads unknown), whatever
/// the output's width: SwiftShader compiles a tile of 8 in about half the time of one of 16,
/// and runs it as fast.
const BROWSER_ROWS_PER_LANE: u16 = 8;

/// A workgroup's cost beyond its weight rows (loading its rows of x, its loop), in weight
/// rows, as [`matmul_tile`] weighs tiles.
const WORKGROUP_OVERHEAD_ROWS: usize = 4;

/// What the CPU family's matmul tile is sized for: a workgroup is one SIMD group of the driver
/// (`lanes`), and a dispatch's workgroups run `threads` at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuDriver {
    pub lanes: u16,
    /// `None` in a browser, whose CPU adapter (SwiftShader) runs workgroups on threads a page
    /// cannot count, and compiles each matmul variant at load for 1 to 13 s (headless
    /// Chromium, growing with the tile): there the tile takes one width and at most 4 rows of x
    /// ([`matmul_tile`]).
    pub threads: Option<usize>,
}

/// The tile of `matmul` (the CPU family), (WG, TN, TM), for m rows of x, n outputs with
/// `epilogue`'s weight rows per output (2 gated), when a uniform window holds `window_rows`
/// rows of x. Measured on lavapipe (benches/kernels.rs):
/// - WG: one SIMD group of the driver (8 lanes with 256-bit vectors, 16 with 512);
/// - TM: rows of x per lane as there are rows to share: 4 from 3 rows, 8 from 8 (1.3x the
///   GFLOP/s of 4 at 16 rows; 12 and 16 spill), never more than a window holds;
/// - TN: the weight rows per lane that finish a dispatch soonest on the driver's threads,
///   each thread running whole workgroups one after another: a 576-wide output at 16 lanes
///   makes 3 workgroups of 16 rows per lane (2 rounds on 2 threads, a quarter of the columns
///   past the end) or 2 of 18 (one round, none wasted: 1.2-1.6x the GFLOP/s at 1 to 128 rows).
///   16 unless another width is at least 10% cheaper: where workgroups are plentiful the
///   widths tie and 16 is the one measured best.
///
/// In a browser (threads unknown) the tiles are few and small, because each costs seconds of
/// SwiftShader's compiler at load: 8 weight rows per lane at every width and TM at most 4, so
/// a model compiles two tiles (TM 1 and 4) per weight format and epilogue. Against the fitted
/// tiles there, the default model loaded in half the time and its demo page's prefill ran
/// about a quarter slower (the 8-row tile is gone); one width instead of 16 weight rows from
/// 512 outputs halved the load again (Qwen2.5-Coder 0.5B: 43-64 s to 22-28 s) at the same
/// speed (bench/README.md, "The browser's load").
pub fn matmul_tile(m: usize, n: usize, window_rows: usize, epilogue: Epilogue, cpu: CpuDriver) -> [u16; 3] {
    let tm: u16 = match m {
        0..=2 => 1,
        3..=7 => 4,
        _ => 8,
    };
    let tm = [8, 4, 1].into_iter().find(|&t| t <= tm && usize::from(t) <= window_rows).unwrap_or(1);
    let g = epilogue.rows_per_output() as u16;
    let Some(threads) = cpu.threads else {
        return [cpu.lanes, BROWSER_ROWS_PER_LANE / g, tm.min(4)];
    };
    // Workgroups down a dispatch: one below 8 rows; from 8 as many as a window holds (or 8), not
    // as many as m makes, so that m picks the tile only through TM and a warm-up of one batch
    // size per TM (`GpuExecutor::warm_up`) compiles every tile serving dispatches.
    let groups_down = if tm == 8 { (window_rows.min(64) / 8).max(1) } else { 1 };
    let cost = |rows_per_lane: u16| {
        let groups = n.div_ceil(usize::from(cpu.lanes * (rows_per_lane / g))) * groups_down;
        groups.div_ceil(threads.max(1)) * (usize::from(rows_per_lane) + WORKGROUP_OVERHEAD_ROWS)
    };
    let best = CPU_ROWS_PER_LANE.into_iter().min_by_key(|&r| cost(r)).unwrap_or(16);
    let rows_per_lane = if cost(best) * 10 <= cost(16) * 9 { best } else { 16 };
    [cpu.lanes, rows_per_lane / g, tm]
}

/// The tile of `matmul_rows` (the baseline family below the plan's `gemm_min_rows` rows): 64
/// invocations, 8 weight rows per workgroup (8 lanes each), TM rows of x: 1 for a lone
/// sequence's decode, else 4.
pub(crate) fn rows_tile(m: usize) -> [u16; 3] {
    [64, 8, if m <= 2 { 1 } else { 4 }]
}

/// The tile of `matmul_tiled` (the baseline family's large batches): 64 invocations, 32 weight
/// rows by 32 rows of x (fixed in the WGSL; named here for the variant and the grid).
pub(crate) const TILED_TILE: [u16; 3] = [64, 32, 32];

/// The tile of `matmul_subgroup` as a GEMV (the subgroup family below the plan's
/// `gemm_min_rows` rows): (64 lanes, 8 weight rows per workgroup, TM rows of x), TM as the
/// baseline's.
pub(crate) fn subgroup_tile(m: usize) -> [u16; 3] {
    [64, 8, if m <= 2 { 1 } else { 4 }]
}

/// The tile of `matmul_subgroup` as a register-blocked GEMM (the subgroup family from the
/// plan's `gemm_min_rows` rows): 64 lanes, 16 weight rows per workgroup, 16 rows of x, each lane
/// folding 2 columns side by side (1 gated; shaders/matmul_subgroup.wgsl). Chosen without a GPU
/// to measure it: 16 rows hold a lane's sums, decoded blocks and x block in about 100 registers
/// (a quarter of the GEMV's weight reads); the device check times it against the GEMV.
pub const SUBGROUP_GEMM_TILE: [u16; 3] = [64, 16, 16];

/// Rows of one expert a tile of `moe_matmul_grouped` sums together, sharing each decoded weight
/// block (its TM; the rows of `moe_group`'s tiles): 8, as the CPU family's matmul shares a block
/// between 8 rows of x from 8 rows.
pub const MOE_TILE_ROWS: u16 = 8;

/// Weight rows (TN · G) a lane of `moe_matmul_grouped` owns in the CPU family: one SIMD group
/// of the driver holds 8 decoded blocks a lane while it walks the tile's rows.
pub(crate) const MOE_CPU_ROWS_PER_LANE: u16 = 8;

/// Weight rows a lane of `moe_matmul_grouped` owns in the GPU families, whose 64 invocations
/// keep each lane's decoded blocks and sums in registers: 2 blocks and 16 sums.
pub(crate) const MOE_GPU_ROWS_PER_LANE: u16 = 2;

/// The tile of `moe_matmul_grouped`, (WG, TN, TM): `lanes` invocations, `rows_per_lane`
/// weight rows each (over `epilogue`'s G rows an output), [`MOE_TILE_ROWS`] rows.
pub(crate) fn moe_tile(lanes: u16, rows_per_lane: u16, epilogue: Epilogue) -> [u16; 3] {
    [lanes, rows_per_lane / epilogue.rows_per_output() as u16, MOE_TILE_ROWS]
}

/// Every shader variant the library can compile.
pub fn shader_variants() -> Vec<ShaderVariant> {
    let mut out = Vec::new();
    for (path, _) in SOURCES {
        let Some(kernel) = path.strip_suffix(".wgsl").filter(|p| !p.contains('/')) else { continue };
        if KV_KERNELS.contains(&kernel) {
            for source in [KvSource::Storage, KvSource::Texture] {
                for f16 in [false, true] {
                    if kernel == "flash_attention" {
                        // The GPU families', whose cache is in buffers.
                        if source == KvSource::Storage {
                            out.extend(HEAD_DIMS.iter().map(|&hd| ShaderVariant::flash(f16, hd)));
                        }
                    } else if kernel == "paged_attention" {
                        // The CPU family's, whose cache is in textures: grouped heads, and
                        // queries from uniform windows or a buffer.
                        if source == KvSource::Texture {
                            for &hd in HEAD_DIMS {
                                for heads in 1..=max_query_heads(usize::from(hd)) {
                                    for x_in in [XSource::Uniform, XSource::Storage] {
                                        out.push(ShaderVariant {
                                            x_in,
                                            ..ShaderVariant::attention(source, f16, hd, heads)
                                        });
                                    }
                                }
                            }
                        }
                    } else {
                        out.push(ShaderVariant::kv(kernel, source, f16));
                    }
                }
            }
            continue;
        }
        if !WEIGHT_KERNELS.contains(&kernel) {
            out.push(ShaderVariant::plain(kernel));
            continue;
        }
        for dtype in DType::WEIGHTS {
            for source in [WeightSource::Storage, WeightSource::Texture] {
                let base = ShaderVariant::weights(kernel, dtype, source);
                if kernel == "embedding" {
                    out.push(base);
                    continue;
                }
                // The CPU family's tile at each width, from either weight source; the GPU
                // families' from buffers.
                if kernel == "moe_matmul_grouped" {
                    for epilogue in MOE_EPILOGUES {
                        let tile =
                            |lanes, rows| ShaderVariant { tile: moe_tile(lanes, rows, epilogue), epilogue, ..base };
                        out.extend(CPU_LANES.map(|lanes| tile(lanes, MOE_CPU_ROWS_PER_LANE)));
                        if source == WeightSource::Storage {
                            out.push(tile(64, MOE_GPU_ROWS_PER_LANE));
                        }
                    }
                    continue;
                }
                // One kernel for every family, from either weight source.
                if kernel == "moe_matmul" {
                    out.extend(MOE_EPILOGUES.map(|epilogue| ShaderVariant { epilogue, ..base }));
                    continue;
                }
                if kernel == "matmul_subgroup" || kernel == "matmul_rows" {
                    if source == WeightSource::Storage {
                        let tile = if kernel == "matmul_rows" { rows_tile } else { subgroup_tile };
                        for epilogue in [Epilogue::None, Epilogue::SiluMul, Epilogue::GeluMul] {
                            out.extend([1, 4].map(|m| ShaderVariant { tile: tile(m), epilogue, ..base }));
                            if kernel == "matmul_subgroup" {
                                out.push(ShaderVariant { tile: SUBGROUP_GEMM_TILE, epilogue, ..base });
                            }
                        }
                    }
                    continue;
                }
                if kernel == "matmul_tiled" {
                    if source == WeightSource::Storage {
                        out.push(ShaderVariant { tile: TILED_TILE, ..base });
                    }
                    continue;
                }
                // The CPU family's: weights from a texture or a buffer, x from a uniform window or
                // a buffer, and an MLP's gate and up projections with its gate as one matmul.
                for epilogue in [Epilogue::None, Epilogue::SiluMul, Epilogue::GeluMul] {
                    let g = epilogue.rows_per_output() as u16;
                    for lanes in CPU_LANES {
                        for rows_per_lane in CPU_ROWS_PER_LANE {
                            for tm in [1, 4, 8] {
                                for x_in in [XSource::Storage, XSource::Uniform] {
                                    let tile = [lanes, rows_per_lane / g, tm];
                                    out.push(ShaderVariant { tile, x_in, epilogue, ..base });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

fn source(path: &str) -> Result<&'static str> {
    SOURCES
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, s)| *s)
        .ok_or_else(|| WeftError::Unsupported(format!("no shader file {path}")))
}

/// The full WGSL text of a variant, with its includes resolved and its tile substituted.
pub fn compose_shader(variant: ShaderVariant) -> Result<String> {
    let mut out = String::new();
    expand(&format!("{}.wgsl", variant.kernel), variant, &mut out)?;
    let [wg, tn, tm] = variant.tile;
    // The codebooks' binding follows the kernel's own.
    let next_binding = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("@group(0) @binding(")?.split_once(')')?.0.parse::<u32>().ok())
        .max()
        .map_or(0, |b| b + 1);
    let text = out
        .replace("{{CODEBOOK_BINDING}}", &next_binding.to_string())
        .replace("{{WG}}", &wg.to_string())
        .replace("{{TN}}", &tn.to_string())
        .replace("{{TM}}", &tm.to_string())
        .replace("{{HD}}", &variant.head_dim.to_string())
        .replace("{{QH}}", &variant.query_heads.to_string())
        .replace("{{G}}", &variant.epilogue.rows_per_output().to_string())
        .replace("{{KV_FORMAT}}", if variant.kv_f16 { "rgba16float" } else { "rgba32float" })
        .replace("{{LAST}}", &(variant.epilogue.rows_per_output() - 1).to_string());
    let lines: Vec<&str> = text.lines().collect();
    let mut unrolled = String::with_capacity(text.len());
    let head_vec4s = u32::from(variant.head_dim) / 4;
    let groups = variant.epilogue.rows_per_output() as u32;
    let constants = [
        ("WG", u32::from(wg)),
        ("TN", u32::from(tn)),
        ("TM", u32::from(tm)),
        ("HV", head_vec4s),
        ("QH", u32::from(variant.query_heads)),
        ("G", groups),
    ];
    unroll(&lines, &constants, &[], &mut unrolled)?;
    Ok(unrolled)
}

/// Expand `#for NAME in 0..BOUND` … `#end` blocks (they nest): the lines between are written
/// once per value of NAME, with `{{NAME}}` replaced by it. BOUND is a number or one of `constants`
/// (the tile's `WG`, `TN`, `TM`; `HV`, an attention head's vec4s, and `QH`, its heads a
/// workgroup; `G`, a matmul's weight rows per output, the last of which `{{LAST}}` names).
/// Unrolling in the composer instead of a WGSL loop keeps every per-iteration value in its own
/// variable: CPU drivers lower a private array indexed by a loop counter to per-lane gathers and
/// scatters.
fn unroll(lines: &[&str], constants: &[(&str, u32)], bound: &[(&str, u32)], out: &mut String) -> Result<()> {
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let Some(head) = line.trim().strip_prefix("#for ") else {
            let mut text = line.to_string();
            for (name, value) in bound {
                text = text.replace(&format!("{{{{{name}}}}}"), &value.to_string());
            }
            out.push_str(&text);
            out.push('\n');
            i += 1;
            continue;
        };
        let bad = || WeftError::Unsupported(format!("cannot read the shader directive {:?}", line.trim()));
        let (name, range) = head.split_once(" in 0..").ok_or_else(bad)?;
        let range = range.trim();
        let count = match constants.iter().find(|(c, _)| *c == range) {
            Some(&(_, value)) => value,
            None => range.parse().map_err(|_| bad())?,
        };
        // The matching `#end`: nested `#for`s each close their own.
        let mut depth = 0;
        let end = lines[i + 1..]
            .iter()
            .position(|l| {
                let l = l.trim();
                if l.starts_with("#for ") {
                    depth += 1;
                } else if l == "#end" {
                    if depth == 0 {
                        return true;
                    }
                    depth -= 1;
                }
                false
            })
            .ok_or_else(|| WeftError::Unsupported(format!("shader directive {:?} has no #end", line.trim())))?;
        let body = &lines[i + 1..i + 1 + end];
        for value in 0..count {
            let mut inner = bound.to_vec();
            inner.push((name.trim(), value));
            unroll(body, constants, &inner, out)?;
        }
        i += end + 2;
    }
    Ok(())
}

fn expand(path: &str, variant: ShaderVariant, out: &mut String) -> Result<()> {
    for line in source(path)?.lines() {
        match line.strip_prefix("#include ") {
            Some("weight_format") => {
                let dtype = variant.weight.ok_or_else(|| {
                    WeftError::Unsupported(format!("kernel {} needs a weight format", variant.kernel))
                })?;
                expand(&format!("formats/{}.wgsl", dtype.name().to_lowercase()), variant, out)?;
            }
            Some("weight_source") => {
                let file = match variant.weights_in {
                    WeightSource::Storage => "shared/weight_storage.wgsl",
                    WeightSource::Texture => "shared/weight_texture.wgsl",
                };
                expand(file, variant, out)?;
            }
            Some(side @ ("kv_read" | "kv_write")) => {
                // A texture cache names its texel format (KV_FORMAT); a buffer of halves has
                // files of its own.
                let file = match (variant.kv_in, variant.kv_f16) {
                    (KvSource::Texture, _) => format!("shared/{side}_texture.wgsl"),
                    (KvSource::Storage, false) => format!("shared/{side}_storage.wgsl"),
                    (KvSource::Storage, true) => format!("shared/{side}_storage_f16.wgsl"),
                };
                expand(&file, variant, out)?;
            }
            Some("epilogue") => expand(variant.epilogue.file(), variant, out)?,
            Some("x_source") => {
                let file = match variant.x_in {
                    XSource::Storage => "shared/x_storage.wgsl",
                    XSource::Uniform => "shared/x_uniform.wgsl",
                };
                expand(file, variant, out)?;
            }
            Some(codebook) if codebook.starts_with("codebook ") => {
                out.push_str(&codebook_wgsl(codebook["codebook ".len()..].trim())?);
            }
            Some(included) => expand(included.trim(), variant, out)?,
            None => out.push_str(line),
        }
        out.push('\n');
    }
    Ok(())
}

/// The name of the storage binding that holds every IQ codebook (`#include codebook`); a
/// pipeline that declares it gets [`codebook_words`] bound there by every dispatch.
pub(crate) const CODEBOOKS_BINDING: &str = "codebooks";

/// The IQ codebooks of [`crate::quant::CODEBOOKS`] as one storage buffer's words: each table in
/// order, two 16-bit entries a word (entry i in word i / 2, the high half for odd i).
pub(crate) fn codebook_words() -> Vec<u32> {
    crate::quant::CODEBOOKS
        .iter()
        .flat_map(|(_, table)| {
            table.chunks(2).map(|p| u32::from(p[0]) | (u32::from(p.get(1).copied().unwrap_or(0)) << 16))
        })
        .collect()
}

/// `#include codebook NAME`: the binding of the codebooks buffer (numbered after the kernel's
/// own bindings, `{{CODEBOOK_BINDING}}`) and `fn name(i) -> u32`, entry i of the codebook `NAME`
/// of [`crate::quant::CODEBOOKS`] (its packed bits) read from there. A buffer, not a WGSL
/// constant array: lavapipe took minutes to compile each matmul variant holding a private
/// copy of the table, and a `const` array indexed at run time is copied into every
/// invocation's memory at each lookup.
fn codebook_wgsl(name: &str) -> Result<String> {
    let mut at = 0;
    for (table, entries) in crate::quant::CODEBOOKS {
        if table == name {
            let f = name.to_lowercase();
            return Ok(format!(
                "@group(0) @binding({{{{CODEBOOK_BINDING}}}}) var<storage, read> {CODEBOOKS_BINDING}: array<u32>;\n\
                 fn {f}(i: u32) -> u32 {{\n    \
                 return ({CODEBOOKS_BINDING}[{at}u + (i >> 1u)] >> (16u * (i & 1u))) & 0xFFFFu;\n}}"
            ));
        }
        at += entries.len().div_ceil(2);
    }
    Err(WeftError::Unsupported(format!("no codebook {name} for #include codebook")))
}

/// What one binding of a kernel is, as its WGSL declaration says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingKind {
    /// `var<uniform>`: bound with a dynamic offset.
    Uniform,
    /// `var<storage, read>`.
    StorageRead,
    /// `var<storage, read_write>`.
    StorageReadWrite,
    /// `texture_storage_2d<FORMAT, read|write>`: weight bytes (rgba32uint, read) and the KV
    /// cache (rgba32float or rgba16float, read by attention, written by rope_kv_write) on CPU
    /// drivers.
    StorageTexture { format: wgpu::TextureFormat, access: wgpu::StorageTextureAccess },
}

/// The group-0 bindings a composed kernel declares, in binding order. Kernels declare each
/// binding on one line (`@group(0) @binding(N) var<...> name: type;`).
pub fn binding_kinds(wgsl: &str) -> Result<Vec<BindingKind>> {
    let mut found: Vec<(u32, BindingKind)> = Vec::new();
    for line in wgsl.lines() {
        let Some(rest) = line.trim().strip_prefix("@group(0) @binding(") else { continue };
        let bad = || WeftError::Unsupported(format!("cannot read the binding declaration {line:?}"));
        let (index, decl) = rest.split_once(')').ok_or_else(bad)?;
        let index: u32 = index.parse().map_err(|_| bad())?;
        let decl = decl.trim();
        let kind = if decl.starts_with("var<uniform>") {
            BindingKind::Uniform
        } else if decl.starts_with("var<storage, read_write>") {
            BindingKind::StorageReadWrite
        } else if decl.starts_with("var<storage, read>") {
            BindingKind::StorageRead
        } else if let Some((_, texel)) = decl.strip_prefix("var ").and_then(|d| d.split_once("texture_storage_2d<")) {
            use wgpu::{StorageTextureAccess::*, TextureFormat::*};
            let (format, access) = texel.split_once('>').and_then(|(t, _)| t.split_once(", ")).ok_or_else(bad)?;
            let format = match format {
                "rgba32uint" => Rgba32Uint,
                "rgba32float" => Rgba32Float,
                "rgba16float" => Rgba16Float,
                _ => return Err(bad()),
            };
            let access = match access {
                "read" => ReadOnly,
                "write" => WriteOnly,
                _ => return Err(bad()),
            };
            BindingKind::StorageTexture { format, access }
        } else {
            return Err(bad());
        };
        found.push((index, kind));
    }
    found.sort_by_key(|(i, _)| *i);
    if found.iter().enumerate().any(|(i, (b, _))| *b != i as u32) {
        return Err(WeftError::Unsupported(format!("bindings are not numbered 0, 1, 2, …: {found:?}")));
    }
    Ok(found.into_iter().map(|(_, k)| k).collect())
}

/// A compiled kernel: its pipeline, bind-group layout and binding kinds.
#[derive(Clone, Debug)]
pub(crate) struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    pub kinds: Vec<BindingKind>,
    /// Whether the last binding is the IQ codebooks ([`CODEBOOKS_BINDING`]), which dispatches
    /// bind themselves.
    pub codebooks: bool,
}

/// Compiled pipelines, built on first use and kept for the life of the device.
#[derive(Default)]
pub(crate) struct PipelineCache {
    pipelines: Mutex<HashMap<ShaderVariant, Pipeline>>,
}

impl PipelineCache {
    /// How many pipelines have been compiled.
    pub(crate) fn len(&self) -> usize {
        self.pipelines.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub(crate) fn get(&self, device: &wgpu::Device, variant: ShaderVariant) -> Result<Pipeline> {
        let mut pipelines = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pipelines.get(&variant) {
            return Ok(p.clone());
        }
        let label = variant.to_string();
        let wgsl = compose_shader(variant)?;
        let kinds = binding_kinds(&wgsl)?;
        let codebooks = wgsl
            .lines()
            .any(|l| l.trim().starts_with("@group(0) @binding(") && l.contains(&format!(" {CODEBOOKS_BINDING}: ")));
        let entries: Vec<wgpu::BindGroupLayoutEntry> = kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: match kind {
                    BindingKind::Uniform => wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: true,
                        min_binding_size: None,
                    },
                    BindingKind::StorageRead | BindingKind::StorageReadWrite => wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: *kind == BindingKind::StorageRead },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    &BindingKind::StorageTexture { format, access } => wgpu::BindingType::StorageTexture {
                        access,
                        format,
                        view_dimension: wgpu::TextureViewDimension::D2,
                    },
                },
                count: None,
            })
            .collect();
        let layout = device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(&label), entries: &entries });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(&label),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let module = shader_module(device, &label, wgsl);
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let compiled = Pipeline { pipeline, layout, kinds, codebooks };
        pipelines.insert(variant, compiled.clone());
        Ok(compiled)
    }
}

/// The shader module of a composed kernel: what the device's WGSL compiler parses and validates
/// (a browser's is Tint, stricter than naga in places), before any pipeline is compiled from it.
pub(crate) fn shader_module(device: &wgpu::Device, label: &str, wgsl: String) -> wgpu::ShaderModule {
    let desc = wgpu::ShaderModuleDescriptor { label: Some(label), source: wgpu::ShaderSource::Wgsl(wgsl.into()) };
    // Bounds checks stay on. The one check turned off is the iteration counter wgpu adds to
    // every loop against infinite loops: it hides constant trip counts from the driver,
    // which then cannot unroll the decode loops (on lavapipe the matmul ran 2x slower).
    // Every loop in shaders/ counts towards a bound taken from a shape that the dispatch
    // functions validated, far below u32::MAX, so each one terminates.
    let mut checks = wgpu::ShaderRuntimeChecks::checked();
    checks.force_loop_bounding = false;
    // SAFETY: see above; the shaders are ours and contain no unbounded loop.
    unsafe { device.create_shader_module_trusted(desc, checks) }
}
