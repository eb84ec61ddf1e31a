// SPDX-License-Identifier: Apache-2.0
// IQ2_S (ggml block_iq2_s, 82-byte super-blocks of 256 elements, 2-byte aligned): d f16, qs 32
// bytes, signs 32 bytes, qh 8 bytes, scales 8 bytes. Sub-block j, group l of 8 elements: index
// = qs[4j + l] | ((qh[j] >> 2l) & 3) << 8, db = d * (0.5 + ((scales[j] >> 4(l / 2)) & 15)) *
// 0.25; value e = db * grid * sign with grid IQ2S_GRID[index] (8 elements of 2 bits: 8, 25, 43;
// the codebooks buffer) and sign bit e of signs[4j + l]. Two scales per 32 elements, so the
// codes are the values themselves: dm = (1, 0), each computed as ggml does.
const W_SUPER_BYTES: u32 = 82u;
const W_UNIT_BYTES: u32 = W_SUPER_BYTES;
const W_HAS_MIN: bool = false;

#include shared/block_words.wgsl
#include shared/iq_codebook.wgsl
#include codebook IQ2S_GRID

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

// The 8 values of group l of the sub-block whose index bytes, high index bits and sign bytes
// are qs, qh and sg, at scale db: elements 0..3 and 4..7.
fn iq2s_group(qs: u32, qh: u32, sg: u32, l: u32, db: f32) -> array<vec4<f32>, 2> {
    let entry = iq2s_grid(((qs >> (8u * l)) & 255u) | (((qh >> (2u * l)) & 3u) << 8u));
    return array<vec4<f32>, 2>(
        db * iq2_grid4(entry, 0u) * iq_signs(sg, 8u * l),
        db * iq2_grid4(entry, 8u) * iq_signs(sg, 8u * l + 4u));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    let j = b & 7u;
    let sb = w_unit_byte(row_byte, b >> 3u);
    let d = unpack2x16float(whalf(sb)).x;
    let qs = wwords2(sb + 2u + 4u * j).x;
    let sg = wwords2(sb + 34u + 4u * j).x;
    let qh = wbyte(sb + 66u + j);
    let s = wbyte(sb + 74u + j);
    let db0 = d * (0.5 + f32(s & 15u)) * 0.25;
    let db1 = d * (0.5 + f32(s >> 4u)) * 0.25;
    let g0 = iq2s_group(qs, qh, sg, 0u, db0);
    let g1 = iq2s_group(qs, qh, sg, 1u, db0);
    let g2 = iq2s_group(qs, qh, sg, 2u, db1);
    let g3 = iq2s_group(qs, qh, sg, 3u, db1);
    return WBlock(vec2<f32>(1.0, 0.0), array<vec4<f32>, 8>(g0[0], g0[1], g1[0], g1[1], g2[0], g2[1], g3[0], g3[1]));
}
