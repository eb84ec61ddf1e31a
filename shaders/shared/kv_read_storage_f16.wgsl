// SPDX-License-Identifier: Apache-2.0
// KV source for reading an f16 cache (GPUs, the portable baseline): the layer's K and V caches
// as storage buffers of 4 halves per vec2<u32>, (slot, kv_head, head_dim / 4) row-major, widened
// with unpack2x16float (core WGSL: no shader-f16 needed).
@group(0) @binding(2) var<storage, read> k_cache: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec2<u32>>;

fn kload(i: u32) -> vec4<f32> {
    let h = k_cache[i];
    return vec4<f32>(unpack2x16float(h.x), unpack2x16float(h.y));
}

fn vload(i: u32) -> vec4<f32> {
    let h = v_cache[i];
    return vec4<f32>(unpack2x16float(h.x), unpack2x16float(h.y));
}
