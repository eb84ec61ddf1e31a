// SPDX-License-Identifier: Apache-2.0
// Weight format Q4_0 (ggml block_q4_0, 18 bytes): d: f16, then 16 bytes of nibbles. Byte i holds
// element i (low nibble) and element i + 16 (high nibble); x = d * (nibble - 8).
// Four chunks, one per 4-byte word: chunk c holds elements 4c .. 4c + 3 and 4c + 16 .. 4c + 19.
const W_BLOCK: u32 = 32u;
const W_CHUNKS: u32 = 4u;
const W_HAS_MIN: bool = false;

fn w_scale(row_byte: u32, blk: u32) -> vec2<f32> {
    return vec2<f32>(half_to_f32(w_u16(row_byte + blk * 18u)), 0.0);
}

fn w_chunk(row_byte: u32, blk: u32, c: u32, k: u32) -> array<f32, 8> {
    var out: array<f32, 8>;
    let word = w_u32(row_byte + blk * 18u + 2u + 4u * c);
    for (var j = 0u; j < 4u; j++) {
        let byte = (word >> (8u * j)) & 0xffu;
        out[j] = f32(byte & 0xfu) - 8.0;
        out[j + 4u] = f32(byte >> 4u) - 8.0;
    }
    return out;
}

fn w_elem(c: u32, j: u32) -> u32 {
    return 4u * c + (j & 3u) + 16u * (j >> 2u);
}
