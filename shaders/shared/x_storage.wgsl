// SPDX-License-Identifier: Apache-2.0
// Activation source: x (f32, row-major) as a storage buffer (GPUs; any m in one dispatch).
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;

fn xload(i: u32) -> vec4<f32> {
    return x[i];
}
