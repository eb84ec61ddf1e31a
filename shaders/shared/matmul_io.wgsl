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

#include shared/x_block.wgsl
