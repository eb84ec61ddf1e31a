// SPDX-License-Identifier: Apache-2.0
// Weight format F16: rows of little-endian IEEE halves, widened with unpack2x16float so the
// baseline needs no shader-f16. Read 8 at a time with scale 1; elements past k read as zero.
const W_BLOCK: u32 = 8u;
const W_CHUNKS: u32 = 1u;
const W_HAS_MIN: bool = false;

fn w_scale(row_byte: u32, blk: u32) -> vec2<f32> {
    return vec2<f32>(1.0, 0.0);
}

fn w_chunk(row_byte: u32, blk: u32, c: u32, k: u32) -> array<f32, 8> {
    var out: array<f32, 8>;
    let first = blk * W_BLOCK;
    for (var j = 0u; j < 8u; j++) {
        if (first + j < k) {
            out[j] = half_to_f32(w_u16(row_byte + (first + j) * 2u));
        }
    }
    return out;
}

fn w_elem(c: u32, j: u32) -> u32 {
    return j;
}
