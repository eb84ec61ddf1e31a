// SPDX-License-Identifier: Apache-2.0
// The gated activations of an MLP, one place for the standalone kernels (silu_mul.wgsl,
// gelu_mul.wgsl) and the matmul that applies them as it writes (shared/epilogue_*.wgsl), so
// both give the same bits.
//   silu_gate(g, u) = silu(g) · u with silu(v) = v / (1 + e^-v)         (SwiGLU)
//   gelu_gate(g, u) = gelu_tanh(g) · u, transformers' "gelu_pytorch_tanh":
//     gelu_tanh(v) = 0.5 v (1 + tanh(√(2/π) (v + 0.044715 v³)))        (GeGLU, Gemma)
// The tanh argument is clamped to ±15, where tanh is ±1 in f32 anyway, because some drivers
// compute tanh through exp and overflow to NaN beyond that.

const SQRT_2_OVER_PI: f32 = 0.7978845608028654;

fn silu_gate(g: f32, u: f32) -> f32 {
    return g / (1.0 + exp(-g)) * u;
}

fn gelu_gate(g: f32, u: f32) -> f32 {
    let t = tanh(clamp(SQRT_2_OVER_PI * (g + 0.044715 * g * g * g), -15.0, 15.0));
    return 0.5 * g * (1.0 + t) * u;
}
