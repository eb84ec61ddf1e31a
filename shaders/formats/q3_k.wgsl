// SPDX-License-Identifier: Apache-2.0
// Q3_K (ggml block_q3_K, 110-byte super-blocks of 256 elements, 2-byte aligned): hmask 32 bytes,
// qs 64 bytes, 12 bytes of 6-bit scales, d f16. Sub-block j: half h = j / 4, quarter r = j % 4;
// element l: q = (qs[32h + l] >> 2r) & 3, minus 4 unless bit 4h + r of hmask[l] is set; value =
// d * (scale(8h + 2r + l / 16) - 32) * q, scale(s) = low 4 bits (scales[s % 8] >> 4(s / 8)) | high
// 2 bits (scales[8 + s % 4] >> 2(s / 4)). The two scales ride in the codes: dm = (d, 0).
const W_SUPER_BYTES: u32 = 110u;
const W_UNIT_BYTES: u32 = W_SUPER_BYTES;
const W_HAS_MIN: bool = false;

#include shared/block_words.wgsl

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn q3(qs: u32, shift: u32, hm: u32, hbit: u32, scale: f32) -> vec4<f32> {
    let q = (bytes4(qs) >> vec4<u32>(shift)) & vec4<u32>(3u);
    let high = (bytes4(hm) >> vec4<u32>(hbit)) & vec4<u32>(1u);
    return scale * (vec4<f32>(q) - select(vec4<f32>(4.0), vec4<f32>(0.0), high == vec4<u32>(1u)));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    let j = b & 7u;
    let h = j >> 2u;
    let r = j & 3u;
    let sb = w_unit_byte(row_byte, b >> 3u);
    let hm = wwords8(sb);
    let qs = wwords8(sb + 32u + 32u * h);
    // Scales 8h + 2r and 8h + 2r + 1: their low bits in bytes 2r, 2r + 1 (nibble h), their high
    // bits in bytes 8 + 2(r % 2), 8 + 2(r % 2) + 1 (bits 2(2h + r / 2)).
    let lo = whalf(sb + 96u + 2u * r) >> (4u * h);
    let hi = whalf(sb + 104u + 2u * (r & 1u)) >> (2u * (2u * h + (r >> 1u)));
    let s0 = f32(i32((lo & 15u) | ((hi & 3u) << 4u)) - 32);
    let s1 = f32(i32(((lo >> 8u) & 15u) | (((hi >> 8u) & 3u) << 4u)) - 32);
    let d = unpack2x16float(whalf(sb + 108u)).x;
    let sh = 2u * r;
    let hb = 4u * h + r;
    return WBlock(vec2<f32>(d, 0.0), array<vec4<f32>, 8>(
        q3(qs[0], sh, hm[0], hb, s0), q3(qs[1], sh, hm[1], hb, s0),
        q3(qs[2], sh, hm[2], hb, s0), q3(qs[3], sh, hm[3], hb, s0),
        q3(qs[4], sh, hm[4], hb, s1), q3(qs[5], sh, hm[5], hb, s1),
        q3(qs[6], sh, hm[6], hb, s1), q3(qs[7], sh, hm[7], hb, s1)));
}
