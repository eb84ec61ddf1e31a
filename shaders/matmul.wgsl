// SPDX-License-Identifier: Apache-2.0
// matmul: y = x · Wᵀ, f32 activations times a weight matrix in any weight format.
//
// Bindings (group 0)
//   0 params  uniform     Params                   mirrors gpu::kernels::matmul::Params
//   1 x       read        f32 (m, k)               activations, row-major
//   2 w       read        u32 (n_part, row_bytes)  raw rows of one weight part, format in formats/
//   3 y       read_write  f32 (m, n_total)         columns n_offset .. n_offset + n_part written
// Workgroup: 64 invocations along n. One invocation computes one output column for TM rows of x.
// It walks k one weight block at a time; per block it reads the scale once, decodes the codes
// 8 at a time and keeps, per row, s = Σ code·x (and Σ x for formats with a min), then adds
// d·s (+ m·Σx) to the row's total. Every loop has a constant trip count so drivers unroll it and
// keep the arrays in registers (lavapipe falls off a cliff otherwise).
// Grid: (ceil(n_part / 64), ceil(m / TM), 1).
// Batch invariance: y[i, j] is summed in an order fixed by k alone, the same whatever m is and
// whichever slot of a tile row i lands in; no reduction crosses invocations.

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
    let row_byte = col * params.row_bytes;
    var acc: array<f32, TM>;
    let num_blocks = (k + W_BLOCK - 1u) / W_BLOCK;
    for (var blk = 0u; blk < num_blocks; blk++) {
        let k0 = blk * W_BLOCK;
        let whole = k0 + W_BLOCK <= k; // only a float format's last block can be partial
        let dm = w_scale(row_byte, blk);
        var s: array<f32, TM>;
        var sx: array<f32, TM>;
        for (var c = 0u; c < W_CHUNKS; c++) {
            let q = w_chunk(row_byte, blk, c, k);
            for (var r = 0u; r < TM; r++) {
                if (m0 + r < params.m) {
                    let xb = (m0 + r) * k + k0;
                    for (var j = 0u; j < 8u; j++) {
                        let e = w_elem(c, j);
                        if (whole || k0 + e < k) {
                            let xv = x[xb + e];
                            s[r] += q[j] * xv;
                            if (W_HAS_MIN) {
                                sx[r] += xv;
                            }
                        }
                    }
                }
            }
        }
        for (var r = 0u; r < TM; r++) {
            if (W_HAS_MIN) {
                acc[r] += dm.x * s[r] + dm.y * sx[r];
            } else {
                acc[r] += dm.x * s[r];
            }
        }
    }
    for (var r = 0u; r < TM; r++) {
        if (m0 + r < params.m) {
            y[(m0 + r) * params.n_total + params.n_offset + col] = acc[r];
        }
    }
}
