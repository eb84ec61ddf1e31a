// SPDX-License-Identifier: Apache-2.0
// rms_norm: y[r, i] = x[r, i] / sqrt(mean(x[r, :]²) + eps) * weight[i].
//
// Bindings (group 0)
//   0 params  uniform     Params         mirrors gpu::kernels::reduce::RmsNormParams
//   1 x       read        f32 (rows, n)
//   2 weight  read        f32 (n)
//   3 y       read_write  f32 (rows, n)
// Workgroup: 64 invocations per row. Invocation t sums the squares of x[r, t], x[r, t + 64], …;
// shared/row_norm.wgsl adds the partial sums in a fixed order; then each invocation scales its
// strided elements. Rows are batch invariant.
// Grid: (rows, 1, 1).

struct Params {
    rows: u32,
    n: u32,
    eps: f32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

#include shared/row_norm.wgsl

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wid.x * params.n;
    var s = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let v = x[base + i];
        s += v * v;
    }
    let scale = norm_scale(lid, s);
    for (var i = lid; i < params.n; i += WG) {
        y[base + i] = x[base + i] * scale * weight[i];
    }
}
