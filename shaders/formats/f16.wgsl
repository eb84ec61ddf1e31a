// SPDX-License-Identifier: Apache-2.0
// Weight format F16: rows of little-endian IEEE halves, widened with unpack2x16float so the
// baseline needs no shader-f16.
#include shared/float_weights.wgsl

fn w_float(row_byte: u32, e: u32) -> f32 {
    return half_to_f32(w_u16(row_byte + e * 2u));
}
