//! The building blocks architectures share, each recording its dispatches: a [`Linear`]
//! projection (weight and optional bias), self-[`Attention`] over the paged KV cache with RoPE,
//! and the gated [`Mlp`]. An architecture file composes them top to bottom.
//!
//! **Invariant:** layers record dispatches over tensors the caller owns; they allocate only
//! what they are told to through [`Activations`], made once per step for all layers.

use crate::error::Result;
use crate::gpu::kernels::elementwise::{add_bias, silu_mul};
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::paged::{PagedKv, kv_write, paged_attention};
use crate::gpu::kernels::rope::{RopePairing, rope};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::config::ModelConfig;
use crate::tensor::TensorFactory;

/// `y = x · Wᵀ (+ b)`.
pub struct Linear {
    pub weight: GpuTensor,      // (out, in), any weight format
    pub bias: Option<GpuTensor>, // (out) F32
}

impl Linear {
    pub fn forward(&self, ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor, y: &GpuTensor) -> Result<()> {
        matmul(ctx, rec, x, &self.weight, y)?;
        if let Some(bias) = &self.bias {
            add_bias(ctx, rec, y, bias)?;
        }
        Ok(())
    }
}

/// The per-step inputs of a forward pass, already on the GPU.
pub struct StepInputs<'a> {
    pub token_ids: &'a GpuTensor,    // (num_tokens) U32
    pub positions: &'a GpuTensor,    // (num_tokens) U32
    pub token_info: &'a GpuTensor,   // (num_tokens, 2) U32: sequence index, position
    pub slots: &'a GpuTensor,        // (num_tokens) U32: KV slot of each token
    pub block_tables: &'a GpuTensor, // (num_seqs, max_blocks_per_seq) U32
    pub logit_rows: &'a GpuTensor,   // (num_logits) U32: the tokens whose logits are sampled
}

/// The activations of one step, shared by every layer (wgpu orders the dispatches that use
/// them). Made once for the most tokens a step may hold and viewed at each step's size, so the
/// same buffers (and bind groups) serve every step.
pub struct Activations {
    pub x: GpuTensor,    // (tokens, hidden): the residual stream
    pub xn: GpuTensor,   // (tokens, hidden): normalised x
    pub q: GpuTensor,    // (tokens, heads · head_dim)
    pub k: GpuTensor,    // (tokens, kv_heads · head_dim)
    pub v: GpuTensor,    // (tokens, kv_heads · head_dim)
    pub attn: GpuTensor, // (tokens, heads · head_dim)
    pub proj: GpuTensor, // (tokens, hidden): o_proj / down_proj output
    pub gate: GpuTensor, // (tokens, intermediate)
    pub up: GpuTensor,   // (tokens, intermediate)
    pub act: GpuTensor,  // (tokens, intermediate)
    pub rows: GpuTensor, // (logit rows, hidden): the normalised rows the LM head reads
}

impl Activations {
    pub fn new(factory: &dyn TensorFactory, c: &ModelConfig, num_tokens: usize, num_logits: usize) -> Result<Self> {
        let t = |cols: usize| factory.activations(&[num_tokens, cols]);
        Ok(Activations {
            x: t(c.hidden_size)?,
            xn: t(c.hidden_size)?,
            q: t(c.num_heads * c.head_dim)?,
            k: t(c.num_kv_heads * c.head_dim)?,
            v: t(c.num_kv_heads * c.head_dim)?,
            attn: t(c.num_heads * c.head_dim)?,
            proj: t(c.hidden_size)?,
            gate: t(c.intermediate_size)?,
            up: t(c.intermediate_size)?,
            act: t(c.intermediate_size)?,
            rows: factory.activations(&[num_logits, c.hidden_size])?,
        })
    }

    /// The first `num_tokens` token rows and `num_logits` logit rows (no copy).
    pub fn view(&self, num_tokens: usize, num_logits: usize) -> Result<Activations> {
        let t = |a: &GpuTensor| a.slice_rows(0..num_tokens);
        Ok(Activations {
            x: t(&self.x)?,
            xn: t(&self.xn)?,
            q: t(&self.q)?,
            k: t(&self.k)?,
            v: t(&self.v)?,
            attn: t(&self.attn)?,
            proj: t(&self.proj)?,
            gate: t(&self.gate)?,
            up: t(&self.up)?,
            act: t(&self.act)?,
            rows: self.rows.slice_rows(0..num_logits)?,
        })
    }

    /// Tokens and logit rows these activations hold.
    pub fn capacity(&self) -> (usize, usize) {
        (self.x.shape()[0], self.rows.shape()[0])
    }
}

/// Grouped-query self-attention with RoPE over the paged KV cache.
pub struct Attention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
}

/// What attention needs besides its weights: the model's shape and RoPE table.
pub struct AttentionSetup<'a> {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub cos_sin: &'a GpuTensor, // (max_positions, head_dim / 2, 2)
    pub pairing: RopePairing,
    pub sliding_window: Option<usize>,
    pub scale: f32,
}

impl Attention {
    /// `a.proj = o(attention(rope(q(a.xn)), rope(k(a.xn)), v(a.xn)))`, writing this step's K and
    /// V into `cache`.
    pub fn forward(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        a: &Activations,
        inputs: &StepInputs<'_>,
        cache: &PagedKv<'_>,
        s: &AttentionSetup<'_>,
    ) -> Result<()> {
        let num_tokens = a.xn.shape()[0];
        self.q.forward(ctx, rec, &a.xn, &a.q)?;
        self.k.forward(ctx, rec, &a.xn, &a.k)?;
        self.v.forward(ctx, rec, &a.xn, &a.v)?;
        let q3 = a.q.reshape(&[num_tokens, s.num_heads, s.head_dim])?;
        let k3 = a.k.reshape(&[num_tokens, s.num_kv_heads, s.head_dim])?;
        let v3 = a.v.reshape(&[num_tokens, s.num_kv_heads, s.head_dim])?;
        let attn3 = a.attn.reshape(&[num_tokens, s.num_heads, s.head_dim])?;
        rope(ctx, rec, &q3, inputs.positions, s.cos_sin, s.pairing)?;
        rope(ctx, rec, &k3, inputs.positions, s.cos_sin, s.pairing)?;
        kv_write(ctx, rec, &k3, &v3, inputs.slots, cache)?;
        paged_attention(ctx, rec, &q3, cache, inputs.block_tables, inputs.token_info, &attn3, s.sliding_window, s.scale)?;
        self.o.forward(ctx, rec, &a.attn, &a.proj)
    }
}

/// The gated MLP: `a.proj = down(silu(gate(a.xn)) · up(a.xn))`.
pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Mlp {
    pub fn forward(&self, ctx: &GpuContext, rec: &mut Recording, a: &Activations) -> Result<()> {
        self.gate.forward(ctx, rec, &a.xn, &a.gate)?;
        self.up.forward(ctx, rec, &a.xn, &a.up)?;
        silu_mul(ctx, rec, &a.gate, &a.up, &a.act)?;
        self.down.forward(ctx, rec, &a.act, &a.proj)
    }
}
