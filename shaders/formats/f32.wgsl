// SPDX-License-Identifier: Apache-2.0
// Weight format F32: rows of little-endian f32, read as blocks of 8 (one chunk, scale 1).
// Elements at or past k (the row length) read as zero, so any k works.
const W_BLOCK: u32 = 8u;
const W_CHUNKS: u32 = 1u;
const W_HAS_MIN: bool = false;

// (scale, min) of block `blk` of the row starting at byte `row_byte`.
fn w_scale(row_byte: u32, blk: u32) -> vec2<f32> {
    return vec2<f32>(1.0, 0.0);
}

// The 8 codes of chunk `c` of block `blk`, as two runs of 4 consecutive elements starting at
// w_first(c) (column 0) and w_first(c) + w_gap (column 1).
fn w_chunk(row_byte: u32, blk: u32, c: u32, k: u32) -> mat2x4<f32> {
    let first = blk * W_BLOCK;
    let base = row_byte / 4u + first;
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        if (first + j < k) {
            v[j] = bitcast<f32>(w[base + j]);
        }
    }
    return mat2x4<f32>(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
}

fn w_first(c: u32) -> u32 {
    return 0u;
}

const W_GAP: u32 = 4u;
