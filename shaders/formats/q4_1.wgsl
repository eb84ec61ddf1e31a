// SPDX-License-Identifier: Apache-2.0
// Weight format Q4_1 (ggml block_q4_1, 20 bytes): d: f16, m: f16, then 16 bytes of nibbles laid
// out as in Q4_0; x = d * nibble + m. Chunks as in Q4_0.
const W_BLOCK: u32 = 32u;
const W_CHUNKS: u32 = 4u;
const W_HAS_MIN: bool = true;

fn w_scale(row_byte: u32, blk: u32) -> vec2<f32> {
    return unpack2x16float(w_u32(row_byte + blk * 20u));
}

fn w_chunk(row_byte: u32, blk: u32, c: u32, k: u32) -> mat2x4<f32> {
    let bytes = vec4<u32>(w_u32(row_byte + blk * 20u + 4u + 4u * c)) >> vec4<u32>(0u, 8u, 16u, 24u);
    return mat2x4<f32>(vec4<f32>(bytes & vec4<u32>(0xfu)), vec4<f32>((bytes >> vec4<u32>(4u)) & vec4<u32>(0xfu)));
}

fn w_first(c: u32) -> u32 {
    return 4u * c;
}

const W_GAP: u32 = 16u;
