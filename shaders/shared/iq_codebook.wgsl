// SPDX-License-Identifier: Apache-2.0
// Helpers of the IQ2/IQ3 codebook decoders (formats/iq2_*.wgsl, iq3_*.wgsl): sign bits to
// factors, ggml's ksigns_iq2xs computed instead of looked up, and the IQ2 grids' values. The
// codebooks themselves come from `#include codebook NAME` (a storage buffer; see
// gpu/pipelines.rs).

// Factors +1 / -1 of the four sign bits of s at bits shift .. shift + 3 (set: negative).
fn iq_signs(s: u32, shift: u32) -> vec4<f32> {
    let bits = (vec4<u32>(s) >> (vec4<u32>(0u, 1u, 2u, 3u) + shift)) & vec4<u32>(1u);
    return select(vec4<f32>(1.0), vec4<f32>(-1.0), bits != vec4<u32>(0u));
}

// ggml's ksigns_iq2xs[i] (i < 128): the 7 sign bits of i and an eighth that makes the minus
// signs even.
fn iq_ksigns(i: u32) -> u32 {
    return i | ((countOneBits(i) & 1u) << 7u);
}

// Grid values of 4 elements of a packed IQ2 codebook entry (2 bits each: 8, 25, 43) at bits
// shift .. shift + 7.
fn iq2_grid4(entry: u32, shift: u32) -> vec4<f32> {
    let k = (vec4<u32>(entry) >> (vec4<u32>(0u, 2u, 4u, 6u) + shift)) & vec4<u32>(3u);
    return vec4<f32>(8u + 17u * k + (k >> vec4<u32>(1u)));
}
