// SPDX-License-Identifier: Apache-2.0
// matmul: y = x · Wᵀ, f32 activations times a weight matrix in any weight format.
//
// Bindings (group 0)
//   0 params  uniform     Params                   mirrors gpu::kernels::matmul::Params
//   1 x       read        f32 (m, k)               activations, row-major
//   2 w       read        u32 (n_part, row_bytes)  raw rows of one weight part, format in formats/
//   3 y       read_write  f32 (m, n_total)         columns n_offset .. n_offset + n_part written
// Workgroup: 64 invocations along n. One invocation computes one output column for TM rows of x:
// it walks k one weight block at a time, decodes the block once and dots it with each row.
// Grid: (ceil(n_part / 64), ceil(m / TM), 1).
// Batch invariance: y[i, j] = Σ_blocks (Σ_within-block w·x), summed in the same order whatever m
// is and whichever slot of a tile row i lands in; no reduction crosses invocations.

#include shared/weight_bytes.wgsl
#include weight_format

struct Params {
    m: u32,
    k: u32,
    n_part: u32,
    n_offset: u32,
    n_total: u32,
    row_bytes: u32,
}

const WG: u32 = 64u;
const TM: u32 = 4u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let col = gid.x;
    if (col >= params.n_part) {
        return;
    }
    let k = params.k;
    let m0 = wid.y * TM;
    let rows = min(TM, params.m - m0);
    let row_byte = col * params.row_bytes;
    var acc: array<f32, TM>;
    let num_blocks = (k + W_BLOCK - 1u) / W_BLOCK;
    for (var blk = 0u; blk < num_blocks; blk++) {
        let wv = w_block(row_byte, blk, k);
        let k0 = blk * W_BLOCK;
        let valid = min(W_BLOCK, k - k0);
        for (var r = 0u; r < rows; r++) {
            let xb = (m0 + r) * k + k0;
            var s = 0.0;
            for (var j = 0u; j < valid; j++) {
                s += wv[j] * x[xb + j];
            }
            acc[r] += s;
        }
    }
    for (var r = 0u; r < rows; r++) {
        y[(m0 + r) * params.n_total + params.n_offset + col] = acc[r];
    }
}
