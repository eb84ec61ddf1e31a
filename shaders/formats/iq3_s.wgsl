// SPDX-License-Identifier: Apache-2.0
// IQ3_S (ggml block_iq3_s, 110-byte super-blocks of 256 elements, 2-byte aligned): d f16, qs 64
// bytes, qh 8 bytes, signs 32 bytes, scales 4 bytes. Sub-block j: db = d * (1 + 2 * ((scales[j
// / 2] >> 4(j % 2)) & 15)); group g of 4 elements: index = qs[8j + g] | ((qh[j] >> g) & 1) << 8
// into IQ3S_GRID (4 elements of 3 bits: 1, 3, ..., 15; the codebooks buffer), signs bits 4g ..
// 4g + 3 of the sub-block's 4 sign bytes; value e = db * grid * sign. One scale per 32
// elements: dm = (db, 0), the codes grid * sign (db * (grid * sign) is ggml's db * grid * sign
// to the bit: the sign is exact).
const W_SUPER_BYTES: u32 = 110u;
const W_UNIT_BYTES: u32 = W_SUPER_BYTES;
const W_HAS_MIN: bool = false;

#include shared/block_words.wgsl
#include shared/iq_codebook.wgsl
#include codebook IQ3S_GRID

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

// The codes of group g (0..7) of a sub-block whose index bytes are q, high index bits qh and
// sign bits sg.
fn iq3s_quad(q: vec2<u32>, qh: u32, sg: u32, g: u32) -> vec4<f32> {
    let low = (select(q.x, q.y, g >= 4u) >> (8u * (g & 3u))) & 255u;
    let entry = iq3s_grid(low | (((qh >> g) & 1u) << 8u));
    let k = (vec4<u32>(entry) >> vec4<u32>(0u, 3u, 6u, 9u)) & vec4<u32>(7u);
    return vec4<f32>(1u + 2u * k) * iq_signs(sg, 4u * g);
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    let j = b & 7u;
    let sb = w_unit_byte(row_byte, b >> 3u);
    let d = unpack2x16float(whalf(sb)).x;
    let q = wwords2(sb + 2u + 8u * j);
    let qh = wbyte(sb + 66u + j);
    let sg = wwords2(sb + 74u + 4u * j).x;
    let s = (wbyte(sb + 106u + j / 2u) >> (4u * (j & 1u))) & 15u;
    let db = d * f32(1u + 2u * s);
    return WBlock(vec2<f32>(db, 0.0), array<vec4<f32>, 8>(
        iq3s_quad(q, qh, sg, 0u), iq3s_quad(q, qh, sg, 1u), iq3s_quad(q, qh, sg, 2u), iq3s_quad(q, qh, sg, 3u),
        iq3s_quad(q, qh, sg, 4u), iq3s_quad(q, qh, sg, 5u), iq3s_quad(q, qh, sg, 6u), iq3s_quad(q, qh, sg, 7u)));
}
