// SPDX-License-Identifier: Apache-2.0
// rope_kv_write: RoPE on the step's query heads (in place) and key heads, and the rotated keys
// and the values written into each token's slot of the paged KV cache, in one pass.
//
// Bindings (group 0)
//   0 params     uniform     Params       mirrors gpu::kernels::paged::RopeKvParams
//   1 qkv        read_write  f32 (num_tokens, row_stride): query heads from column 0, key heads
//                            from k_col, value heads from v_col (each head head_dim wide)
//   2 positions  read        u32 (num_tokens)
//   3 cos_sin    read        f32 (table_rows, rope_dim / 2, 2)   cos and sin of pos · inv_freq[i]
//   4 slots      read        u32 (num_tokens)   block * block_size + offset; >= num_slots: skip
//   5 k_cache    kv_write    vec4 (num_slots, num_kv_heads, head_dim / 4) from cache_offset
//   6 v_cache    kv_write    likewise (storage buffers, or storage textures on CPU drivers)
// The angles come from a table built on the CPU, so every frequency scheme (plain, llama3,
// linear, LongRoPE, YaRN, each with its attention factor folded into cos and sin) and every
// position gets exactly the f32 angles the reference computes.
// Only the first rope_dim dimensions of each head rotate (partial rotary, Phi-4-mini: 96 of
// 128); the rest pass through, as in transformers' `q[..., :rotary_dim]` and ggml's n_dims.
// Pairing: neox = 1 rotates (i, i + rope_dim/2) ("rotate half", HF Llama);
//          neox = 0 rotates (2i, 2i + 1) (interleaved, GPT-J / Meta's original Llama).
// Workgroup: 64 invocations. Per token, the first num_heads · rope_dim/2 invocations each
// rotate one query pair in place; the next num_kv_heads · head_dim/4 each compute four
// consecutive dimensions of one key head (reading their partners from qkv, which keeps the
// unrotated keys) and store them, with the value's four, as one vec4 into the cache: whole
// texels, as a storage texture requires. Every rotated element is computed with the same
// expression either way. Positions past the table are left unrotated.
// Grid: (min(g, 65535), ceil(g / 65535), 1), g = ceil(num_tokens · (num_heads · rope_dim/2 +
// num_kv_heads · head_dim/4) / 64).

#include kv_write

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
    rope_dim: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;
@group(0) @binding(3) var<storage, read> cos_sin: array<f32>;
@group(0) @binding(4) var<storage, read> slots: array<u32>;

// Dimension d of a key head at `base`, rotated by position `pos`.
fn rotated_key(base: u32, d: u32, pos: u32) -> f32 {
    let half = params.rope_dim / 2u;
    let x = qkv[base + d];
    if (d >= params.rope_dim || pos >= params.table_rows) {
        return x;
    }
    var i = d / 2u;
    var partner = d ^ 1u;
    var first = (d & 1u) == 0u;
    if (params.neox == 1u) {
        i = d % half;
        partner = select(d - half, d + half, d < half);
        first = d < half;
    }
    let c = cos_sin[(pos * half + i) * 2u];
    let s = cos_sin[(pos * half + i) * 2u + 1u];
    let y = qkv[base + partner];
    // The same expressions as the query pairs below: first element xa·c - xb·s, second xb·c + xa·s.
    if (first) {
        return x * c - y * s;
    }
    return x * c + y * s;
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = params.rope_dim / 2u;
    let quads = params.head_dim / 4u;
    let q_pairs = params.num_heads * half;
    let per_token = q_pairs + params.num_kv_heads * quads;
    let id = gid.x + gid.y * nwg.x * WG;
    if (id >= params.num_tokens * per_token) {
        return;
    }
    let t = id / per_token;
    let r = id % per_token;
    let pos = positions[t];
    let row = t * params.row_stride;
    if (r < q_pairs) {
        let i = r % half;
        var a = 2u * i;
        var b = a + 1u;
        if (params.neox == 1u) {
            a = i;
            b = i + half;
        }
        if (pos < params.table_rows) {
            let c = cos_sin[(pos * half + i) * 2u];
            let s = cos_sin[(pos * half + i) * 2u + 1u];
            let base = row + (r / half) * params.head_dim;
            let xa = qkv[base + a];
            let xb = qkv[base + b];
            qkv[base + a] = xa * c - xb * s;
            qkv[base + b] = xb * c + xa * s;
        }
        return;
    }
    let slot = slots[t];
    if (slot >= params.num_slots) {
        return;
    }
    let kv_head = (r - q_pairs) / quads;
    let d0 = 4u * ((r - q_pairs) % quads);
    let k_base = row + params.k_col + kv_head * params.head_dim;
    let v_base = row + params.v_col + kv_head * params.head_dim;
    let k = vec4<f32>(rotated_key(k_base, d0, pos), rotated_key(k_base, d0 + 1u, pos),
                      rotated_key(k_base, d0 + 2u, pos), rotated_key(k_base, d0 + 3u, pos));
    let v = vec4<f32>(qkv[v_base + d0], qkv[v_base + d0 + 1u], qkv[v_base + d0 + 2u], qkv[v_base + d0 + 3u]);
    kv_store(params.cache_offset + (slot * params.num_kv_heads + kv_head) * quads + d0 / 4u, k, v);
}
