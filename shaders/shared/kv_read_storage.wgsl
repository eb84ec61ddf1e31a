// SPDX-License-Identifier: Apache-2.0
// KV source for reading (GPUs, the portable baseline): the layer's K and V caches as storage
// buffers of vec4, (slot, kv_head, head_dim / 4) row-major.
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;

fn kload(i: u32) -> vec4<f32> {
    return k_cache[i];
}

fn vload(i: u32) -> vec4<f32> {
    return v_cache[i];
}
