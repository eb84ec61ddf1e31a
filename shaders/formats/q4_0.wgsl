// SPDX-License-Identifier: Apache-2.0
// Q4_0 (ggml block_q4_0, 18 bytes): d f16, 16 bytes of nibbles as Q4_1; value = d * (q - 8).
// A block starts on a word or mid-word (2-byte aligned); both cases read the same 5 words and
// pick with select (no divergent branch).
const W_BLOCK_BYTES: u32 = 18u;
const W_UNIT_BYTES: u32 = W_BLOCK_BYTES;
const W_HAS_MIN: bool = false;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn nib_lo(v: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u)) - 8.0;
}

fn nib_hi(v: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(v) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u)) - 8.0;
}

fn w_block(byte: u32) -> WBlock {
    let mid = (byte & 2u) != 0u;
    let s = wspan5(byte >> 2u);
    let c0 = select((s[0] >> 16u) | (s[1] << 16u), s[1], mid);
    let c1 = select((s[1] >> 16u) | (s[2] << 16u), s[2], mid);
    let c2 = select((s[2] >> 16u) | (s[3] << 16u), s[3], mid);
    let c3 = select((s[3] >> 16u) | (s[4] << 16u), s[4], mid);
    let d = unpack2x16float(select(s[0], s[0] >> 16u, mid)).x;
    return WBlock(vec2<f32>(d, 0.0), array<vec4<f32>, 8>(
        nib_lo(c0), nib_lo(c1), nib_lo(c2), nib_lo(c3),
        nib_hi(c0), nib_hi(c1), nib_hi(c2), nib_hi(c3)));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    return w_block(w_unit_byte(row_byte, b));
}
