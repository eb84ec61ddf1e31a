// SPDX-License-Identifier: Apache-2.0
// Weight format Q4_0 (ggml block_q4_0, 18 bytes): d: f16, then 16 bytes of nibbles. Byte i holds
// element i (low nibble) and element i + 16 (high nibble); x = d * (nibble - 8).
const W_BLOCK: u32 = 32u;

fn w_block(row_byte: u32, blk: u32, k: u32) -> array<f32, W_BLOCK> {
    var out: array<f32, W_BLOCK>;
    let b = row_byte + blk * 18u;
    let d = half_to_f32(w_u16(b));
    for (var i = 0u; i < 4u; i++) {
        let word = w_u32(b + 2u + 4u * i);
        for (var j = 0u; j < 4u; j++) {
            let byte = (word >> (8u * j)) & 0xffu;
            out[4u * i + j] = d * (f32(byte & 0xfu) - 8.0);
            out[4u * i + j + 16u] = d * (f32(byte >> 4u) - 8.0);
        }
    }
    return out;
}
