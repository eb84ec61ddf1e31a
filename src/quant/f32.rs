//! F32: plain little-endian floats (GGUF type 0). Shader: `shaders/formats/f32.wgsl`.

use super::{DType, Format};

pub const FORMAT: Format = Format {
    dtype: DType::F32,
    name: "F32",
    ggml_type: 0,
    block_elems: 1,
    block_bytes: 4,
    decode: |bytes, out| out.extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
    encode: |values, out| out.extend(values.iter().flat_map(|v| v.to_le_bytes())),
};
