// SPDX-License-Identifier: Apache-2.0
// What every matmul kernel binds besides its x and weight sources: the parameters
// (mirrors gpu::kernels::matmul::Params) and the output y (y_row0 + m, n_total), columns
// n_offset .. n_offset + n_part of which this dispatch writes.
struct Params {
    m: u32,
    k: u32,
    n_part: u32,
    n_offset: u32,
    n_total: u32,
    row_bytes: u32,
    y_row0: u32,
    w_base: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

// Block b of x's row `row`, as eight vec4s (xload comes from the x source).
fn x_block(row: u32, b: u32) -> array<vec4<f32>, 8> {
    let i = row * (params.k / 4u) + b * 8u;
    return array<vec4<f32>, 8>(xload(i), xload(i + 1u), xload(i + 2u), xload(i + 3u),
                               xload(i + 4u), xload(i + 5u), xload(i + 6u), xload(i + 7u));
}
