// SPDX-License-Identifier: Apache-2.0
// matmul: y = x · Wᵀ on CPU drivers (the `cpu` kernel family), f32 activations times weights
// in any format (formats/*.wgsl), every M;
// or, with a gated epilogue, y[:, c] = act(x · W[c]ᵀ) · (x · W[n_part + c]ᵀ): an MLP's gate and
// up projections and its SwiGLU/GeGLU in one pass (shared/epilogue_*.wgsl).
//
// Bindings (group 0)
//   0 params  uniform     Params                     mirrors gpu::kernels::matmul::Params
//   1 x       x_source    f32 (m, k)                 storage buffer, or (CPU drivers) a 64 KiB
//                                                    uniform window of whole rows
//   2 w       weight_source  raw bytes of one part   storage buffer, or (CPU drivers) an
//                                                    rgba32uint texture holding the same bytes,
//                                                    the part starting w_base bytes into it
//   3 y       read_write  f32 (y_row0 + m, n_total)  columns n_offset .. n_offset + n_part
// G (1, or 2 with a gated epilogue) weight rows per output column: row c, and row n_part + c.
// Tile constants (text-substituted when the variant is composed):
//   WG  invocations per workgroup (one SIMD group of llvmpipe: 8 lanes, 16 with 512-bit vectors)
//   TN  output columns per invocation     TM  rows of x per invocation (1, 4 or 8 by m)
// The tile is unrolled when the variant is composed (`#for`): every accumulator, x block and
// row offset is its own variable, never a private array indexed in a loop. CPU drivers turn
// such arrays into per-lane gathers and scatters (lavapipe: 1.1-1.15x the GFLOP/s of the loop
// form at m = 1 and 16, the same bits).
// Workgroup: WG invocations; invocation i of workgroup (gx, gy) computes the TM x TN outputs in
//   rows gy*TM + r and columns gx*WG*TN + j*WG + i (r < TM, j < TN). Per 32-element block it
//   loads the TM x-blocks once (workgroup-uniform loads), decodes each of its G·TN weight
//   blocks once (w_block_at) and applies each to all TM rows; it writes epilogue(acc_0, acc_G-1).
// Grid: (ceil(n_part / (WG*TN)), ceil(m / TM), 1); with a uniform x window, one dispatch per
//   window of rows (params.m = rows in it, params.y_row0 = its first row).
// Requires k % 32 == 0.
// Batch invariance: y[i, c] = fold over blocks b = 0, 1, ... of block_acc(acc, dm_b,
//   block_dot(q_b, x_b), sum(x_b)) with the fixed fma/add tree of shared/block_recipe.wgsl. That
//   order depends only on k: not on m, the tile, which slot row i lands in, nor the weight or x
//   source. Rows past m are clamped (computed and discarded), never branched on.

#include shared/block_recipe.wgsl
#include shared/matmul_io.wgsl
#include weight_source
#include x_source
#include weight_format
#include epilogue

const WG: u32 = {{WG}}u;
const TN: u32 = {{TN}}u;
const TM: u32 = {{TM}}u;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let nb = params.k / 32u;
    let m0 = wid.y * TM;
    let col0 = wid.x * (WG * TN) + lid.x;
    // Byte offset of each owned weight row (clamped: out-of-range columns recompute the last).
#for g in 0..G
#for j in 0..TN
    let rowb_{{g}}_{{j}} = params.w_base + w_row_byte(min(col0 + {{j}}u * WG, params.n_part - 1u) + {{g}}u * params.n_part, params.row_bytes);
#end
#end
#for g in 0..G
#for r in 0..TM
#for j in 0..TN
    var acc_{{g}}_{{r}}_{{j}} = 0.0;
#end
#end
#end
    for (var b = 0u; b < nb; b++) {
#for r in 0..TM
        let xb_{{r}} = x_block(min(m0 + {{r}}u, params.m - 1u), b);
        let sx_{{r}} = block_sum(xb_{{r}});
#end
#for g in 0..G
#for j in 0..TN
        {
            let blk = w_block_at(rowb_{{g}}_{{j}}, b);
#for r in 0..TM
            acc_{{g}}_{{r}}_{{j}} = block_acc(acc_{{g}}_{{r}}_{{j}}, blk.dm, block_dot(blk.q, xb_{{r}}), sx_{{r}});
#end
        }
#end
#end
    }
#for r in 0..TM
    if (m0 + {{r}}u < params.m) {
        let y0 = (params.y_row0 + m0 + {{r}}u) * params.n_total + params.n_offset;
#for j in 0..TN
        if (col0 + {{j}}u * WG < params.n_part) {
            y[y0 + col0 + {{j}}u * WG] = epilogue(acc_0_{{r}}_{{j}}, acc_{{LAST}}_{{r}}_{{j}});
        }
#end
    }
#end
}
