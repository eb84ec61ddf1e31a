// SPDX-License-Identifier: Apache-2.0
// Weight format F32: rows of little-endian f32.
#include shared/float_weights.wgsl

fn w_float(row_byte: u32, e: u32) -> f32 {
    return bitcast<f32>(w[row_byte / 4u + e]);
}
