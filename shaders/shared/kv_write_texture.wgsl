// SPDX-License-Identifier: Apache-2.0
// KV destination for writing on CPU drivers: write-only rgba32float (or rgba16float: KV_FORMAT)
// storage textures (core WebGPU), laid out as shared/kv_read_texture.wgsl reads them.
@group(0) @binding(5) var k_tex: texture_storage_2d<{{KV_FORMAT}}, write>;
@group(0) @binding(6) var v_tex: texture_storage_2d<{{KV_FORMAT}}, write>;

fn kv_store(i: u32, k: vec4<f32>, v: vec4<f32>) {
    let at = vec2<u32>(i & 8191u, i >> 13u);
    textureStore(k_tex, at, k);
    textureStore(v_tex, at, v);
}
