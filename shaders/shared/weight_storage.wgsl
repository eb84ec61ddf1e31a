// SPDX-License-Identifier: Apache-2.0
// Weight source: the raw bytes of one weight part in a storage buffer (portable; what GPUs want).
// Every weight kernel reads weights only through these functions. Rows are in order (row-major).
@group(0) @binding(2) var<storage, read> w: array<u32>;

// Byte of unit 0 (the first block) of `row`.
fn w_row_byte(row: u32, row_bytes: u32) -> u32 {
    return row * row_bytes;
}

// Byte of unit u of the row whose unit 0 is at row_byte (W_UNIT_BYTES: the format's block).
fn w_unit_byte(row_byte: u32, u: u32) -> u32 {
    return row_byte + u * W_UNIT_BYTES;
}

// Word i (4 bytes, little-endian) of the part.
fn wload(i: u32) -> u32 {
    return w[i];
}

// Words i .. i + 3, i a multiple of 4.
fn wload4a(i: u32) -> vec4<u32> {
    return vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]);
}

// Words i .. i + 4 / i .. i + 8, any i.
fn wspan5(i: u32) -> array<u32, 5> {
    return array<u32, 5>(w[i], w[i + 1u], w[i + 2u], w[i + 3u], w[i + 4u]);
}

fn wspan9(i: u32) -> array<u32, 9> {
    return array<u32, 9>(w[i], w[i + 1u], w[i + 2u], w[i + 3u], w[i + 4u], w[i + 5u], w[i + 6u], w[i + 7u], w[i + 8u]);
}
