// SPDX-License-Identifier: Apache-2.0
// matmul: y = x · Wᵀ, f32 activations times weights in any format (formats/*.wgsl), every M.
//
// Bindings (group 0)
//   0 params  uniform     Params                     mirrors gpu::kernels::matmul::Params
//   1 x       x_source    f32 (m, k)                 storage buffer, or (CPU drivers) a 64 KiB
//                                                    uniform window of whole rows
//   2 w       weight_source  raw bytes of one part   storage buffer, or (CPU drivers) an
//                                                    rgba32uint texture holding the same bytes,
//                                                    the part starting w_base bytes into it
//   3 y       read_write  f32 (y_row0 + m, n_total)  columns n_offset .. n_offset + n_part
// Tile constants (text-substituted when the variant is composed):
//   WG  invocations per workgroup (8 on CPU drivers: one SIMD group of llvmpipe)
//   TN  output columns per invocation     TM  rows of x per invocation (1 for m <= 2, else 4)
// Workgroup: WG invocations; invocation i of workgroup (gx, gy) computes the TM x TN outputs in
//   rows gy*TM + r and columns gx*WG*TN + j*WG + i (r < TM, j < TN). Per 32-element block it
//   loads the TM x-blocks once (workgroup-uniform loads), decodes each of its TN weight blocks
//   once (w_block_at) and applies each to all TM rows.
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

const WG: u32 = {{WG}}u;
const TN: u32 = {{TN}}u;
const TM: u32 = {{TM}}u;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let k4 = params.k / 4u;
    let nb = params.k / 32u;
    let m0 = wid.y * TM;
    // Byte offset of each owned weight row (clamped: out-of-range columns recompute the last).
    var rowb: array<u32, TN>;
    for (var j = 0u; j < TN; j++) {
        rowb[j] = params.w_base + min(wid.x * (WG * TN) + j * WG + lid.x, params.n_part - 1u) * params.row_bytes;
    }
    var xrow: array<u32, TM>;
    for (var r = 0u; r < TM; r++) {
        xrow[r] = min(m0 + r, params.m - 1u) * k4;
    }
    var acc: array<f32, TM * TN>;
    for (var i = 0u; i < TM * TN; i++) {
        acc[i] = 0.0;
    }
    // Fully rewritten every block before use (safe under naga's hoisting of locals).
    var xb: array<array<vec4<f32>, 8>, TM>;
    var sx: array<f32, TM>;
    for (var b = 0u; b < nb; b++) {
        for (var r = 0u; r < TM; r++) {
            for (var j = 0u; j < 8u; j++) {
                xb[r][j] = xload(xrow[r] + b * 8u + j);
            }
            sx[r] = block_sum(xb[r]);
        }
        for (var j = 0u; j < TN; j++) {
            let blk = w_block_at(rowb[j], b);
            for (var r = 0u; r < TM; r++) {
                acc[r * TN + j] = block_acc(acc[r * TN + j], blk.dm, block_dot(blk.q, xb[r]), sx[r]);
            }
        }
    }
    for (var r = 0u; r < TM; r++) {
        for (var j = 0u; j < TN; j++) {
            let col = wid.x * (WG * TN) + j * WG + lid.x;
            if (col < params.n_part && m0 + r < params.m) {
                y[(params.y_row0 + m0 + r) * params.n_total + params.n_offset + col] = acc[r * TN + j];
            }
        }
    }
}
