// SPDX-License-Identifier: Apache-2.0
// Matmul epilogue: none. Each output is its own accumulator (G = 1 weight row per output).
fn epilogue(acc: f32, unused: f32) -> f32 {
    return acc;
}
