// SPDX-License-Identifier: Apache-2.0
// token_mask: structured output's allowed-token masks applied to logits in place, after the
// penalties and before sampling: every token a masked row may not pick gets MASKED, far below
// any real logit, so it keeps no probability (exp underflows to 0) and sample.wgsl leaves it
// out of its filtering range. Rows without a mask are not touched.
//
// Bindings (group 0)
//   0 params     uniform     Params                        mirrors gpu::kernels::token_mask::Params
//   1 logits     read_write  f32 (rows, vocab)
//   2 masks      read        u32 (num_masked, words)        bit t % 32 of word t / 32: token t, 1 = allowed
//   3 mask_rows  read        u32 (num_masked)               the logit row of each mask
// Workgroup: 256 invocations, one (mask, token) pair each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(num_masked · vocab / 256).

struct Params {
    num_masked: u32,
    vocab: u32,
    words: u32,
}

const WG: u32 = 256u;
// A forbidden token's logit; sample.wgsl's MASKED must stay equal.
const MASKED: f32 = -1e30;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read> masks: array<u32>;
@group(0) @binding(3) var<storage, read> mask_rows: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * WG;
    if (e >= params.num_masked * params.vocab) {
        return;
    }
    let m = e / params.vocab;
    let token = e % params.vocab;
    let allowed = (masks[m * params.words + token / 32u] >> (token % 32u)) & 1u;
    if (allowed == 0u) {
        logits[mask_rows[m] * params.vocab + token] = MASKED;
    }
}
