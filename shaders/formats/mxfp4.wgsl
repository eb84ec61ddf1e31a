// SPDX-License-Identifier: Apache-2.0
// MXFP4 (ggml block_mxfp4, 17 bytes): e u8 (E8M0), 16 bytes of E2M1 nibbles as Q4_0 (low nibbles
// elements 0..15, high 16..31); value = kvalues_mxfp4[nibble] * 2^(e - 128), ggml's doubled
// E2M1 values {0, 1, 2, 3, 4, 6, 8, 12} (bit 3 the sign) with a halved scale, so dm = (2^(e - 128),
// 0). A block starts at any byte: the same 5 words hold it from any of the four offsets, and the
// codes are shifted out of them (no divergent branch).
const W_BLOCK_BYTES: u32 = 17u;
const W_UNIT_BYTES: u32 = W_BLOCK_BYTES;
const W_HAS_MIN: bool = false;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

// The magnitudes 0, 1, 2, 3 and 4, 6, 8, 12 as the bytes of two words, looked up with a select
// and a shift rather than an indexed array (see shared/iq4_grid.wgsl).
const MX_LO: u32 = 0x03020100u;
const MX_HI: u32 = 0x0C080604u;

// Values of the four nibbles of word c at bits shift, shift + 8, shift + 16, shift + 24.
fn mx4(c: u32, shift: u32) -> vec4<f32> {
    let n = (vec4<u32>(c) >> (vec4<u32>(0u, 8u, 16u, 24u) + shift)) & vec4<u32>(15u);
    let g = select(vec4<u32>(MX_LO), vec4<u32>(MX_HI), (n & vec4<u32>(4u)) != vec4<u32>(0u));
    let m = vec4<i32>((g >> ((n & vec4<u32>(3u)) * 8u)) & vec4<u32>(255u));
    // Negated as integers, so code 8 is +0 as in ggml.
    return vec4<f32>(select(m, -m, (n & vec4<u32>(8u)) != vec4<u32>(0u)));
}

// The 4 bytes at byte o (1..4) of the window a, b: whole word b at o = 4, where a 32-bit shift
// would wrap.
fn mx_word(a: u32, b: u32, o: u32) -> u32 {
    return select((a >> (8u * o)) | (b << (32u - 8u * o)), b, o == 4u);
}

fn w_block(byte: u32) -> WBlock {
    let s = wspan5(byte >> 2u);
    let e = (s[0] >> (8u * (byte & 3u))) & 255u;
    // ggml_e8m0_to_fp32_half: 2^(e - 128), a subnormal below e = 2.
    let d = select(bitcast<f32>((e - 1u) << 23u), bitcast<f32>(0x00200000u << e), e < 2u);
    let o = (byte & 3u) + 1u;
    let c0 = mx_word(s[0], s[1], o);
    let c1 = mx_word(s[1], s[2], o);
    let c2 = mx_word(s[2], s[3], o);
    let c3 = mx_word(s[3], s[4], o);
    return WBlock(vec2<f32>(d, 0.0), array<vec4<f32>, 8>(
        mx4(c0, 0u), mx4(c1, 0u), mx4(c2, 0u), mx4(c3, 0u),
        mx4(c0, 4u), mx4(c1, 4u), mx4(c2, 4u), mx4(c3, 4u)));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    return w_block(w_unit_byte(row_byte, b));
}
