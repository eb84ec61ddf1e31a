// SPDX-License-Identifier: Apache-2.0
// matmul_subgroup: y = x · Wᵀ on GPUs with subgroups (the `subgroup` kernel family), for every
// M and every weight of a model, so that a tensor's sums never depend on its batch. Row
// parallel: the lanes of one subgroup share a weight row, lane s decoding blocks s, s + L,
// s + 2L, … (L lanes) so that neighbouring lanes read neighbouring blocks of the same row
// (coalesced, where matmul.wgsl's lanes each walk a row of their own), and each decoded block
// serves TM rows of x; subgroupAdd joins the lanes' sums. With a gated epilogue,
// y[:, c] = act(x · W[c]ᵀ) · (x · W[n_part + c]ᵀ) (an MLP's gate and up projections and its
// SwiGLU/GeGLU, shared/epilogue_*.wgsl).
//
// Bindings (group 0)
//   0 params  uniform        Params                  mirrors gpu::kernels::matmul::Params
//   1 x       storage, read  f32 (m, k)
//   2 w       storage, read  raw bytes of one part   the part starts w_base bytes into it
//   3 y       read_write     f32 (y_row0 + m, n_total)  columns n_offset .. n_offset + n_part
// Tile constants: WG = 64 invocations; TN = 8 output columns per workgroup; TM rows of x (1
//   for m <= 2, else 4); G weight rows per output column (1, or 2 with a gated epilogue: rows c
//   and n_part + c).
// Workgroup: WG invocations in subgroups of S lanes (consecutive local invocation indices, as
//   every Vulkan, Metal and D3D12 driver forms them); L = min(S, WG) lanes take part in each
//   sum. Subgroup g (of max(1, WG / S)) computes max(1, TN · L / WG) of the workgroup's TN
//   columns for the TM rows gy*TM + r. Requires S >= WG / TN = 8.
// Grid: (ceil(n_part / TN), ceil(m / TM), 1).
// Requires k % 32 == 0.
// Batch invariance: lane s folds its blocks in increasing order with shared/block_recipe.wgsl
//   and subgroupAdd joins the L lanes in the device's fixed order: the result depends on k and
//   the device's subgroup size, not on m, the row's slot or the tile. Rows past m and n_part are
//   clamped (computed and discarded), so control flow stays uniform for subgroupAdd.

#include shared/block_recipe.wgsl
#include shared/matmul_io.wgsl
#include weight_source
#include x_source
#include weight_format
#include epilogue
#include shared/block_fold.wgsl

const WG: u32 = {{WG}}u;
const TN: u32 = {{TN}}u;
const TM: u32 = {{TM}}u;
const G: u32 = {{G}}u;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_size) sg_size: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let nb = params.k / 32u;
    let m0 = wid.y * TM;
    let lanes = min(sg_size, WG);
    // Weight rows per subgroup: TN shared among the WG / S subgroups (one takes all when S >= WG).
    let rows_per_sg = max(1u, TN * lanes / WG);
    let sg = lid / lanes;
    for (var i = 0u; i < rows_per_sg; i++) {
        let col = wid.x * TN + sg * rows_per_sg + i;
        // Accumulators are indexed g * TM + r.
        var acc = array<f32, G * TM>();
        for (var b = lane; b < nb; b += lanes) {
            fold_block(&acc, col, m0, b);
        }
        for (var r = 0u; r < TM; r++) {
            let first = subgroupAdd(acc[r]);
            var last = first;
            if (G > 1u) {
                last = subgroupAdd(acc[TM + r]);
            }
            if (lane == 0u && col < params.n_part && m0 + r < params.m) {
                y[(params.y_row0 + m0 + r) * params.n_total + params.n_offset + col] = epilogue(first, last);
            }
        }
    }
}
