// SPDX-License-Identifier: Apache-2.0
// moe_combine: out[t, c] = sum over slots s of weights[t, s] * y[t * top_k + s, c]: a token's
// experts' outputs, weighted by the router and summed back into the token's row; with
// `accumulate`, that sum is added to what out holds (a shared expert's output).
//
// Bindings (group 0)
//   0 params   uniform     Params                       mirrors gpu::kernels::moe::CombineParams
//   1 y        read        f32 (tokens * top_k, cols)   each slot's expert output
//   2 weights  read        f32 (tokens, top_k)          each slot's router weight
//   3 out      read_write  f32 (tokens, cols)
// Workgroup: 256 invocations, one output element each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(tokens * cols / 256).
// Batch invariance: the slots are added in slot order, fma by fma from zero, whatever the batch,
// and out's old value (with accumulate) last.

struct Params {
    len: u32,
    cols: u32,
    top_k: u32,
    accumulate: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read> weights: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.len) {
        return;
    }
    let t = i / params.cols;
    let c = i % params.cols;
    var acc = 0.0;
    for (var s = 0u; s < params.top_k; s++) {
        let slot = t * params.top_k + s;
        acc = fma(weights[slot], y[slot * params.cols + c], acc);
    }
    if (params.accumulate != 0u) {
        acc += out[i];
    }
    out[i] = acc;
}
