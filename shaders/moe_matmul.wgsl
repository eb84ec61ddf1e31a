// SPDX-License-Identifier: Apache-2.0
// moe_matmul: the experts' projections of a mixture-of-experts layer (ggml's mul_mat_id): for
// each (token, slot) row r, y[r, :] = x[r / x_div, :] · W[e]ᵀ with e = ids[r], the slot's expert,
// W the stacked experts of one projection in any weight format (formats/*.wgsl); or, with a
// gated epilogue, y[r, c] = act(x · W[e][c]ᵀ) · (x · W[e][n + c]ᵀ): an expert's gate and up
// projections and its SwiGLU in one pass (shared/epilogue_*.wgsl). With params.has_bias = 1 each
// expert's bias is added to each of its G sums before the epilogue (gpt-oss). Every kernel
// family runs it.
//
// Bindings (group 0)
//   0 params   uniform        Params                     mirrors gpu::kernels::moe::MatmulParams
//                                                        (shared/moe_matmul_io.wgsl)
//   1 x        storage, read  f32 (rows / x_div, k)      x_div = top_k: a token's row serves
//                                                        each of its slots (gate and up);
//                                                        1: each slot has its own row (down)
//   2 w        weight_source  raw bytes of one part      experts first_expert ..
//                                                        first_expert + part_experts, expert
//                                                        e's G·n rows at (e - first_expert)·G·n,
//                                                        the part starting w_base bytes in
//   3 y        read_write     f32 (rows, n)
//   4 ids      storage, read  u32 (rows)                 each row's expert
//   5 bias     storage, read  f32 (num_experts, G · n)   each expert's bias, in its weight
//                                                        rows' order; unused (any buffer)
//                                                        when has_bias is 0
// G (1, or 2 with a gated epilogue) weight rows per output column: row c, and row n + c.
// Workgroup: 64 invocations; invocation i of workgroup (gx, gy, gz) computes column gx*64 + i
//   of row gy + gz * (workgroups in y). A row whose expert this part does not hold is left
//   for the dispatch of the part that does (one dispatch per part, each whole experts).
// Grid: (ceil(n / 64), min(rows, 65535), ceil(rows / 65535)).
// Requires k % 32 == 0.
// Batch invariance: y[r, c] = fold over blocks b = 0, 1, ... of block_acc(acc, dm_b,
//   block_dot(q_b, x_b), sum(x_b)) from zero (shared/block_recipe.wgsl): an order that depends
//   on k alone, not on the rows beside r nor which experts they chose.

#include shared/block_recipe.wgsl
#include shared/x_storage.wgsl
#include shared/x_block.wgsl
#include weight_source
#include weight_format
#include epilogue
#include shared/moe_matmul_io.wgsl

@group(0) @binding(4) var<storage, read> ids: array<u32>;

const WG: u32 = 64u;
const G: u32 = {{G}}u;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.y + wid.z * nwg.y;
    let col = wid.x * WG + lid.x;
    if (row >= params.rows || col >= params.n) {
        return;
    }
    let e = ids[row];
    if (e < params.first_expert || e - params.first_expert >= params.part_experts) {
        return;
    }
    let expert_row0 = (e - params.first_expert) * G * params.n;
#for g in 0..G
    let rowb_{{g}} = params.w_base + w_row_byte(expert_row0 + {{g}}u * params.n + col, params.row_bytes);
    var acc_{{g}} = 0.0;
#end
    let x_row = row / params.x_div;
    for (var b = 0u; b < params.k / 32u; b++) {
        let xb = x_block(x_row, b);
        let sx = block_sum(xb);
#for g in 0..G
        {
            let blk = w_block_at(rowb_{{g}}, b);
            acc_{{g}} = block_acc(acc_{{g}}, blk.dm, block_dot(blk.q, xb), sx);
        }
#end
    }
    if (params.has_bias == 1u) {
#for g in 0..G
        acc_{{g}} += bias[(e * G + {{g}}u) * params.n + col];
#end
    }
    y[row * params.n + col] = epilogue(acc_0, acc_{{LAST}});
}
