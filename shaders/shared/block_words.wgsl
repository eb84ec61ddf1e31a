// SPDX-License-Identifier: Apache-2.0
// Helpers of the super-block format decoders (formats/*_k.wgsl, iq*.wgsl), over the weight
// source's wload / wspan9: realigned words and 16-bit fields at 2-byte-aligned addresses
// (Q6_K's and Q3_K's super-blocks are 210 and 110 bytes, so every other one starts mid-word).

// The 8 words (32 bytes) starting at `byte`, which is even. A start mid-word reads the same 9
// words and shifts with select (no divergent branch).
fn wwords8(byte: u32) -> array<u32, 8> {
    let mid = (byte & 2u) != 0u;
    let s = wspan9(byte >> 2u);
    return array<u32, 8>(
        select(s[0], (s[0] >> 16u) | (s[1] << 16u), mid),
        select(s[1], (s[1] >> 16u) | (s[2] << 16u), mid),
        select(s[2], (s[2] >> 16u) | (s[3] << 16u), mid),
        select(s[3], (s[3] >> 16u) | (s[4] << 16u), mid),
        select(s[4], (s[4] >> 16u) | (s[5] << 16u), mid),
        select(s[5], (s[5] >> 16u) | (s[6] << 16u), mid),
        select(s[6], (s[6] >> 16u) | (s[7] << 16u), mid),
        select(s[7], (s[7] >> 16u) | (s[8] << 16u), mid));
}

// The 2 words (8 bytes) starting at `byte`, which is even, realigned as wwords8 does.
fn wwords2(byte: u32) -> vec2<u32> {
    let mid = (byte & 2u) != 0u;
    let i = byte >> 2u;
    let w0 = wload(i);
    let w1 = wload(i + 1u);
    let w2 = wload(i + 2u);
    return select(vec2<u32>(w0, w1), vec2<u32>((w0 >> 16u) | (w1 << 16u), (w1 >> 16u) | (w2 << 16u)), mid);
}

// The byte at `byte`, in the low 8 bits.
fn wbyte(byte: u32) -> u32 {
    return (wload(byte >> 2u) >> ((byte & 3u) * 8u)) & 255u;
}

// The 16 bits at `byte` (even), in the low half.
fn whalf(byte: u32) -> u32 {
    return (wload(byte >> 2u) >> ((byte & 2u) * 8u)) & 0xFFFFu;
}

// Byte k (0..3) of each lane of `v`.
fn bytes4(v: u32) -> vec4<u32> {
    return (vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u);
}
