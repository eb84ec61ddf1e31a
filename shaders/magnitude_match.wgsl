// SPDX-License-Identifier: Apache-2.0
// magnitude_match: x[r, :] *= rms(target[r, :]) / sqrt(max(mean(x[r, :]²), min_square)), giving each
// row of x the root mean square of target's row (Gemma 3n's AltUp streams, made from the
// embedding and unmade at the end, take the first stream's magnitude; transformers clamps the
// mean square at 1e-5).
//
// Bindings (group 0)
//   0 params  uniform     Params   mirrors gpu::kernels::altup::MagnitudeParams
//   1 x       read_write  f32 (rows, n)
//   2 target_rows  read      f32 (rows, n)
// Workgroup: 64 invocations per row. Invocation l sums the squares of its strided elements of
// target, then of x; shared/row_sum.wgsl adds each in a fixed order; then each invocation scales
// its strided elements. Rows are batch invariant.
// Grid: (rows, 1, 1).

struct Params {
    rows: u32,
    n: u32,
    min_square: f32,
}

const WG: u32 = 64u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> target_rows: array<f32>;

#include shared/row_sum.wgsl

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wid.x * params.n;
    var st = 0.0;
    var sx = 0.0;
    for (var i = lid; i < params.n; i += WG) {
        let t = target_rows[base + i];
        let v = x[base + i];
        st += t * t;
        sx += v * v;
    }
    let want = sqrt(row_sum(lid, st) / f32(params.n));
    workgroupBarrier();
    let have = sqrt(max(row_sum(lid, sx) / f32(params.n), params.min_square));
    let scale = want / have;
    for (var i = lid; i < params.n; i += WG) {
        x[base + i] = x[base + i] * scale;
    }
}
