// SPDX-License-Identifier: Apache-2.0
// head_rms_norm: RMSNorm of every query and key head of a fused qkv row, in place, before RoPE
// (Qwen3's and Gemma 3's q_norm / k_norm): for token t and head h < num_heads + num_kv_heads,
// x[t, h·hd .. (h+1)·hd] = x / sqrt(mean(x²) + eps) * weight, with q_weight for the query heads
// and k_weight for the key heads. The value heads after them are left alone.
//
// Bindings (group 0)
//   0 params    uniform     Params    mirrors gpu::kernels::reduce::HeadNormParams
//   1 q_weight  read        f32 (head_dim)
//   2 k_weight  read        f32 (head_dim)
//   3 x         read_write  f32 (num_tokens, row_stride): the qkv rows
// Workgroup: 64 invocations per (head, token), reducing as rms_norm.wgsl does
// (shared/row_norm.wgsl): each invocation reads and writes only its own strided elements.
// Grid: (num_heads + num_kv_heads, num_tokens, 1).

struct Params {
    num_heads: u32,
    n: u32,
    row_stride: u32,
    eps: f32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_weight: array<f32>;
@group(0) @binding(2) var<storage, read> k_weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;

#include shared/row_norm.wgsl

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let head = wid.x;
    let base = wid.y * params.row_stride + head * params.n;
    var s = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let v = x[base + i];
        s += v * v;
    }
    let scale = norm_scale(lid, s);
    let is_q = head < params.num_heads;
    for (var i = lid; i < params.n; i += WG) {
        x[base + i] = x[base + i] * scale * select(k_weight[i], q_weight[i], is_q);
    }
}
