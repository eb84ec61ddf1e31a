// SPDX-License-Identifier: Apache-2.0
// add: acc[i] += delta[i % delta_len], in place: the residual connection (delta_len = len) or a
// bias broadcast over rows (delta_len = row length).
//
// Bindings (group 0)
//   0 params  uniform     Params   mirrors gpu::kernels::elementwise::Params
//   1 acc     read_write  f32 (len)
//   2 delta   read        f32 (delta_len)
// Workgroup: 256 invocations, one element each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(len / 256).

struct Params {
    len: u32,
    delta_len: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> acc: array<f32>;
@group(0) @binding(2) var<storage, read> delta: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.len) {
        return;
    }
    acc[i] += delta[i % params.delta_len];
}
