// SPDX-License-Identifier: Apache-2.0
// matmul_bsplit: y = x · Wᵀ for very tall weights read once per step (the LM head, e.g.
// 49152 x 576) on CPU drivers: the 8 lanes of a workgroup read 8 consecutive blocks of the SAME
// weight row, i.e. contiguous memory, instead of 8 different rows. A tensor uses it at EVERY m:
// its sums differ from matmul.wgsl's in the last bits, so switching with m would make a row's
// result depend on its batch.
//
// Bindings (group 0)
//   0 params  uniform        Params                  mirrors gpu::kernels::matmul::Params
//   1 x       x_source       f32 (m, k)              as matmul.wgsl
//   2 w       weight_source  raw bytes of one part   as matmul.wgsl
//   3 y       read_write     f32 (y_row0 + m, n_total)
// Tile constants: TN weight rows (output columns) per workgroup, TM rows of x (lavapipe: TN =
//   32, TM = 1 for m <= 2; TN = 16 and TM = 4 below m = 8, TM = 8 from there; WG is unused and
//   fixed at 8).
// Workgroup: 8 invocations; lane g owns blocks b = g, g + 8, g + 16, ... of the TN weight rows
//   wid.x*TN .. + TN and the TM rows wid.y*TM .. + TM. Workgroup memory: 8 * TN * TM floats
//   (<= 1024 here, 4 KiB). One barrier.
// Grid: (ceil(n_part / TN), ceil(m / TM), 1) (one dispatch per uniform x window as in cols).
// Requires k % 32 == 0.
// Batch invariance: for each output, partial p_g = fold over its blocks b = g mod 8 in
//   increasing b of block_acc (shared/block_recipe.wgsl), then y = ((p0 + p1) + p2) + ... + p7
//   in lane order through workgroup memory. The order depends only on k, not on m, the tile or
//   the row's slot.

#include shared/block_recipe.wgsl
#include shared/matmul_io.wgsl
#include weight_source
#include x_source
#include weight_format

const TN: u32 = {{TN}}u;
const TM: u32 = {{TM}}u;

var<workgroup> part: array<f32, 8u * TN * TM>;

@compute @workgroup_size(8)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let g = lid.x;
    let k4 = params.k / 4u;
    let nb = params.k / 32u;
    let m0 = wid.y * TM;
    var rowb: array<u32, TN>;
    for (var j = 0u; j < TN; j++) {
        rowb[j] = params.w_base + min(wid.x * TN + j, params.n_part - 1u) * params.row_bytes;
    }
    var xrow: array<u32, TM>;
    for (var r = 0u; r < TM; r++) {
        xrow[r] = min(m0 + r, params.m - 1u) * k4;
    }
    var acc: array<f32, TM * TN>;
    for (var i = 0u; i < TM * TN; i++) {
        acc[i] = 0.0;
    }
    var xb: array<array<vec4<f32>, 8>, TM>;
    var sx: array<f32, TM>;
    for (var b = g; b < nb; b += 8u) {
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
    for (var i = 0u; i < TM * TN; i++) {
        part[i * 8u + g] = acc[i];
    }
    workgroupBarrier();
    var t = 0.0;
    for (var i = g; i < TM * TN; i += 8u) {
        t = part[i * 8u];
        for (var h = 1u; h < 8u; h++) {
            t = t + part[i * 8u + h];
        }
        let r = i / TN;
        let col = wid.x * TN + (i % TN);
        if (col < params.n_part && m0 + r < params.m) {
            y[(params.y_row0 + m0 + r) * params.n_total + params.n_offset + col] = t;
        }
    }
}
