// SPDX-License-Identifier: Apache-2.0
// Q2_K (ggml block_q2_K, 84-byte super-blocks of 256 elements, word-aligned): 16 scale bytes
// (low nibble scale, high nibble min, one per 16 elements), qs 64 bytes, d f16, dmin f16.
// Sub-block j: half h = j / 4, quarter r = j % 4; element l: q = (qs[32h + l] >> 2r) & 3, s =
// scales[8h + 2r + l / 16]; value = (d * (s & 15)) * q - dmin * (s >> 4). A min per 16 elements
// cannot ride in dm, so the codes are the values themselves: dm = (1, 0), computed as ggml does.
const W_SUPER_BYTES: u32 = 84u;
const W_UNIT_BYTES: u32 = W_SUPER_BYTES;
const W_HAS_MIN: bool = false;

#include shared/block_words.wgsl

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn q2(qs: u32, shift: u32, dl: f32, ml: f32) -> vec4<f32> {
    return dl * vec4<f32>((bytes4(qs) >> vec4<u32>(shift)) & vec4<u32>(3u)) - ml;
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    let j = b & 7u;
    let h = j >> 2u;
    let r = j & 3u;
    let sb = w_unit_byte(row_byte, b >> 3u);
    let qs = wspan9((sb + 16u + 32u * h) >> 2u);
    let s = whalf(sb + 8u * h + 2u * r);
    let dd = unpack2x16float(wload((sb + 80u) >> 2u));
    let dl0 = dd.x * f32(s & 15u);
    let ml0 = dd.y * f32((s >> 4u) & 15u);
    let dl1 = dd.x * f32((s >> 8u) & 15u);
    let ml1 = dd.y * f32((s >> 12u) & 15u);
    let sh = 2u * r;
    return WBlock(vec2<f32>(1.0, 0.0), array<vec4<f32>, 8>(
        q2(qs[0], sh, dl0, ml0), q2(qs[1], sh, dl0, ml0), q2(qs[2], sh, dl0, ml0), q2(qs[3], sh, dl0, ml0),
        q2(qs[4], sh, dl1, ml1), q2(qs[5], sh, dl1, ml1), q2(qs[6], sh, dl1, ml1), q2(qs[7], sh, dl1, ml1)));
}
