// SPDX-License-Identifier: Apache-2.0
// One 32-element block of a row-parallel matmul (matmul_rows, matmul_subgroup): block b of the
// G weight rows of each of the CN output columns col + c (rows col + c and n_part + col + c,
// clamped), each decoded once and held together, folded into acc[(c * G + g) * TM + r] against
// x's rows m0 + r (clamped), each loaded and summed once, with shared/block_recipe.wgsl. Uses
// the including kernel's CN, G and TM. Each accumulator's chain is the same whatever CN and TM.
fn fold_block(acc: ptr<function, array<f32, CN * G * TM>>, col: u32, m0: u32, b: u32) {
    var blk = array<WBlock, CN * G>();
    for (var c = 0u; c < CN; c++) {
        for (var g = 0u; g < G; g++) {
            let row = min(col + c, params.n_part - 1u) + g * params.n_part;
            blk[c * G + g] = w_block_at(params.w_base + w_row_byte(row, params.row_bytes), b);
        }
    }
    for (var r = 0u; r < TM; r++) {
        let xb = x_block(min(m0 + r, params.m - 1u), b);
        let sx = block_sum(xb);
        for (var i = 0u; i < CN * G; i++) {
            (*acc)[i * TM + r] = block_acc((*acc)[i * TM + r], blk[i].dm, block_dot(blk[i].q, xb), sx);
        }
    }
}
