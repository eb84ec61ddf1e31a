// SPDX-License-Identifier: Apache-2.0
// gate_mul: out[r, c] = act(gate[r, c]) * src[r, up_col + c], the gated activations outside a
// matmul's epilogue (the formulas are shared/glu.wgsl's, which the epilogues use too):
//   - an MLP's SwiGLU or GeGLU, gate and up side by side in one row of src
//     (gate = src[r, gate_col + c], gate_col 0 and up_col cols);
//   - Gemma 4's per-layer input gate, in place (gate_in_out 1: gate = out[r, c]), src a row of
//     every layer's inputs side by side and up_col that layer's slice.
// act: 0 silu, 1 gelu_tanh. One kernel for all three, so they cannot drift apart.
//
// Bindings (group 0)
//   0 params  uniform     Params    mirrors gpu::kernels::elementwise::GateMulParams
//   1 src     read        f32 (rows, src_stride)
//   2 out     read_write  f32 (rows, cols)
// Workgroup: 256 invocations, one output element each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(rows * cols / 256).

#include shared/glu.wgsl

struct Params {
    len: u32,
    cols: u32,
    src_stride: u32,
    gate_col: u32,
    up_col: u32,
    act: u32,
    gate_in_out: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.len) {
        return;
    }
    let row = (i / params.cols) * params.src_stride;
    let c = i % params.cols;
    var g: f32;
    if (params.gate_in_out != 0u) {
        g = out[i];
    } else {
        g = src[row + params.gate_col + c];
    }
    let u = src[row + params.up_col + c];
    if (params.act == 0u) {
        out[i] = silu_gate(g, u);
    } else {
        out[i] = gelu_gate(g, u);
    }
}
