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
// 8 at a time (two vec4 runs) and keeps, per row, s = Σ code·x (and Σ x for formats with a min),
// then adds d·s (+ m·Σx) to the row's total. Loops have constant trip counts and the math is
// vec4, so drivers keep everything in registers (lavapipe is many times slower otherwise).
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

// Four consecutive activations from element i; where `check`, those at or past `limit` are 0.
fn x4(i: u32, check: bool, limit: u32) -> vec4<f32> {
    let v = vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
    if (!check) {
        return v;
    }
    return select(vec4<f32>(0.0), v, vec4<u32>(i) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(limit));
}

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
    // Per-block sums, zeroed by hand each block: naga's WGSL output (what browsers get) declares
    // every local once per function, so a `var` inside the loop would not restart at zero there.
    var s: array<f32, TM>;
    var sx: array<f32, TM>;
    let num_blocks = (k + W_BLOCK - 1u) / W_BLOCK;
    for (var blk = 0u; blk < num_blocks; blk++) {
        let k0 = blk * W_BLOCK;
        let partial = k0 + W_BLOCK > k; // only a float format's last block can be partial
        let dm = w_scale(row_byte, blk);
        for (var r = 0u; r < TM; r++) {
            s[r] = 0.0;
            sx[r] = 0.0;
        }
        for (var c = 0u; c < W_CHUNKS; c++) {
            let q = w_chunk(row_byte, blk, c, k);
            let e = k0 + w_first(c);
            for (var r = 0u; r < TM; r++) {
                if (m0 + r < params.m) {
                    let row = (m0 + r) * k;
                    let lo = x4(row + e, partial, row + k);
                    let hi = x4(row + e + W_GAP, partial, row + k);
                    s[r] += dot(q[0], lo) + dot(q[1], hi);
                    if (W_HAS_MIN) {
                        sx[r] += dot(lo + hi, vec4<f32>(1.0));
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
