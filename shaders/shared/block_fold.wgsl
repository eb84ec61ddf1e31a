// SPDX-License-Identifier: Apache-2.0
// One 32-element block of a row-parallel matmul (matmul_rows, matmul_subgroup): block b of the
// G weight rows of output column `col` (rows col and n_part + col, clamped), each decoded once,
// folded into acc[g * TM + r] against x's rows m0 + r (clamped), each loaded and summed once,
// with shared/block_recipe.wgsl. Uses the including kernel's G and TM.
fn fold_block(acc: ptr<function, array<f32, G * TM>>, col: u32, m0: u32, b: u32) {
    var blk = array<WBlock, G>();
    for (var g = 0u; g < G; g++) {
        let row = min(col, params.n_part - 1u) + g * params.n_part;
        blk[g] = w_block_at(params.w_base + w_row_byte(row, params.row_bytes), b);
    }
    for (var r = 0u; r < TM; r++) {
        let xb = x_block(min(m0 + r, params.m - 1u), b);
        let sx = block_sum(xb);
        for (var g = 0u; g < G; g++) {
            (*acc)[g * TM + r] = block_acc((*acc)[g * TM + r], blk[g].dm, block_dot(blk[g].q, xb), sx);
        }
    }
}
