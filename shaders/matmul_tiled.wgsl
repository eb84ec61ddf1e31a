// SPDX-License-Identifier: Apache-2.0
// matmul_tiled: y = x · Wᵀ for prefill and large batches on GPUs (the baseline family from
// TILED_MIN_ROWS rows): a workgroup computes a 32 x 32 tile of y, staging each 32-element block
// of its 32 x rows and of its 32 decoded weight rows in workgroup memory, so every weight block
// is read and decoded once per 32 rows of x instead of once per 4.
//
// Bindings (group 0)
//   0 params  uniform        Params                  mirrors gpu::kernels::matmul::Params
//   1 x       storage, read  f32 (m, k)
//   2 w       storage, read  raw bytes of one part   the part starts w_base bytes into it
//   3 y       read_write     f32 (y_row0 + m, n_total)  columns n_offset .. n_offset + n_part
// Tile: BM = 32 rows of x by BN = 32 weight rows (output columns); WG = 64 invocations as 8 x 8.
// Workgroup memory: per block, the tile's x blocks (32 x 8 vec4), decoded weight codes
//   (32 x 8 vec4), their (d, m) and the x blocks' sums: 8.4 KiB. Two barriers per block.
// Workgroup: invocation (tx, ty) = (lid % 8, lid / 8) computes the 4 x 4 outputs in rows
//   wid.y*32 + ty + 8i and columns wid.x*32 + tx + 8j (i, j < 4). Per block, invocations 0..31
//   decode one weight row's block each, 32..63 sum one x row's block each, and all load x.
//   Every CHUNK_BLOCKS blocks (and after the last) it adds its chunk sums to its totals.
// Grid: (ceil(n_part / 32), ceil(m / 32), 1).
// Requires k % 32 == 0.
// Batch invariance: each output is the in-order sum of its chunks, each chunk's blocks folded
//   from zero with block_dot and block_acc of shared/block_recipe.wgsl, exactly as
//   matmul_rows.wgsl sums (the tests compare their bits); rows past m and columns past n_part
//   are clamped (computed and discarded), never branched around a barrier.

#include shared/block_recipe.wgsl
#include shared/matmul_io.wgsl
#include weight_source
#include x_source
#include weight_format

const WG: u32 = 64u;
const BM: u32 = 32u;
const BN: u32 = 32u;

var<workgroup> xs: array<vec4<f32>, 256>;  // (BM, 8): the tile's x blocks
var<workgroup> qs: array<vec4<f32>, 256>;  // (BN, 8): the tile's decoded weight codes
var<workgroup> dms: array<vec2<f32>, 32>;  // (BN): their (d, m)
var<workgroup> sxs: array<f32, 32>;        // (BM): sum of each x block

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let k4 = params.k / 4u;
    let nb = params.k / 32u;
    let tx = lid % 8u;
    let ty = lid / 8u;
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    // The x row and weight row this invocation stages (clamped).
    let stage = lid % 32u;
    let x_row = min(row0 + stage, params.m - 1u) * k4;
    let w_row = params.w_base + w_row_byte(min(col0 + stage, params.n_part - 1u), params.row_bytes);
    var acc = array<f32, 16>();
    var total = array<f32, 16>();
    for (var b = 0u; b < nb; b++) {
        // Every invocation loads 4 of the tile's 256 x vec4s: row lid / 2, half lid % 2.
        for (var v = 0u; v < 4u; v++) {
            let e = 4u * (lid % 2u) + v;
            let r = lid / 2u;
            xs[r * 8u + e] = xload(min(row0 + r, params.m - 1u) * k4 + b * 8u + e);
        }
        if (lid < 32u) {
            let blk = w_block_at(w_row, b);
            dms[stage] = blk.dm;
            for (var v = 0u; v < 8u; v++) {
                qs[stage * 8u + v] = blk.q[v];
            }
        } else {
            var xb = array<vec4<f32>, 8>();
            for (var v = 0u; v < 8u; v++) {
                xb[v] = xload(x_row + b * 8u + v);
            }
            sxs[stage] = block_sum(xb);
        }
        workgroupBarrier();
        for (var i = 0u; i < 4u; i++) {
            let r = ty + 8u * i;
            var xb = array<vec4<f32>, 8>();
            for (var v = 0u; v < 8u; v++) {
                xb[v] = xs[r * 8u + v];
            }
            let sx = sxs[r];
            for (var j = 0u; j < 4u; j++) {
                let c = tx + 8u * j;
                var q = array<vec4<f32>, 8>();
                for (var v = 0u; v < 8u; v++) {
                    q[v] = qs[c * 8u + v];
                }
                acc[i * 4u + j] = block_acc(acc[i * 4u + j], dms[c], block_dot(q, xb), sx);
            }
        }
        workgroupBarrier();
        if ((b + 1u) % CHUNK_BLOCKS == 0u || b + 1u == nb) {
            for (var i = 0u; i < 16u; i++) {
                total[i] = total[i] + acc[i];
                acc[i] = 0.0;
            }
        }
    }
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            let row = row0 + ty + 8u * i;
            let col = col0 + tx + 8u * j;
            if (row < params.m && col < params.n_part) {
                y[(params.y_row0 + row) * params.n_total + params.n_offset + col] = total[i * 4u + j];
            }
        }
    }
}
