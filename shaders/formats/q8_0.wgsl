// SPDX-License-Identifier: Apache-2.0
// Weight format Q8_0 (ggml block_q8_0, 34 bytes): d: f16, then 32 signed bytes; x = d * q.
// Four chunks of 8 codes: chunk c holds elements 8c .. 8c + 7.
const W_BLOCK: u32 = 32u;
const W_CHUNKS: u32 = 4u;
const W_HAS_MIN: bool = false;

fn w_scale(row_byte: u32, blk: u32) -> vec2<f32> {
    return vec2<f32>(half_to_f32(w_u16(row_byte + blk * 34u)), 0.0);
}

// Four signed bytes of a word, sign-extended: shift each to the top, then arithmetic-shift down.
fn signed_bytes(word: u32) -> vec4<f32> {
    let up = vec4<u32>(word) << vec4<u32>(24u, 16u, 8u, 0u);
    return vec4<f32>(bitcast<vec4<i32>>(up) >> vec4<u32>(24u));
}

fn w_chunk(row_byte: u32, blk: u32, c: u32, k: u32) -> mat2x4<f32> {
    let b = row_byte + blk * 34u + 2u + 8u * c;
    return mat2x4<f32>(signed_bytes(w_u32(b)), signed_bytes(w_u32(b + 4u)));
}

fn w_first(c: u32) -> u32 {
    return 8u * c;
}

const W_GAP: u32 = 4u;
