// SPDX-License-Identifier: Apache-2.0
// Weight format F16: rows of little-endian IEEE halves, widened with unpack2x16float so the
// baseline needs no shader-f16. Elements at or past k read as zero.
const W_BLOCK: u32 = 8u;

fn w_block(row_byte: u32, blk: u32, k: u32) -> array<f32, W_BLOCK> {
    var out: array<f32, W_BLOCK>;
    let first = blk * W_BLOCK;
    for (var j = 0u; j < W_BLOCK; j++) {
        if (first + j < k) {
            out[j] = half_to_f32(w_u16(row_byte + (first + j) * 2u));
        }
    }
    return out;
}
