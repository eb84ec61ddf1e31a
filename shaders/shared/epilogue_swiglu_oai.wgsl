// SPDX-License-Identifier: Apache-2.0
// Matmul epilogue: gpt-oss's clamped SwiGLU. Output column c takes two weight rows, c (gate)
// and n_part + c (up), G = 2 accumulators, and writes swiglu_oai_gate(gate, up)
// (shared/glu.wgsl).
#include shared/glu.wgsl

fn epilogue(gate: f32, up: f32) -> f32 {
    return swiglu_oai_gate(gate, up);
}
