// SPDX-License-Identifier: Apache-2.0
// argmax: out[r] = the index of the largest x[r, :]; ties go to the lowest index, NaNs never win.
//
// Bindings (group 0)
//   0 params  uniform     Params         mirrors gpu::kernels::argmax::Params
//   1 x       read        f32 (rows, n)
//   2 out     read_write  u32 (rows)
// Workgroup: 64 invocations per row, each scanning t, t + 64, …; a fixed tree over workgroup
// memory keeps the (value, index) pair with the larger value, the lower index on ties.
// Grid: (rows, 1, 1).

struct Params {
    rows: u32,
    n: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

var<workgroup> sh_val: array<f32, WG>;
var<workgroup> sh_idx: array<u32, WG>;

// Whether (va, ia) beats (vb, ib).
fn better(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    return va > vb || (va == vb && ia < ib);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wid.x * params.n;
    var best = -3.4028234663852886e38;
    var best_idx = 0xffffffffu;
    for (var i = lid; i < params.n; i += WG) {
        let v = x[base + i];
        if (better(v, i, best, best_idx)) {
            best = v;
            best_idx = i;
        }
    }
    sh_val[lid] = best;
    sh_idx[lid] = best_idx;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride && better(sh_val[lid + stride], sh_idx[lid + stride], sh_val[lid], sh_idx[lid])) {
            sh_val[lid] = sh_val[lid + stride];
            sh_idx[lid] = sh_idx[lid + stride];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        // A row holding only NaN or -inf has no winner: report index 0.
        out[wid.x] = select(sh_idx[0], 0u, sh_idx[0] == 0xffffffffu);
    }
}
