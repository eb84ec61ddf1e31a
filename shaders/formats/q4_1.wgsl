// SPDX-License-Identifier: Apache-2.0
// Q4_1 (ggml block_q4_1, 20 bytes): d f16, m f16, 16 bytes of nibbles; byte i holds element i
// (low nibble) and i + 16 (high); value = d * q + m.
// Block interface (v2): w_block(byte) decodes the whole 32-element block whose first byte is
// `byte` (even; for Q4_1 a multiple of 4) into codes q[j] = elements 4j .. 4j+3 (natural order)
// and dm = (d, m): the block contributes d * (q . x) + m * sum(x). Straight-line code (no loops
// over private arrays: lavapipe otherwise spills them to scratch).
const W_BLOCK_BYTES: u32 = 20u;
const W_HAS_MIN: bool = true;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn nib_lo(v: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u));
}

fn nib_hi(v: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(v) >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u));
}

fn w_block(byte: u32) -> WBlock {
    let s = wspan5(byte >> 2u);
    return WBlock(unpack2x16float(s[0]), array<vec4<f32>, 8>(
        nib_lo(s[1]), nib_lo(s[2]), nib_lo(s[3]), nib_lo(s[4]),
        nib_hi(s[1]), nib_hi(s[2]), nib_hi(s[3]), nib_hi(s[4])));
}
