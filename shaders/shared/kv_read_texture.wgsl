// SPDX-License-Identifier: Apache-2.0
// KV source for reading on CPU drivers: the layer's K and V caches in rgba32float (or, for an
// f16 cache, rgba16float: KV_FORMAT) textures 8192 texels wide, vec4 i at texel
// (i % 8192, i / 8192), bound as read-only storage textures. An
// image load is one vector gather for 8 lanes on llvmpipe, where a storage load is a per-lane
// loop (and a sampled texture's fetch also looks up each lane's mip level).
@group(0) @binding(2) var k_tex: texture_storage_2d<{{KV_FORMAT}}, read>;
@group(0) @binding(3) var v_tex: texture_storage_2d<{{KV_FORMAT}}, read>;

fn kload(i: u32) -> vec4<f32> {
    return textureLoad(k_tex, vec2<u32>(i & 8191u, i >> 13u));
}

fn vload(i: u32) -> vec4<f32> {
    return textureLoad(v_tex, vec2<u32>(i & 8191u, i >> 13u));
}
