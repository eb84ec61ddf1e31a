// SPDX-License-Identifier: Apache-2.0
// head_rms_norm: RMSNorm of the query and key parts of a fused qkv row, in place, before RoPE,
// in groups: each query head or the whole query projection, and likewise the keys (Qwen3's and
// Gemma 3's q_norm / k_norm per head; OLMo 2's over the whole q and k projections). For token t
// and group g < q_groups + k_groups, over its n columns from `base`,
// x[t, base .. base + n] = x / sqrt(mean(x²) + eps) * weight, with q_weight (n wide) for the
// query groups (n = params.n, base = col0 + g·n) and k_weight (params.k_n wide) for the key
// groups (base = col0 + q_groups·params.n + (g - q_groups)·k_n). col0 is 0 for q and k; one
// part's heads alone (Gemma 4's q_norm where a layer shares another's KV, its weightless v_norm)
// are "query" groups from that part's column, with no key groups. Columns outside the groups
// are left alone.
//
// Bindings (group 0)
//   0 params    uniform     Params    mirrors gpu::kernels::reduce::HeadNormParams
//   1 q_weight  read        f32 (n): a head's width, or all the query heads'
//   2 k_weight  read        f32 (k_n): a head's width, or all the key heads'
//   3 x         read_write  f32 (num_tokens, row_stride): the qkv rows
// Workgroup: 64 invocations per (group, token), reducing as rms_norm.wgsl does
// (shared/row_norm.wgsl): each invocation reads and writes only its own strided elements.
// Grid: (q_groups + k_groups, num_tokens, 1).

struct Params {
    q_groups: u32,
    n: u32,
    k_n: u32,
    row_stride: u32,
    col0: u32,
    eps: f32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_weight: array<f32>;
@group(0) @binding(2) var<storage, read> k_weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;

#include shared/row_norm.wgsl

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let group = wid.x;
    let is_q = group < params.q_groups;
    let n = select(params.k_n, params.n, is_q);
    let offset = select(params.q_groups * params.n + (group - params.q_groups) * params.k_n, group * params.n, is_q);
    let base = wid.y * params.row_stride + params.col0 + offset;
    var s = 0.0;
    for (var i = lid; i < n; i += WG) {
        let v = x[base + i];
        s += v * v;
    }
    let scale = norm_scale_of(lid, s, n);
    for (var i = lid; i < n; i += WG) {
        x[base + i] = x[base + i] * scale * select(k_weight[i], q_weight[i], is_q);
    }
}
