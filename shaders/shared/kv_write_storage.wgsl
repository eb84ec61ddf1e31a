// SPDX-License-Identifier: Apache-2.0
// KV destination for writing (GPUs, the portable baseline): storage buffers of vec4, laid out
// as shared/kv_read_storage.wgsl reads them.
@group(0) @binding(5) var<storage, read_write> k_cache: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<vec4<f32>>;

fn kv_store(i: u32, k: vec4<f32>, v: vec4<f32>) {
    k_cache[i] = k;
    v_cache[i] = v;
}
