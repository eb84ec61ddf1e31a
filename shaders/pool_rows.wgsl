// SPDX-License-Identifier: Apache-2.0
// pool_rows: out[o, c] = (x[first_o, c] + x[first_o + 1, c] + … + x[first_o + count_o - 1, c]) / count_o
// — an embedding's pooling over its sequence's final hidden rows: the mean of all of them, or
// one row (CLS: the first; last-token: the last), which count 1 copies exactly.
//
// Bindings (group 0)
//   0 params  uniform     Params              mirrors gpu::kernels::reduce::PoolParams
//   1 x       read        f32 (rows, cols)
//   2 spans   read        u32 (outputs, 2)    (first row, count ≥ 1) per output row
//   3 out     read_write  f32 (outputs, cols)
// Workgroup: 256 invocations, one output element each, summing its column down the span in row
// order: an output depends only on its own rows (batch invariant).
// Grid: (min(g, 65535), ceil(g / 65535), 1) with g = ceil(outputs · cols / 256).

struct Params {
    outputs: u32,
    cols: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> spans: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    if (i >= params.outputs * params.cols) {
        return;
    }
    let o = i / params.cols;
    let c = i % params.cols;
    let first = spans[2u * o];
    let count = spans[2u * o + 1u];
    var s = 0.0;
    for (var r = first; r < first + count; r++) {
        s += x[r * params.cols + c];
    }
    out[i] = s / f32(count);
}
