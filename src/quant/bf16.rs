//! BF16: bfloat16, the top half of an f32, little-endian (GGUF type 30; safetensors' `BF16`).
//! Kept 16-bit on the GPU like F16, widened there by a shift (exact). Shader:
//! `shaders/formats/bf16.wgsl`.

use half::bf16;

use super::{DType, Format};

pub const FORMAT: Format = Format {
    dtype: DType::BF16,
    name: "BF16",
    ggml_type: 30,
    block_elems: 1,
    block_bytes: 2,
    decode: |bytes, out| out.extend(bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())),
    // Round to nearest, ties to even, as torch and gguf-py round f32 to bfloat16.
    encode: |values, out| out.extend(values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes())),
};
