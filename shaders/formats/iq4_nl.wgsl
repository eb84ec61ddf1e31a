// SPDX-License-Identifier: Apache-2.0
// IQ4_NL (ggml block_iq4_nl, 18 bytes): Q4_0's layout (d f16, 16 bytes of nibbles) with each
// nibble an index into a fixed non-linear grid; value = d * grid[nibble]. A block starts on a
// word or mid-word; both cases read the same 5 words and pick with select.
const W_BLOCK_BYTES: u32 = 18u;
const W_UNIT_BYTES: u32 = W_BLOCK_BYTES;
const W_HAS_MIN: bool = false;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

#include shared/iq4_grid.wgsl

fn w_block(byte: u32) -> WBlock {
    let mid = (byte & 2u) != 0u;
    let s = wspan5(byte >> 2u);
    let c0 = select((s[0] >> 16u) | (s[1] << 16u), s[1], mid);
    let c1 = select((s[1] >> 16u) | (s[2] << 16u), s[2], mid);
    let c2 = select((s[2] >> 16u) | (s[3] << 16u), s[3], mid);
    let c3 = select((s[3] >> 16u) | (s[4] << 16u), s[4], mid);
    let d = unpack2x16float(select(s[0], s[0] >> 16u, mid)).x;
    return WBlock(vec2<f32>(d, 0.0), array<vec4<f32>, 8>(
        iq4(c0, 0u), iq4(c1, 0u), iq4(c2, 0u), iq4(c3, 0u),
        iq4(c0, 4u), iq4(c1, 4u), iq4(c2, 4u), iq4(c3, 4u)));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    return w_block(w_unit_byte(row_byte, b));
}
