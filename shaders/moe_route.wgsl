// SPDX-License-Identifier: Apache-2.0
// moe_route: a mixture-of-experts router's choice per token, on the GPU so the experts' matmuls
// read it without a host round trip. params.mode picks the routing:
//   0, 1: p = softmax(logits[t, :]); the top_k largest p in order (largest first, ties to the
//         lower expert, as a stable descending sort would give), their p divided by their sum
//         when mode is 1 (Qwen3-MoE's norm_topk_prob).
//   2:    the top_k largest logits in that order, weighted by a softmax over those top_k logits
//         alone (gpt-oss; llama.cpp's softmax_weight gating).
//   3, 4: g = sigmoid(logits[t, :]); the top_k largest g + bias (the bias steers the choice
//         only; it is 0 without `has_bias`), weighted by their g, divided by (their sum + 1e-6)
//         when mode is 4 (LFM2-MoE, as transformers' Lfm2MoeTopKRouter).
// With has_scale, each slot's weight is then multiplied by its expert's scale (Gemma 4's
// per_expert_scale, llama.cpp's ffn_down_exps.scale), after any renormalisation.
//
// Bindings (group 0)
//   0 params   uniform     Params                  mirrors gpu::kernels::moe::RouteParams
//   1 logits   read        f32 (tokens, experts)   the router's logits
//   2 ids      read_write  u32 (tokens, top_k)     each slot's expert
//   3 weights  read_write  f32 (tokens, top_k)     each slot's weight
//   4 bias     read        f32 (experts)           the choice's bias (modes 3, 4, with has_bias)
//   5 scale    read        f32 (experts)           each expert's weight scale (with has_scale)
// Workgroup: 64 invocations, one token each (experts are a few hundred at most: a serial loop).
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(tokens / 64).
// Pick s takes the largest score (p, the logit in mode 2, g + bias in modes 3 and 4) among the experts after pick s - 1
// in the order (score descending, expert ascending), so no mask of taken experts is kept. Every
// p is recomputed from the same max and sum with the same operations, so equal logits give
// equal p.
// Batch invariance: a token reads its own row only, in expert order.

struct Params {
    tokens: u32,
    experts: u32,
    top_k: u32,
    mode: u32,
    has_bias: u32,
    has_scale: u32,
}

const WG: u32 = 64u;
const RENORMALIZE: u32 = 1u;
const TOP_K_SOFTMAX: u32 = 2u;
const SIGMOID: u32 = 3u;
const SIGMOID_RENORMALIZE: u32 = 4u;
const NEG_MAX: f32 = -3.4028234663852886e38;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> scale: array<f32>;

fn sigmoid_of(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * WG;
    if (t >= params.tokens) {
        return;
    }
    let row = t * params.experts;
    var top = logits[row];
    for (var e = 1u; e < params.experts; e++) {
        top = max(top, logits[row + e]);
    }
    var sum = 0.0;
    for (var e = 0u; e < params.experts; e++) {
        sum += exp(logits[row + e] - top);
    }
    let sigmoid = params.mode >= SIGMOID;
    let out = t * params.top_k;
    var prev = 0.0;
    var prev_e = 0u;
    var total = 0.0;
    for (var s = 0u; s < params.top_k; s++) {
        // A NaN row picks expert 0 (with weight 0 from probabilities) rather than an expert
        // past the end.
        var best_e = 0u;
        var best = NEG_MAX;
        for (var e = 0u; e < params.experts; e++) {
            let logit = logits[row + e];
            var v = logit;
            if (sigmoid) {
                v = sigmoid_of(logit);
                if (params.has_bias != 0u) {
                    v += bias[e];
                }
            } else if (params.mode != TOP_K_SOFTMAX) {
                v = exp(logit - top) / sum;
            }
            let after = s == 0u || v < prev || (v == prev && e > prev_e);
            if (after && v > best) {
                best = v;
                best_e = e;
            }
        }
        var weight = best;
        if (sigmoid) {
            weight = sigmoid_of(logits[row + best_e]);
        } else if (params.mode != TOP_K_SOFTMAX) {
            weight = max(best, 0.0);
        }
        ids[out + s] = best_e;
        weights[out + s] = weight;
        total += weight;
        prev = best;
        prev_e = best_e;
    }
    if (params.mode == RENORMALIZE) {
        for (var s = 0u; s < params.top_k; s++) {
            weights[out + s] = weights[out + s] / total;
        }
    }
    if (params.mode == SIGMOID_RENORMALIZE) {
        for (var s = 0u; s < params.top_k; s++) {
            weights[out + s] = weights[out + s] / (total + 1e-6);
        }
    }
    if (params.mode == TOP_K_SOFTMAX) {
        // The picks hold their logits, largest first: a softmax over them from that max.
        let m = weights[out];
        var z = 0.0;
        for (var s = 0u; s < params.top_k; s++) {
            z += exp(weights[out + s] - m);
        }
        for (var s = 0u; s < params.top_k; s++) {
            weights[out + s] = exp(weights[out + s] - m) / z;
        }
    }
    if (params.has_scale != 0u) {
        for (var s = 0u; s < params.top_k; s++) {
            weights[out + s] = weights[out + s] * scale[ids[out + s]];
        }
    }
}
