// SPDX-License-Identifier: Apache-2.0
// gaussian_topk: Gemma 3n's activation sparsity over the first n columns of each row,
// x[r, i] = max(x[r, i] - (mean + std · multiplier), 0) with the row's mean and population
// standard deviation (the cutoff a Gaussian's quantile p puts there: multiplier = icdf(p)).
//
// Bindings (group 0)
//   0 params  uniform     Params   mirrors gpu::kernels::altup::TopkParams
//   1 x       read_write  f32 (rows, stride): each row's first n columns (an MLP's gate beside its up)
// Workgroup: 64 invocations per row. Invocation l sums its strided elements, shared/row_sum.wgsl
// adds the sums in a fixed order (the mean), then the same for the squared distances from the
// mean (the variance, two-pass as torch.std); then each invocation cuts its elements. Rows are
// batch invariant.
// Grid: (rows, 1, 1).

struct Params {
    rows: u32,
    n: u32,
    stride: u32,
    multiplier: f32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

#include shared/row_sum.wgsl

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wid.x * params.stride;
    var s = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        s += x[base + i];
    }
    let mean = row_sum(lid, s) / f32(params.n);
    workgroupBarrier();
    var d = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let v = x[base + i] - mean;
        d += v * v;
    }
    let sd = sqrt(row_sum(lid, d) / f32(params.n));
    let cutoff = mean + sd * params.multiplier;
    for (var i = lid; i < params.n; i += WG) {
        x[base + i] = max(x[base + i] - cutoff, 0.0);
    }
}
