// SPDX-License-Identifier: Apache-2.0
// sample: pick each row's next token from its logits — greedy, or temperature with top-k,
// top-p and min-p filtering driven by a uniform random number drawn on the CPU — and report the
// chosen token's log-probability and the row's top-n log-probabilities (of the raw logits)
// when it asks for top_n > 0 (the engine's `top_logprobs`); without, the logprob is 0.
//
// Bindings (group 0)
//   0 params    uniform     Params                 mirrors gpu::kernels::sample::Params
//   1 logits    read        f32 (rows, vocab)
//   2 settings  read        u32 (rows, 8)          per row: temperature (f32 bits; 0 = greedy),
//                                                  top_k (0 = off), top_p (f32 bits), min_p (f32
//                                                  bits), u in [0, 1) (f32 bits), top_n (<= MAX_TOP)
//   3 out       read_write  u32 (rows, 2 + 2·MAX_TOP)  token, logprob bits, then top_n (id, logprob bits)
// Workgroup: WG = 256 invocations per row. Invocation t owns the contiguous slice
// [t·chunk, (t+1)·chunk) of the vocabulary; every row-wide quantity is a fixed-order tree over
// workgroup memory, so a row's result depends only on that row (batch invariant).
// Filtering happens in log space on s = (logit - max) / temperature, with the threshold of
// shared/sample_filter.wgsl. The token is where the running sum of kept exp(s), in vocabulary
// order, passes goal = u · (their total).
// Grid: (rows, 1, 1).

struct Params {
    rows: u32,
    vocab: u32,
}

const MAX_TOP: u32 = 20u;
const OUT_STRIDE: u32 = 42u; // 2 + 2 * MAX_TOP
const SETTINGS: u32 = 8u;
const NONE: u32 = 0xffffffffu;

#include shared/sample_filter.wgsl

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> settings: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x;
    let vocab = params.vocab;
    let base = row * vocab;
    let chunk = (vocab + WG - 1u) / WG;
    let first = min(lid * chunk, vocab);
    let last = min(first + chunk, vocab);
    let cfg = row * SETTINGS;
    let temperature = bitcast<f32>(settings[cfg]);
    let top_k = settings[cfg + 1u];
    let top_p = bitcast<f32>(settings[cfg + 2u]);
    let min_p = bitcast<f32>(settings[cfg + 3u]);
    let u = bitcast<f32>(settings[cfg + 4u]);
    let top_n = min(settings[cfg + 5u], MAX_TOP);

    // The row's max is where a draw's s starts and log-softmax's shift; its log-sum-exp only
    // log-probabilities need, and a greedy row that reports none needs neither (its argmax
    // below is a pass of its own).
    let logprobs = top_n > 0u;
    var row_max = 0.0;
    if (temperature > 0.0 || logprobs) {
        var local_max = NEG_MAX;
        for (var i = first; i < last; i++) {
            local_max = max(local_max, logits[base + i]);
        }
        row_max = max_all(lid, local_max);
    }
    var log_z = 0.0;
    if (logprobs) {
        var local_sum = 0.0;
        for (var i = first; i < last; i++) {
            local_sum += exp(logits[base + i] - row_max);
        }
        log_z = log(sum_all(lid, local_sum));
    }

    // NONE until a draw picks a token: a greedy row, or a draw whose goal rounding left past
    // the last kept token, takes the argmax (below).
    var token = NONE;
    if (temperature > 0.0) {
        let inv_t = 1.0 / temperature;
        let tau = filter_threshold(lid, base, first, last, vocab, row_max, inv_t, top_k, top_p, min_p);

        var kept = 0.0;
        for (var i = first; i < last; i++) {
            let s = (logits[base + i] - row_max) * inv_t;
            kept += select(0.0, exp(s), s >= tau);
        }
        // Exclusive prefix of the per-invocation sums, in invocation (= vocabulary) order.
        workgroupBarrier();
        sh_f[lid] = kept;
        workgroupBarrier();
        if (lid == 0u) {
            var running = 0.0;
            for (var j = 0u; j < WG; j++) {
                let here = sh_f[j];
                sh_f[j] = running;
                running += here;
            }
            sh_u[0] = bitcast<u32>(running);
        }
        workgroupBarrier();
        let total = bitcast<f32>(sh_u[0]);
        let goal = u * total;
        let start = sh_f[lid];
        workgroupBarrier();
        // The invocation whose slice holds the goal walks it; rounding can leave the goal
        // past the last kept token, which then wins (the invocation holding it sees no winner).
        sh_u[lid] = NONE;
        if (goal >= start && (goal < start + kept || lid == WG - 1u)) {
            var running = start;
            var last_kept = NONE;
            for (var i = first; i < last; i++) {
                let s = (logits[base + i] - row_max) * inv_t;
                if (s >= tau) {
                    last_kept = i;
                    running += exp(s);
                    if (running > goal) {
                        break;
                    }
                }
            }
            sh_u[lid] = last_kept;
        }
        workgroupBarrier();
        if (lid == 0u) {
            var pick = NONE;
            for (var j = 0u; j < WG; j++) {
                if (sh_u[j] != NONE) {
                    pick = sh_u[j];
                    break;
                }
            }
            sh_u[0] = pick;
        }
        token = workgroupUniformLoad(&sh_u[0]);
    }

    // The argmax is the first of the top-n alternatives, so one ranking scan serves both (a
    // single call of argmax_below: shaders inline each call, and SwiftShader compiles every
    // copy again).
    let o = row * OUT_STRIDE;
    let ranks = max(top_n, select(0u, 1u, token == NONE));
    var cap_v = POS_MAX;
    var cap_i = 0u;
    for (var n = 0u; n < ranks; n++) {
        let best = argmax_below(lid, base, first, last, cap_v, cap_i);
        cap_v = logits[base + best];
        cap_i = best;
        if (n == 0u && token == NONE) {
            token = best;
        }
        if (lid == 0u && n < top_n) {
            out[o + 2u + 2u * n] = best;
            out[o + 3u + 2u * n] = bitcast<u32>(cap_v - row_max - log_z);
        }
    }
    if (lid == 0u) {
        out[o] = token;
        out[o + 1u] = bitcast<u32>(select(0.0, logits[base + token] - row_max - log_z, logprobs));
    }
}
