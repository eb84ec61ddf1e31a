// SPDX-License-Identifier: Apache-2.0
// IQ4_XS (ggml block_iq4_xs, 136-byte super-blocks of 256 elements, 8-byte aligned): d f16,
// scales_h u16, scales_l 4 bytes, 128 bytes of nibbles (16 per sub-block, as Q4_0). Sub-block j:
// ls = (scales_l[j / 2] >> 4(j % 2)) & 15 | ((scales_h >> 2j) & 3) << 4; value = (d * (ls - 32))
// * grid[nibble] with IQ4_NL's grid, so dm = (d * (ls - 32), 0).
const W_SUPER_BYTES: u32 = 136u;
const W_UNIT_BYTES: u32 = W_SUPER_BYTES;
const W_HAS_MIN: bool = false;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

#include shared/iq4_grid.wgsl

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    let j = b & 7u;
    let i = w_unit_byte(row_byte, b >> 3u) >> 2u;
    // The header's two words share one aligned group of four (i is even).
    let g = wload4a(i & ~3u);
    let odd = (i & 2u) != 0u;
    let h0 = select(g.x, g.z, odd); // d | scales_h << 16
    let h1 = select(g.y, g.w, odd); // scales_l
    let s = wspan5(i + 2u + 4u * j);
    let ls = ((h1 >> (4u * j)) & 15u) | (((h0 >> (16u + 2u * j)) & 3u) << 4u);
    let d = unpack2x16float(h0).x;
    return WBlock(vec2<f32>(d * f32(i32(ls) - 32), 0.0), array<vec4<f32>, 8>(
        iq4(s[0], 0u), iq4(s[1], 0u), iq4(s[2], 0u), iq4(s[3], 0u),
        iq4(s[0], 4u), iq4(s[1], 4u), iq4(s[2], 4u), iq4(s[3], 4u)));
}
