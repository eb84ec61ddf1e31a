// SPDX-License-Identifier: Apache-2.0
// The per-block reduction every matmul kernel uses, so that within a kernel family all of them
// (any tile, any M, any weight source) give bit-identical results:
//   s   = q . x over the block: four fma chains over the vec4 lanes j = 0..7, folded (x+y)+(z+w)
//   sx  = sum(x) over the block, folded the same fixed way (only formats with a min use it)
//   acc = fma(d, s, acc), then acc = fma(m, sx, acc) for formats with a min.
// Explicit fma (not dot(), not a*b+c) so no driver can contract differently per kernel.
//
// The baseline family (matmul_rows, matmul_tiled) sums an output in chunks of CHUNK_BLOCKS
// blocks: each chunk folded as above from zero, the chunks added in order, so that lanes can
// fold a row's chunks side by side. The CPU family folds a row's blocks in one chain.
const CHUNK_BLOCKS: u32 = 4u;

fn block_dot(q: array<vec4<f32>, 8>, xb: array<vec4<f32>, 8>) -> f32 {
    var s4 = q[0] * xb[0];
    s4 = fma(q[1], xb[1], s4);
    s4 = fma(q[2], xb[2], s4);
    s4 = fma(q[3], xb[3], s4);
    s4 = fma(q[4], xb[4], s4);
    s4 = fma(q[5], xb[5], s4);
    s4 = fma(q[6], xb[6], s4);
    s4 = fma(q[7], xb[7], s4);
    return (s4.x + s4.y) + (s4.z + s4.w);
}

fn block_sum(xb: array<vec4<f32>, 8>) -> f32 {
    let t4 = ((xb[0] + xb[1]) + (xb[2] + xb[3])) + ((xb[4] + xb[5]) + (xb[6] + xb[7]));
    return (t4.x + t4.y) + (t4.z + t4.w);
}

fn block_acc(acc: f32, dm: vec2<f32>, s: f32, sx: f32) -> f32 {
    let a = fma(dm.x, s, acc);
    if (W_HAS_MIN) {
        return fma(dm.y, sx, a);
    }
    return a;
}
