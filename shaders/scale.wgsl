// SPDX-License-Identifier: Apache-2.0
// scale: in place over x, by mode:
//   0  x[i] *= factor                    (Gemma scales its token embeddings by √hidden)
//   1  x[i] = factor * tanh(x[i] / factor)  (soft-capping at factor: Gemma 4's final logits;
//      transformers divides by the cap, takes tanh, multiplies back, in that order)
// The tanh argument is clamped to ±15, where tanh is ±1 in f32 anyway, because some drivers
// compute tanh through exp and overflow to NaN beyond that (as shared/glu.wgsl does).
//
// Bindings (group 0)
//   0 params  uniform     Params    mirrors gpu::kernels::elementwise::ScaleParams
//   1 x       read_write  f32 (len)
// Workgroup: 256 invocations, one element each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(len / 256).

struct Params {
    len: u32,
    factor: f32,
    mode: u32,
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
    if (params.mode == 0u) {
        x[i] = x[i] * params.factor;
    } else {
        x[i] = tanh(clamp(x[i] / params.factor, -15.0, 15.0)) * params.factor;
    }
}
