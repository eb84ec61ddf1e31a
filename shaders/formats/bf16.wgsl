// SPDX-License-Identifier: Apache-2.0
// BF16: rows of bfloat16 (an f32's top 16 bits); a "block" is 32 elements = 64 bytes (16-byte
// aligned), scale 1. Widened exactly by shifting each half into an f32's top bits: no feature
// needed. Each word holds two elements, the lower-addressed in its low half.
const W_BLOCK_BYTES: u32 = 64u;
const W_UNIT_BYTES: u32 = W_BLOCK_BYTES;
const W_HAS_MIN: bool = false;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn b4(a: u32, b: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, b & 0xffff0000u));
}

fn w_block(byte: u32) -> WBlock {
    let i = byte >> 2u;
    let v0 = wload4a(i);
    let v1 = wload4a(i + 4u);
    let v2 = wload4a(i + 8u);
    let v3 = wload4a(i + 12u);
    return WBlock(vec2<f32>(1.0, 0.0), array<vec4<f32>, 8>(
        b4(v0.x, v0.y), b4(v0.z, v0.w), b4(v1.x, v1.y), b4(v1.z, v1.w),
        b4(v2.x, v2.y), b4(v2.z, v2.w), b4(v3.x, v3.y), b4(v3.z, v3.w)));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    return w_block(w_unit_byte(row_byte, b));
}
