// SPDX-License-Identifier: Apache-2.0
// add_rms_norm: the residual connection and the next norm in one pass:
//   x[r, i] += delta[r, i] * delta_scale;  y[r, i] = x[r, i] / sqrt(mean(x[r, :]²) + eps) * weight[i].
// With delta_scale 1 (all but Granite's residual multiplier), bit for bit what `add` then
// `rms_norm` compute (the same additions, the same reduction).
//
// Bindings (group 0)
//   0 params  uniform     Params         mirrors gpu::kernels::reduce::AddRmsNormParams
//   1 x       read_write  f32 (rows, n)  the residual stream, updated in place
//   2 delta   read        f32 (rows, n)
//   3 weight  read        f32 (n)
//   4 y       read_write  f32 (rows, n)
// Workgroup: 64 invocations per row, as rms_norm.
// Grid: (rows, 1, 1).

struct Params {
    rows: u32,
    n: u32,
    eps: f32,
    delta_scale: f32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> delta: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

#include shared/row_norm.wgsl

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wid.x * params.n;
    var s = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let v = x[base + i] + delta[base + i] * params.delta_scale;
        x[base + i] = v;
        s += v * v;
    }
    let scale = norm_scale(lid, s);
    for (var i = lid; i < params.n; i += WG) {
        y[base + i] = x[base + i] * scale * weight[i];
    }
}
