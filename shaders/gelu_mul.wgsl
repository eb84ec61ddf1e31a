// SPDX-License-Identifier: Apache-2.0
// gelu_mul: out[r, c] = gelu_tanh(gate_up[r, c]) * gate_up[r, cols + c], the GeGLU gate of
// Gemma's MLP (transformers' "gelu_pytorch_tanh"): gelu_tanh(v) = 0.5 v (1 + tanh(√(2/π) (v +
// 0.044715 v³))). The tanh argument is clamped to ±15, where tanh is ±1 in f32 anyway, because
// some drivers compute tanh through exp and overflow to NaN beyond that.
//
// Bindings (group 0)
//   0 params   uniform     Params             mirrors gpu::kernels::elementwise::SiluMulParams
//   1 gate_up  read        f32 (rows, 2 * cols)
//   2 out      read_write  f32 (rows, cols)
// Workgroup: 256 invocations, one output element each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(rows * cols / 256).

struct Params {
    len: u32,
    cols: u32,
}

const WG: u32 = 256u;
const SQRT_2_OVER_PI: f32 = 0.7978845608028654;

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
    let t = tanh(clamp(SQRT_2_OVER_PI * (g + 0.044715 * g * g * g), -15.0, 15.0));
    out[i] = 0.5 * g * (1.0 + t) * gate_up[r * 2u * params.cols + params.cols + c];
}
