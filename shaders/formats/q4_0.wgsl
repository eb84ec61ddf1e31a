// SPDX-License-Identifier: Apache-2.0
// Weight format Q4_0 (ggml block_q4_0, 18 bytes): d: f16, then 16 bytes of nibbles. Byte i holds
// element i (low nibble) and element i + 16 (high nibble); x = d * (nibble - 8).
// Four chunks, one per 4-byte word: chunk c holds elements 4c .. 4c + 3 and 4c + 16 .. 4c + 19.
//
// The block interface every format gives the weight kernels:
//   W_BLOCK, W_CHUNKS  elements per block, 8-code chunks per block
//   W_HAS_MIN          whether values are d·code + m (else d·code)
//   w_scale(row_byte, blk) -> (d, m) of block blk of the row starting at byte row_byte
//   w_chunk(row_byte, blk, c, k) -> the 8 codes of chunk c as two vec4 runs of consecutive
//                      elements, starting at w_first(c) and w_first(c) + W_GAP in the block
const W_BLOCK: u32 = 32u;
const W_CHUNKS: u32 = 4u;
const W_HAS_MIN: bool = false;

fn w_scale(row_byte: u32, blk: u32) -> vec2<f32> {
    return vec2<f32>(half_to_f32(w_u16(row_byte + blk * 18u)), 0.0);
}

fn w_chunk(row_byte: u32, blk: u32, c: u32, k: u32) -> mat2x4<f32> {
    let bytes = vec4<u32>(w_u32(row_byte + blk * 18u + 2u + 4u * c)) >> vec4<u32>(0u, 8u, 16u, 24u);
    return mat2x4<f32>(vec4<f32>(bytes & vec4<u32>(0xfu)) - 8.0, vec4<f32>((bytes >> vec4<u32>(4u)) & vec4<u32>(0xfu)) - 8.0);
}

fn w_first(c: u32) -> u32 {
    return 4u * c;
}

const W_GAP: u32 = 16u;
