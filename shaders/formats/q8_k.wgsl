// SPDX-License-Identifier: Apache-2.0
// Q8_K (ggml block_q8_K, 292-byte super-blocks of 256 elements, word-aligned): d f32, 256
// signed bytes, 16 i16 block sums (not needed to decode); value = d * q.
const W_SUPER_BYTES: u32 = 292u;
const W_UNIT_BYTES: u32 = W_SUPER_BYTES;
const W_HAS_MIN: bool = false;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn signed_bytes(word: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    let i = (w_unit_byte(row_byte, b >> 3u)) >> 2u;
    let d = bitcast<f32>(wload(i));
    let s = wspan9(i + 1u + 8u * (b & 7u));
    return WBlock(vec2<f32>(d, 0.0), array<vec4<f32>, 8>(
        signed_bytes(s[0]), signed_bytes(s[1]), signed_bytes(s[2]), signed_bytes(s[3]),
        signed_bytes(s[4]), signed_bytes(s[5]), signed_bytes(s[6]), signed_bytes(s[7])));
}
