// SPDX-License-Identifier: Apache-2.0
// F32: a "block" is 32 elements = 128 bytes (16-byte aligned), scale 1.
const W_BLOCK_BYTES: u32 = 128u;
const W_UNIT_BYTES: u32 = W_BLOCK_BYTES;
const W_HAS_MIN: bool = false;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn w_block(byte: u32) -> WBlock {
    let i = byte >> 2u;
    return WBlock(vec2<f32>(1.0, 0.0), array<vec4<f32>, 8>(
        bitcast<vec4<f32>>(wload4a(i + 0u)),
        bitcast<vec4<f32>>(wload4a(i + 4u)),
        bitcast<vec4<f32>>(wload4a(i + 8u)),
        bitcast<vec4<f32>>(wload4a(i + 12u)),
        bitcast<vec4<f32>>(wload4a(i + 16u)),
        bitcast<vec4<f32>>(wload4a(i + 20u)),
        bitcast<vec4<f32>>(wload4a(i + 24u)),
        bitcast<vec4<f32>>(wload4a(i + 28u))));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    return w_block(w_unit_byte(row_byte, b));
}
