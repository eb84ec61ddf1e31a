// SPDX-License-Identifier: Apache-2.0
// sigmoid_mul: x[i] = x[i] · sigmoid(gate[i / group]), in place: Qwen3.5's attention output
// gate (group 1: the attention output times the sigmoid of the second half of its query
// projection) and Qwen3.5-MoE's shared-expert gate (group = the row's width: one gate logit
// scales a token's whole shared-expert output).
//
// Bindings (group 0)
//   0 params  uniform     Params  mirrors gpu::kernels::elementwise::SigmoidMulParams (len, group)
//   1 x       read_write  f32 (len)
//   2 gate    read        f32 (len / group)
// Workgroup: 256 invocations, one element of x each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(len / 256).

struct Params {
    len: u32,
    group: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> gate: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.len) {
        return;
    }
    x[i] = x[i] * (1.0 / (1.0 + exp(-gate[i / params.group])));
}
