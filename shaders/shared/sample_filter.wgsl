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

// The largest v of the workgroup: group_floor's tree with every invocation in one set.
fn max_all(lid: u32, v: f32) -> f32 {
    return group_floor(lid, v, 1u);
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

// Bisection steps one pass over the row decides. A pass tests every threshold those steps can
// reach, the 7 midpoints at the dyadic positions 1..7 of [lo, hi] (position 0 is lo, 8 is hi),
// each computed as the step reaching it computes it, and then takes the 3 steps: the same τ as
// one step a pass, in a third of the passes over the row. BISECT_STEPS is a multiple. (Five
// steps a pass, 31 thresholds, made a pass 2.6x dearer on llvmpipe, for a fifth of the passes.)
const STEPS_PER_PASS: u32 = 3u;
const POSITIONS: u32 = 8u; // 2^STEPS_PER_PASS

var<workgroup> sh_a: array<vec4<f32>, WG>;
var<workgroup> sh_b: array<vec4<f32>, WG>;
// The tokens the bisections can count, as s: each invocation's in the row's order, the
// invocations' one after another (when they fit).
const KEPT_CAP: u32 = 1024u;
var<workgroup> sh_kept: array<f32, KEPT_CAP>;
var<workgroup> sh_kept_total: u32;

// Two vec4s summed over the workgroup, each component in sum_all's order.
fn sum_all8(lid: u32, a: vec4<f32>, b: vec4<f32>) -> array<vec4<f32>, 2> {
    workgroupBarrier();
    sh_a[lid] = a;
    sh_b[lid] = b;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            sh_a[lid] += sh_a[lid + stride];
            sh_b[lid] += sh_b[lid + stride];
        }
        workgroupBarrier();
    }
    return array<vec4<f32>, 2>(sh_a[0], sh_b[0]);
}

// STEPS_PER_PASS bisection steps of [lo, hi] toward the largest τ where the row's count of
// s >= τ (or with `mass`, its sum of exp(s) over s >= τ) is at least `goal`. Each invocation
// reads its entries start .. end: of the row (logits, turned into s), or with `compacted` of
// sh_kept (already s).
fn bisect_pass(
    lid: u32, base: u32, start: u32, end: u32, compacted: bool, row_max: f32, inv_t: f32,
    lo: ptr<function, f32>, hi: ptr<function, f32>, mass: bool, goal: f32,
) {
    // t[p] = 0.5 · (t[p - h] + t[p + h]), h the lowest set bit of p: the midpoint of the
    // interval a bisection has narrowed to when it tests position p.
    var t: array<f32, 9>;
    t[0] = *lo;
    t[POSITIONS] = *hi;
    for (var h = POSITIONS / 2u; h > 0u; h >>= 1u) {
        for (var p = h; p < POSITIONS; p += 2u * h) {
            t[p] = 0.5 * (t[p - h] + t[p + h]);
        }
    }
    // Per invocation, the counts or masses at positions 1..4 and 5..8 (8 is hi, unused).
    let ta = vec4<f32>(t[1], t[2], t[3], t[4]);
    let tb = vec4<f32>(t[5], t[6], t[7], t[8]);
    var ca = vec4<f32>(0.0);
    var cb = vec4<f32>(0.0);
    for (var i = start; i < end; i++) {
        let s = entry_s(i, compacted, base, row_max, inv_t);
        // Counts stay below 2^24, so summing them in f32 is exact.
        var w = 1.0;
        if (mass) {
            w = exp(s);
        }
        let vs = vec4<f32>(s);
        ca += select(vec4<f32>(0.0), vec4<f32>(w), vs >= ta);
        cb += select(vec4<f32>(0.0), vec4<f32>(w), vs >= tb);
    }
    let r = sum_all8(lid, ca, cb);
    var total = array<f32, 9>(0.0, r[0].x, r[0].y, r[0].z, r[0].w, r[1].x, r[1].y, r[1].z, r[1].w);
    // The steps: from the middle position, up or down by half as far each time.
    var p = POSITIONS / 2u;
    var h = POSITIONS / 2u;
    for (var level = 0u; level < STEPS_PER_PASS; level++) {
        h >>= 1u;
        if (total[p] >= goal) {
            *lo = t[p];
            p += h;
        } else {
            *hi = t[p];
            p -= h;
        }
    }
}

// Entry i of what an invocation reads: s of the row's token i, or with `compacted` sh_kept[i].
fn entry_s(i: u32, compacted: bool, base: u32, row_max: f32, inv_t: f32) -> f32 {
    if (compacted) {
        return sh_kept[i];
    }
    return (logits[base + i] - row_max) * inv_t;
}

// The largest of v within each of `groups` sets of invocations (invocation l in set
// l % groups), then the least of those: at least `groups` invocations hold a value at or above
// it. `groups` is a power of two up to WG.
fn group_floor(lid: u32, v: f32, groups: u32) -> f32 {
    workgroupBarrier();
    sh_f[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            if (stride >= groups) {
                sh_f[lid] = max(sh_f[lid], sh_f[lid + stride]);
            } else {
                sh_f[lid] = min(sh_f[lid], sh_f[lid + stride]);
            }
        }
        workgroupBarrier();
    }
    return sh_f[0];
}

// The filter threshold τ of the row at `base` (largest logit row_max): the kept tokens are
// those with s = (logit - row_max) · inv_t >= τ. Top-k keeps s >= τk, the largest τ with at
// least k survivors; top-p keeps s >= τp, the largest τ whose survivors (among top-k's) hold at
// least top_p of the mass; min-p keeps s >= ln(min_p). τk and τp are found by BISECT_STEPS
// steps of bisection, STEPS_PER_PASS of them a pass (bisect_pass) over the row or, where they
// fit in sh_kept, over the only tokens those passes can count: the ones at or above a floor.
fn filter_threshold(
    lid: u32, base: u32, first: u32, last: u32, vocab: u32, row_max: f32, inv_t: f32,
    top_k: u32, top_p: f32, min_p: f32,
) -> f32 {
    // s lies in [lowest, 0]. Tokens masked by token_mask.wgsl stay out: their far-off value
    // would stretch the bisections below past their precision.
    var local_low = 0.0;
    var local_high = NEG_MAX;
    for (var i = first; i < last; i++) {
        let logit = logits[base + i];
        let s = (logit - row_max) * inv_t;
        if (logit > MASKED) {
            local_low = min(local_low, s);
        }
        local_high = max(local_high, s);
    }
    let lowest = -max_all(lid, -local_low);
    let top_k_on = top_k > 0u && top_k < vocab;
    if (!top_k_on && top_p >= 1.0) {
        return select(lowest, max(lowest, log(min_p)), min_p > 0.0);
    }
    // The floor: every threshold either bisection tests is at or above `lowest`. Top-k's τk is
    // at or above the least of the largest s of k or more sets of invocations (that many tokens
    // lie at or above it), so counted at any lower threshold the tokens at or above the floor
    // are already k or more, and the bisection decides as it would over the row. Top-p alone
    // takes such a least largest s of 64 sets, else of every invocation, where the tokens at
    // or above it hold the mass it needs (their sum, in the same order, is at most the sum at
    // any lower threshold) and fit in sh_kept.
    var floor = lowest;
    var floor_wide = lowest;
    if (top_k_on && top_k <= WG) {
        var groups = 1u;
        while (groups < top_k) {
            groups <<= 1u;
        }
        floor = max(lowest, group_floor(lid, local_high, groups));
    } else if (!top_k_on) {
        floor = max(lowest, group_floor(lid, local_high, 64u));
        floor_wide = max(lowest, group_floor(lid, local_high, WG));
    }
    var above = 0u;
    var above_wide = 0u;
    var above_lowest = 0u;
    var mass = 0.0;
    var mass_above = 0.0;
    var mass_wide = 0.0;
    for (var i = first; i < last; i++) {
        let s = (logits[base + i] - row_max) * inv_t;
        above += select(0u, 1u, s >= floor);
        above_wide += select(0u, 1u, s >= floor_wide);
        above_lowest += select(0u, 1u, s >= lowest);
        if (!top_k_on && s >= lowest) {
            let e = exp(s);
            mass += e;
            mass_above += select(0.0, e, s >= floor);
            mass_wide += select(0.0, e, s >= floor_wide);
        }
    }
    // Top-p alone: the mass to keep, over every token (τ is `lowest`).
    var need = 0.0;
    if (!top_k_on) {
        need = top_p * sum_all(lid, mass);
        // Every sum first: each has barriers, which a short-circuit would put under a branch.
        let held = sum_all(lid, mass_above) >= need;
        let wide_mass = sum_all(lid, mass_wide);
        let wide_count = sum_all(lid, f32(above_wide));
        let held_wide = wide_mass >= need && wide_count <= f32(KEPT_CAP);
        if (!held && held_wide) {
            floor = floor_wide;
            above = above_wide;
        } else if (!held) {
            floor = lowest;
            above = above_lowest;
        }
    }
    workgroupBarrier();
    sh_u[lid] = above;
    workgroupBarrier();
    if (lid == 0u) {
        var running = 0u;
        for (var j = 0u; j < WG; j++) {
            let here = sh_u[j];
            sh_u[j] = running;
            running += here;
        }
        sh_kept_total = running;
    }
    let compacted = workgroupUniformLoad(&sh_kept_total) <= KEPT_CAP;
    let offset = sh_u[lid];
    var start = first;
    var end = last;
    if (compacted) {
        start = offset;
        end = offset + above;
        var at = offset;
        for (var i = first; i < last; i++) {
            let s = (logits[base + i] - row_max) * inv_t;
            if (s >= floor) {
                sh_kept[at] = s;
                at++;
            }
        }
    }
    var tau = lowest;
    if (top_k_on) {
        // Invariant: count(s >= lo) >= k; hi fails it (or is above every s).
        var lo = lowest;
        var hi = 1.0;
        for (var round = 0u; round < BISECT_STEPS / STEPS_PER_PASS; round++) {
            bisect_pass(lid, base, start, end, compacted, row_max, inv_t, &lo, &hi, false, f32(top_k));
        }
        tau = lo;
    }
    if (top_p < 1.0) {
        if (top_k_on) {
            var kept_mass = 0.0;
            for (var i = start; i < end; i++) {
                let s = entry_s(i, compacted, base, row_max, inv_t);
                if (s >= tau) {
                    kept_mass += exp(s);
                }
            }
            need = top_p * sum_all(lid, kept_mass);
        }
        // Invariant: the mass at or above lo is >= need.
        var lo = tau;
        var hi = 1.0;
        for (var round = 0u; round < BISECT_STEPS / STEPS_PER_PASS; round++) {
            bisect_pass(lid, base, start, end, compacted, row_max, inv_t, &lo, &hi, true, need);
        }
        tau = lo;
    }
    if (min_p > 0.0) {
        tau = max(tau, log(min_p));
    }
    return tau;
}
