//! The building blocks architectures share, each recording its dispatches: a [`Linear`]
//! projection (one or several weight matrices written side by side, optional bias),
//! self-[`Attention`] over the paged KV cache with RoPE (and optional q/k norms, per head or
//! over the whole projection), the gated [`Mlp`] (SwiGLU or GeGLU), and the Mamba2
//! [`SsmMixer`] over a sequence's recurrent-state slot (LFM2's short convolution, used by one
//! architecture, is in `arch::lfm2`), and the mixture-of-experts [`MoeMlp`]. An architecture
//! file composes them top to bottom.
//!
//! Projections of the same input run as one: q, k and v land side by side in one `qkv` row
//! (one matmul when the checkpoint's tensors share a format), gate and up in one `gate_up` row;
//! RoPE and the KV write are one kernel, the residual add and the next norm another, and the
//! MLP's gate is applied by the gate-and-up matmul as it writes. A layer is 8 dispatches: 9
//! where the gate is a pass of its own (the baseline family's tiled matmul, from 32 rows), one
//! more where split-K attention joins a long context, and on CPU drivers more for prefill
//! steps (one matmul per window of rows).
//!
//! **Invariant:** layers record dispatches over tensors the caller owns; they allocate only
//! what they are told to through [`Activations`], made once for all steps.

use crate::error::Result;
use crate::gpu::Epilogue;
use crate::gpu::kernels::elementwise::{add_bias, gelu_mul, silu_mul};
use crate::gpu::kernels::matmul::{matmul, matmul_gated, matmul_into, supports_gated};
use crate::gpu::kernels::moe::{moe_combine, moe_matmul, moe_route};
use crate::gpu::kernels::paged::{PagedKv, QkvLayout, attention_partials_cols, paged_attention, rope_kv_write};
use crate::gpu::kernels::reduce::head_rms_norm;
use crate::gpu::kernels::rope::RopePairing;
use crate::gpu::kernels::ssm::{
    ConvForm, GateAt, ScanShape, ScanWeights, SeqStates, SsdChunks, SsdScratch, gated_rms_norm, ssd_scan, ssm_conv,
    ssm_scan,
};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::lora::LoraModule;
use crate::model::config::{ModelConfig, MoeConfig, SsmConfig};
use crate::model::lora_pool::LoraStep;
use crate::model::weights::{Checkpoint, HostTensor, Loader, upload_experts};
use crate::tensor::TensorFactory;

/// `y = x · Wᵀ (+ b)`, where W is one matrix or several whose outputs sit side by side in y's
/// columns (in order), and b covers all of y's columns.
pub struct Linear {
    pub weights: Vec<GpuTensor>, // each (out_i, in), any weight format
    pub bias: Option<GpuTensor>, // (Σ out_i) F32
}

impl Linear {
    pub fn forward(&self, ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor, y: &GpuTensor) -> Result<()> {
        let mut col = 0;
        for w in &self.weights {
            matmul_into(ctx, rec, x, w, y, col)?;
            col += w.shape()[0];
        }
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
    /// (num_logits, 2) U32: per logit row, the (first row, rows) its embedding pools — the
    /// row itself, or for an embedding request's row of an encoder its sequence's first row
    /// (CLS) or all of them (mean). Read by encoders, which have no LM head.
    pub pool_spans: &'a GpuTensor,
    /// Per sequence: first row, rows, state slot, start position (the recurrent kernels').
    pub seq_states: SeqStates<'a>,
    /// How the recurrent layers' scans split those rows (see `model::scan_plan`).
    pub scan: ScanTables<'a>,
    /// The adapter slot of each row, when any row of the step runs a LoRA adapter; `None`
    /// records no LoRA dispatch at all.
    pub lora: Option<LoraStep<'a>>,
}

/// One layer's LoRA: the step's slots and the layer's index in the pool.
#[derive(Clone, Copy)]
pub struct LayerLora<'a> {
    pub step: LoraStep<'a>,
    pub layer: usize,
}

impl LayerLora<'_> {
    fn apply(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        m: LoraModule,
        x: &GpuTensor,
        y: &GpuTensor,
        col: usize,
    ) -> Result<()> {
        self.step.pool.apply(ctx, rec, &self.step, self.layer, m, x, y, col)
    }
}

/// A step's recurrent rows as the scans take them (`model::scan_plan::ScanPlan` on the GPU):
/// heads token by token, then whole chunks in the SSD form (none when the step has no whole
/// chunk), then tails and decodes token by token.
pub struct ScanTables<'a> {
    pub before: SeqStates<'a>,
    pub ssd: Option<SsdChunks<'a>>,
    pub after: SeqStates<'a>,
}

/// The activations of one step, shared by every layer (wgpu orders the dispatches that use
/// them). Made once for the most tokens a step may hold and viewed at each step's size, so the
/// same buffers (and bind groups) serve every step.
pub struct Activations {
    pub x: GpuTensor,             // (tokens, hidden): the residual stream
    pub xn: GpuTensor,            // (tokens, hidden): normalised x
    pub qkv: GpuTensor,           // (tokens, (heads + 2 · kv_heads) · head_dim)
    pub attn: GpuTensor,          // (tokens, heads · head_dim)
    pub attn_partials: GpuTensor, // (tokens, kernels::paged::attention_partials_cols): split-K attention's
    pub proj: GpuTensor,          // (tokens, hidden): o_proj / down_proj output
    pub gate_up: GpuTensor,       // (tokens, 2 · intermediate)
    pub act: GpuTensor,           // (tokens, intermediate)
    pub rows: GpuTensor,          // (logit rows, hidden): the normalised rows the LM head reads
    pub normed: GpuTensor,        // (tokens, hidden): a normalised sub-layer output (Gemma's post-norms)
    /// A Mamba2 mixer's buffers, for models with state-space layers.
    pub ssm: Option<SsmActivations>,
    /// The experts' buffers, for mixture-of-experts models.
    pub moe: Option<MoeActivations>,
    /// LFM2's short convolutions' buffers.
    pub short_conv: Option<ShortConvActivations>,
    /// Qwen3.5's Gated DeltaNet layers' and gated attention's buffers.
    pub delta_net: Option<DeltaNetActivations>,
}

/// The buffers of Qwen3.5's layers.
pub struct DeltaNetActivations {
    pub mixed: GpuTensor,     // (tokens, conv_channels + value + 2 · v_heads): q, k, v, z, b, a
    pub qkv: GpuTensor,       // (tokens, conv_channels): q, k, v convolved
    pub core: GpuTensor,      // (tokens, value): the recurrence's output
    pub normed: GpuTensor,    // (tokens, value): normalised and gated by z
    pub attn_gate: GpuTensor, // (tokens, heads · head_dim): the attention layers' output gate
}

/// The buffers of a mixture-of-experts MLP: the routing, then a row per (token, slot).
pub struct MoeActivations {
    pub logits: GpuTensor,  // (tokens, experts): the router's
    pub ids: GpuTensor,     // (tokens, experts_per_token) U32: each slot's expert
    pub weights: GpuTensor, // (tokens, experts_per_token): each slot's weight
    pub act: GpuTensor,     // (tokens · experts_per_token, expert intermediate): gated
    pub out: GpuTensor,     // (tokens · experts_per_token, hidden): each slot's expert output
}

/// The buffers of an LFM2 short convolution.
pub struct ShortConvActivations {
    pub bcx: GpuTensor, // (tokens, 3 · hidden): in_proj's B, C, x
    pub y: GpuTensor,   // (tokens, hidden): C · conv(B · x)
}

/// The buffers of a Mamba2 mixer.
pub struct SsmActivations {
    pub zxbcdt: GpuTensor, // (tokens, inner + conv_channels + heads): in_proj's z, xBC, dt
    pub xbc: GpuTensor,    // (tokens, conv_channels): the convolved x, B, C
    pub y: GpuTensor,      // (tokens, inner): the scan's output
    pub yn: GpuTensor,     // (tokens, inner): gated and normalised
    /// The chunked scan's scratch, for as many whole chunks as the step's tokens can hold
    /// (`None` where the executor scans token by token only).
    pub ssd: Option<SsdScratch>,
}

impl Activations {
    /// `split_attention`: room for split-K attention's partial results (see
    /// [`KernelFamily::splits_attention`](crate::gpu::KernelFamily::splits_attention));
    /// `scan_chunk`: the rows per chunk of the chunked scan, if the executor uses it.
    pub fn new(
        factory: &dyn TensorFactory,
        c: &ModelConfig,
        num_tokens: usize,
        num_logits: usize,
        split_attention: bool,
        scan_chunk: Option<usize>,
    ) -> Result<Self> {
        // A model without attention or MLP (a pure state-space one) still gets one-column
        // buffers: the fields stay plain tensors, and nothing reads them.
        let t = |cols: usize| factory.activations(&[num_tokens, cols.max(1)]);
        let ssm = match &c.ssm {
            Some(ssm) => Some(SsmActivations {
                zxbcdt: t(ssm.in_proj_size())?,
                xbc: t(ssm.conv_channels())?,
                y: t(ssm.inner_size())?,
                yn: t(ssm.inner_size())?,
                ssd: match scan_chunk {
                    Some(q) => Some(SsdScratch::new(factory, scan_shape(ssm), num_tokens / q, q)?),
                    None => None,
                },
            }),
            None => None,
        };
        let moe = match &c.moe {
            Some(m) => {
                let (k, slots) = (m.experts_per_token, num_tokens * m.experts_per_token);
                Some(MoeActivations {
                    logits: t(m.num_experts)?,
                    ids: factory.zeros(&[num_tokens, k], crate::quant::DType::U32)?,
                    weights: factory.zeros(&[num_tokens, k], crate::quant::DType::F32)?,
                    act: factory.zeros(&[slots, m.expert_intermediate_size], crate::quant::DType::F32)?,
                    out: factory.zeros(&[slots, c.hidden_size], crate::quant::DType::F32)?,
                })
            }
            None => None,
        };
        // A mixture-of-experts model has no dense MLP (its layers are all sparse).
        let dense_mlp = if c.moe.is_some() { 0 } else { c.intermediate_size };
        let short_conv = match c.short_conv {
            Some(_) => Some(ShortConvActivations { bcx: t(3 * c.hidden_size)?, y: t(c.hidden_size)? }),
            None => None,
        };
        let delta_net = match &c.delta_net {
            Some(d) => Some(DeltaNetActivations {
                mixed: t(d.in_proj_size())?,
                qkv: t(d.conv_channels())?,
                core: t(d.value_size())?,
                normed: t(d.value_size())?,
                attn_gate: t(c.num_heads * c.head_dim)?,
            }),
            None => None,
        };
        Ok(Activations {
            x: t(c.hidden_size)?,
            xn: t(c.hidden_size)?,
            qkv: t((c.num_heads + 2 * c.num_kv_heads) * c.head_dim)?,
            attn: t(c.num_heads * c.head_dim)?,
            attn_partials: t(attention_partials_cols(split_attention, c.num_heads, c.head_dim))?,
            proj: t(c.hidden_size)?,
            gate_up: t(2 * dense_mlp)?,
            act: t(dense_mlp)?,
            rows: factory.activations(&[num_logits, c.hidden_size])?,
            normed: t(c.hidden_size)?,
            ssm,
            moe,
            short_conv,
            delta_net,
        })
    }

    /// Qwen3.5's buffers, or an error for a model without Gated DeltaNet layers.
    pub fn delta_net(&self) -> Result<&DeltaNetActivations> {
        self.delta_net
            .as_ref()
            .ok_or_else(|| crate::error::WeftError::Unsupported("this model has no Gated DeltaNet activations".into()))
    }

    /// LFM2's short-convolution buffers, or an error for a model without them.
    pub fn short_conv(&self) -> Result<&ShortConvActivations> {
        self.short_conv.as_ref().ok_or_else(|| {
            crate::error::WeftError::Unsupported("this model has no short-convolution activations".into())
        })
    }

    /// The Mamba2 mixer's buffers, or an error for a model without state-space layers.
    pub fn ssm(&self) -> Result<&SsmActivations> {
        self.ssm
            .as_ref()
            .ok_or_else(|| crate::error::WeftError::Unsupported("this model has no state-space activations".into()))
    }

    /// The experts' buffers, or an error for a dense model.
    pub fn moe(&self) -> Result<&MoeActivations> {
        self.moe.as_ref().ok_or_else(|| {
            crate::error::WeftError::Unsupported("this model has no mixture-of-experts activations".into())
        })
    }

    /// The first `num_tokens` token rows and `num_logits` logit rows (no copy).
    pub fn view(&self, num_tokens: usize, num_logits: usize) -> Result<Activations> {
        let t = |a: &GpuTensor| a.slice_rows(0..num_tokens);
        Ok(Activations {
            x: t(&self.x)?,
            xn: t(&self.xn)?,
            qkv: t(&self.qkv)?,
            attn: t(&self.attn)?,
            attn_partials: t(&self.attn_partials)?,
            proj: t(&self.proj)?,
            gate_up: t(&self.gate_up)?,
            act: t(&self.act)?,
            rows: self.rows.slice_rows(0..num_logits)?,
            normed: t(&self.normed)?,
            ssm: match &self.ssm {
                Some(s) => Some(SsmActivations {
                    zxbcdt: t(&s.zxbcdt)?,
                    xbc: t(&s.xbc)?,
                    y: t(&s.y)?,
                    yn: t(&s.yn)?,
                    ssd: s.ssd.clone(),
                }),
                None => None,
            },
            moe: match &self.moe {
                Some(m) => {
                    let slots = num_tokens * m.ids.shape()[1];
                    Some(MoeActivations {
                        logits: t(&m.logits)?,
                        ids: t(&m.ids)?,
                        weights: t(&m.weights)?,
                        act: m.act.slice_rows(0..slots)?,
                        out: m.out.slice_rows(0..slots)?,
                    })
                }
                None => None,
            },
            short_conv: match &self.short_conv {
                Some(s) => Some(ShortConvActivations { bcx: t(&s.bcx)?, y: t(&s.y)? }),
                None => None,
            },
            delta_net: match &self.delta_net {
                Some(d) => Some(DeltaNetActivations {
                    mixed: t(&d.mixed)?,
                    qkv: t(&d.qkv)?,
                    core: t(&d.core)?,
                    normed: t(&d.normed)?,
                    attn_gate: t(&d.attn_gate)?,
                }),
                None => None,
            },
        })
    }
}

/// Grouped-query self-attention with RoPE over the paged KV cache.
pub struct Attention {
    pub qkv: Linear, // q, k, v side by side
    pub o: Linear,
    /// RMSNorm of q and k before RoPE: each head (Qwen3, Gemma 3) or each whole projection
    /// (OLMo 2), by the weights' widths.
    pub qk_norm: Option<QkNorm>,
}

/// The norms of q and k, per head or over the whole projection.
pub struct QkNorm {
    pub q: GpuTensor, // (head_dim) per head, or (heads · head_dim)
    pub k: GpuTensor, // (head_dim) per head, or (kv_heads · head_dim)
    pub eps: f32,
}

/// What attention needs besides its weights: the model's shape and RoPE table.
pub struct AttentionSetup<'a> {
    pub layout: QkvLayout,
    pub cos_sin: &'a GpuTensor, // (max_positions, head_dim / 2, 2)
    pub pairing: RopePairing,
    pub sliding_window: Option<usize>,
    pub scale: f32,
}

impl Attention {
    /// `a.proj = o(attention(rope(q), rope(k), v))` with q, k, v from `a.xn`, writing this
    /// step's K and V into `cache`; each projection with its rows' LoRA deltas when `lora`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        a: &Activations,
        inputs: &StepInputs<'_>,
        cache: &PagedKv<'_>,
        s: &AttentionSetup<'_>,
        lora: Option<LayerLora<'_>>,
    ) -> Result<()> {
        self.qkv.forward(ctx, rec, &a.xn, &a.qkv)?;
        if let Some(l) = &lora {
            let (q_cols, kv_cols) = (s.layout.num_heads * s.layout.head_dim, s.layout.num_kv_heads * s.layout.head_dim);
            l.apply(ctx, rec, LoraModule::Q, &a.xn, &a.qkv, 0)?;
            l.apply(ctx, rec, LoraModule::K, &a.xn, &a.qkv, q_cols)?;
            l.apply(ctx, rec, LoraModule::V, &a.xn, &a.qkv, q_cols + kv_cols)?;
        }
        if let Some(n) = &self.qk_norm {
            head_rms_norm(ctx, rec, &a.qkv, s.layout, &n.q, &n.k, n.eps)?;
        }
        rope_kv_write(ctx, rec, &a.qkv, s.layout, inputs.positions, s.cos_sin, s.pairing, inputs.slots, cache)?;
        let (tables, info) = (inputs.block_tables, inputs.token_info);
        let (out, partials) = (&a.attn, &a.attn_partials);
        paged_attention(ctx, rec, &a.qkv, s.layout, cache, tables, info, out, partials, s.sliding_window, s.scale)?;
        self.o.forward(ctx, rec, &a.attn, &a.proj)?;
        match &lora {
            Some(l) => l.apply(ctx, rec, LoraModule::O, &a.attn, &a.proj, 0),
            None => Ok(()),
        }
    }
}

/// The gate of a gated MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// SwiGLU: silu(gate) · up (Llama, Qwen).
    Silu,
    /// GeGLU with the tanh GELU: gelu_tanh(gate) · up (Gemma).
    GeluTanh,
}

/// The gated MLP: `a.proj = down(act(gate(a.xn)) · up(a.xn))`.
pub struct Mlp {
    pub gate_up: Linear, // gate, up side by side
    pub down: Linear,
    pub gate: Gate,
}

impl Mlp {
    /// With `lora`, gate and up take their deltas before the gate is applied, so the pass that
    /// fuses the gate into the matmul is not used.
    pub fn forward(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        a: &Activations,
        lora: Option<LayerLora<'_>>,
    ) -> Result<()> {
        let epilogue = match self.gate {
            Gate::Silu => Epilogue::SiluMul,
            Gate::GeluTanh => Epilogue::GeluMul,
        };
        match self.gate_up.weights.as_slice() {
            // Gate and up in one matrix: one pass that also applies the gate, where supported.
            [w] if lora.is_none()
                && self.gate_up.bias.is_none()
                && w.parts().len() == 1
                && supports_gated(ctx, a.xn.shape()[0]) =>
            {
                matmul_gated(ctx, rec, &a.xn, w, &a.act, epilogue)?
            }
            _ => {
                self.gate_up.forward(ctx, rec, &a.xn, &a.gate_up)?;
                if let Some(l) = &lora {
                    l.apply(ctx, rec, LoraModule::Gate, &a.xn, &a.gate_up, 0)?;
                    l.apply(ctx, rec, LoraModule::Up, &a.xn, &a.gate_up, a.act.shape()[1])?;
                }
                match self.gate {
                    Gate::Silu => silu_mul(ctx, rec, &a.gate_up, &a.act)?,
                    Gate::GeluTanh => gelu_mul(ctx, rec, &a.gate_up, &a.act)?,
                }
            }
        }
        self.down.forward(ctx, rec, &a.act, &a.proj)?;
        match &lora {
            Some(l) => l.apply(ctx, rec, LoraModule::Down, &a.act, &a.proj, 0),
            None => Ok(()),
        }
    }
}

/// The scan kernels' view of a Mamba2 layer's shape.
fn scan_shape(s: &SsmConfig) -> ScanShape {
    ScanShape { num_heads: s.num_heads, head_dim: s.head_dim, state_size: s.state_size, num_groups: s.num_groups }
}

/// A Mamba2 mixer: `a.proj = out_proj(gated_norm(scan(conv(xBC)), z))` with z, xBC, dt from
/// `in_proj(a.xn)`, continuing each sequence's conv window and SSM state in its slot.
pub struct SsmMixer {
    pub shape: SsmConfig,
    pub in_proj: Linear,        // (inner + conv_channels + heads, hidden)
    pub conv_weight: GpuTensor, // (conv_channels, conv_kernel) F32
    pub conv_bias: GpuTensor,   // (conv_channels)
    pub a: GpuTensor,           // (heads): -exp(A_log)
    pub d: GpuTensor,           // (heads)
    pub dt_bias: GpuTensor,     // (heads)
    pub norm: GpuTensor,        // (inner)
    pub out_proj: Linear,       // (hidden, inner)
}

impl SsmMixer {
    /// Layer `layer`'s mixer: GGUF names `blk.N.ssm_*` (llama.cpp's converter stores A as
    /// `-exp(A_log)`), Hugging Face names `{hf_prefix}.in_proj.weight`, … (A as `A_log`).
    pub fn load(w: &Loader<'_>, shape: SsmConfig, hidden: usize, layer: usize, hf_prefix: &str) -> Result<SsmMixer> {
        let (inner, heads, channels) = (shape.inner_size(), shape.num_heads, shape.conv_channels());
        let checkpoint = w.source.checkpoint();
        let name = |gguf: &str, hf: &str| match checkpoint {
            Checkpoint::Gguf => format!("blk.{layer}.{gguf}"),
            Checkpoint::HuggingFace => format!("{hf_prefix}.{hf}"),
        };
        let f32s = |name: String, shape: &[usize]| -> Result<GpuTensor> {
            w.factory.upload_f32(shape, &w.named_values(&name, shape.iter().product())?)
        };
        let mut a = w.named_values(&name("ssm_a", "A_log"), heads)?;
        if checkpoint == Checkpoint::HuggingFace {
            a.iter_mut().for_each(|v| *v = -v.exp());
        }
        let matrix = |name: String, shape: &[usize]| -> Result<Linear> {
            Ok(Linear { weights: vec![w.named_matrix(&name, shape)?], bias: None })
        };
        Ok(SsmMixer {
            shape,
            in_proj: matrix(name("ssm_in.weight", "in_proj.weight"), &[shape.in_proj_size(), hidden])?,
            conv_weight: f32s(name("ssm_conv1d.weight", "conv1d.weight"), &[channels, shape.conv_kernel])?,
            conv_bias: f32s(name("ssm_conv1d.bias", "conv1d.bias"), &[channels])?,
            a: w.factory.upload_f32(&[heads], &a)?,
            d: f32s(name("ssm_d", "D"), &[heads])?,
            dt_bias: f32s(name("ssm_dt.bias", "dt_bias"), &[heads])?,
            norm: f32s(name("ssm_norm.weight", "norm.weight"), &[inner])?,
            out_proj: matrix(name("ssm_out.weight", "out_proj.weight"), &[hidden, inner])?,
        })
    }

    /// `a.proj = mixer(a.xn)`, reading and writing the slots' `conv_state` (slots, conv_kernel
    /// - 1, conv_channels) and `ssm_state` (slots, heads, head_dim, state_size).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        a: &Activations,
        inputs: &StepInputs<'_>,
        conv_state: &GpuTensor,
        ssm_state: &GpuTensor,
        eps: f32,
    ) -> Result<()> {
        let s = self.shape;
        let acts = a.ssm()?;
        let (inner, channels) = (s.inner_size(), s.conv_channels());
        // z, xBC, dt side by side.
        self.in_proj.forward(ctx, rec, &a.xn, &acts.zxbcdt)?;
        let (w, b, seqs) = (&self.conv_weight, &self.conv_bias, &inputs.seq_states);
        ssm_conv(ctx, rec, &acts.zxbcdt, inner, ConvForm::Silu, w, b, seqs, conv_state, &acts.xbc)?;
        let shape = scan_shape(&s);
        let weights = ScanWeights { a: &self.a, d: &self.d, dt_bias: &self.dt_bias };
        let (dt, dt_offset) = (&acts.zxbcdt, inner + channels);
        // Heads token by token, whole chunks in the SSD form, then tails and decodes.
        let ScanTables { before, ssd, after } = &inputs.scan;
        if before.num_seqs > 0 {
            ssm_scan(ctx, rec, shape, &acts.xbc, dt, dt_offset, &weights, before, ssm_state, &acts.y)?;
        }
        if let Some(chunks) = ssd {
            let scratch = acts.ssd.as_ref().ok_or_else(|| {
                crate::error::WeftError::Unsupported("a chunked scan was planned without its scratch space".into())
            })?;
            ssd_scan(ctx, rec, shape, &acts.xbc, dt, dt_offset, &weights, chunks, scratch, ssm_state, &acts.y)?;
        }
        if after.num_seqs > 0 {
            ssm_scan(ctx, rec, shape, &acts.xbc, dt, dt_offset, &weights, after, ssm_state, &acts.y)?;
        }
        let group = inner / s.num_groups;
        gated_rms_norm(ctx, rec, &acts.y, &acts.zxbcdt, 0, &self.norm, group, &acts.yn, eps, GateAt::Input)?;
        self.out_proj.forward(ctx, rec, &acts.yn, &a.proj)
    }
}

/// A mixture-of-experts MLP (Qwen3-MoE's sparse block): `a.proj = Σ_s w_s · expert_{e_s}(a.xn)`
/// over each token's top-k experts e_s by the router's softmax, each expert a SwiGLU MLP. Five
/// dispatches, all on the GPU: the router's matmul, the top-k choice, every slot's gate and up
/// with SwiGLU, every slot's down, and the weighted sum.
pub struct MoeMlp {
    pub shape: MoeConfig,
    pub router: GpuTensor,  // (experts, hidden)
    pub gate_up: GpuTensor, // (experts · 2 · ff, hidden): each expert's gate rows, then its up rows
    pub down: GpuTensor,    // (experts · hidden, ff)
}

impl MoeMlp {
    /// Layer `layer`'s experts: GGUF stacks each projection's experts in one tensor
    /// (`blk.N.ffn_gate_exps.weight` (experts, ff, hidden), `ffn_up_exps`, `ffn_down_exps`,
    /// router `ffn_gate_inp`); Hugging Face stores one matrix per expert
    /// (`{prefix}.experts.E.gate_proj.weight`, …, router `{prefix}.gate.weight`: transformers 5
    /// fuses them in memory, but saves this form). Gate and up must share a format (they run as
    /// one matmul).
    pub fn load(w: &Loader<'_>, shape: MoeConfig, hidden: usize, layer: usize, hf_prefix: &str) -> Result<MoeMlp> {
        let (experts, ff) = (shape.num_experts, shape.expert_intermediate_size);
        let file = w.source.file();
        let (router, gate_up, down) = match w.source.checkpoint() {
            Checkpoint::Gguf => {
                let name = |part: &str| format!("blk.{layer}.{part}.weight");
                let gate = w.named_host(&name("ffn_gate_exps"), &[experts, ff, hidden])?;
                let up = w.named_host(&name("ffn_up_exps"), &[experts, ff, hidden])?;
                if gate.dtype != up.dtype {
                    return Err(crate::error::WeftError::model(
                        file,
                        format!(
                            "layer {layer}'s experts store gate as {} and up as {}; weft runs them as one matmul, \
                             which needs one format",
                            gate.dtype, up.dtype
                        ),
                    ));
                }
                // Each expert's gate rows, then its up rows.
                let half = gate.bytes.len() / experts;
                let gate_up: Vec<u8> = (0..experts)
                    .flat_map(|e| [&gate.bytes[e * half..][..half], &up.bytes[e * half..][..half]])
                    .flatten()
                    .copied()
                    .collect();
                let down = w.named_host(&name("ffn_down_exps"), &[experts, hidden, ff])?;
                let gate_up =
                    HostTensor { shape: vec![experts * 2 * ff, hidden], dtype: gate.dtype, bytes: gate_up.into() };
                (name("ffn_gate_inp"), gate_up, down)
            }
            Checkpoint::HuggingFace => {
                let name = |part: &str| format!("{hf_prefix}.{part}");
                let (mut gate_up, mut down, mut dtypes) = (Vec::new(), Vec::new(), Vec::new());
                for e in 0..experts {
                    for (part, rows, cols) in
                        [("gate_proj", ff, hidden), ("up_proj", ff, hidden), ("down_proj", hidden, ff)]
                    {
                        let t = w.named_host(&name(&format!("experts.{e}.{part}.weight")), &[rows, cols])?;
                        dtypes.push(t.dtype);
                        let out = if part == "down_proj" { &mut down } else { &mut gate_up };
                        out.extend_from_slice(&t.bytes);
                    }
                }
                if dtypes.iter().any(|&d| d != dtypes[0]) {
                    return Err(crate::error::WeftError::model(
                        file,
                        format!("layer {layer}'s experts mix formats; weft needs one format for all of them"),
                    ));
                }
                let dtype = dtypes[0];
                let gate_up = HostTensor { shape: vec![experts * 2 * ff, hidden], dtype, bytes: gate_up.into() };
                let down = HostTensor { shape: vec![experts * hidden, ff], dtype, bytes: down.into() };
                (name("gate.weight"), gate_up, down)
            }
        };
        let upload = |what: &str, t: &HostTensor<'_>, rows: usize, cols: usize| {
            let name = format!("layer {layer}'s {what} experts");
            upload_experts(file, &name, [rows, cols], t.dtype, &t.bytes, experts, w.factory)
        };
        Ok(MoeMlp {
            shape,
            router: w.named_matrix(&router, &[experts, hidden])?,
            gate_up: upload("gate and up", &gate_up, experts * 2 * ff, hidden)?,
            down: upload("down", &down, experts * hidden, ff)?,
        })
    }

    /// `a.proj = moe(a.xn)`.
    pub fn forward(&self, ctx: &GpuContext, rec: &mut Recording, a: &Activations) -> Result<()> {
        let m = a.moe()?;
        let experts = self.shape.num_experts;
        matmul(ctx, rec, &a.xn, &self.router, &m.logits)?;
        moe_route(ctx, rec, &m.logits, &m.ids, &m.weights, self.shape.normalize_weights)?;
        moe_matmul(ctx, rec, &a.xn, &self.gate_up, experts, &m.ids, &m.act, Epilogue::SiluMul)?;
        moe_matmul(ctx, rec, &m.act, &self.down, experts, &m.ids, &m.out, Epilogue::None)?;
        moe_combine(ctx, rec, &m.out, &m.weights, &a.proj)
    }
}
