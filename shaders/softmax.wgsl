// SPDX-License-Identifier: Apache-2.0
// softmax: x[r, :] = exp(x[r, :] - max) / Σ exp(x[r, :] - max), in place.
//
// Bindings (group 0)
//   0 params  uniform     Params         mirrors gpu::kernels::softmax::Params
//   1 x       read_write  f32 (rows, n)
// Workgroup: 64 invocations per row, each over the strided elements t, t + 64, …; the row max and
// the row sum are each combined by a fixed tree over workgroup memory.
// Grid: (rows, 1, 1).

struct Params {
    rows: u32,
    n: u32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

var<workgroup> sh: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wid.x * params.n;
    var m = -3.4028234663852886e38;
    for (var i = lid; i < params.n; i += WG) {
        m = max(m, x[base + i]);
    }
    sh[lid] = m;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            sh[lid] = max(sh[lid], sh[lid + stride]);
        }
        workgroupBarrier();
    }
    let row_max = sh[0];
    workgroupBarrier();
    var s = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let e = exp(x[base + i] - row_max);
        x[base + i] = e;
        s += e;
    }
    sh[lid] = s;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            sh[lid] += sh[lid + stride];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sh[0];
    for (var i = lid; i < params.n; i += WG) {
        x[base + i] *= inv;
    }
}
