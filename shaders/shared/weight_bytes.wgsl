// SPDX-License-Identifier: Apache-2.0
// Byte-level reads from `w`, the raw bytes of one weight part seen as array<u32>.
// The including kernel declares `w`. GGUF blocks are 18 or 34 bytes long, so a block (and the
// words inside it) may start at any even byte: these helpers take even byte offsets.

// The 16-bit little-endian value at an even byte offset.
fn w_u16(byte: u32) -> u32 {
    return (w[byte >> 2u] >> ((byte & 2u) * 8u)) & 0xffffu;
}

// The 32-bit little-endian value at an even byte offset (stitched from two words when unaligned).
fn w_u32(byte: u32) -> u32 {
    let word = byte >> 2u;
    if ((byte & 2u) == 0u) {
        return w[word];
    }
    return (w[word] >> 16u) | (w[word + 1u] << 16u);
}

// An IEEE half held in the low 16 bits, widened to f32 (core WGSL: no shader-f16 needed).
fn half_to_f32(bits: u32) -> f32 {
    return unpack2x16float(bits).x;
}
