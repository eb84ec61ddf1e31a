// SPDX-License-Identifier: Apache-2.0
// The block interface (see formats/q4_0.wgsl) for unquantized weights: blocks of 8 elements in
// one chunk with scale 1. The including format defines `w_float(row_byte, e)`, element e of the
// row starting at byte row_byte. Elements at or past k (the row length) read as zero, so any k
// works.
const W_BLOCK: u32 = 8u;
const W_CHUNKS: u32 = 1u;
const W_HAS_MIN: bool = false;
const W_GAP: u32 = 4u;

fn w_scale(row_byte: u32, blk: u32) -> vec2<f32> {
    return vec2<f32>(1.0, 0.0);
}

fn w_chunk(row_byte: u32, blk: u32, c: u32, k: u32) -> mat2x4<f32> {
    let first = blk * W_BLOCK;
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        if (first + j < k) {
            v[j] = w_float(row_byte, first + j);
        }
    }
    return mat2x4<f32>(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
}

fn w_first(c: u32) -> u32 {
    return 0u;
}
