// SPDX-License-Identifier: Apache-2.0
// silu_mul: out[i] = silu(gate[i]) * up[i], silu(v) = v / (1 + e^-v): the SwiGLU gate of an MLP.
//
// Bindings (group 0)
//   0 params  uniform     Params   mirrors gpu::kernels::elementwise::SiluMulParams
//   1 gate    read        f32 (len)
//   2 up      read        f32 (len)
//   3 out     read_write  f32 (len)
// Workgroup: 256 invocations, one element each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(len / 256).

struct Params {
    len: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.len) {
        return;
    }
    let g = gate[i];
    out[i] = g / (1.0 + exp(-g)) * up[i];
}
