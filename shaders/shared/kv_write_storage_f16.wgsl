// SPDX-License-Identifier: Apache-2.0
// KV destination for writing an f16 cache (GPUs, the portable baseline): storage buffers of 4
// halves per vec2<u32>, laid out as shared/kv_read_storage_f16.wgsl reads them; narrowed with
// pack2x16float.
@group(0) @binding(5) var<storage, read_write> k_cache: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<vec2<u32>>;

fn kv_store(i: u32, k: vec4<f32>, v: vec4<f32>) {
    k_cache[i] = vec2<u32>(pack2x16float(k.xy), pack2x16float(k.zw));
    v_cache[i] = vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw));
}
