// SPDX-License-Identifier: Apache-2.0
// Weight format F16: rows of little-endian IEEE halves, widened with unpack2x16float so the
// baseline needs no shader-f16. Read as blocks of 8 (one chunk, scale 1); elements at or past k
// read as zero.
const W_BLOCK: u32 = 8u;
const W_CHUNKS: u32 = 1u;
const W_HAS_MIN: bool = false;

fn w_scale(row_byte: u32, blk: u32) -> vec2<f32> {
    return vec2<f32>(1.0, 0.0);
}

fn w_chunk(row_byte: u32, blk: u32, c: u32, k: u32) -> mat2x4<f32> {
    let first = blk * W_BLOCK;
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        if (first + j < k) {
            v[j] = half_to_f32(w_u16(row_byte + (first + j) * 2u));
        }
    }
    return mat2x4<f32>(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
}

fn w_first(c: u32) -> u32 {
    return 0u;
}

const W_GAP: u32 = 4u;
