// SPDX-License-Identifier: Apache-2.0
// What sample.wgsl and spec_sample.wgsl share, so that a draft model's kept distribution is
// exactly the one the sampler draws from: row-wide reductions over workgroup memory, the greedy
// pick, and the filter threshold of temperature, top-k, top-p and min-p.
// The including shader declares `logits` (storage, read, f32) and runs WG invocations per row;
// invocation lid owns the vocabulary slice [first, last). Every row-wide quantity is a
// fixed-order tree, so a row's result depends only on that row (batch invariant).

const WG: u32 = 256u;
const BISECT_STEPS: u32 = 30u;
// ±f32::MAX written exactly: browsers reject a longer decimal (like 3.4028235e38) above it.
const NEG_MAX: f32 = -3.4028234663852886e38;
const POS_MAX: f32 = 3.4028234663852886e38;
// The logit of a token structured output forbids (token_mask.wgsl's MASKED).
const MASKED: f32 = -1e30;

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

// The best (value, index) of the row at `base` among entries ranking strictly below
// (cap_v, cap_i); (POS_MAX, 0) gives the greedy pick.
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

// The filter threshold τ of the row at `base` (largest logit row_max): the kept tokens are
// those with s = (logit - row_max) · inv_t >= τ. Top-k keeps s >= τk, the largest τ with at
// least k survivors; top-p keeps s >= τp, the largest τ whose survivors (among top-k's) hold at
// least top_p of the mass; min-p keeps s >= ln(min_p). τk and τp are found by BISECT_STEPS
// steps of bisection.
fn filter_threshold(
    lid: u32, base: u32, first: u32, last: u32, vocab: u32, row_max: f32, inv_t: f32,
    top_k: u32, top_p: f32, min_p: f32,
) -> f32 {
    // s lies in [lowest, 0]. Tokens masked by token_mask.wgsl stay out: their far-off value
    // would stretch the bisections below past their precision.
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
    return tau;
}
