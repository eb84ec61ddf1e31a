// SPDX-License-Identifier: Apache-2.0
// gated_delta_net: the recurrence of a Gated DeltaNet layer (Qwen3.5's linear attention),
// token by token from each sequence's state slot, leaving the state after its last token
// there. For v head h, its q/k head g (h / (v_heads / k_heads), or h % k_heads when the v
// heads are tiled), value dimension j:
//   q̂ = q[t, g] / sqrt(|q[t, g]|² + 1e-6) / sqrt(head_k)       (L2 norm, then the scale)
//   k̂ = k[t, g] / sqrt(|k[t, g]|² + 1e-6)
//   decay = exp(a_neg[h] · softplus(a[t, h] + dt_bias[h]))      (a_neg = -exp(A_log))
//   β = sigmoid(b[t, h])
//   S[:, j] ← S[:, j] · decay                                   (S: head_k × head_v)
//   δ_j = β · (v[t, h, j] - Σ_i S[i, j] · k̂_i)
//   S[:, j] ← S[:, j] + k̂ · δ_j
//   y[t, h, j] = Σ_i S[i, j] · q̂_i
// as transformers' torch_recurrent_gated_delta_rule computes it. S starts from a slot (the
// sequence's own, or a prefix snapshot being restored), or from zero at position 0, and ends
// in the sequence's own slot (and in a snapshot slot when asked). A decode row is the
// one-token case; a prefill chunk runs its rows in order, so chunked prefill at any boundary
// equals one pass.
//
// Bindings (group 0)
//   0 params   uniform     Params  mirrors gpu::kernels::ssm::DeltaParams
//   1 qkv      read        vec4<f32> (tokens, (2 · k_heads · head_k + v_heads · head_v) / 4):
//                                    the convolved q, k, v side by side
//   2 ba       read        f32 (tokens, ba_stride): b[t, h] = ba[t, ba_offset + h],
//                                    a[t, h] = ba[t, ba_offset + v_heads + h]
//   3 a_neg    read        f32 (v_heads): -exp(A_log)
//   4 dt_bias  read        f32 (v_heads)
//   5 seqs     read        u32 (num_seqs, 6): first row, rows, own slot, start position,
//                                slot read from, snapshot slot written (0xffffffff: none)
//   6 state    read_write  vec4<f32> (slots, v_heads, head_v, head_k / 4): column j of head
//                                h's S at [slot, h, j]
//   7 y        read_write  f32 (tokens, v_heads · head_v)
// Workgroup: 64 invocations, one value dimension j of one v head of one sequence each: the
// columns of S are independent, so nothing is shared between invocations. Per row the
// invocation computes both norms over its q/k head (each invocation alike: the same sums in
// the same order), then walks its column twice, four entries at a time: once for S^T k̂ after
// the decay, once to update and write the column and sum y. Nothing is held in a private
// array (on CPU drivers an indexed private array is a per-lane loop). Every sum runs in four
// lanes in order and joins them pairwise, so a sequence's rows do not depend on its batch.
// Requires head_k and head_v to be multiples of 4.
// Grid: (ceil(v_heads · head_v / 64), num_seqs, 1).

struct Params {
    k_heads: u32,
    v_heads: u32,
    head_k: u32,
    head_v: u32,
    ba_stride: u32,
    ba_offset: u32,
    tiled: u32,
}

const WG: u32 = 64u;
// Columns of the seqs table, and its "no slot" entry.
const SEQ_COLS: u32 = 6u;
const NO_SLOT: u32 = 0xffffffffu;
// transformers' l2norm epsilon (llama.cpp uses the model's RMSNorm epsilon, 1e-6 in Qwen3.5).
const L2_EPS: f32 = 1e-6;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> ba: array<f32>;
@group(0) @binding(3) var<storage, read> a_neg: array<f32>;
@group(0) @binding(4) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(5) var<storage, read> seqs: array<u32>;
@group(0) @binding(6) var<storage, read_write> state: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;

#include shared/softplus.wgsl

fn total(acc: vec4<f32>) -> f32 {
    return (acc.x + acc.y) + (acc.z + acc.w);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let width = params.v_heads * params.head_v;
    let col = gid.x;
    if (col >= width) {
        return;
    }
    let h = col / params.head_v;
    let g = select(h / (params.v_heads / params.k_heads), h % params.k_heads, params.tiled != 0u);
    let k4 = params.head_k / 4u;
    let key4 = params.k_heads * k4;
    let row_width4 = 2u * key4 + width / 4u;
    let s = gid.y;
    let first_row = seqs[SEQ_COLS * s];
    let num_rows = seqs[SEQ_COLS * s + 1u];
    let slot = seqs[SEQ_COLS * s + 2u];
    let fresh = seqs[SEQ_COLS * s + 3u] == 0u;
    let read_slot = seqs[SEQ_COLS * s + 4u];
    let save_slot = seqs[SEQ_COLS * s + 5u];

    let a_h = a_neg[h];
    let bias_h = dt_bias[h];
    let q_scale = inverseSqrt(f32(params.head_k));
    // Column `col` of a slot's state starts at (slot · width + col) · k4.
    let own = (slot * width + col) * k4;
    let save = (save_slot * width + col) * k4;
    for (var t = 0u; t < num_rows; t++) {
        let row = first_row + t;
        let q_base = row * row_width4 + g * k4;
        let k_base = q_base + key4;
        let v = qkv[row * row_width4 + 2u * key4 + col / 4u][col % 4u];
        var qq = vec4<f32>(0.0);
        var kk = vec4<f32>(0.0);
        for (var i = 0u; i < k4; i++) {
            qq += qkv[q_base + i] * qkv[q_base + i];
            kk += qkv[k_base + i] * qkv[k_base + i];
        }
        let q_norm = inverseSqrt(total(qq) + L2_EPS) * q_scale;
        let k_norm = inverseSqrt(total(kk) + L2_EPS);
        let ba_row = row * params.ba_stride + params.ba_offset;
        let beta = 1.0 / (1.0 + exp(-ba[ba_row + h]));
        let decay = exp(a_h * softplus(ba[ba_row + params.v_heads + h] + bias_h));
        // The first row continues from the slot read from (or from zero), later ones from
        // the own slot, which every row leaves its state in.
        let src = select(own, (read_slot * width + col) * k4, t == 0u);
        let zero = fresh && t == 0u;
        var kv = vec4<f32>(0.0);
        for (var i = 0u; i < k4; i++) {
            let st = select(state[src + i], vec4<f32>(0.0), zero) * decay;
            kv += st * (qkv[k_base + i] * k_norm);
        }
        let delta = beta * (v - total(kv));
        let last = t + 1u == num_rows && save_slot != NO_SLOT;
        var out = vec4<f32>(0.0);
        for (var i = 0u; i < k4; i++) {
            let st = select(state[src + i], vec4<f32>(0.0), zero) * decay + (qkv[k_base + i] * k_norm) * delta;
            out += st * (qkv[q_base + i] * q_norm);
            state[own + i] = st;
            if (last) {
                state[save + i] = st;
            }
        }
        y[row * width + col] = total(out);
    }
}
