// SPDX-License-Identifier: Apache-2.0
// Q5_K (ggml block_q5_K, 176-byte super-blocks of 256 elements, 16-byte aligned): d f16, dmin
// f16, 12 bytes of 6-bit scales and mins (as Q4_K), 32 bytes qh, 128 bytes of nibbles. Element
// l of sub-block j: q = nibble (as Q4_K) | (bit j of qh[l]) << 4; value = (d * sc) * q -
// (dmin * m), so dm = (d * sc, -(dmin * m)).
const W_SUPER_BYTES: u32 = 176u;
const W_UNIT_BYTES: u32 = W_SUPER_BYTES;
const W_HAS_MIN: bool = true;

#include shared/k_scales.wgsl

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn q5(word: u32, shift: u32, qh: u32, hbit: u32) -> vec4<f32> {
    let lo = (vec4<u32>(word) >> (vec4<u32>(0u, 8u, 16u, 24u) + shift)) & vec4<u32>(15u);
    let hi = (vec4<u32>(qh) >> (vec4<u32>(0u, 8u, 16u, 24u) + hbit)) & vec4<u32>(1u);
    return vec4<f32>(lo | (hi << vec4<u32>(4u)));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    let j = b & 7u;
    let i = w_unit_byte(row_byte, b >> 3u) >> 2u;
    let h = wload4a(i); // d | dmin, then scale bytes 0..3, 4..7, 8..11
    let h0 = wload4a(i + 4u);
    let h1 = wload4a(i + 8u);
    let q0 = wload4a(i + 12u + 8u * (j >> 1u));
    let q1 = wload4a(i + 16u + 8u * (j >> 1u));
    let s = 4u * (j & 1u);
    return WBlock(k_scale_min(h, j), array<vec4<f32>, 8>(
        q5(q0.x, s, h0.x, j), q5(q0.y, s, h0.y, j), q5(q0.z, s, h0.z, j), q5(q0.w, s, h0.w, j),
        q5(q1.x, s, h1.x, j), q5(q1.y, s, h1.y, j), q5(q1.z, s, h1.z, j), q5(q1.w, s, h1.w, j)));
}
