// SPDX-License-Identifier: Apache-2.0
// penalize: apply logit biases, then repetition, presence and frequency penalties, to logits in
// place, before the token masks and sampling. Each entry names a (row, token) pair: a token the
// row's request biases, or one seen before in its sequence, with how often it was generated
// (UNSEEN for a token only biased). Every pair appears at most once, so no two invocations
// touch the same logit.
//   bias b:                                logit += b
//   repetition r (prompt and output tokens): logit > 0 ? logit / r : logit * r
//   presence p, frequency f (output tokens): logit -= p · [count > 0] + f · count
//
// Bindings (group 0)
//   0 params     uniform     Params                 mirrors gpu::kernels::penalize::Params
//   1 logits     read_write  f32 (rows, vocab)
//   2 entries    read        u32 (num_entries, 4)   row, token, times generated or UNSEEN, bias (f32 bits)
//   3 penalties  read        f32 (rows, 3)          repetition, presence, frequency
// Workgroup: 64 invocations, one entry each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(num_entries / 64).

struct Params {
    num_entries: u32,
    vocab: u32,
}

const WG: u32 = 64u;
// gpu::kernels::penalize::UNSEEN must stay equal.
const UNSEEN: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read> entries: array<u32>;
@group(0) @binding(3) var<storage, read> penalties: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= params.num_entries) {
        return;
    }
    let row = entries[4u * e];
    let token = entries[4u * e + 1u];
    let seen = entries[4u * e + 2u];
    if (token >= params.vocab) {
        return;
    }
    let i = row * params.vocab + token;
    var l = logits[i] + bitcast<f32>(entries[4u * e + 3u]);
    if (seen != UNSEEN) {
        let count = f32(seen);
        let repetition = penalties[3u * row];
        l = select(l * repetition, l / repetition, l > 0.0);
        l -= penalties[3u * row + 1u] * select(0.0, 1.0, count > 0.0) + penalties[3u * row + 2u] * count;
    }
    logits[i] = l;
}
