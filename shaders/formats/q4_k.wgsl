// SPDX-License-Identifier: Apache-2.0
// Q4_K (ggml block_q4_K, 144-byte super-blocks of 256 elements, 16-byte aligned): d f16, dmin
// f16, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles. Sub-block j (32 elements) has
// (sc, m) = get_scale_min_k4(j) and the low (even j) or high (odd j) nibbles of bytes
// 32 * (j / 2) .. + 32; value = (d * sc) * q - (dmin * m), so dm = (d * sc, -(dmin * m)).
const W_SUPER_BYTES: u32 = 144u;
const W_HAS_MIN: bool = true;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn nib(word: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(word) >> (vec4<u32>(0u, 8u, 16u, 24u) + shift)) & vec4<u32>(15u));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    let j = b & 7u;
    let i = (row_byte + (b >> 3u) * W_SUPER_BYTES) >> 2u;
    let h = wload4a(i); // d | dmin, then scale bytes 0..3, 4..7, 8..11
    let q0 = wload4a(i + 4u + 8u * (j >> 1u));
    let q1 = wload4a(i + 8u + 8u * (j >> 1u));
    // get_scale_min_k4: sub-blocks 0..3 in the low 6 bits of bytes j and j + 4; 4..7 in the
    // nibbles of byte j + 4 with the top bits in the high 2 bits of bytes j - 4 and j.
    let sh = 8u * (j & 3u);
    let a = (h.y >> sh) & 255u;
    let bb = (h.z >> sh) & 255u;
    let c = (h.w >> sh) & 255u;
    let hi = j >= 4u;
    let sc = select(a & 63u, (c & 15u) | ((a >> 6u) << 4u), hi);
    let m = select(bb & 63u, (c >> 4u) | ((bb >> 6u) << 4u), hi);
    let dd = unpack2x16float(h.x);
    let s = 4u * (j & 1u);
    return WBlock(vec2<f32>(dd.x * f32(sc), -(dd.y * f32(m))), array<vec4<f32>, 8>(
        nib(q0.x, s), nib(q0.y, s), nib(q0.z, s), nib(q0.w, s),
        nib(q1.x, s), nib(q1.y, s), nib(q1.z, s), nib(q1.w, s)));
}
