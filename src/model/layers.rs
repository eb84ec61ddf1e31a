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
use crate::gpu::kernels::elementwise::{add_bias, gelu_mul, sigmoid_mul, silu_mul};
use crate::gpu::kernels::matmul::{matmul, matmul_gated, matmul_into, supports_gated};
use crate::gpu::kernels::moe::{TILE_WORDS, max_tiles, moe_combine, moe_group, moe_matmul, moe_route};
use crate::gpu::kernels::paged::{PagedKv, QkvLayout, attention_partials_cols, paged_attention, rope_kv_write};
use crate::gpu::kernels::reduce::head_rms_norm;
use crate::gpu::kernels::rope::RopePairing;
use crate::gpu::kernels::ssm::{
    ConvForm, GateAt, ScanShape, ScanWeights, SeqStates, SsdChunks, SsdScratch, gated_rms_norm, ssd_scan, ssm_conv,
    ssm_scan,
};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::lora::LoraModule;
use crate::model::config::{ExpertGate, ModelConfig, MoeConfig, Routing, SsmConfig};
use crate::model::lora_pool::LoraStep;
use crate::model::weights::{
    Alternating, Checkpoint, HostTensor, Loader, SourcedTensor, upload_experts, upload_matrix,
};
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
    /// Gemma 4's per-layer embeddings' buffers.
    pub per_layer: Option<PerLayerActivations>,
    /// Gemma 3n's AltUp streams and Laurel branch.
    pub altup: Option<AltUpActivations>,
}

/// The buffers of Gemma 3n's AltUp and Laurel. The streams keep their whole height in a view
/// of fewer tokens: stream j's rows start at j · capacity (the most tokens a step holds,
/// rounded up to 64), and a step uses the first rows of each (`gpu::kernels::altup`).
#[derive(Clone)]
pub struct AltUpActivations {
    pub streams: GpuTensor,     // (n · capacity, hidden): the hidden state's n copies
    pub predictions: GpuTensor, // (n · capacity, hidden): a layer's prediction of each
    pub modal: GpuTensor,       // (tokens, n): the router's tanh outputs
    pub laurel: GpuTensor,      // (tokens, laurel_rank): Laurel's low-rank middle
}

/// The buffers of Gemma 4's per-layer embeddings.
#[derive(Clone)]
pub struct PerLayerActivations {
    pub inputs: GpuTensor,  // (tokens, layers · per_layer): every layer's input, made before the first
    pub scratch: GpuTensor, // (tokens, layers · per_layer): the token table's rows, the projection
    pub gate: GpuTensor,    // (tokens, per_layer): a layer's gated input
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
#[derive(Clone)]
pub struct MoeActivations {
    pub logits: GpuTensor,      // (tokens, experts): the router's
    pub ids: GpuTensor,         // (tokens, experts_per_token) U32: each slot's expert
    pub weights: GpuTensor,     // (tokens, experts_per_token): each slot's weight
    pub act: GpuTensor,         // (tokens · experts_per_token, expert intermediate): gated
    pub out: GpuTensor,         // (tokens · experts_per_token, hidden): each slot's expert output
    pub shared_gate: GpuTensor, // (tokens, 1): a gated shared expert's gate logit
    /// (1 + max_tiles(tokens · experts_per_token, experts), TILE_WORDS) U32: the slots grouped
    /// by expert (`moe_group`'s tile table)
    pub tiles: GpuTensor,
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
                    shared_gate: t(1)?,
                    tiles: factory
                        .zeros(&[1 + max_tiles(slots, m.num_experts), TILE_WORDS], crate::quant::DType::U32)?,
                })
            }
            None => None,
        };
        // A mixture-of-experts model's layers are all sparse: its only dense MLP is a shared
        // expert, if it has one.
        let dense_mlp = c.moe.map_or(c.intermediate_size, |m| {
            if m.leading_dense_layers > 0 {
                m.shared_expert_size.max(c.intermediate_size)
            } else {
                m.shared_expert_size
            }
        });
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
        let per_layer = match &c.gemma4 {
            Some(g) if g.per_layer_input_size > 0 => {
                let all = c.num_layers * g.per_layer_input_size;
                Some(PerLayerActivations { inputs: t(all)?, scratch: t(all)?, gate: t(g.per_layer_input_size)? })
            }
            _ => None,
        };
        let altup = match c.gemma4.as_ref().and_then(|g| g.gemma3n.as_ref()) {
            Some(x) => {
                // Each stream's height a multiple of 64 rows, so that every stream starts at a
                // storage-offset-aligned byte (256) whatever the hidden size.
                let rows = x.altup_num_inputs * num_tokens.next_multiple_of(64);
                let streams = || factory.activations(&[rows, c.hidden_size]);
                Some(AltUpActivations {
                    streams: streams()?,
                    predictions: streams()?,
                    modal: t(x.altup_num_inputs)?,
                    laurel: t(x.laurel_rank)?,
                })
            }
            None => None,
        };
        // Layers may differ (Gemma 4's full layers, its double-wide MLPs): sized for the widest,
        // viewed narrower by `Activations::for_layer`.
        let (qkv_cols, attn_cols, head_dim) = c.widest_attention();
        let dense_mlp = (0..c.num_layers).fold(dense_mlp, |m, i| m.max(c.layer_intermediate_size(i)));
        Ok(Activations {
            x: t(c.hidden_size)?,
            xn: t(c.hidden_size)?,
            qkv: t(qkv_cols)?,
            attn: t(attn_cols)?,
            attn_partials: t(attention_partials_cols(split_attention, c.num_heads, head_dim))?,
            proj: t(c.hidden_size)?,
            gate_up: t(2 * dense_mlp)?,
            act: t(dense_mlp)?,
            rows: factory.activations(&[num_logits, c.hidden_size])?,
            normed: t(c.hidden_size)?,
            ssm,
            moe,
            short_conv,
            delta_net,
            per_layer,
            altup,
        })
    }

    /// A view of these activations at one layer's widths, where layers differ (Gemma 4): q/k/v
    /// rows of `layout`, its attention output and split-K partials, an MLP of `intermediate`.
    pub fn for_layer(&self, layout: QkvLayout, intermediate: usize) -> Result<Activations> {
        let tokens = self.x.shape()[0];
        let split = self.attn_partials.shape()[1] != attention_partials_cols(false, 0, 0);
        let attn_cols = layout.num_heads * layout.head_dim;
        let partials = attention_partials_cols(split, layout.num_heads, layout.head_dim);
        Ok(Activations {
            qkv: self.qkv.prefix(&[tokens, layout.row_stride()])?,
            attn: self.attn.prefix(&[tokens, attn_cols])?,
            attn_partials: self.attn_partials.prefix(&[tokens, partials])?,
            gate_up: self.gate_up.prefix(&[tokens, 2 * intermediate])?,
            act: self.act.prefix(&[tokens, intermediate])?,
            x: self.x.clone(),
            xn: self.xn.clone(),
            proj: self.proj.clone(),
            rows: self.rows.clone(),
            normed: self.normed.clone(),
            ssm: None,
            moe: self.moe.clone(),
            short_conv: None,
            delta_net: None,
            per_layer: self.per_layer.clone(),
            altup: self.altup.clone(),
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
                        shared_gate: t(&m.shared_gate)?,
                        tiles: m.tiles.slice_rows(0..1 + max_tiles(slots, m.logits.shape()[1]))?,
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
            per_layer: match &self.per_layer {
                Some(p) => {
                    Some(PerLayerActivations { inputs: t(&p.inputs)?, scratch: t(&p.scratch)?, gate: t(&p.gate)? })
                }
                None => None,
            },
            altup: match &self.altup {
                Some(x) => Some(AltUpActivations {
                    streams: x.streams.clone(),
                    predictions: x.predictions.clone(),
                    modal: t(&x.modal)?,
                    laurel: t(&x.laurel)?,
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
    /// Each head's attention-sink logit (gpt-oss), joining its softmax's denominator.
    pub sinks: Option<GpuTensor>, // (heads) F32
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
        let (window, sinks) = (s.sliding_window, self.sinks.as_ref());
        paged_attention(ctx, rec, &a.qkv, s.layout, cache, tables, info, out, partials, window, s.scale, sinks)?;
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

/// A layer's feed-forward block: one dense MLP, or routed experts.
pub enum FeedForward {
    Dense(Mlp),
    // Boxed: the experts hold more tensors, and layers are walked, not copied.
    Experts(Box<MoeMlp>),
}

impl FeedForward {
    /// `a.proj = ffn(a.xn)`. Adapters reach dense MLPs only: an architecture with experts
    /// offers no LoRA layout, so `lora` is `None` there.
    pub fn forward(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        a: &Activations,
        lora: Option<LayerLora<'_>>,
    ) -> Result<()> {
        match self {
            FeedForward::Dense(mlp) => mlp.forward(ctx, rec, a, lora),
            FeedForward::Experts(moe) => moe.forward(ctx, rec, a),
        }
    }
}

/// A mixture-of-experts MLP (Qwen3-MoE's sparse block, gpt-oss's, Granite MoE's, Qwen3.5-MoE's):
/// `a.proj = shared(a.xn) + Σ_s w_s · expert_{e_s}(a.xn)` over each token's top-k experts e_s
/// and weights w_s, chosen by the config's routing from the router's logits, each expert a
/// gated MLP (SwiGLU, or gpt-oss's clamped SwiGLU with biased projections), the shared expert
/// (Granite's, Qwen3.5-MoE's) where the model has one, scaled by sigmoid(a.xn · shared_gate)
/// where it is gated (Qwen3.5-MoE's). Five dispatches, all on the GPU (six with a router
/// bias, one more from [`GROUPED_MIN_TOKENS`]; a projection split over several bindings takes
/// one per part), after the shared expert's (and its gate's two): the router's matmul, the
/// top-k choice, (the slots grouped by expert,) every slot's gate and up with the gate and
/// every slot's down (grouped: each weight block decoded once for up to `TILE_ROWS` slots of
/// its expert), and the weighted sum (added onto the shared expert's output).
pub struct MoeMlp {
    pub shape: MoeConfig,
    pub router: GpuTensor,               // (experts, hidden)
    pub router_bias: Option<GpuTensor>,  // (experts)
    pub gate_up: GpuTensor,              // (experts · 2 · ff, hidden): each expert's gate rows, then its up rows
    pub gate_up_bias: Option<GpuTensor>, // (experts, 2 · ff): likewise
    pub down: GpuTensor,                 // (experts · hidden, ff)
    pub down_bias: Option<GpuTensor>,    // (experts, hidden)
    pub choice_bias: Option<GpuTensor>,  // (experts): steers a sigmoid routing's choice (LFM2-MoE)
    pub expert_scale: Option<GpuTensor>, // (experts): multiplies each chosen expert's weight (Gemma 4)
    pub shared: Option<Mlp>,
    pub shared_gate: Option<GpuTensor>, // (1, hidden): the shared expert's gate
}

/// Tokens from which a step's experts run grouped by expert (`moe_group`, `moe_matmul` by
/// tiles) rather than row by row. On lavapipe (bench/README.md, "Experts grouped by expert") a
/// Qwen3-30B-A3B-shaped layer (128 experts, top 8) ran grouped at 0.9x (CPU family) and 0.4x
/// (subgroup family) the per-row speed at 16 tokens (about one row an expert) and at 3.1x and
/// 1.4x at 128 (eight). 64: the warm-up's prefill (`GpuExecutor::warm_up`) records both.
pub const GROUPED_MIN_TOKENS: usize = 64;

/// How a Hugging Face checkpoint stores a layer's experts, under `prefix`.
#[derive(Clone, Copy, Debug)]
pub enum HfExperts<'a> {
    /// One matrix per expert and projection (`{prefix}.experts.E.gate_proj.weight`, …), router
    /// `{prefix}.gate.weight`, shared expert `{prefix}.shared_expert.{gate,up,down}_proj` and
    /// its gate `{prefix}.shared_expert_gate`, prefix `model.layers.N.mlp` (Qwen3-MoE,
    /// Qwen3.5-MoE: transformers 5 stacks the experts in memory, but saves this form); or the
    /// experts stacked as transformers holds them, `{prefix}.experts.gate_up_proj` (experts,
    /// 2 · ff, hidden; each expert's gate rows, then its up rows) and `experts.down_proj`
    /// (experts, hidden, ff) (Qwen3.5-MoE's published checkpoints).
    PerExpert(&'a str),
    /// gpt-oss's fused, input-major tensors: `{prefix}.experts.gate_up_proj` (experts, hidden,
    /// 2 · ff) with gate and up in alternate columns, `down_proj` (experts, ff, hidden), their
    /// `_bias`es, router `{prefix}.router.weight` and `.bias`; prefix `model.layers.N.mlp`.
    GptOss(&'a str),
    /// Granite MoE, under the layer's prefix (`model.layers.N`): `block_sparse_moe.input_linear`
    /// (experts, 2 · ff, hidden), each expert's gate rows then its up rows,
    /// `block_sparse_moe.output_linear` (experts, hidden, ff), router
    /// `block_sparse_moe.router.layer`, shared expert `shared_mlp.input_linear` / `output_linear`.
    Granite(&'a str),
    /// LFM2-MoE: one matrix per expert (`{prefix}.experts.E.w1.weight` gate, `w3` up, `w2`
    /// down), router `{prefix}.gate.weight`, choice bias `{prefix}.expert_bias`; prefix
    /// `model.layers.N.feed_forward`.
    Lfm2(&'a str),
    /// Gemma 4, under the layer's prefix (`model.layers.N`): `experts.gate_up_proj` (experts,
    /// 2 · ff, hidden), each expert's gate rows then its up rows, `experts.down_proj` (experts,
    /// hidden, ff), router `router.proj`, each expert's weight scale `router.per_expert_scale`.
    Gemma4(&'a str),
}

/// A layer's experts stacked as weft wants them, from a Hugging Face checkpoint: `gate_up`
/// (experts, 2 · ff, hidden), each expert's gate rows then its up rows, `down` (experts,
/// hidden, ff), no biases.
fn stacked_experts<'w>(
    w: &'w Loader<'_>,
    gate_up: &str,
    down: &str,
    router: String,
    [experts, ff, hidden]: [usize; 3],
) -> Result<HostExperts<'w>> {
    let gate_up = w.named_host(gate_up, &[experts, 2 * ff, hidden])?;
    let down = w.named_host(down, &[experts, hidden, ff])?;
    Ok(HostExperts {
        router,
        router_bias: None,
        gate_up: HostTensor { shape: vec![experts * 2 * ff, hidden], ..gate_up }.into(),
        gate_up_bias: None,
        down: HostTensor { shape: vec![experts * hidden, ff], ..down }.into(),
        down_bias: None,
    })
}

/// A layer's experts on the host, in weft's layout, before upload.
struct HostExperts<'a> {
    router: String,
    router_bias: Option<String>,
    gate_up: SourcedTensor<'a>,     // (experts · 2 · ff, hidden)
    gate_up_bias: Option<Vec<f32>>, // (experts · 2 · ff)
    down: SourcedTensor<'a>,        // (experts · hidden, ff)
    down_bias: Option<Vec<f32>>,    // (experts · hidden)
}

/// gpt-oss's MXFP4 experts as transformers stores them, `{name}_blocks` (experts, rows, cols /
/// 32, 16) U8 (element 2i of a block in byte i's low nibble, 2i + 1 in its high one) and
/// `{name}_scales` (experts, rows, cols / 32) U8 (E8M0), repacked into GGUF's MXFP4 blocks (the
/// scale byte, then element j in byte j's low nibble and j + 16 in its high one: what
/// llama.cpp's converter writes), with `interleaved` rows (gpt-oss's gate_up: gate, up, gate, …)
/// reordered into each expert's gate rows then its up rows; `None` if the checkpoint has no
/// blocks of that name.
fn mxfp4_experts<'a>(
    w: &Loader<'_>,
    name: &str,
    experts: usize,
    rows: usize,
    cols: usize,
    interleaved: bool,
) -> Result<Option<HostTensor<'a>>> {
    let (blocks_name, scales_name) = (format!("{name}_blocks"), format!("{name}_scales"));
    let Some((shape, blocks)) = w.source.get_u8(&blocks_name)? else { return Ok(None) };
    let per_row = cols / crate::quant::QK;
    let (scale_shape, scales) = w.source.get_u8(&scales_name)?.ok_or_else(|| w.missing_tensor(&scales_name))?;
    if shape != [experts, rows, per_row, 16] || scale_shape != [experts, rows, per_row] {
        return Err(crate::error::WeftError::model(
            w.source.file(),
            format!(
                "{blocks_name} {shape:?} and {scales_name} {scale_shape:?} are not MXFP4 blocks of {experts} experts \
                 of {rows} rows of {cols}"
            ),
        ));
    }
    let source_row = |r: usize| {
        let (e, r) = (r / rows, r % rows);
        let r = if interleaved && r < rows / 2 {
            2 * r
        } else if interleaved {
            2 * (r - rows / 2) + 1
        } else {
            r
        };
        e * rows + r
    };
    let mut out = Vec::with_capacity(experts * rows * per_row * 17);
    for r in (0..experts * rows).map(source_row) {
        for b in 0..per_row {
            let block = &blocks[(r * per_row + b) * 16..][..16];
            let code = |k: usize| if k.is_multiple_of(2) { block[k / 2] & 0x0F } else { block[k / 2] >> 4 };
            out.push(scales[r * per_row + b]);
            out.extend((0..16).map(|j| code(j) | (code(j + 16) << 4)));
        }
    }
    Ok(Some(HostTensor { shape: vec![experts * rows, cols], dtype: crate::quant::DType::MXFP4, bytes: out.into() }))
}

impl MoeMlp {
    /// Layer `layer`'s experts: GGUF stacks each projection's experts in one tensor
    /// (`blk.N.ffn_gate_exps.weight` (experts, ff, hidden), `ffn_up_exps`, `ffn_down_exps`,
    /// router `ffn_gate_inp`, each with an optional `.bias`; or gate and up as one
    /// `ffn_gate_up_exps` (experts, 2 · ff, hidden)); Hugging Face as `hf` says. Gate and up must
    /// share a format (they run as one matmul).
    pub fn load(w: &Loader<'_>, shape: MoeConfig, hidden: usize, layer: usize, hf: HfExperts<'_>) -> Result<MoeMlp> {
        let (experts, ff) = (shape.num_experts, shape.expert_intermediate_size);
        let file = w.source.file();
        // transformers' own layout for Qwen3.5-MoE's published checkpoints: each layer's
        // experts stacked (the per-expert form is what its save_pretrained writes).
        let stacked_hf = match (w.source.checkpoint(), hf) {
            (Checkpoint::HuggingFace, HfExperts::PerExpert(prefix)) => {
                w.source.get_source(&format!("{prefix}.experts.gate_up_proj"))?.is_some()
            }
            _ => false,
        };
        let host = match (w.source.checkpoint(), hf) {
            (Checkpoint::Gguf, _) => {
                let name = |part: &str| format!("blk.{layer}.{part}.weight");
                let bias_name = |part: &str| format!("blk.{layer}.{part}.bias");
                let optional = |part: &str, len: usize| -> Result<Option<Vec<f32>>> {
                    let name = bias_name(part);
                    if w.source.get_source(&name)?.is_none() {
                        return Ok(None);
                    }
                    w.named_values(&name, len).map(Some)
                };
                let (gate_up, gate_up_bias) = if w.source.get_source(&name("ffn_gate_up_exps"))?.is_some() {
                    // The converter's --fuse-gate-up-exps: already each expert's gate rows,
                    // then its up rows.
                    let fused = w.named_source(&name("ffn_gate_up_exps"), &[experts, 2 * ff, hidden])?;
                    let gate_up = SourcedTensor { shape: vec![experts * 2 * ff, hidden], ..fused };
                    (gate_up, optional("ffn_gate_up_exps", experts * 2 * ff)?)
                } else {
                    let gate = w.named_source(&name("ffn_gate_exps"), &[experts, ff, hidden])?;
                    let up = w.named_source(&name("ffn_up_exps"), &[experts, ff, hidden])?;
                    if gate.dtype != up.dtype {
                        return Err(crate::error::WeftError::model(
                            file,
                            format!(
                                "layer {layer}'s experts store gate as {} and up as {}; weft runs them as one \
                                 matmul, which needs one format",
                                gate.dtype, up.dtype
                            ),
                        ));
                    }
                    // Each expert's gate rows, then its up rows, read from the two tensors in turn.
                    let half = gate.bytes.len_bytes() / experts as u64;
                    let (shape, dtype) = (vec![experts * 2 * ff, hidden], gate.dtype);
                    let bytes = Box::new(Alternating { parts: vec![gate.bytes, up.bytes], chunk_bytes: half });
                    let gate_up = SourcedTensor { shape, dtype, bytes };
                    let gate_up_bias =
                        match (optional("ffn_gate_exps", experts * ff)?, optional("ffn_up_exps", experts * ff)?) {
                            (Some(g), Some(u)) => Some(
                                (0..experts)
                                    .flat_map(|e| [&g[e * ff..][..ff], &u[e * ff..][..ff]])
                                    .flatten()
                                    .copied()
                                    .collect(),
                            ),
                            (None, None) => None,
                            _ => {
                                return Err(crate::error::WeftError::model(
                                    file,
                                    format!("layer {layer}'s experts have a bias on one of gate and up only"),
                                ));
                            }
                        };
                    (gate_up, gate_up_bias)
                };
                let down = w.named_source(&name("ffn_down_exps"), &[experts, hidden, ff])?;
                let router_bias = bias_name("ffn_gate_inp");
                HostExperts {
                    router: name("ffn_gate_inp"),
                    router_bias: w.source.get_source(&router_bias)?.is_some().then_some(router_bias),
                    gate_up,
                    gate_up_bias,
                    down: SourcedTensor { shape: vec![experts * hidden, ff], ..down },
                    down_bias: optional("ffn_down_exps", experts * hidden)?,
                }
            }
            (Checkpoint::HuggingFace, HfExperts::Granite(prefix)) => {
                let name = |part: &str| format!("{prefix}.block_sparse_moe.{part}");
                let (gate_up, down) = (name("input_linear.weight"), name("output_linear.weight"));
                stacked_experts(w, &gate_up, &down, name("router.layer.weight"), [experts, ff, hidden])?
            }
            (Checkpoint::HuggingFace, HfExperts::Gemma4(prefix)) => {
                let name = |part: &str| format!("{prefix}.{part}");
                let (gate_up, down) = (name("experts.gate_up_proj"), name("experts.down_proj"));
                stacked_experts(w, &gate_up, &down, name("router.proj.weight"), [experts, ff, hidden])?
            }
            (Checkpoint::HuggingFace, HfExperts::PerExpert(prefix)) if stacked_hf => {
                let name = |part: &str| format!("{prefix}.{part}");
                let (gate_up, down) = (name("experts.gate_up_proj"), name("experts.down_proj"));
                stacked_experts(w, &gate_up, &down, name("gate.weight"), [experts, ff, hidden])?
            }
            (Checkpoint::HuggingFace, HfExperts::PerExpert(prefix) | HfExperts::Lfm2(prefix)) => {
                let name = |part: &str| format!("{prefix}.{part}");
                let parts = match hf {
                    HfExperts::Lfm2(_) => ["w1", "w3", "w2"],
                    _ => ["gate_proj", "up_proj", "down_proj"],
                };
                let (mut gate_up, mut down, mut dtypes) = (Vec::new(), Vec::new(), Vec::new());
                for e in 0..experts {
                    for (i, (rows, cols)) in [(ff, hidden), (ff, hidden), (hidden, ff)].into_iter().enumerate() {
                        let t = w.named_host(&name(&format!("experts.{e}.{}.weight", parts[i])), &[rows, cols])?;
                        dtypes.push(t.dtype);
                        let out = if i == 2 { &mut down } else { &mut gate_up };
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
                HostExperts {
                    router: name("gate.weight"),
                    router_bias: None,
                    gate_up: HostTensor { shape: vec![experts * 2 * ff, hidden], dtype, bytes: gate_up.into() }.into(),
                    gate_up_bias: None,
                    down: HostTensor { shape: vec![experts * hidden, ff], dtype, bytes: down.into() }.into(),
                    down_bias: None,
                }
            }
            (Checkpoint::HuggingFace, HfExperts::GptOss(prefix)) => {
                let name = |part: &str| format!("{prefix}.{part}");
                let biases = || -> Result<(Vec<f32>, Vec<f32>)> {
                    let gate_up = w.named_f32(&name("experts.gate_up_proj_bias"), &[experts, 2 * ff])?;
                    let column = |r: usize| if r < ff { 2 * r } else { 2 * (r - ff) + 1 };
                    let gate_up = (0..experts * 2 * ff).map(|r| gate_up[r / (2 * ff) * 2 * ff + column(r % (2 * ff))]);
                    Ok((gate_up.collect(), w.named_f32(&name("experts.down_proj_bias"), &[experts, hidden])?))
                };
                // OpenAI's checkpoints: MXFP4 blocks and scales, repacked into GGUF's MXFP4.
                if let Some(gate_up) = mxfp4_experts(w, &name("experts.gate_up_proj"), experts, 2 * ff, hidden, true)? {
                    let down = mxfp4_experts(w, &name("experts.down_proj"), experts, hidden, ff, false)?
                        .ok_or_else(|| w.missing_tensor(&name("experts.down_proj_blocks")))?;
                    let (gate_up_bias, down_bias) = biases()?;
                    HostExperts {
                        router: name("router.weight"),
                        router_bias: Some(name("router.bias")),
                        gate_up: gate_up.into(),
                        gate_up_bias: Some(gate_up_bias),
                        down: down.into(),
                        down_bias: Some(down_bias),
                    }
                } else {
                    // Input-major, gate and up in alternate columns: transposed on the host into
                    // each expert's gate rows, then its up rows.
                    let gate_up = w.named_f32(&name("experts.gate_up_proj"), &[experts, hidden, 2 * ff])?;
                    let down = w.named_f32(&name("experts.down_proj"), &[experts, ff, hidden])?;
                    let column = |r: usize| if r < ff { 2 * r } else { 2 * (r - ff) + 1 };
                    let gate_up: Vec<f32> = (0..experts * 2 * ff)
                        .flat_map(|row| {
                            let (e, c) = (row / (2 * ff), column(row % (2 * ff)));
                            (0..hidden).map(move |h| (e * hidden + h) * 2 * ff + c)
                        })
                        .map(|i| gate_up[i])
                        .collect();
                    let down: Vec<f32> = (0..experts * hidden)
                        .flat_map(|row| {
                            let (e, h) = (row / hidden, row % hidden);
                            (0..ff).map(move |f| (e * ff + f) * hidden + h)
                        })
                        .map(|i| down[i])
                        .collect();
                    let f32_host = |shape: Vec<usize>, values: Vec<f32>| HostTensor {
                        shape,
                        dtype: crate::quant::DType::F32,
                        bytes: bytemuck::cast_slice(&values).to_vec().into(),
                    };
                    let (gate_up_bias, down_bias) = biases()?;
                    HostExperts {
                        router: name("router.weight"),
                        router_bias: Some(name("router.bias")),
                        gate_up: f32_host(vec![experts * 2 * ff, hidden], gate_up).into(),
                        gate_up_bias: Some(gate_up_bias),
                        down: f32_host(vec![experts * hidden, ff], down).into(),
                        down_bias: Some(down_bias),
                    }
                }
            }
        };
        let upload = |what: &str, t: &SourcedTensor<'_>, rows: usize, cols: usize| {
            let name = format!("layer {layer}'s {what} experts");
            upload_experts(file, &name, [rows, cols], t.dtype, &*t.bytes, experts, w.factory)
        };
        let shared = match (shape.shared_expert_size, w.source.checkpoint(), hf) {
            (0, ..) => None,
            (sff, Checkpoint::Gguf, _) => {
                let name = |part: &str| format!("blk.{layer}.{part}.weight");
                let gate_up = [(name("ffn_gate_shexp"), sff), (name("ffn_up_shexp"), sff)];
                Some(Mlp {
                    gate_up: w.named_linear(&gate_up, None, hidden)?,
                    down: w.named_linear(&[(name("ffn_down_shexp"), hidden)], None, sff)?,
                    gate: Gate::Silu,
                })
            }
            (sff, Checkpoint::HuggingFace, HfExperts::Granite(prefix)) => {
                let name = |part: &str| format!("{prefix}.shared_mlp.{part}.weight");
                Some(Mlp {
                    gate_up: w.named_linear(&[(name("input_linear"), 2 * sff)], None, hidden)?,
                    down: w.named_linear(&[(name("output_linear"), hidden)], None, sff)?,
                    gate: Gate::Silu,
                })
            }
            (sff, Checkpoint::HuggingFace, HfExperts::PerExpert(prefix)) => {
                let name = |part: &str| format!("{prefix}.shared_expert.{part}.weight");
                Some(Mlp {
                    gate_up: w.named_linear(&[(name("gate_proj"), sff), (name("up_proj"), sff)], None, hidden)?,
                    down: w.named_linear(&[(name("down_proj"), hidden)], None, sff)?,
                    gate: Gate::Silu,
                })
            }
            (_, Checkpoint::HuggingFace, _) => {
                return Err(crate::error::WeftError::model(
                    file,
                    "weft reads shared experts of Granite MoE and Qwen3.5-MoE only",
                ));
            }
        };
        // GGUF stores the gate as a vector of hidden (or a (1, hidden) matrix), transformers as
        // a Linear of one output: either way one row of hidden values, kept in its format (a
        // quantizer may have quantized it).
        let shared_gate = match (shape.shared_expert_gated && shared.is_some(), w.source.checkpoint(), hf) {
            (false, ..) => None,
            (true, Checkpoint::Gguf, _) => Some(format!("blk.{layer}.ffn_gate_inp_shexp.weight")),
            (true, Checkpoint::HuggingFace, HfExperts::PerExpert(prefix)) => {
                Some(format!("{prefix}.shared_expert_gate.weight"))
            }
            (true, Checkpoint::HuggingFace, _) => {
                return Err(crate::error::WeftError::model(
                    file,
                    "weft reads gated shared experts of Qwen3.5-MoE only",
                ));
            }
        };
        let shared_gate = match shared_gate {
            Some(name) => {
                let t = w.source.get(&name)?.ok_or_else(|| w.missing_tensor(&name))?;
                if t.shape != [hidden] && t.shape != [1, hidden] {
                    return Err(crate::error::WeftError::model(
                        file,
                        format!("tensor {name} has shape {:?}, expected [{hidden}] or [1, {hidden}]", t.shape),
                    ));
                }
                Some(upload_matrix(file, &name, &HostTensor { shape: vec![1, hidden], ..t }, w.factory)?)
            }
            None => None,
        };
        let upload_bias = |values: Option<Vec<f32>>, cols: usize| -> Result<Option<GpuTensor>> {
            values.map(|v| w.factory.upload_f32(&[experts, cols], &v)).transpose()
        };
        let router_bias = match &host.router_bias {
            Some(name) => Some(w.factory.upload_f32(&[experts], &w.named_values(name, experts)?)?),
            None => None,
        };
        let choice_bias = match (shape.routing, w.source.checkpoint(), hf) {
            (Routing::Sigmoid { .. }, Checkpoint::Gguf, _) => Some(format!("blk.{layer}.exp_probs_b.bias")),
            (Routing::Sigmoid { .. }, Checkpoint::HuggingFace, HfExperts::Lfm2(prefix)) => {
                Some(format!("{prefix}.expert_bias"))
            }
            _ => None,
        };
        let choice_bias = match choice_bias {
            Some(name) if w.source.get_source(&name)?.is_some() => {
                Some(w.factory.upload_f32(&[experts], &w.named_values(&name, experts)?)?)
            }
            _ => None,
        };
        // Gemma 4's per-expert scales; llama.cpp reads `ffn_down_exps.scale` of any
        // architecture's GGUF (1 where absent), and so does weft.
        let expert_scale = match (w.source.checkpoint(), hf) {
            (Checkpoint::Gguf, _) => Some(format!("blk.{layer}.ffn_down_exps.scale")),
            (Checkpoint::HuggingFace, HfExperts::Gemma4(prefix)) => Some(format!("{prefix}.router.per_expert_scale")),
            _ => None,
        };
        let expert_scale = match expert_scale {
            Some(name) if w.source.get(&name)?.is_some() => {
                Some(w.factory.upload_f32(&[experts], &w.named_values(&name, experts)?)?)
            }
            _ => None,
        };
        Ok(MoeMlp {
            shape,
            router: w.named_matrix(&host.router, &[experts, hidden])?,
            router_bias,
            gate_up: upload("gate and up", &host.gate_up, experts * 2 * ff, hidden)?,
            gate_up_bias: upload_bias(host.gate_up_bias, 2 * ff)?,
            down: upload("down", &host.down, experts * hidden, ff)?,
            down_bias: upload_bias(host.down_bias, hidden)?,
            choice_bias,
            expert_scale,
            shared,
            shared_gate,
        })
    }

    /// `a.proj = moe(a.xn)`.
    pub fn forward(&self, ctx: &GpuContext, rec: &mut Recording, a: &Activations) -> Result<()> {
        self.forward_routed_by(ctx, rec, a, &a.xn)
    }

    /// `a.proj = moe(a.xn)` with the experts chosen from `router_input` (tokens, hidden) rather
    /// than a.xn (Gemma 4's router normalises the residual stream its own way). The router's
    /// matmul reads it before the experts' sum is written, so it may be `a.proj`.
    pub fn forward_routed_by(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        a: &Activations,
        router_input: &GpuTensor,
    ) -> Result<()> {
        let m = a.moe()?;
        let experts = self.shape.num_experts;
        if let Some(shared) = &self.shared {
            shared.forward(ctx, rec, a, None)?;
        }
        if let Some(gate) = &self.shared_gate {
            matmul(ctx, rec, &a.xn, gate, &m.shared_gate)?;
            sigmoid_mul(ctx, rec, &a.proj, &m.shared_gate)?;
        }
        matmul(ctx, rec, router_input, &self.router, &m.logits)?;
        if let Some(bias) = &self.router_bias {
            add_bias(ctx, rec, &m.logits, bias)?;
        }
        let (routing, choice_bias, scale) = (self.shape.routing, self.choice_bias.as_ref(), self.expert_scale.as_ref());
        moe_route(ctx, rec, &m.logits, &m.ids, &m.weights, routing, choice_bias, scale)?;
        let gate = match self.shape.gate {
            ExpertGate::Silu => Epilogue::SiluMul,
            ExpertGate::SwigluOai => Epilogue::SwigluOai,
            ExpertGate::GeluTanh => Epilogue::GeluMul,
        };
        // Grouped by expert from GROUPED_MIN_TOKENS tokens; row by row below, where an expert
        // rarely has two rows to share its weights. The same bits either way.
        let tokens = m.ids.shape()[0];
        let tiles = (tokens >= GROUPED_MIN_TOKENS).then_some(&m.tiles);
        if let Some(t) = tiles {
            moe_group(ctx, rec, &m.ids, experts, t)?;
        }
        let ids = &m.ids;
        let gate_up_bias = self.gate_up_bias.as_ref();
        moe_matmul(ctx, rec, &a.xn, &self.gate_up, experts, ids, tiles, &m.act, gate, gate_up_bias)?;
        let down_bias = self.down_bias.as_ref();
        moe_matmul(ctx, rec, &m.act, &self.down, experts, ids, tiles, &m.out, Epilogue::None, down_bias)?;
        moe_combine(ctx, rec, &m.out, &m.weights, &a.proj, self.shared.is_some())
    }
}
