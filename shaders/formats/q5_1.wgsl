// SPDX-License-Identifier: Apache-2.0
// Q5_1 (ggml block_q5_1, 24 bytes, word-aligned): d f16, m f16, qh u32, 16 bytes of nibbles as
// Q4_1; value = d * (nibble | bit << 4) + m.
const W_BLOCK_BYTES: u32 = 24u;
const W_UNIT_BYTES: u32 = W_BLOCK_BYTES;
const W_HAS_MIN: bool = true;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

// Elements 4j .. 4j+3: nibbles of word c at bit `shift`, fifth bits of qh from bit `hbit`.
fn q5(c: u32, shift: u32, qh: u32, hbit: u32) -> vec4<f32> {
    let lo = (vec4<u32>(c) >> (vec4<u32>(0u, 8u, 16u, 24u) + shift)) & vec4<u32>(15u);
    let hi = (vec4<u32>(qh) >> (vec4<u32>(0u, 1u, 2u, 3u) + hbit)) & vec4<u32>(1u);
    return vec4<f32>(lo | (hi << vec4<u32>(4u)));
}

fn w_block(byte: u32) -> WBlock {
    let s = wspan5(byte >> 2u);
    let c3 = wload((byte >> 2u) + 5u);
    let qh = s[1];
    return WBlock(unpack2x16float(s[0]), array<vec4<f32>, 8>(
        q5(s[2], 0u, qh, 0u), q5(s[3], 0u, qh, 4u), q5(s[4], 0u, qh, 8u), q5(c3, 0u, qh, 12u),
        q5(s[2], 4u, qh, 16u), q5(s[3], 4u, qh, 20u), q5(s[4], 4u, qh, 24u), q5(c3, 4u, qh, 28u)));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    return w_block(w_unit_byte(row_byte, b));
}
