// SPDX-License-Identifier: Apache-2.0
// sample: pick each row's next token from its logits — greedy, or temperature with top-k,
// top-p and min-p filtering driven by a uniform random number drawn on the CPU — and report the
// chosen token's log-probability and the row's top-n log-probabilities (of the raw logits).
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
// Filtering happens in log space on s = (logit - max) / temperature: top-k keeps s >= τk, the
// largest τ with at least k survivors; top-p keeps s >= τp, the largest τ whose survivors (among
// top-k's) hold at least top_p of the mass; min-p keeps s >= ln(min_p). τk and τp are found by
// 30 steps of bisection. The token is where the running sum of kept exp(s), in vocabulary order,
// passes goal = u · (their total).
// Grid: (rows, 1, 1).

struct Params {
    rows: u32,
    vocab: u32,
}

const WG: u32 = 256u;
const MAX_TOP: u32 = 20u;
const OUT_STRIDE: u32 = 42u; // 2 + 2 * MAX_TOP
const SETTINGS: u32 = 8u;
const BISECT_STEPS: u32 = 30u;
// -f32::MAX written exactly: browsers reject a longer decimal (like 3.4028235e38) that lies above it.
const NEG_MAX: f32 = -3.4028234663852886e38;
// The logit of a token structured output forbids (token_mask.wgsl's MASKED).
const MASKED: f32 = -1e30;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> settings: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

var<workgroup> sh_f: array<f32, WG>;
var<workgroup> sh_u: array<u32, WG>;

fn sum_all(lid: u32, v: f32) -> f32 {
    workgroupBarrier();
    sh_f[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            sh_f[lid] += sh_f[lid + stride];
        }
        workgroupBarrier();
    }
    return sh_f[0];
}

fn max_all(lid: u32, v: f32) -> f32 {
    workgroupBarrier();
    sh_f[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            sh_f[lid] = max(sh_f[lid], sh_f[lid + stride]);
        }
        workgroupBarrier();
    }
    return sh_f[0];
}

// Whether (va, ia) ranks above (vb, ib): larger value first, lower index on ties.
fn above(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    return va > vb || (va == vb && ia < ib);
}

// The best (value, index) among entries ranking strictly below (cap_v, cap_i).
fn argmax_below(lid: u32, base: u32, first: u32, last: u32, cap_v: f32, cap_i: u32) -> u32 {
    var best_v = NEG_MAX;
    var best_i = 0xffffffffu;
    for (var i = first; i < last; i++) {
        let v = logits[base + i];
        if (above(cap_v, cap_i, v, i) && above(v, i, best_v, best_i)) {
            best_v = v;
            best_i = i;
        }
    }
    workgroupBarrier();
    sh_f[lid] = best_v;
    sh_u[lid] = best_i;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride && above(sh_f[lid + stride], sh_u[lid + stride], sh_f[lid], sh_u[lid])) {
            sh_f[lid] = sh_f[lid + stride];
            sh_u[lid] = sh_u[lid + stride];
        }
        workgroupBarrier();
    }
    // A uniform load: callers branch on the winner around further barriers, and browsers
    // (Tint) prove barrier uniformity only through workgroupUniformLoad.
    return workgroupUniformLoad(&sh_u[0]);
}

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

    var local_max = NEG_MAX;
    for (var i = first; i < last; i++) {
        local_max = max(local_max, logits[base + i]);
    }
    let row_max = max_all(lid, local_max);
    var local_sum = 0.0;
    for (var i = first; i < last; i++) {
        local_sum += exp(logits[base + i] - row_max);
    }
    let log_z = log(sum_all(lid, local_sum));

    var token = 0u;
    if (temperature <= 0.0) {
        token = argmax_below(lid, base, first, last, 3.4028234663852886e38, 0u);
    } else {
        let inv_t = 1.0 / temperature;
        // s = (logit - max) / T lies in [lowest, 0]. Tokens masked by token_mask.wgsl stay
        // out: their far-off value would stretch the bisections below past their precision.
        var local_low = 0.0;
        for (var i = first; i < last; i++) {
            if (logits[base + i] > MASKED) {
                local_low = min(local_low, (logits[base + i] - row_max) * inv_t);
            }
        }
        let lowest = -max_all(lid, -local_low);

        var tau = lowest;
        if (top_k > 0u && top_k < vocab) {
            // Invariant: count(s >= lo) >= k; hi fails it (or is above every s).
            var lo = lowest;
            var hi = 1.0;
            for (var step = 0u; step < BISECT_STEPS; step++) {
                let mid = 0.5 * (lo + hi);
                // Counts stay below 2^24, so summing them in f32 is exact.
                var n = 0.0;
                for (var i = first; i < last; i++) {
                    n += select(0.0, 1.0, (logits[base + i] - row_max) * inv_t >= mid);
                }
                if (sum_all(lid, n) >= f32(top_k)) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            tau = lo;
        }
        if (top_p < 1.0) {
            var mass = 0.0;
            for (var i = first; i < last; i++) {
                let s = (logits[base + i] - row_max) * inv_t;
                mass += select(0.0, exp(s), s >= tau);
            }
            let need = top_p * sum_all(lid, mass);
            // Invariant: the mass at or above lo is >= need.
            var lo = tau;
            var hi = 1.0;
            for (var step = 0u; step < BISECT_STEPS; step++) {
                let mid = 0.5 * (lo + hi);
                var part = 0.0;
                for (var i = first; i < last; i++) {
                    let s = (logits[base + i] - row_max) * inv_t;
                    part += select(0.0, exp(s), s >= mid);
                }
                if (sum_all(lid, part) >= need) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            tau = lo;
        }
        if (min_p > 0.0) {
            tau = max(tau, log(min_p));
        }

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
        sh_u[lid] = 0xffffffffu;
        if (goal >= start && (goal < start + kept || lid == WG - 1u)) {
            var running = start;
            var last_kept = 0xffffffffu;
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
            var pick = 0xffffffffu;
            for (var j = 0u; j < WG; j++) {
                if (sh_u[j] != 0xffffffffu) {
                    pick = sh_u[j];
                    break;
                }
            }
            sh_u[0] = pick;
        }
        token = workgroupUniformLoad(&sh_u[0]);
        if (token == 0xffffffffu) {
            token = argmax_below(lid, base, first, last, 3.4028234663852886e38, 0u);
        }
    }

    let o = row * OUT_STRIDE;
    if (lid == 0u) {
        out[o] = token;
        out[o + 1u] = bitcast<u32>(logits[base + token] - row_max - log_z);
    }
    var cap_v = 3.4028234663852886e38;
    var cap_i = 0u;
    for (var n = 0u; n < top_n; n++) {
        let best = argmax_below(lid, base, first, last, cap_v, cap_i);
        cap_v = logits[base + best];
        cap_i = best;
        if (lid == 0u) {
            out[o + 2u + 2u * n] = best;
            out[o + 3u + 2u * n] = bitcast<u32>(cap_v - row_max - log_z);
        }
    }
}
