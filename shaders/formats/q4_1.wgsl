// SPDX-License-Identifier: Apache-2.0
// Q4_1 (ggml block_q4_1, 20 bytes): d f16, m f16, 16 bytes of nibbles; byte i holds element i
// (low nibble) and i + 16 (high); value = d * q + m.
// Block interface (v3): w_block_at(row_byte, b) decodes the whole 32-element block b of the
// weight row whose first block is at byte `row_byte` into codes q[j] = elements 4j .. 4j+3
// (natural order) and dm = (d, m): the block contributes d * (q . x) + m * sum(x), and element i
// is dm.x * q[i] + dm.y exactly as quant::dequantize computes it. A 32-element format finds its
// block at w_unit_byte(row_byte, b) (w_block); a super-block format decodes sub-block b % 8 of
// super-block b / 8 at w_unit_byte(row_byte, b / 8). W_UNIT_BYTES is the size of that unit,
// which the weight source (shared/weight_*.wgsl) needs to find rows and units. Straight-line
// code (no loops over private arrays: lavapipe otherwise spills them to scratch).
const W_BLOCK_BYTES: u32 = 20u;
const W_UNIT_BYTES: u32 = W_BLOCK_BYTES;
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

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    return w_block(w_unit_byte(row_byte, b));
}
