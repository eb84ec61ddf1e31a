// SPDX-License-Identifier: Apache-2.0
// matmul_subgroup: y = x · Wᵀ on GPUs with subgroups (the `subgroup` kernel family), for every
// M and every weight of a model, so that a tensor's sums never depend on its batch. Row
// parallel: the lanes of one subgroup share a weight row, lane s decoding blocks s, s + L,
// s + 2L, … (L lanes) so that neighbouring lanes read neighbouring blocks of the same row
// (coalesced, where matmul.wgsl's lanes each walk a row of their own), and each decoded block
// serves TM rows of x; subgroupAdd joins the lanes' sums. With a gated epilogue,
// y[:, c] = act(x · W[c]ᵀ) · (x · W[n_part + c]ᵀ) (an MLP's gate and up projections and its
// SwiGLU/GeGLU, shared/epilogue_*.wgsl).
// Two tiles of one kernel: the GEMV of decode and small batches (TN = 8, TM = 1 or 4, CN = 1),
// and from the plan's gemm_min_rows rows the register-blocked GEMM (TN = 16, TM = 16): each lane
// holds CN columns' decoded blocks at once and applies them to 16 rows of x, so a weight block
// is read and decoded once per 16 rows instead of 4, and each x block loaded once per CN columns.
//
// Bindings (group 0)
//   0 params  uniform        Params                  mirrors gpu::kernels::matmul::Params
//   1 x       storage, read  f32 (m, k)
//   2 w       storage, read  raw bytes of one part   the part starts w_base bytes into it
//   3 y       read_write     f32 (y_row0 + m, n_total)  columns n_offset .. n_offset + n_part
// Tile constants: WG = 64 invocations; TN output columns per workgroup (8, 16 for the GEMM); TM
//   rows of x (1 for m <= 2, 4 below gemm_min_rows, 16 from it); G weight rows per output column
//   (1, or 2 with a gated epilogue: rows c and n_part + c); CN = max(1, TM / (8·G)) columns a
//   subgroup folds side by side (1 for the GEMV; 2, or 1 gated, for the GEMM: its decoded blocks,
//   G·CN of them, and TM·G·CN sums are what each lane holds).
// Workgroup: WG invocations in subgroups of S lanes (consecutive local invocation indices, as
//   every Vulkan, Metal and D3D12 driver forms them); L = min(S, WG) lanes take part in each
//   sum. Subgroup g (of max(1, WG / S)) computes C = max(1, TN · L / WG) of the workgroup's TN
//   columns, CN at a time (columns of a pass past its C are computed and discarded), for the TM
//   rows gy*TM + r. Requires S >= WG / TN = 8.
// Grid: (ceil(n_part / TN), ceil(m / TM), 1).
// Requires k % 32 == 0.
// Batch invariance: lane s folds its blocks in increasing order with shared/block_recipe.wgsl
//   and subgroupAdd joins the L lanes in the device's fixed order: the result depends on k and
//   the device's subgroup size, not on m, the row's slot or the tile (TM, TN and CN choose which
//   outputs a lane folds side by side, never the order of any output's sum): the GEMM's bits are
//   the GEMV's (tests/kernels compare them). Rows past m and n_part are clamped (computed and
//   discarded), so control flow stays uniform for subgroupAdd.
//   (Why not matmul_tiled.wgsl's workgroup-memory tiles: they fold each output's blocks in one
//   chain, an order the GEMV's L-way split cannot give without joining lanes serially; staging
//   the GEMV's order instead takes L blocks of every tile row and column at once, (BM + BN)·L
//   ·128 bytes, 128 KiB for 32 x 32 at L = 32, past every GPU's workgroup memory.)

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
const CN: u32 = max(1u, TM / (8u * G));

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
    // Columns per subgroup: TN shared among the WG / S subgroups (one takes all when S >= WG).
    let cols = max(1u, TN * lanes / WG);
    let sg = lid / lanes;
    for (var i = 0u; i < cols; i += CN) {
        let col = wid.x * TN + sg * cols + i;
        // Accumulators are indexed (c * G + g) * TM + r.
        var acc = array<f32, CN * G * TM>();
        for (var b = lane; b < nb; b += lanes) {
            fold_block(&acc, col, m0, b);
        }
        for (var c = 0u; c < CN; c++) {
            for (var r = 0u; r < TM; r++) {
                let first = subgroupAdd(acc[c * G * TM + r]);
                var last = first;
                if (G > 1u) {
                    last = subgroupAdd(acc[(c * G + 1u) * TM + r]);
                }
                if (lane == 0u && i + c < cols && col + c < params.n_part && m0 + r < params.m) {
                    y[(params.y_row0 + m0 + r) * params.n_total + params.n_offset + col + c] = epilogue(first, last);
                }
            }
        }
    }
}
