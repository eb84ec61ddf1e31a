// SPDX-License-Identifier: Apache-2.0
// Weight format Q4_1 (ggml block_q4_1, 20 bytes): d: f16, m: f16, then 16 bytes of nibbles laid
// out as in Q4_0; x = d * nibble + m.
const W_BLOCK: u32 = 32u;

fn w_block(row_byte: u32, blk: u32, k: u32) -> array<f32, W_BLOCK> {
    var out: array<f32, W_BLOCK>;
    let b = row_byte + blk * 20u;
    let d = half_to_f32(w_u16(b));
    let m = half_to_f32(w_u16(b + 2u));
    for (var i = 0u; i < 4u; i++) {
        let word = w_u32(b + 4u + 4u * i);
        for (var j = 0u; j < 4u; j++) {
            let byte = (word >> (8u * j)) & 0xffu;
            out[4u * i + j] = d * f32(byte & 0xfu) + m;
            out[4u * i + j + 16u] = d * f32(byte >> 4u) + m;
        }
    }
    return out;
}
