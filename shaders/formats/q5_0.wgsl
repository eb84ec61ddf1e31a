// SPDX-License-Identifier: Apache-2.0
// Q5_0 (ggml block_q5_0, 22 bytes): d f16, qh u32 (bit i = element i's fifth bit), 16 bytes of
// nibbles as Q4_0; value = d * ((nibble | bit << 4) - 16). A block starts on a word or mid-word;
// both cases read the same 6 words and pick with select.
const W_BLOCK_BYTES: u32 = 22u;
const W_UNIT_BYTES: u32 = W_BLOCK_BYTES;
const W_HAS_MIN: bool = false;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

// Elements 4j .. 4j+3: nibbles of word c at bit `shift`, fifth bits of qh from bit `hbit`.
fn q5(c: u32, shift: u32, qh: u32, hbit: u32) -> vec4<f32> {
    let lo = (vec4<u32>(c) >> (vec4<u32>(0u, 8u, 16u, 24u) + shift)) & vec4<u32>(15u);
    let hi = (vec4<u32>(qh) >> (vec4<u32>(0u, 1u, 2u, 3u) + hbit)) & vec4<u32>(1u);
    return vec4<f32>(lo | (hi << vec4<u32>(4u))) - 16.0;
}

fn w_block(byte: u32) -> WBlock {
    let mid = (byte & 2u) != 0u;
    let s = wspan5(byte >> 2u);
    let s5 = wload((byte >> 2u) + 5u);
    let d = unpack2x16float(select(s[0], s[0] >> 16u, mid)).x;
    let qh = select((s[0] >> 16u) | (s[1] << 16u), s[1], mid);
    let c0 = select((s[1] >> 16u) | (s[2] << 16u), s[2], mid);
    let c1 = select((s[2] >> 16u) | (s[3] << 16u), s[3], mid);
    let c2 = select((s[3] >> 16u) | (s[4] << 16u), s[4], mid);
    let c3 = select((s[4] >> 16u) | (s5 << 16u), s5, mid);
    return WBlock(vec2<f32>(d, 0.0), array<vec4<f32>, 8>(
        q5(c0, 0u, qh, 0u), q5(c1, 0u, qh, 4u), q5(c2, 0u, qh, 8u), q5(c3, 0u, qh, 12u),
        q5(c0, 4u, qh, 16u), q5(c1, 4u, qh, 20u), q5(c2, 4u, qh, 24u), q5(c3, 4u, qh, 28u)));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    return w_block(w_unit_byte(row_byte, b));
}
