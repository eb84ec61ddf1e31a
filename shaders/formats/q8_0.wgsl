// SPDX-License-Identifier: Apache-2.0
// Weight format Q8_0 (ggml block_q8_0, 34 bytes): d: f16, then 32 signed bytes; x = d * q.
const W_BLOCK: u32 = 32u;

fn w_block(row_byte: u32, blk: u32, k: u32) -> array<f32, W_BLOCK> {
    var out: array<f32, W_BLOCK>;
    let b = row_byte + blk * 34u;
    let d = half_to_f32(w_u16(b));
    for (var i = 0u; i < 8u; i++) {
        let word = w_u32(b + 2u + 4u * i);
        for (var j = 0u; j < 4u; j++) {
            // Shift byte j to the top, then arithmetic-shift back down to sign-extend it.
            let q = bitcast<i32>(word << (24u - 8u * j)) >> 24u;
            out[4u * i + j] = d * f32(q);
        }
    }
    return out;
}
