// SPDX-License-Identifier: Apache-2.0
// F16: rows of IEEE halves; a "block" is 32 elements = 64 bytes (16-byte aligned), scale 1.
// Widened with unpack2x16float: core WGSL, no shader-f16.
const W_BLOCK_BYTES: u32 = 64u;
const W_UNIT_BYTES: u32 = W_BLOCK_BYTES;
const W_HAS_MIN: bool = false;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn h4(a: u32, b: u32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(a), unpack2x16float(b));
}

fn w_block(byte: u32) -> WBlock {
    let i = byte >> 2u;
    let v0 = wload4a(i);
    let v1 = wload4a(i + 4u);
    let v2 = wload4a(i + 8u);
    let v3 = wload4a(i + 12u);
    return WBlock(vec2<f32>(1.0, 0.0), array<vec4<f32>, 8>(
        h4(v0.x, v0.y), h4(v0.z, v0.w), h4(v1.x, v1.y), h4(v1.z, v1.w),
        h4(v2.x, v2.y), h4(v2.z, v2.w), h4(v3.x, v3.y), h4(v3.z, v3.w)));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    return w_block(w_unit_byte(row_byte, b));
}
