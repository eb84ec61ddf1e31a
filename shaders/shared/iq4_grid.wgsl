// SPDX-License-Identifier: Apache-2.0
// The 16-value non-linear grid of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl: -127, -104, -83,
// -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113), stored + 128 as the bytes of four
// words and looked up with selects and a shift, not an indexed array (lavapipe would spill one).
const IQ4_G0: u32 = 0x3F2D1801u; //   1,  24,  45,  63
const IQ4_G1: u32 = 0x766A5D4Fu; //  79,  93, 106, 118
const IQ4_G2: u32 = 0xA6998D81u; // 129, 141, 153, 166
const IQ4_G3: u32 = 0xF1D9C5B5u; // 181, 197, 217, 241

// Grid values of the four nibbles of word c at bits shift, shift + 8, shift + 16, shift + 24.
fn iq4(c: u32, shift: u32) -> vec4<f32> {
    let n = (vec4<u32>(c) >> (vec4<u32>(0u, 8u, 16u, 24u) + shift)) & vec4<u32>(15u);
    let g = select(
        select(vec4<u32>(IQ4_G0), vec4<u32>(IQ4_G1), n >= vec4<u32>(4u)),
        select(vec4<u32>(IQ4_G2), vec4<u32>(IQ4_G3), n >= vec4<u32>(12u)),
        n >= vec4<u32>(8u));
    return vec4<f32>((g >> ((n & vec4<u32>(3u)) * 8u)) & vec4<u32>(255u)) - 128.0;
}
