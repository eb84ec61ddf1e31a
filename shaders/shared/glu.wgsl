// SPDX-License-Identifier: Apache-2.0
// The gated activations of an MLP, one place for the standalone kernel (gate_mul.wgsl) and
// the matmul that applies them as it writes (shared/epilogue_*.wgsl), so both give the same
// bits.
//   silu_gate(g, u) = silu(g) · u with silu(v) = v / (1 + e^-v)         (SwiGLU)
//   gelu_gate(g, u) = gelu_tanh(g) · u, transformers' "gelu_pytorch_tanh":
//     gelu_tanh(v) = 0.5 v (1 + tanh(√(2/π) (v + 0.044715 v³)))        (GeGLU, Gemma)
//   swiglu_oai_gate(g, u) = g' σ(1.702 g') (u' + 1), g' = min(g, 7), u' = clamp(u, -7, 7)
//     (gpt-oss's experts: transformers' GptOssExperts._apply_gate, llama.cpp's swiglu_oai,
//     which both fix alpha 1.702 and limit 7)
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

const OAI_ALPHA: f32 = 1.702;
const OAI_LIMIT: f32 = 7.0;

fn swiglu_oai_gate(g: f32, u: f32) -> f32 {
    let gc = min(g, OAI_LIMIT);
    let uc = clamp(u, -OAI_LIMIT, OAI_LIMIT);
    return gc / (1.0 + exp(-OAI_ALPHA * gc)) * (uc + 1.0);
}
