// SPDX-License-Identifier: Apache-2.0
// Weight format F32: rows of little-endian f32. Decoded W_BLOCK elements at a time; elements at
// or past k (the row length) read as zero so any k works.
const W_BLOCK: u32 = 8u;

// Elements [blk * W_BLOCK, blk * W_BLOCK + W_BLOCK) of the row starting at byte `row_byte`.
fn w_block(row_byte: u32, blk: u32, k: u32) -> array<f32, W_BLOCK> {
    var out: array<f32, W_BLOCK>;
    let first = blk * W_BLOCK;
    let base = row_byte / 4u + first;
    for (var j = 0u; j < W_BLOCK; j++) {
        if (first + j < k) {
            out[j] = bitcast<f32>(w[base + j]);
        }
    }
    return out;
}
