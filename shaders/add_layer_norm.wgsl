// SPDX-License-Identifier: Apache-2.0
// add_layer_norm: the residual connection and a LayerNorm in one pass (BERT's post-norm layers
// and its embedding norm):
//   x[r, i] += delta[r, i];  y[r, i] = (x[r, i] - mean) / sqrt(var + eps) * weight[i] + bias[i]
// with mean and var (biased, as torch's LayerNorm) over the row, var from the centred values.
//
// Bindings (group 0)
//   0 params  uniform     Params         mirrors gpu::kernels::reduce::LayerNormParams
//   1 x       read_write  f32 (rows, n)  the residual stream, updated in place
//   2 delta   read        f32 (rows, n)
//   3 weight  read        f32 (n)
//   4 bias    read        f32 (n)
//   5 y       read_write  f32 (rows, n)
// Workgroup: 64 invocations per row, as rms_norm. Invocation t takes x[r, t], x[r, t + 64], …;
// shared/row_norm.wgsl's fixed tree adds the partial sums, once for the mean and once for the
// squared deviations. Rows are batch invariant.
// Grid: (rows, 1, 1).

struct Params {
    rows: u32,
    n: u32,
    eps: f32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> delta: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

#include shared/row_norm.wgsl

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wid.x * params.n;
    var s = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let v = x[base + i] + delta[base + i];
        x[base + i] = v;
        s += v;
    }
    let mean = row_sum(lid, s) / f32(params.n);
    workgroupBarrier();
    var d2 = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let d = x[base + i] - mean;
        d2 += d * d;
    }
    let scale = inverseSqrt(row_sum(lid, d2) / f32(params.n) + params.eps);
    for (var i = lid; i < params.n; i += WG) {
        y[base + i] = (x[base + i] - mean) * scale * weight[i] + bias[i];
    }
}
