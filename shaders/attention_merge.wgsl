// SPDX-License-Identifier: Apache-2.0
// attention_merge: joins the partial softmax states that flash_attention left for the query
// tokens whose context it split (shared/attention_splits.wgsl), in split order:
//   M = max_j m_j,  S = Σ_j s_j · exp(m_j - M),  out = (Σ_j o_j · exp(m_j - M)) / S
// where split j left its running max m_j, sum s_j and unnormalised weighted V sum o_j. Tokens
// with one split were finished by flash_attention and are skipped. With has_sinks = 1 the head's
// sink logit joins the sum as paged_attention.wgsl says: M' = max(M, sink), out = (Σ_j o_j ·
// exp(m_j - M)) · exp(M - M') / (S · exp(M - M') + exp(sink - M')).
//
// Bindings (group 0)
//   0 params      uniform     Params  mirrors gpu::kernels::paged::MergeParams
//   1 token_info  read        u32 (num_tokens, 2)  (sequence index, last position seen) per token
//   2 partials    read        vec4 (num_tokens, num_heads, SPLITS, 1 + HD/4): (m, s, 0, 0), o
//   3 out         read_write  vec4 (num_tokens, num_heads · HD / 4)
//   4 sinks       read        f32 (num_heads)  each head's sink logit; unused when has_sinks is 0
// Workgroup: 64 invocations per (head, token); invocation i joins output vec4s i, i + 64, …
// (a head of 512 has 128). No workgroup memory: each vec4's splits are read where joined.
// Grid: (num_heads, num_tokens, 1).

#include shared/attention_splits.wgsl

struct Params {
    num_heads: u32,
    head_dim: u32,
    window: u32,
    split_min: u32,
    has_sinks: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> token_info: array<u32>;
@group(0) @binding(2) var<storage, read> partials: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> sinks: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let head = wid.x;
    let t = wid.y;
    let hv = params.head_dim / 4u;
    let pos = token_info[2u * t + 1u];
    let splits = split_layout(pos + 1u - first_position(pos, params.window), params.split_min).y;
    if (splits == 1u) {
        return;
    }
    let base = (t * params.num_heads + head) * SPLITS * (hv + 1u);
    var m = NEG_MAX;
    for (var j = 0u; j < splits; j++) {
        m = max(m, partials[base + j * (hv + 1u)].x);
    }
    for (var d = lid; d < hv; d += 64u) {
        var s = 0.0;
        var o = vec4<f32>(0.0);
        for (var j = 0u; j < splits; j++) {
            let state = partials[base + j * (hv + 1u)];
            let w = exp(state.x - m);
            s += state.y * w;
            o += partials[base + j * (hv + 1u) + 1u + d] * w;
        }
        if (params.has_sinks == 1u) {
            let sink = sinks[head];
            let top = max(m, sink);
            let c = exp(m - top);
            out[(t * params.num_heads + head) * hv + d] = o * c / (s * c + exp(sink - top));
        } else {
            out[(t * params.num_heads + head) * hv + d] = o / s;
        }
    }
}
