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
//   8 y        read_write  f32 (tokens, heads · head_dim)
// Workgroup: 64 invocations, one (head, channel) pair of one sequence each; the pair's
// state_size states stay in registers as vec4s (four states per load and per dynamic index:
// on CPU drivers every storage load and private-array index is a per-lane loop), and y sums
// four running lanes, each in order n = 0.., then adds them pairwise. A sequence's rows do not
// depend on its batch. Requires state_size and heads · head_dim to be multiples of 4.
// Grid: (ceil(heads · head_dim / 64), num_seqs, 1).

struct Params {
    heads: u32,
    head_dim: u32,
    state_size: u32,
    groups: u32,
    dt_stride: u32,
    dt_offset: u32,
}

const WG: u32 = 64u;
// The largest state_size the registers hold (Mamba2 and Granite 4.0-H use 128), in vec4s.
const MAX_STATE4: u32 = 32u;
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
@group(0) @binding(8) var<storage, read_write> y: array<f32>;

// softplus as torch computes it: linear above 20.
fn softplus(v: f32) -> f32 {
    return select(log(1.0 + exp(v)), v, v > 20.0);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let inner = params.heads * params.head_dim;
    let hp = gid.x;
    if (hp >= inner) {
        return;
    }
    let h = hp / params.head_dim;
    let g = h / (params.heads / params.groups);
    let n_state = params.state_size;
    let n4 = n_state / 4u;
    let row_width = inner + 2u * params.groups * n_state;
    let s = gid.y;
    let first_row = seqs[SEQ_COLS * s];
    let num_rows = seqs[SEQ_COLS * s + 1u];
    let slot = seqs[SEQ_COLS * s + 2u];
    let fresh = seqs[SEQ_COLS * s + 3u] == 0u;
    let read_slot = seqs[SEQ_COLS * s + 4u];
    let save_slot = seqs[SEQ_COLS * s + 5u];

    var st: array<vec4<f32>, MAX_STATE4>;
    for (var i = 0u; i < n4; i++) {
        st[i] = select(state[(read_slot * inner + hp) * n4 + i], vec4<f32>(0.0), fresh);
    }
    let a_h = a[h];
    let d_h = d[h];
    let bias_h = dt_bias[h];
    for (var t = 0u; t < num_rows; t++) {
        let row = first_row + t;
        let step = softplus(dt[row * params.dt_stride + params.dt_offset + h] + bias_h);
        let decay = exp(step * a_h);
        let x_index = row * row_width + hp;
        let xv = xbc[x_index / 4u][x_index % 4u];
        let b_base = (row * row_width + inner + g * n_state) / 4u;
        let c_base = (row * row_width + inner + (params.groups + g) * n_state) / 4u;
        var acc = vec4<f32>(0.0);
        for (var i = 0u; i < n4; i++) {
            st[i] = st[i] * decay + (step * xbc[b_base + i]) * xv;
            acc += st[i] * xbc[c_base + i];
        }
        y[row * inner + hp] = ((acc.x + acc.y) + (acc.z + acc.w)) + d_h * xv;
    }
    for (var i = 0u; i < n4; i++) {
        state[(slot * inner + hp) * n4 + i] = st[i];
        if (save_slot != NO_SLOT) {
            state[(save_slot * inner + hp) * n4 + i] = st[i];
        }
    }
}
