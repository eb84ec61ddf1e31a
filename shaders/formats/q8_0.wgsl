// SPDX-License-Identifier: Apache-2.0
// Weight format Q8_0 (ggml block_q8_0, 34 bytes): d: f16, then 32 signed bytes; x = d * q.
// Four chunks of 8 codes: chunk c holds elements 8c .. 8c + 7.
const W_BLOCK: u32 = 32u;
const W_CHUNKS: u32 = 4u;
const W_HAS_MIN: bool = false;

fn w_scale(row_byte: u32, blk: u32) -> vec2<f32> {
    return vec2<f32>(half_to_f32(w_u16(row_byte + blk * 34u)), 0.0);
}

fn w_chunk(row_byte: u32, blk: u32, c: u32, k: u32) -> array<f32, 8> {
    var out: array<f32, 8>;
    let b = row_byte + blk * 34u + 2u + 8u * c;
    let lo = w_u32(b);
    let hi = w_u32(b + 4u);
    for (var j = 0u; j < 4u; j++) {
        // Shift byte j to the top, then arithmetic-shift back down to sign-extend it.
        out[j] = f32(bitcast<i32>(lo << (24u - 8u * j)) >> 24u);
        out[j + 4u] = f32(bitcast<i32>(hi << (24u - 8u * j)) >> 24u);
    }
    return out;
}

fn w_elem(c: u32, j: u32) -> u32 {
    return 8u * c + j;
}
