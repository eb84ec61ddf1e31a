// SPDX-License-Identifier: Apache-2.0
// Q8_0 (ggml block_q8_0, 34 bytes): d f16, 32 signed bytes; value = d * q. A block starts on a
// word or mid-word; both cases read the same 9 words and pick with select.
const W_BLOCK_BYTES: u32 = 34u;
const W_UNIT_BYTES: u32 = W_BLOCK_BYTES;
const W_HAS_MIN: bool = false;

struct WBlock {
    dm: vec2<f32>,
    q: array<vec4<f32>, 8>,
}

fn signed_bytes(word: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(word) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

fn w_block(byte: u32) -> WBlock {
    let mid = (byte & 2u) != 0u;
    let s = wspan9(byte >> 2u);
    let c0 = select((s[0] >> 16u) | (s[1] << 16u), s[1], mid);
    let c1 = select((s[1] >> 16u) | (s[2] << 16u), s[2], mid);
    let c2 = select((s[2] >> 16u) | (s[3] << 16u), s[3], mid);
    let c3 = select((s[3] >> 16u) | (s[4] << 16u), s[4], mid);
    let c4 = select((s[4] >> 16u) | (s[5] << 16u), s[5], mid);
    let c5 = select((s[5] >> 16u) | (s[6] << 16u), s[6], mid);
    let c6 = select((s[6] >> 16u) | (s[7] << 16u), s[7], mid);
    let c7 = select((s[7] >> 16u) | (s[8] << 16u), s[8], mid);
    let d = unpack2x16float(select(s[0], s[0] >> 16u, mid)).x;
    return WBlock(vec2<f32>(d, 0.0), array<vec4<f32>, 8>(
        signed_bytes(c0), signed_bytes(c1), signed_bytes(c2), signed_bytes(c3),
        signed_bytes(c4), signed_bytes(c5), signed_bytes(c6), signed_bytes(c7)));
}

fn w_block_at(row_byte: u32, b: u32) -> WBlock {
    return w_block(w_unit_byte(row_byte, b));
}
