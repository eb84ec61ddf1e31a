// SPDX-License-Identifier: Apache-2.0
// The RMS norm scale of one row, shared by rms_norm and add_rms_norm so both reduce in the same
// order: each of the WG invocations passes the sum of squares of its strided elements; a fixed
// tree over workgroup memory adds them (row_sum, which add_layer_norm also uses for its mean and
// variance); the result is 1 / sqrt(mean + eps). The order depends only on n, so rows are batch
// invariant. The including kernel defines WG and params.n/eps.

var<workgroup> sh_sum: array<f32, WG>;

fn norm_scale(lid: u32, partial: f32) -> f32 {
    return norm_scale_of(lid, partial, params.n);
}

// norm_scale of a row n wide, where n is not params.n (head_rms_norm's key groups).
fn norm_scale_of(lid: u32, partial: f32, n: u32) -> f32 {
    return inverseSqrt(row_sum(lid, partial) / f32(n) + params.eps);
}

// The sum of the WG invocations' partials, in a fixed tree. Every invocation must call it; a
// second call must follow a workgroupBarrier() after the first result is read.
fn row_sum(lid: u32, partial: f32) -> f32 {
    sh_sum[lid] = partial;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            sh_sum[lid] += sh_sum[lid + stride];
        }
        workgroupBarrier();
    }
    return sh_sum[0];
}
