// SPDX-License-Identifier: Apache-2.0
// ssd_chunk_dt: the first pass of the chunked (SSD) scan of a Mamba2 layer: per chunk of Q rows
// and head h, each row's step dt_t = softplus(dt_raw[t, h] + dt_bias[h]), the running log decay
// cs_t = Σ_{s <= t} dt_s · a[h] from the chunk's first row (inclusive), and the weight
// w_t = exp(cs_end - cs_t) · dt_t with which row t's input reaches the chunk's end state
// (cs_end = cs_{Q-1}), so that the later passes take no exponential per state.
//
// Bindings (group 0)
//   0 params   uniform     Params  mirrors gpu::kernels::ssm::SsdParams
//   1 dt       read        f32 (tokens, dt_stride): dt_raw[t, h] = dt[t, dt_offset + h]
//   2 a        read        f32 (heads): -exp(A_log)
//   3 dt_bias  read        f32 (heads)
//   4 chunks   read        u32 (num_chunks): each chunk's first row (its Q rows follow it)
//   5 dtcs     read_write  vec4<f32> (num_chunks, heads, Q): (dt_t, cs_t, w_t, 0)
// Workgroup: 64 invocations, one (chunk, head) each, walking the chunk's rows in order (the
//   sum's order is fixed: a chunk's numbers depend only on its own rows).
// Grid: (ceil(num_chunks · heads / 64), 1, 1).

#include shared/ssd_params.wgsl
#include shared/softplus.wgsl

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> dt: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(4) var<storage, read> chunks: array<u32>;
@group(0) @binding(5) var<storage, read_write> dtcs: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= params.num_chunks * params.heads) {
        return;
    }
    let c = i / params.heads;
    let h = i % params.heads;
    let first = chunks[c];
    let a_h = a[h];
    let bias_h = dt_bias[h];
    var cs = 0.0;
    for (var t = 0u; t < params.q; t++) {
        let step = softplus(dt[(first + t) * params.dt_stride + params.dt_offset + h] + bias_h);
        cs = cs + step * a_h;
        dtcs[i * params.q + t] = vec4<f32>(step, cs, 0.0, 0.0);
    }
    for (var t = 0u; t < params.q; t++) {
        let v = dtcs[i * params.q + t];
        dtcs[i * params.q + t].z = exp(cs - v.y) * v.x;
    }
}
