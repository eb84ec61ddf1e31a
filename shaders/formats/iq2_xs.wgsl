// SPDX-License-Identifier: Apache-2.0
// IQ2_XS (ggml block_iq2_xs, 74-byte super-blocks of 256 elements, 2-byte aligned): d f16, qs
// 32 u16, scales 8 bytes. Sub-block j, group l of 8 elements: q = qs[4j + l], db = d * (0.5 +
// ((scales[j] >> 4(l / 2)) & 15)) * 0.25; value e = db * grid * sign with grid IQ2XS_GRID[q &
// 511] (8 elements of 2 bits: 8, 25, 43; the codebooks buffer) and sign bit e of ksigns(q >> 9).
// Two scales per 32 elements, so the codes are the values themselves: dm = (1, 0), each
// computed as ggml does.
const W_SUPER_BYTES: u32 = 74u;
const W_UNIT_BYTES: u32 = W_SUPER_BYTES;
const W_HAS_MIN: bool = false;

#include shared/block_words.wgsl
#include shared/iq_codebook.wgsl
#include codebook IQ2XS_GRID

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

// The 8 values of qs word q (its low 16 bits) at scale db, elements 0..3 and 4..7.
fn iq2xs_group(q: u32, db: f32) -> array<vec4<f32>, 2> {
    let entry = iq2xs_grid(q & 511u);
    let signs = iq_ksigns((q >> 9u) & 127u);
    return array<vec4<f32>, 2>(
        db * iq2_grid4(entry, 0u) * iq_signs(signs, 0u),
        db * iq2_grid4(entry, 8u) * iq_signs(signs, 4u));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    let j = b & 7u;
    let sb = w_unit_byte(row_byte, b >> 3u);
    let d = unpack2x16float(whalf(sb)).x;
    // The sub-block's 4 u16 of qs.
    let q = wwords2(sb + 2u + 8u * j);
    let s = wbyte(sb + 66u + j);
    let db0 = d * (0.5 + f32(s & 15u)) * 0.25;
    let db1 = d * (0.5 + f32(s >> 4u)) * 0.25;
    let g0 = iq2xs_group(q.x, db0);
    let g1 = iq2xs_group(q.x >> 16u, db0);
    let g2 = iq2xs_group(q.y, db1);
    let g3 = iq2xs_group(q.y >> 16u, db1);
    return WBlock(vec2<f32>(1.0, 0.0), array<vec4<f32>, 8>(g0[0], g0[1], g1[0], g1[1], g2[0], g2[1], g3[0], g3[1]));
}
