// SPDX-License-Identifier: Apache-2.0
// Block b of x's row `row`, as eight vec4s: for kernels whose Params has k (x's row length) and
// whose x source defines xload.
fn x_block(row: u32, b: u32) -> array<vec4<f32>, 8> {
    let i = row * (params.k / 4u) + b * 8u;
    return array<vec4<f32>, 8>(xload(i), xload(i + 1u), xload(i + 2u), xload(i + 3u),
                               xload(i + 4u), xload(i + 5u), xload(i + 6u), xload(i + 7u));
}
