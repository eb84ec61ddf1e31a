// SPDX-License-Identifier: Apache-2.0
// ssd_chunk_cb: the second pass of the chunked (SSD) scan: per chunk and head h (of group g),
// the causal Q x Q matrix of how row s's input reaches row t's output within the chunk:
//   m[t, s] = exp(cs_t - cs_s) · dt_s · (C_t · B_s)   for s <= t
// (the "attention" of the SSD form; ssd_chunk_scan multiplies it by x).
//
// Bindings (group 0)
//   0 params  uniform     Params  mirrors gpu::kernels::ssm::SsdParams
//   1 xbc     read        vec4<f32> (tokens, (heads · head_dim + 2 · groups · state_size) / 4): x, B, C
//   2 chunks  read        u32 (num_chunks): each chunk's first row
//   3 dtcs    read        vec4<f32> (num_chunks, heads, Q): (dt_t, cs_t, w_t, 0)
//   4 m       read_write  f32 (num_chunks, heads, Q, Q)
// Workgroup: 64 invocations, one (t, s) entry each; C_t · B_s runs over the state four at a
//   time in increasing n, the four lanes added pairwise.
// Grid: (ceil(Q · Q / 64), heads, num_chunks).

#include shared/ssd_params.wgsl

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> xbc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> chunks: array<u32>;
@group(0) @binding(3) var<storage, read> dtcs: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> m: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let q = params.q;
    let e = gid.x;
    let t = e / q;
    let s = e % q;
    if (t >= q || s > t) {
        return;
    }
    let h = gid.y;
    let c = gid.z;
    let g = h / (params.heads / params.groups);
    let inner = params.heads * params.head_dim;
    let n4 = params.state_size / 4u;
    let row_width4 = (inner + 2u * params.groups * params.state_size) / 4u;
    let first = chunks[c];
    let b_base = (first + s) * row_width4 + (inner + g * params.state_size) / 4u;
    let c_base = (first + t) * row_width4 + (inner + (params.groups + g) * params.state_size) / 4u;
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < n4; i++) {
        acc = fma(xbc[c_base + i], xbc[b_base + i], acc);
    }
    let dc = (c * params.heads + h) * q;
    let src = dtcs[dc + s];
    let decay = exp(dtcs[dc + t].y - src.y) * src.x;
    m[((c * params.heads + h) * q + t) * q + s] = decay * ((acc.x + acc.y) + (acc.z + acc.w));
}
