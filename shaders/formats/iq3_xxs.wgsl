// SPDX-License-Identifier: Apache-2.0
// IQ3_XXS (ggml block_iq3_xxs, 98-byte super-blocks of 256 elements, 2-byte aligned): d f16, qs
// 64 bytes, then 8 u32 of scales and signs. Sub-block j: a = that u32, db = d * (0.5 + (a >>
// 28)) * 0.5; group l of 8 elements: signs = ksigns((a >> 7l) & 127), elements 0..3 from
// IQ3XXS_GRID[qs[8j + 2l]] and 4..7 from IQ3XXS_GRID[qs[8j + 2l + 1]] (4 elements of 3 bits:
// 4, 12, ..., 52, 62; the codebooks buffer); value e = db * grid * sign e. One scale per 32
// elements: dm = (db, 0), the codes grid * sign (db * (grid * sign) is ggml's db * grid * sign
// to the bit: the sign is exact).
const W_SUPER_BYTES: u32 = 98u;
const W_UNIT_BYTES: u32 = W_SUPER_BYTES;
const W_HAS_MIN: bool = false;

#include shared/block_words.wgsl
#include shared/iq_codebook.wgsl
#include codebook IQ3XXS_GRID

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

// Grid values of the 4 elements of entry i: 3 bits each, 4 + 8k but 62 for k = 7.
fn iq3xxs_grid4(i: u32) -> vec4<f32> {
    let k = (vec4<u32>(iq3xxs_grid(i)) >> vec4<u32>(0u, 3u, 6u, 9u)) & vec4<u32>(7u);
    return vec4<f32>(4u + 8u * k + select(vec4<u32>(0u), vec4<u32>(2u), k == vec4<u32>(7u)));
}

// The 8 codes of a group whose two index bytes are the low 16 bits of q, with sign index si.
fn iq3xxs_group(q: u32, si: u32) -> array<vec4<f32>, 2> {
    let signs = iq_ksigns(si & 127u);
    return array<vec4<f32>, 2>(
        iq3xxs_grid4(q & 255u) * iq_signs(signs, 0u),
        iq3xxs_grid4((q >> 8u) & 255u) * iq_signs(signs, 4u));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    let j = b & 7u;
    let sb = w_unit_byte(row_byte, b >> 3u);
    let d = unpack2x16float(whalf(sb)).x;
    let q = wwords2(sb + 2u + 8u * j);
    let a = wwords2(sb + 66u + 4u * j).x;
    let db = d * (0.5 + f32(a >> 28u)) * 0.5;
    let g0 = iq3xxs_group(q.x, a);
    let g1 = iq3xxs_group(q.x >> 16u, a >> 7u);
    let g2 = iq3xxs_group(q.y, a >> 14u);
    let g3 = iq3xxs_group(q.y >> 16u, a >> 21u);
    return WBlock(vec2<f32>(db, 0.0), array<vec4<f32>, 8>(g0[0], g0[1], g1[0], g1[1], g2[0], g2[1], g3[0], g3[1]));
}
