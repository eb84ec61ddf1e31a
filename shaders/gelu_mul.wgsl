// SPDX-License-Identifier: Apache-2.0
// gelu_mul: out[r, c] = gelu_tanh(gate_up[r, c]) * gate_up[r, cols + c], the GeGLU gate of
// Gemma's MLP (transformers' "gelu_pytorch_tanh"; the formula is in shared/glu.wgsl).
//
// Bindings (group 0)
//   0 params   uniform     Params             mirrors gpu::kernels::elementwise::SiluMulParams
//   1 gate_up  read        f32 (rows, 2 * cols)
//   2 out      read_write  f32 (rows, cols)
// Workgroup: 256 invocations, one output element each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(rows * cols / 256).

#include shared/glu.wgsl

struct Params {
    len: u32,
    cols: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> gate_up: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.len) {
        return;
    }
    let r = i / params.cols;
    let c = i % params.cols;
    let g = gate_up[r * 2u * params.cols + c];
    out[i] = gelu_gate(g, gate_up[r * 2u * params.cols + params.cols + c]);
}
