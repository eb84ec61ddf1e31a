// SPDX-License-Identifier: Apache-2.0
// What both experts' matmuls (moe_matmul.wgsl row by row, moe_matmul_grouped.wgsl by tiles)
// bind besides their weight source, x and the rows they take: the parameters (mirrors
// gpu::kernels::moe::MatmulParams), y (rows, n) and each expert's bias (num_experts, G · n).
struct Params {
    rows: u32,
    k: u32,
    n: u32,
    x_div: u32,
    row_bytes: u32,
    first_expert: u32,
    part_experts: u32,
    w_base: u32,
    has_bias: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read> bias: array<f32>;
