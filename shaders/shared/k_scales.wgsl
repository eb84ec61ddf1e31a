// SPDX-License-Identifier: Apache-2.0
// The scale pair of sub-block j (of 8) of a Q4_K or Q5_K super-block, from its first 16 bytes
// h (d | dmin as f16, then 12 bytes of 6-bit scales and mins), as (d * sc, -(dmin * m)).
// ggml's get_scale_min_k4: sub-blocks 0..3 in the low 6 bits of bytes j and j + 4; 4..7 in the
// nibbles of byte j + 4 with the top bits in the high 2 bits of bytes j - 4 and j.
fn k_scale_min(h: vec4<u32>, j: u32) -> vec2<f32> {
    let sh = 8u * (j & 3u);
    let a = (h.y >> sh) & 255u;
    let bb = (h.z >> sh) & 255u;
    let c = (h.w >> sh) & 255u;
    let hi = j >= 4u;
    let sc = select(a & 63u, (c & 15u) | ((a >> 6u) << 4u), hi);
    let m = select(bb & 63u, (c >> 4u) | ((bb >> 6u) << 4u), hi);
    let dd = unpack2x16float(h.x);
    return vec2<f32>(dd.x * f32(sc), -(dd.y * f32(m)));
}
