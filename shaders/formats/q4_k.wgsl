// SPDX-License-Identifier: Apache-2.0
// Q4_K (ggml block_q4_K, 144-byte super-blocks of 256 elements, 16-byte aligned): d f16, dmin
// f16, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles. Sub-block j (32 elements) has
// (sc, m) = get_scale_min_k4(j) and the low (even j) or high (odd j) nibbles of bytes
// 32 * (j / 2) .. + 32; value = (d * sc) * q - (dmin * m), so dm = (d * sc, -(dmin * m)).
const W_SUPER_BYTES: u32 = 144u;
const W_UNIT_BYTES: u32 = W_SUPER_BYTES;
const W_HAS_MIN: bool = true;

#include shared/k_scales.wgsl

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn nib(word: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(word) >> (vec4<u32>(0u, 8u, 16u, 24u) + shift)) & vec4<u32>(15u));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    let j = b & 7u;
    let i = w_unit_byte(row_byte, b >> 3u) >> 2u;
    let h = wload4a(i); // d | dmin, then scale bytes 0..3, 4..7, 8..11
    let q0 = wload4a(i + 4u + 8u * (j >> 1u));
    let q1 = wload4a(i + 8u + 8u * (j >> 1u));
    let s = 4u * (j & 1u);
    return WBlock(k_scale_min(h, j), array<vec4<f32>, 8>(
        nib(q0.x, s), nib(q0.y, s), nib(q0.z, s), nib(q0.w, s),
        nib(q1.x, s), nib(q1.y, s), nib(q1.z, s), nib(q1.w, s)));
}
