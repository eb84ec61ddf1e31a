// SPDX-License-Identifier: Apache-2.0
// rope_kv_write: RoPE on the step's query heads (in place) and key heads, and the rotated keys
// and the values written into each token's slot of the paged KV cache, in one pass.
//
// Bindings (group 0)
//   0 params     uniform     Params       mirrors gpu::kernels::paged::RopeKvParams
//   1 qkv        read_write  f32 (num_tokens, row_stride): query heads from column 0, key heads
//                            from k_col, value heads from v_col (each head head_dim wide)
//   2 positions  read        u32 (num_tokens)
//   3 cos_sin    read        f32 (table_rows, head_dim / 2, 2)   cos and sin of pos · inv_freq[i]
//   4 slots      read        u32 (num_tokens)   block * block_size + offset; >= num_slots: skip
//   5 k_cache    read_write  f32 (num_slots, num_kv_heads, head_dim) from element cache_offset
//   6 v_cache    read_write  f32 likewise
// The angles come from a table built on the CPU, so every frequency scheme (plain, llama3,
// linear) and every position gets exactly the f32 angles the reference computes.
// Pairing: neox = 1 rotates (i, i + head_dim/2) ("rotate half", HF Llama);
//          neox = 0 rotates (2i, 2i + 1) (interleaved, GPT-J / Meta's original Llama).
// Workgroup: 64 invocations, one per rotated pair: a query pair is rotated in place; a key pair
// is rotated into the cache, and the two value elements at the same offsets are copied there.
// Positions past the table are left unrotated.
// Grid: (min(g, 65535), ceil(g / 65535), 1), g = ceil(num_tokens · (num_heads + num_kv_heads) ·
// head_dim/2 / 64).

struct Params {
    num_tokens: u32,
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    row_stride: u32,
    k_col: u32,
    v_col: u32,
    neox: u32,
    table_rows: u32,
    cache_offset: u32,
    num_slots: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<storage, read> cos_sin: array<f32>;
@group(0) @binding(4) var<storage, read> slots: array<u32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = params.head_dim / 2u;
    let per_token = (params.num_heads + params.num_kv_heads) * half;
    let id = gid.x + gid.y * nwg.x * WG;
    if (id >= params.num_tokens * per_token) {
        return;
    }
    let t = id / per_token;
    let r = id % per_token;
    let pos = positions[t];
    let i = r % half;
    // Offsets of the pair within a head.
    var a = 2u * i;
    var b = a + 1u;
    if (params.neox == 1u) {
        a = i;
        b = i + half;
    }
    var c = 1.0;
    var s = 0.0;
    if (pos < params.table_rows) {
        c = cos_sin[(pos * half + i) * 2u];
        s = cos_sin[(pos * half + i) * 2u + 1u];
    }
    let row = t * params.row_stride;
    if (r < params.num_heads * half) {
        let base = row + (r / half) * params.head_dim;
        let xa = qkv[base + a];
        let xb = qkv[base + b];
        if (pos < params.table_rows) {
            qkv[base + a] = xa * c - xb * s;
            qkv[base + b] = xb * c + xa * s;
        }
        return;
    }
    let kv_head = (r - params.num_heads * half) / half;
    let slot = slots[t];
    if (slot >= params.num_slots) {
        return;
    }
    let k_base = row + params.k_col + kv_head * params.head_dim;
    let v_base = row + params.v_col + kv_head * params.head_dim;
    let dst = params.cache_offset + (slot * params.num_kv_heads + kv_head) * params.head_dim;
    let xa = qkv[k_base + a];
    let xb = qkv[k_base + b];
    if (pos < params.table_rows) {
        k_cache[dst + a] = xa * c - xb * s;
        k_cache[dst + b] = xb * c + xa * s;
    } else {
        k_cache[dst + a] = xa;
        k_cache[dst + b] = xb;
    }
    v_cache[dst + a] = qkv[v_base + a];
    v_cache[dst + b] = qkv[v_base + b];
}
