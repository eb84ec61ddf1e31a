// SPDX-License-Identifier: Apache-2.0
// kv_write: copy each new token's K and V rows into its slot of the paged KV cache.
//
// Bindings (group 0)
//   0 params   uniform     Params                 mirrors gpu::kernels::paged::KvWriteParams
//   1 k        read        f32 (num_tokens, kv_dim)          kv_dim = num_kv_heads * head_dim
//   2 v        read        f32 (num_tokens, kv_dim)
//   3 slots    read        u32 (num_tokens)       block * block_size + offset; 0xffffffff = skip
//   4 k_cache  read_write  f32 (num_slots, kv_dim) starting at element cache_offset (one layer)
//   5 v_cache  read_write  f32 (num_slots, kv_dim) likewise
// Workgroup: 256 invocations, one element of one token's K and V row each.
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(num_tokens * kv_dim / 256).

struct KvWriteParams {
    num_tokens: u32,
    kv_dim: u32,
    cache_offset: u32,
    num_slots: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: KvWriteParams;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> slots: array<u32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.num_tokens * params.kv_dim) {
        return;
    }
    let t = i / params.kv_dim;
    let slot = slots[t];
    if (slot >= params.num_slots) {
        return;
    }
    let dst = params.cache_offset + slot * params.kv_dim + i % params.kv_dim;
    k_cache[dst] = k[i];
    v_cache[dst] = v[i];
}
