// SPDX-License-Identifier: Apache-2.0
// ssd_chunk_scan: the last pass of the chunked (SSD) scan: each chunk's outputs from the state
// it starts from (S_in, ssd_state_pass) and from its own rows:
//   y[t, h, p] = exp(cs_t) · Σ_n C_t[n] · S_in[h, p, n]  +  Σ_{s <= t} m[t, s] · x_s[h, p]
//              + d[h] · x_t[h, p]
// with m[t, s] = exp(cs_t - cs_s) · dt_s · (C_t · B_s) from ssd_chunk_cb,
// which is the token-by-token recurrence of ssm_scan.wgsl regrouped (the SSD form of Mamba2).
//
// Bindings (group 0)
//   0 params  uniform     Params  mirrors gpu::kernels::ssm::SsdParams
//   1 xbc     read        vec4<f32> (tokens, (heads · head_dim + 2 · groups · state_size) / 4): x, B, C
//   2 chunks  read        u32 (num_chunks): each chunk's first row
//   3 dtcs    read        vec4<f32> (num_chunks, heads, Q): (dt_t, cs_t, w_t, 0)
//   4 m       read        f32 (num_chunks, heads, Q, Q): m[t, s] (s <= t)
//   5 states  read        vec4<f32> (num_chunks, heads, head_dim, state_size / 4): S_in
//   6 d       read        f32 (heads)
//   7 y       read_write  vec4<f32> (tokens, heads · head_dim / 4)
// Workgroup: 64 invocations, four channels (p .. p + 3) of one row t of one head of one chunk
//   each. The state term runs over n four at a time (one running vec4 per channel, added
//   pairwise at the end), the chunk term over s in order.
// Grid: (ceil(Q · head_dim / 4 / 64), heads, num_chunks).

#include shared/ssd_params.wgsl

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> xbc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> chunks: array<u32>;
@group(0) @binding(3) var<storage, read> dtcs: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> m: array<f32>;
@group(0) @binding(5) var<storage, read> states: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> d: array<f32>;
@group(0) @binding(7) var<storage, read_write> y: array<vec4<f32>>;

fn total(acc: vec4<f32>) -> f32 {
    return (acc.x + acc.y) + (acc.z + acc.w);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let q = params.q;
    let p4 = params.head_dim / 4u;
    let e = gid.x;
    if (e >= q * p4) {
        return;
    }
    let t = e / p4;
    let pq = e % p4;
    let h = gid.y;
    let c = gid.z;
    let g = h / (params.heads / params.groups);
    let n4 = params.state_size / 4u;
    let inner = params.heads * params.head_dim;
    let row_width4 = (inner + 2u * params.groups * params.state_size) / 4u;
    let first = chunks[c];
    let row = first + t;
    let dc = (c * params.heads + h) * q;
    let cs_t = dtcs[dc + t].y;
    // The state term: channel hp + k of S_in against C_t.
    let hp = h * params.head_dim + 4u * pq;
    let s_in = (c * inner + hp) * n4;
    let c_base = row * row_width4 + (inner + (params.groups + g) * params.state_size) / 4u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var i = 0u; i < n4; i++) {
        let cv = xbc[c_base + i];
        acc0 = fma(states[s_in + i], cv, acc0);
        acc1 = fma(states[s_in + n4 + i], cv, acc1);
        acc2 = fma(states[s_in + 2u * n4 + i], cv, acc2);
        acc3 = fma(states[s_in + 3u * n4 + i], cv, acc3);
    }
    let carried = vec4<f32>(total(acc0), total(acc1), total(acc2), total(acc3));
    // The chunk term: earlier rows of the chunk (and this one), decayed to row t.
    let m_row = ((c * params.heads + h) * q + t) * q;
    var own = vec4<f32>(0.0);
    for (var s = 0u; s <= t; s++) {
        own = fma(vec4<f32>(m[m_row + s]), xbc[(first + s) * row_width4 + hp / 4u], own);
    }
    let xt = xbc[row * row_width4 + hp / 4u];
    y[row * (inner / 4u) + hp / 4u] = fma(vec4<f32>(exp(cs_t)), carried, own) + d[h] * xt;
}
