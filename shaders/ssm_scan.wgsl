// SPDX-License-Identifier: Apache-2.0
// ssm_scan: the selective-state update of a Mamba2 layer (SSD with scalar A per head), token
// by token from each sequence's state slot, leaving the state after its last token there. For
// head h, channel p of the head, state index n, group g = h / (heads / groups):
//   dt      = softplus(dt_raw[t, h] + dt_bias[h])
//   S[p, n] = S[p, n] · exp(dt · a[h]) + (dt · B[t, g, n]) · x[t, h, p]
//   y[t, h, p] = Σ_n S[p, n] · C[t, g, n] + d[h] · x[t, h, p]
// S starts from a slot (the sequence's own, or a prefix snapshot being restored), or from zero
// at position 0, and ends in the sequence's own slot (and in a snapshot slot when asked). A
// decode row is the one-token case; a prefill chunk runs its rows in order, so chunked prefill
// at any boundary equals one pass.
//
// Bindings (group 0)
//   0 params   uniform     Params  mirrors gpu::kernels::ssm::ScanParams
//   1 xbc      read        vec4<f32> (tokens, (heads · head_dim + 2 · groups · state_size) / 4): x, B, C
//   2 dt       read        f32 (tokens, dt_stride): dt_raw[t, h] = dt[t, dt_offset + h]
//   3 a        read        f32 (heads): -exp(A_log)
//   4 d        read        f32 (heads)
//   5 dt_bias  read        f32 (heads)
//   6 seqs     read        u32 (num_seqs, 6): first row, rows, own slot, start position,
//                                slot read from, snapshot slot written (0xffffffff: none)
//   7 state    read_write  vec4<f32> (slots, heads, head_dim, state_size / 4)
//   8 y        read_write  vec4<f32> (tokens, heads · head_dim / 4)
// Workgroup: 64 invocations, one quad of channels (p .. p + 3 of one head) of one sequence
// each. For each row, the invocation walks the state four states at a time (n = 4i .. 4i + 3):
// it reads B and C once for its four channels, reads each channel's four states from the slot,
// updates them and writes them back, so nothing is held in a private array (on CPU drivers an
// indexed private array and every storage load are per-lane loops; this shares each B/C load
// among four channels and indexes nothing). Each channel's y sums four running lanes, each in
// order n = 0.., then adds them pairwise. A sequence's rows do not depend on its batch.
// Requires state_size and head_dim to be multiples of 4.
// Grid: (ceil(heads · head_dim / 4 / 64), num_seqs, 1).

struct Params {
    heads: u32,
    head_dim: u32,
    state_size: u32,
    groups: u32,
    dt_stride: u32,
    dt_offset: u32,
}

const WG: u32 = 64u;
// Columns of the seqs table, and its "no slot" entry.
const SEQ_COLS: u32 = 6u;
const NO_SLOT: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> xbc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> dt: array<f32>;
@group(0) @binding(3) var<storage, read> a: array<f32>;
@group(0) @binding(4) var<storage, read> d: array<f32>;
@group(0) @binding(5) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(6) var<storage, read> seqs: array<u32>;
@group(0) @binding(7) var<storage, read_write> state: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> y: array<vec4<f32>>;

#include shared/softplus.wgsl

// One channel's state quad after a token: s · decay + (step · B) · x.
fn update(s: vec4<f32>, decay: f32, step_b: vec4<f32>, xv: f32) -> vec4<f32> {
    return s * decay + step_b * xv;
}

fn total(acc: vec4<f32>) -> f32 {
    return (acc.x + acc.y) + (acc.z + acc.w);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let inner = params.heads * params.head_dim;
    let q = gid.x;
    if (q >= inner / 4u) {
        return;
    }
    // Channels hp .. hp + 3, all of head h (head_dim % 4 == 0).
    let hp = 4u * q;
    let h = hp / params.head_dim;
    let g = h / (params.heads / params.groups);
    let n4 = params.state_size / 4u;
    let row_width4 = (inner + 2u * params.groups * params.state_size) / 4u;
    let s = gid.y;
    let first_row = seqs[SEQ_COLS * s];
    let num_rows = seqs[SEQ_COLS * s + 1u];
    let slot = seqs[SEQ_COLS * s + 2u];
    let fresh = seqs[SEQ_COLS * s + 3u] == 0u;
    let read_slot = seqs[SEQ_COLS * s + 4u];
    let save_slot = seqs[SEQ_COLS * s + 5u];

    let a_h = a[h];
    let d_h = d[h];
    let bias_h = dt_bias[h];
    // State index of channel hp's quad 0 in a slot; channel c adds c · n4.
    let own = (slot * inner + hp) * n4;
    let save = (save_slot * inner + hp) * n4;
    for (var t = 0u; t < num_rows; t++) {
        let row = first_row + t;
        let step = softplus(dt[row * params.dt_stride + params.dt_offset + h] + bias_h);
        let decay = exp(step * a_h);
        let xv = xbc[row * row_width4 + q];
        let b_base = row * row_width4 + (inner + g * params.state_size) / 4u;
        let c_base = row * row_width4 + (inner + (params.groups + g) * params.state_size) / 4u;
        // The first row continues from the slot read from (or from zero), later ones from
        // the own slot, which every row leaves its state in.
        let src = select(own, (read_slot * inner + hp) * n4, t == 0u);
        let zero = fresh && t == 0u;
        let last = t + 1u == num_rows && save_slot != NO_SLOT;
        var acc0 = vec4<f32>(0.0);
        var acc1 = vec4<f32>(0.0);
        var acc2 = vec4<f32>(0.0);
        var acc3 = vec4<f32>(0.0);
        for (var i = 0u; i < n4; i++) {
            let step_b = step * xbc[b_base + i];
            let c = xbc[c_base + i];
            let s0 = update(select(state[src + i], vec4<f32>(0.0), zero), decay, step_b, xv.x);
            let s1 = update(select(state[src + n4 + i], vec4<f32>(0.0), zero), decay, step_b, xv.y);
            let s2 = update(select(state[src + 2u * n4 + i], vec4<f32>(0.0), zero), decay, step_b, xv.z);
            let s3 = update(select(state[src + 3u * n4 + i], vec4<f32>(0.0), zero), decay, step_b, xv.w);
            acc0 += s0 * c;
            acc1 += s1 * c;
            acc2 += s2 * c;
            acc3 += s3 * c;
            state[own + i] = s0;
            state[own + n4 + i] = s1;
            state[own + 2u * n4 + i] = s2;
            state[own + 3u * n4 + i] = s3;
            if (last) {
                state[save + i] = s0;
                state[save + n4 + i] = s1;
                state[save + 2u * n4 + i] = s2;
                state[save + 3u * n4 + i] = s3;
            }
        }
        y[row * (inner / 4u) + q] = vec4<f32>(total(acc0), total(acc1), total(acc2), total(acc3)) + d_h * xv;
    }
}
