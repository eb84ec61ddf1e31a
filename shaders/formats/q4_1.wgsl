// SPDX-License-Identifier: Apache-2.0
// Weight format Q4_1 (ggml block_q4_1, 20 bytes): d: f16, m: f16, then 16 bytes of nibbles laid
// out as in Q4_0; x = d * nibble + m. Chunks as in Q4_0.
const W_BLOCK: u32 = 32u;
const W_CHUNKS: u32 = 4u;
const W_HAS_MIN: bool = true;

fn w_scale(row_byte: u32, blk: u32) -> vec2<f32> {
    let b = row_byte + blk * 20u;
    return vec2<f32>(half_to_f32(w_u16(b)), half_to_f32(w_u16(b + 2u)));
}

fn w_chunk(row_byte: u32, blk: u32, c: u32, k: u32) -> array<f32, 8> {
    var out: array<f32, 8>;
    let word = w_u32(row_byte + blk * 20u + 4u + 4u * c);
    for (var j = 0u; j < 4u; j++) {
        let byte = (word >> (8u * j)) & 0xffu;
        out[j] = f32(byte & 0xfu);
        out[j + 4u] = f32(byte >> 4u);
    }
    return out;
}

fn w_elem(c: u32, j: u32) -> u32 {
    return 4u * c + (j & 3u) + 16u * (j >> 2u);
}
