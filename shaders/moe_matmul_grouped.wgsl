// SPDX-License-Identifier: Apache-2.0
// moe_matmul_grouped: the experts' projections of a mixture-of-experts layer, by tiles of rows
// that chose the same expert (moe_group's table): what moe_matmul computes row by row, with
// each weight block read and decoded once for up to TM rows. For each row r of a tile of
// expert e, y[r, :] = x[r / x_div, :] · W[e]ᵀ, W the stacked experts of one projection in any
// weight format (formats/*.wgsl); or, with a gated epilogue, y[r, c] = act(x · W[e][c]ᵀ) ·
// (x · W[e][n + c]ᵀ) (shared/epilogue_*.wgsl). With params.has_bias = 1 each expert's bias is
// added to each of its G sums before the epilogue (gpt-oss). Every kernel family runs it.
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
//   4 tiles    storage, read  u32 (1 + tiles, 2 + TM)    moe_group's table: row 0 word 0 the
//                                                        number of tiles; row 1 + i: tile i's
//                                                        expert, row count c (1..TM), c rows
//   5 bias     storage, read  f32 (num_experts, G · n)   each expert's bias, in its weight
//                                                        rows' order; unused (any buffer)
//                                                        when has_bias is 0
// G (1, or 2 with a gated epilogue) weight rows per output column: row c, and row n + c.
// Tile constants (text-substituted when the variant is composed): WG invocations, TN output
//   columns per invocation, TM = gpu::kernels::moe::TILE_ROWS rows per tile.
// Workgroup: WG invocations; workgroup (gx, gy) takes tile gy (leaving at once when there are
//   fewer tiles, or when its expert is not in this part), invocation i its columns
//   gx*WG*TN + j*WG + i (j < TN) for the tile's c rows. Per 32-element block it decodes its
//   G·TN weight blocks once (w_block_at), then for each of the c rows loads the row's x block
//   (workgroup-uniform loads) and folds it into the row's G·TN sums; rows past c are branched
//   around (the branch is the same for the whole workgroup). Columns past n are clamped
//   (computed and discarded).
// Grid: (ceil(n / (WG*TN)), gpu::kernels::moe::max_tiles(rows, experts), 1).
// Requires k % 32 == 0.
// Batch invariance: y[r, c] = fold over blocks b = 0, 1, ... of block_acc(acc, dm_b,
//   block_dot(q_b, x_b), sum(x_b)) from zero (shared/block_recipe.wgsl), then the bias: the
//   operations of moe_matmul, in its order, whichever rows share r's tile and slot.

#include shared/block_recipe.wgsl
#include shared/x_storage.wgsl
#include shared/x_block.wgsl
#include weight_source
#include weight_format
#include epilogue
#include shared/moe_matmul_io.wgsl

@group(0) @binding(4) var<storage, read> tiles: array<u32>;

const WG: u32 = {{WG}}u;
const TN: u32 = {{TN}}u;
const TM: u32 = {{TM}}u;
const G: u32 = {{G}}u;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let at = (wid.y + 1u) * (2u + TM);
    if (wid.y >= tiles[0]) {
        return;
    }
    let e = tiles[at];
    if (e < params.first_expert || e - params.first_expert >= params.part_experts) {
        return;
    }
    let count = tiles[at + 1u];
    let nb = params.k / 32u;
    let col0 = wid.x * (WG * TN) + lid.x;
    let expert_row0 = (e - params.first_expert) * G * params.n;
#for j in 0..TN
    let col_{{j}} = min(col0 + {{j}}u * WG, params.n - 1u);
#for g in 0..G
    let rowb_{{g}}_{{j}} = params.w_base + w_row_byte(expert_row0 + {{g}}u * params.n + col_{{j}}, params.row_bytes);
#end
#end
    // Each slot's row (slots past count repeat the last row; they are never summed).
#for r in 0..TM
    let row_{{r}} = tiles[at + 2u + min({{r}}u, count - 1u)];
#end
#for g in 0..G
#for r in 0..TM
#for j in 0..TN
    var acc_{{g}}_{{r}}_{{j}} = 0.0;
#end
#end
#end
    for (var b = 0u; b < nb; b++) {
#for g in 0..G
#for j in 0..TN
        let blk_{{g}}_{{j}} = w_block_at(rowb_{{g}}_{{j}}, b);
#end
#end
#for r in 0..TM
        if (count > {{r}}u) {
            let xb = x_block(row_{{r}} / params.x_div, b);
            let sx = block_sum(xb);
#for g in 0..G
#for j in 0..TN
            acc_{{g}}_{{r}}_{{j}} = block_acc(acc_{{g}}_{{r}}_{{j}}, blk_{{g}}_{{j}}.dm, block_dot(blk_{{g}}_{{j}}.q, xb), sx);
#end
#end
        }
#end
    }
#for r in 0..TM
    if (count > {{r}}u) {
#for j in 0..TN
        if (col0 + {{j}}u * WG < params.n) {
            if (params.has_bias == 1u) {
#for g in 0..G
                acc_{{g}}_{{r}}_{{j}} += bias[(e * G + {{g}}u) * params.n + col_{{j}}];
#end
            }
            y[row_{{r}} * params.n + col_{{j}}] = epilogue(acc_0_{{r}}_{{j}}, acc_{{LAST}}_{{r}}_{{j}});
        }
#end
    }
#end
}
