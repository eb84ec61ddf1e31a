// SPDX-License-Identifier: Apache-2.0
// spec_sample: the rejection-sampling rule of speculative decoding with a draft model. Each
// speculative row names a logit row and a mode:
//   keep (1)   a draft's row: write the distribution its token was drawn from, p over the
//              vocabulary after temperature and top-k/top-p/min-p filtering (exactly
//              sample.wgsl's filtering), into a slot of the draft distributions;
//   verify (2) a target's row checking drafted token d drawn from the distribution q kept in a
//              slot: keep d when ua · q(d) < p(d) (probability min(1, p(d)/q(d))), else draw
//              from the normalised residual max(0, p − q) with ur by inverse CDF in vocabulary
//              order; write the token and its log-probability (0 unless the row reports
//              log-probabilities) over the sampler's output row.
// The result is distributed exactly as p whatever q is (the standard speculative sampling
// lemma), and a rejected row never picks d (the residual is 0 there).
//
// Bindings (group 0)
//   0 params    uniform     Params                   mirrors gpu::kernels::spec_sample::Params
//   1 logits    read        f32 (logit_rows, vocab)  after penalties and token masks
//   2 spec      read        u32 (rows, 12)           per row: logit row, mode, slot, draft token,
//                                                    temperature (f32 bits; 0 = greedy), top_k,
//                                                    top_p (f32 bits), min_p (f32 bits),
//                                                    ua (f32 bits), ur (f32 bits), 1 when
//                                                    the row reports log-probabilities, 0
//   3 probs     read_write  f32 (slots, vocab)       the draft distributions
//   4 out       read_write  u32 (logit_rows, 42)     sample.wgsl's output rows: token, logprob bits, …
// A slot is written (keep) or read (verify) by at most one row of a dispatch.
// Workgroup: WG = 256 invocations per row; invocation t owns the slice [t·chunk, (t+1)·chunk)
// of the vocabulary, and every row-wide sum is a fixed-order tree, so a row's result depends
// only on that row (batch invariant).
// Grid: (rows, 1, 1).

struct Params {
    rows: u32,
    vocab: u32,
}

const OUT_STRIDE: u32 = 42u; // sample.wgsl's 2 + 2 * MAX_TOP
const SPEC: u32 = 12u;
const KEEP: u32 = 1u;
const VERIFY: u32 = 2u;
const NONE: u32 = 0xffffffffu;

#include shared/sample_filter.wgsl

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> spec: array<u32>;
@group(0) @binding(3) var<storage, read_write> probs: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

// The row being worked on (the same in every invocation of a workgroup).
var<private> base: u32;       // first logit of the row
var<private> slot_base: u32;  // first probability of the slot
var<private> row_max: f32;
var<private> inv_t: f32;
var<private> tau: f32;        // kept: (logit - max) · inv_t >= tau
var<private> total: f32;      // sum of exp over the kept tokens
var<private> greedy_token: u32; // the argmax when the temperature is 0, else NONE

// p(i): the filtered, normalised target (or draft) probability of token i.
fn p_of(i: u32) -> f32 {
    if (greedy_token != NONE) {
        return select(0.0, 1.0, i == greedy_token);
    }
    let s = (logits[base + i] - row_max) * inv_t;
    return select(0.0, exp(s) / total, s >= tau);
}

// The residual weight max(0, p - q) of token i.
fn residual_of(i: u32) -> f32 {
    return max(0.0, p_of(i) - probs[slot_base + i]);
}

// Weight of token i in the draw: the residual, or p itself.
fn weight_of(i: u32, residual: bool) -> f32 {
    if (residual) {
        return residual_of(i);
    }
    return p_of(i);
}

// Inverse CDF over the weights in vocabulary order: the token where the running sum passes
// u · (their total); rounding that leaves the goal past the last positive weight picks that one.
fn draw(lid: u32, first: u32, last: u32, u: f32, residual: bool) -> u32 {
    var mine = 0.0;
    for (var i = first; i < last; i++) {
        mine += weight_of(i, residual);
    }
    // Exclusive prefix of the per-invocation sums, in invocation (= vocabulary) order.
    workgroupBarrier();
    sh_f[lid] = mine;
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
    let goal = u * bitcast<f32>(sh_u[0]);
    let start = sh_f[lid];
    workgroupBarrier();
    sh_u[lid] = NONE;
    if (mine > 0.0 && goal >= start) {
        var running = start;
        var last_positive = NONE;
        for (var i = first; i < last; i++) {
            let w = weight_of(i, residual);
            if (w > 0.0) {
                last_positive = i;
                running += w;
                if (running > goal) {
                    break;
                }
            }
        }
        sh_u[lid] = last_positive;
    }
    workgroupBarrier();
    if (lid == 0u) {
        // The first slice whose end passes the goal holds the token; when rounding leaves the
        // goal past every slice, the last slice with weight wins.
        var pick = NONE;
        for (var j = 0u; j < WG; j++) {
            if (sh_u[j] != NONE) {
                pick = sh_u[j];
                let end = select(sh_f[j + 1u], POS_MAX, j + 1u == WG);
                if (goal < end) {
                    break;
                }
            }
        }
        sh_u[0] = pick;
    }
    return workgroupUniformLoad(&sh_u[0]);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x * SPEC;
    let logit_row = spec[r];
    let mode = spec[r + 1u];
    let slot = spec[r + 2u];
    let drafted = spec[r + 3u];
    let temperature = bitcast<f32>(spec[r + 4u]);
    let top_k = spec[r + 5u];
    let top_p = bitcast<f32>(spec[r + 6u]);
    let min_p = bitcast<f32>(spec[r + 7u]);
    let ua = bitcast<f32>(spec[r + 8u]);
    let ur = bitcast<f32>(spec[r + 9u]);
    let logprobs = spec[r + 10u] != 0u;
    let vocab = params.vocab;
    base = logit_row * vocab;
    slot_base = slot * vocab;
    let chunk = (vocab + WG - 1u) / WG;
    let first = min(lid * chunk, vocab);
    let last = min(first + chunk, vocab);

    var local_max = NEG_MAX;
    for (var i = first; i < last; i++) {
        local_max = max(local_max, logits[base + i]);
    }
    row_max = max_all(lid, local_max);
    // The log-sum-exp only a verify row that reports its token's log-probability needs.
    var log_z = 0.0;
    if (mode == VERIFY && logprobs) {
        var local_sum = 0.0;
        for (var i = first; i < last; i++) {
            local_sum += exp(logits[base + i] - row_max);
        }
        log_z = log(sum_all(lid, local_sum));
    }

    // The kept set, found exactly as sample.wgsl finds it.
    greedy_token = NONE;
    inv_t = 1.0;
    tau = 0.0;
    total = 1.0;
    if (temperature <= 0.0) {
        greedy_token = argmax_below(lid, base, first, last, POS_MAX, 0u);
    } else {
        inv_t = 1.0 / temperature;
        tau = filter_threshold(lid, base, first, last, vocab, row_max, inv_t, top_k, top_p, min_p);
        var kept = 0.0;
        for (var i = first; i < last; i++) {
            let s = (logits[base + i] - row_max) * inv_t;
            kept += select(0.0, exp(s), s >= tau);
        }
        total = sum_all(lid, kept);
    }

    if (mode == KEEP) {
        for (var i = first; i < last; i++) {
            probs[slot_base + i] = p_of(i);
        }
        return;
    }
    if (mode != VERIFY) {
        return;
    }
    // Every invocation reads the same q(d); the broadcast proves it uniform to the compiler.
    workgroupBarrier();
    if (lid == 0u) {
        sh_u[0] = select(0u, 1u, ua * probs[slot_base + drafted] < p_of(drafted));
    }
    let accepted = workgroupUniformLoad(&sh_u[0]) == 1u;
    var token = drafted;
    if (!accepted) {
        // From the residual, or where none is left (p and q agree to rounding) from p itself:
        // one call of draw, which shaders inline (SwiftShader compiles every copy again).
        token = NONE;
        for (var attempt = 0u; attempt < 2u && token == NONE; attempt++) {
            token = draw(lid, first, last, ur, attempt == 0u);
        }
    }
    if (lid == 0u) {
        let o = logit_row * OUT_STRIDE;
        out[o] = token;
        out[o + 1u] = bitcast<u32>(select(0.0, logits[base + token] - row_max - log_z, logprobs));
    }
}
