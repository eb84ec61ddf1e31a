// SPDX-License-Identifier: Apache-2.0
// Matmul epilogue: SwiGLU. Output column c takes two weight rows, c (gate) and n_part + c (up),
// G = 2 accumulators, and writes silu_gate(gate, up) as gate_mul.wgsl would.
#include shared/glu.wgsl

fn epilogue(gate: f32, up: f32) -> f32 {
    return silu_gate(gate, up);
}
