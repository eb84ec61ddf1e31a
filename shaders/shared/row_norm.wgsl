// SPDX-License-Identifier: Apache-2.0
// The RMS norm scale of one row, shared by rms_norm and add_rms_norm so both reduce in the same
// order: each of the WG invocations passes the sum of squares of its strided elements;
// shared/row_sum.wgsl adds them in a fixed tree (row_sum, which add_layer_norm also uses for its
// mean and variance); the result is 1 / sqrt(mean + eps). The order depends only on n, so rows
// are batch invariant. The including kernel defines WG and params.n/eps.

#include shared/row_sum.wgsl

fn norm_scale(lid: u32, partial: f32) -> f32 {
    return norm_scale_of(lid, partial, params.n);
}

// norm_scale of a row n wide, where n is not params.n (head_rms_norm's key groups).
fn norm_scale_of(lid: u32, partial: f32, n: u32) -> f32 {
    return inverseSqrt(row_sum(lid, partial) / f32(n) + params.eps);
}

