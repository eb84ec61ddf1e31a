// SPDX-License-Identifier: Apache-2.0
// Activation source: a 64 KiB window of whole rows of x (f32, row-major) bound as a uniform
// buffer (binding offset = first_row * k * 4, a multiple of 256 when k % 64 == 0; binding size
// 65536, so pad the buffer by 64 KiB). Rows per window = floor(16384 / k); one dispatch per
// window, params.m = rows in the window, params.y_row0 = first row. The x buffer needs
// STORAGE | UNIFORM usage (written as storage by the previous kernel). Uniform loads with a
// workgroup-uniform address are one scalar load + broadcast on llvmpipe (storage loads are not).
@group(0) @binding(1) var<uniform> x: array<vec4<f32>, 4096>;

fn xload(i: u32) -> vec4<f32> {
    return x[i];
}
