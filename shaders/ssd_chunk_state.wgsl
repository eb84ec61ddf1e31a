// SPDX-License-Identifier: Apache-2.0
// ssd_chunk_state: the third pass of the chunked (SSD) scan: what each chunk adds to the state
// of each head, as if it started from zero:
//   dS[c, h, p, n] = Σ_t exp(cs_end - cs_t) · dt_t · B_t[n] · x_t[h, p],  t = 0 .. Q - 1
// with cs_end the chunk's last cs; ssd_chunk_dt made w_t = exp(cs_end - cs_t) · dt_t.
// ssd_state_pass then adds the decayed state the chunk starts from.
//
// Bindings (group 0)
//   0 params  uniform     Params  mirrors gpu::kernels::ssm::SsdParams
//   1 xbc     read        vec4<f32> (tokens, (heads · head_dim + 2 · groups · state_size) / 4): x, B, C
//   2 chunks  read        u32 (num_chunks): each chunk's first row
//   3 dtcs    read        vec4<f32> (num_chunks, heads, Q): (dt_t, cs_t, w_t, 0)
//   4 states  read_write  vec4<f32> (num_chunks, heads, head_dim, state_size / 4): dS
// Workgroup: 64 invocations, four states (n .. n + 3) of one channel p of one head each,
//   neighbours on neighbouring states (their B loads are contiguous); the sum runs over the
//   chunk's rows in order.
// Grid: (ceil(heads · head_dim · state_size / 4 / 64), num_chunks, 1).

#include shared/ssd_params.wgsl

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> xbc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> chunks: array<u32>;
@group(0) @binding(3) var<storage, read> dtcs: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> states: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n4 = params.state_size / 4u;
    let inner = params.heads * params.head_dim;
    let i = gid.x;
    if (i >= inner * n4) {
        return;
    }
    let c = gid.y;
    let hp = i / n4;
    let nq = i % n4;
    let h = hp / params.head_dim;
    let g = h / (params.heads / params.groups);
    let q = params.q;
    let row_width4 = (inner + 2u * params.groups * params.state_size) / 4u;
    let first = chunks[c];
    let dc = (c * params.heads + h) * q;
    var acc = vec4<f32>(0.0);
    for (var t = 0u; t < q; t++) {
        let row = first + t;
        let w = dtcs[dc + t].z * xbc[row * row_width4 + hp / 4u][hp % 4u];
        acc = fma(vec4<f32>(w), xbc[row * row_width4 + (inner + g * params.state_size) / 4u + nq], acc);
    }
    states[(c * inner + hp) * n4 + nq] = acc;
}
