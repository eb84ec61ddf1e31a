// SPDX-License-Identifier: Apache-2.0
// Q6_K (ggml block_q6_K, 210-byte super-blocks of 256 elements, 2-byte aligned): ql 128 bytes,
// qh 64 bytes, 16 signed 8-bit scales, d f16. Sub-block j: half h = j / 4, quarter r = j % 4;
// element l: q = (ql[64h + 32(r % 2) + l] >> 4(r / 2)) & 15 | ((qh[32h + l] >> 2r) & 3) << 4,
// value = d * scale[8h + 2r + l / 16] * (q - 32). Two scales per sub-block, so the codes carry
// them: dm = (d, 0), q = scale * (q - 32), exactly ggml's value (d * scale is exact in f32).
const W_SUPER_BYTES: u32 = 210u;
const W_UNIT_BYTES: u32 = W_SUPER_BYTES;
const W_HAS_MIN: bool = false;

#include shared/block_words.wgsl

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn q6(ql: u32, lshift: u32, qh: u32, hshift: u32, scale: f32) -> vec4<f32> {
    let lo = (bytes4(ql) >> vec4<u32>(lshift)) & vec4<u32>(15u);
    let hi = (bytes4(qh) >> vec4<u32>(hshift)) & vec4<u32>(3u);
    return scale * (vec4<f32>(lo | (hi << vec4<u32>(4u))) - 32.0);
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    let j = b & 7u;
    let h = j >> 2u;
    let r = j & 3u;
    let sb = w_unit_byte(row_byte, b >> 3u);
    let ql = wwords8(sb + 64u * h + 32u * (r & 1u));
    let qh = wwords8(sb + 128u + 32u * h);
    let sc = whalf(sb + 192u + 8u * h + 2u * r);
    let s0 = f32((bitcast<i32>(sc) << 24u) >> 24u);
    let s1 = f32((bitcast<i32>(sc) << 16u) >> 24u);
    let d = unpack2x16float(whalf(sb + 208u)).x;
    let ls = 4u * (r >> 1u);
    let hs = 2u * r;
    return WBlock(vec2<f32>(d, 0.0), array<vec4<f32>, 8>(
        q6(ql[0], ls, qh[0], hs, s0), q6(ql[1], ls, qh[1], hs, s0),
        q6(ql[2], ls, qh[2], hs, s0), q6(ql[3], ls, qh[3], hs, s0),
        q6(ql[4], ls, qh[4], hs, s1), q6(ql[5], ls, qh[5], hs, s1),
        q6(ql[6], ls, qh[6], hs, s1), q6(ql[7], ls, qh[7], hs, s1)));
}
