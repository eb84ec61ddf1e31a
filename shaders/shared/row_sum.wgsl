// SPDX-License-Identifier: Apache-2.0
// A row's sum over a workgroup, in a fixed tree over workgroup memory: the order depends only on
// WG, so rows are batch invariant. The including kernel defines WG. Used by the norms
// (shared/row_norm.wgsl) and by Gemma 3n's magnitude_match and gaussian_topk.

var<workgroup> sh_sum: array<f32, WG>;

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
