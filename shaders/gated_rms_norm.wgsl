// SPDX-License-Identifier: Apache-2.0
// gated_rms_norm: Mamba2's output norm, gated by z and normalised per group of n columns:
//   v[r, i] = x[r, i] · silu(z[r, z_offset + i])
//   y[r, i] = v[r, i] / sqrt(mean(v[r, group(i)]²) + eps) · weight[i]
// or, with `gate_after` (Qwen3.5's Gated DeltaNet output norm), the gate applied after it:
//   y[r, i] = x[r, i] / sqrt(mean(x[r, group(i)]²) + eps) · weight[i] · silu(z[r, z_offset + i])
//
// Bindings (group 0)
//   0 params  uniform     Params  mirrors gpu::kernels::ssm::GatedNormParams
//   1 x       read        f32 (rows, groups · n)
//   2 z       read        f32 (rows, z_stride)
//   3 weight  read        f32 (groups · n)
//   4 y       read_write  f32 (rows, groups · n)
// Workgroup: 64 invocations per (row, group). Invocation t sums the squares of its strided
// elements v[r, t], v[r, t + 64], …; shared/row_norm.wgsl adds the partial sums in a fixed
// order; then each invocation scales its strided elements. Rows are batch invariant.
// Grid: (rows, groups, 1).

struct Params {
    rows: u32,
    n: u32,
    z_stride: u32,
    z_offset: u32,
    eps: f32,
    gate_after: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> z: array<f32>;
@group(0) @binding(3) var<storage, read> weight: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

#include shared/row_norm.wgsl

fn gate(r: u32, i: u32) -> f32 {
    let g = z[r * params.z_stride + params.z_offset + i];
    return g / (1.0 + exp(-g));
}

// The value normalised: x gated first, or x itself when the gate comes after.
fn gated(r: u32, width: u32, i: u32) -> f32 {
    if (params.gate_after != 0u) {
        return x[r * width + i];
    }
    return x[r * width + i] * gate(r, i);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {
    let r = wid.x;
    let width = nwg.y * params.n;
    let first = wid.y * params.n;
    var s = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let v = gated(r, width, first + i);
        s += v * v;
    }
    let scale = norm_scale(lid, s);
    for (var i = lid; i < params.n; i += WG) {
        let col = first + i;
        let normed = gated(r, width, col) * scale * weight[col];
        y[r * width + col] = select(normed, normed * gate(r, col), params.gate_after != 0u);
    }
}
