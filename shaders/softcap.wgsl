// SPDX-License-Identifier: Apache-2.0
// softcap: x[i] = cap * tanh(x[i] / cap), in place: Gemma 4's final logit soft-capping
// (transformers divides by the cap, takes tanh, multiplies back, in that order).
// The tanh argument is clamped to ±15, where tanh is ±1 in f32 anyway, because some drivers
// compute tanh through exp and overflow to NaN beyond that (as shared/glu.wgsl does).
//
// Bindings (group 0)
//   0 params  uniform     Params    mirrors gpu::kernels::elementwise::ScaleParams (factor: the cap)
//   1 x       read_write  f32 (len)
// Workgroup: 256 invocations, one element each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(len / 256).

struct Params {
    len: u32,
    cap: f32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.len) {
        return;
    }
    x[i] = tanh(clamp(x[i] / params.cap, -15.0, 15.0)) * params.cap;
}
