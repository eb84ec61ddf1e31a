// SPDX-License-Identifier: Apache-2.0
// Weight format F32: rows of little-endian f32, read 8 at a time as one "block" of one chunk
// with scale 1. Elements at or past k (the row length) read as zero, so any k works.
const W_BLOCK: u32 = 8u;
const W_CHUNKS: u32 = 1u;
const W_HAS_MIN: bool = false;

// (scale, min) of block `blk` of the row starting at byte `row_byte`.
fn w_scale(row_byte: u32, blk: u32) -> vec2<f32> {
    return vec2<f32>(1.0, 0.0);
}

// The 8 codes of chunk `c` of block `blk`; code j belongs to element w_elem(c, j) of the block.
fn w_chunk(row_byte: u32, blk: u32, c: u32, k: u32) -> array<f32, 8> {
    var out: array<f32, 8>;
    let first = blk * W_BLOCK;
    let base = row_byte / 4u + first;
    for (var j = 0u; j < 8u; j++) {
        if (first + j < k) {
            out[j] = bitcast<f32>(w[base + j]);
        }
    }
    return out;
}

fn w_elem(c: u32, j: u32) -> u32 {
    return j;
}
