// SPDX-License-Identifier: Apache-2.0
// gelu_mul_at: x[r, c] = gelu_tanh(x[r, c]) * up[r, up_col + c], in place: Gemma 4's
// per-layer input gate, gelu_tanh(per_layer_input_gate(h)) times that layer's slice of the
// per-layer inputs, which sit side by side in one row per token (the formula is
// shared/glu.wgsl's, as the MLP's GeGLU).
//
// Bindings (group 0)
//   0 params  uniform     Params    mirrors gpu::kernels::elementwise::GeluMulAtParams
//   1 up      read        f32 (rows, up_stride)
//   2 x       read_write  f32 (rows, cols)
// Workgroup: 256 invocations, one element of x each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(rows * cols / 256).

#include shared/glu.wgsl

struct Params {
    len: u32,
    cols: u32,
    up_stride: u32,
    up_col: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> up: array<f32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.len) {
        return;
    }
    let r = i / params.cols;
    let c = i % params.cols;
    x[i] = gelu_gate(x[i], up[r * params.up_stride + params.up_col + c]);
}
