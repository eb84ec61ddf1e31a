// SPDX-License-Identifier: Apache-2.0
// matmul_rows: y = x · Wᵀ in the baseline family (GPUs without usable subgroups, and every
// browser on a GPU: wgpu's web backend requests none) below TILED_MIN_ROWS rows of x: decode
// and small batches. Row parallel: 8 lanes share each weight row, so a decode step keeps 8
// invocations busy per output (one per output leaves a 576-column projection a few hundred
// invocations on a GPU built for tens of thousands), and neighbouring lanes read neighbouring
// chunks of the row. With a gated epilogue, y[:, c] = act(x · W[c]ᵀ) · (x · W[n_part + c]ᵀ)
// (an MLP's gate and up projections and its SwiGLU/GeGLU, shared/epilogue_*.wgsl).
//
// Bindings (group 0)
//   0 params  uniform        Params                  mirrors gpu::kernels::matmul::Params
//   1 x       storage, read  f32 (m, k)
//   2 w       storage, read  raw bytes of one part   the part starts w_base bytes into it
//   3 y       read_write     f32 (y_row0 + m, n_total)  columns n_offset .. n_offset + n_part
// Tile constants: WG = 64 invocations; TN = 8 output columns per workgroup, so WG / TN = 8
//   lanes per column; TM rows of x (1 for m <= 2, else 4); G weight rows per output column (1,
//   or 2 with a gated epilogue: rows c and n_part + c).
// Workgroup memory: each invocation's chunk sums, G x WG x TM f32 (2 KiB at most).
// Workgroup: invocation lid is lane s = lid % 8 of column wid.x * TN + lid / 8. A weight row's
//   blocks form chunks of CHUNK_BLOCKS (shared/block_recipe.wgsl); in round t lane s folds
//   chunk 8t + s of the column's G rows for its TM rows of x, and lane 0 then adds the round's
//   chunk sums to its totals in chunk order and finally writes epilogue(totals).
//   Two barriers a round, ceil(k / (8 · 32 · CHUNK_BLOCKS)) rounds.
// Grid: (ceil(n_part / TN), ceil(m / TM), 1).
// Requires k % 32 == 0.
// Batch invariance: y = ((c_0 + c_1) + c_2) + ..., c_i the fold of chunk i's blocks from zero
//   with block_acc: the order matmul_tiled.wgsl sums in, so the switch to it at
//   TILED_MIN_ROWS changes no bits, and an order that depends on k alone. Rows past m and
//   n_part are clamped (computed and discarded), so every invocation reaches every barrier.

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
// Output columns fold_block (shared/block_fold.wgsl) folds at once: one per 8 lanes here.
const CN: u32 = 1u;
const LANES: u32 = WG / TN;

var<workgroup> chunk_sums: array<f32, G * WG * TM>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let nb = params.k / 32u;
    let chunks = (nb + CHUNK_BLOCKS - 1u) / CHUNK_BLOCKS;
    let lane = lid % LANES;
    let col = wid.x * TN + lid / LANES;
    let m0 = wid.y * TM;
    // Accumulators and sums are indexed g * TM + r.
    var total = array<f32, G * TM>();
    for (var round = 0u; round < chunks; round += LANES) {
        var acc = array<f32, G * TM>();
        let first = (round + lane) * CHUNK_BLOCKS;
        for (var b = first; b < min(first + CHUNK_BLOCKS, nb); b++) {
            fold_block(&acc, col, m0, b);
        }
        for (var i = 0u; i < G * TM; i++) {
            chunk_sums[(i / TM * WG + lid) * TM + i % TM] = acc[i];
        }
        workgroupBarrier();
        if (lane == 0u) {
            for (var j = 0u; j < min(LANES, chunks - round); j++) {
                for (var i = 0u; i < G * TM; i++) {
                    total[i] = total[i] + chunk_sums[(i / TM * WG + lid + j) * TM + i % TM];
                }
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u && col < params.n_part) {
        for (var r = 0u; r < TM; r++) {
            if (m0 + r < params.m) {
                y[(params.y_row0 + m0 + r) * params.n_total + params.n_offset + col] = epilogue(total[r], total[(G - 1u) * TM + r]);
            }
        }
    }
}
