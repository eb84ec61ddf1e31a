//! F16: IEEE half floats, little-endian (GGUF type 1). Shader: `shaders/formats/f16.wgsl`.

use half::f16;

use super::{DType, Format, f16_at};

pub const FORMAT: Format = Format {
    dtype: DType::F16,
    name: "F16",
    ggml_type: 1,
    block_elems: 1,
    block_bytes: 2,
    decode: |bytes, out| out.extend((0..bytes.len() / 2).map(|i| f16_at(bytes, 2 * i))),
    encode: |values, out| out.extend(values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes())),
};
