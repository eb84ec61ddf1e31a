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

// The largest v of the workgroup: group_floors' tree with every invocation in one set.
fn max_all(lid: u32, v: f32) -> f32 {
    return group_floors(lid, vec4<f32>(v), vec4<u32>(1u)).x;
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
const STEPS_PER_PASS: u32 = 3u; // bisect_pass writes its 7 midpoints out for 3
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
    // t_p = 0.5 · (t_(p - h) + t_(p + h)), h the lowest set bit of p: the midpoint of the
    // interval a bisection has narrowed to when it tests position p. Named values, not a
    // private array indexed in loops, which CPU drivers keep in memory.
    let t0 = *lo;
    let t8 = *hi;
    let t4 = 0.5 * (t0 + t8);
    let t2 = 0.5 * (t0 + t4);
    let t6 = 0.5 * (t4 + t8);
    // Per invocation, the counts or masses at positions 1..4 and 5..8 (8 is hi, unused).
    let ta = vec4<f32>(0.5 * (t0 + t2), t2, 0.5 * (t2 + t4), t4);
    let tb = vec4<f32>(0.5 * (t4 + t6), t6, 0.5 * (t6 + t8), t8);
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
    // The steps: from the middle position, up or down by half as far each time.
    var p = POSITIONS / 2u;
    var h = POSITIONS / 2u;
    for (var level = 0u; level < STEPS_PER_PASS; level++) {
        h >>= 1u;
        let i = (p - 1u) & 3u;
        let in_a = p <= 4u;
        if (select(r[1][i], r[0][i], in_a) >= goal) {
            *lo = select(tb[i], ta[i], in_a);
            p += h;
        } else {
            *hi = select(tb[i], ta[i], in_a);
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

// Per component c: the largest of v[c] within each of groups[c] sets of invocations
// (invocation l in set l % groups[c]), then the least of those: at least groups[c]
// invocations hold a value at or above it. Each groups[c] is a power of two up to WG. Four
// floors in one tree: shaders inline each call, and a browser's SwiftShader compiles every
// inlined tree again.
fn group_floors(lid: u32, v: vec4<f32>, groups: vec4<u32>) -> vec4<f32> {
    workgroupBarrier();
    sh_a[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            let a = sh_a[lid];
            let b = sh_a[lid + stride];
            sh_a[lid] = select(min(a, b), max(a, b), vec4<u32>(stride) >= groups);
        }
        workgroupBarrier();
    }
    return sh_a[0];
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
    let top_k_on = top_k > 0u && top_k < vocab;
    // Sets for top-k's floor (below): the least power of two at or above k, where k <= WG.
    var k_groups = 1u;
    while (k_groups < top_k && k_groups < WG) {
        k_groups <<= 1u;
    }
    // The lowest s, and the three floors the filters below may take, in one tree.
    let floors = group_floors(lid, vec4<f32>(-local_low, local_high, local_high, local_high), vec4<u32>(1u, k_groups, 64u, WG));
    let lowest = -floors.x;
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
        floor = max(lowest, floors.y);
    } else if (!top_k_on) {
        floor = max(lowest, floors.z);
        floor_wide = max(lowest, floors.w);
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
        // The four sums in one tree (each component in sum_all's order).
        let sums = sum_all8(lid, vec4<f32>(mass, mass_above, mass_wide, f32(above_wide)), vec4<f32>(0.0))[0];
        need = top_p * sums.x;
        let held = sums.y >= need;
        let held_wide = sums.z >= need && sums.w <= f32(KEPT_CAP);
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
    // Top-k's bisection (a count), then top-p's (a mass) over what top-k kept, from one call
    // of bisect_pass: shaders inline each call, and SwiftShader took ~0.9 s to compile a copy.
    var tau = lowest;
    for (var phase = 0u; phase < 2u; phase++) {
        let by_mass = phase == 1u;
        if ((!by_mass && !top_k_on) || (by_mass && top_p >= 1.0)) {
            continue;
        }
        var goal = f32(top_k);
        if (by_mass) {
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
            goal = need;
        }
        // Invariant: the count (or mass) at or above lo reaches the goal; hi fails it (or is
        // above every s).
        var lo = tau;
        var hi = 1.0;
        for (var round = 0u; round < BISECT_STEPS / STEPS_PER_PASS; round++) {
            bisect_pass(lid, base, start, end, compacted, row_max, inv_t, &lo, &hi, by_mass, goal);
        }
        tau = lo;
    }
    if (min_p > 0.0) {
        tau = max(tau, log(min_p));
    }
    return tau;
}
