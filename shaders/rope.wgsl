// SPDX-License-Identifier: Apache-2.0
// rope: rotate pairs of each head's dimensions by position-dependent angles, in place.
//
// Bindings (group 0)
//   0 params     uniform     Params                              mirrors gpu::kernels::rope::Params
//   1 x          read_write  f32 (num_tokens, num_heads, head_dim)
//   2 positions  read        u32 (num_tokens)
//   3 cos_sin    read        f32 (table_rows, head_dim / 2, 2)   cos and sin of pos · inv_freq[i]
// The angles come from a table built on the CPU, so every frequency scheme (plain, llama3,
// linear) and every position gets exactly the f32 angles the reference computes.
// Pairing: neox = 1 rotates (i, i + head_dim/2) ("rotate half", HF Llama);
//          neox = 0 rotates (2i, 2i + 1) (interleaved, GPT-J / Meta's original Llama).
// Workgroup: 64 invocations, one per rotated pair; positions past the table are left untouched.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(num_tokens * num_heads * head_dim/2 / 64).

struct Params {
    num_tokens: u32,
    num_heads: u32,
    head_dim: u32,
    neox: u32,
    table_rows: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<storage, read> cos_sin: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = params.head_dim / 2u;
    let id = gid.x + gid.y * nwg.x * WG;
    if (id >= params.num_tokens * params.num_heads * half) {
        return;
    }
    let i = id % half;
    let head = id / half; // token * num_heads + head
    let pos = positions[head / params.num_heads];
    if (pos >= params.table_rows) {
        return;
    }
    let c = cos_sin[(pos * half + i) * 2u];
    let s = cos_sin[(pos * half + i) * 2u + 1u];
    let base = head * params.head_dim;
    var a = base + 2u * i;
    var b = a + 1u;
    if (params.neox == 1u) {
        a = base + i;
        b = a + half;
    }
    let xa = x[a];
    let xb = x[b];
    x[a] = xa * c - xb * s;
    x[b] = xb * c + xa * s;
}
