//! The kernels of Mamba2 (state-space) layers: the causal depthwise convolution over the
//! conv window ([`ssm_conv`], which also runs LFM2's gated short convolution), the selective-state scan token by token ([`ssm_scan`]) or by
//! chunks of rows in its SSD form ([`ssd_scan`]), and the gated, grouped RMSNorm
//! ([`gated_rms_norm`]), and Qwen3.5's Gated DeltaNet recurrence ([`gated_delta_net`]), which
//! shares their per-sequence table and state slots. The convolution and the scans continue each sequence from its
//! recurrent-state slot and leave the new state there; `seqs` says which rows are whose.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(ConvParams { channels: u32, kernel: u32, x_stride: u32, x_offset: u32, gated: u32 });
shader_params!(ScanParams { heads: u32, head_dim: u32, state_size: u32, groups: u32, dt_stride: u32, dt_offset: u32 });
shader_params!(SsdParams {
    heads: u32,
    head_dim: u32,
    state_size: u32,
    groups: u32,
    q: u32,
    num_chunks: u32,
    dt_stride: u32,
    dt_offset: u32,
});
shader_params!(GatedNormParams { rows: u32, n: u32, z_stride: u32, z_offset: u32, eps: f32, gate_after: u32 });
shader_params!(DeltaParams {
    k_heads: u32,
    v_heads: u32,
    head_k: u32,
    head_v: u32,
    ba_stride: u32,
    ba_offset: u32,
    tiled: u32,
});

/// Invocations per workgroup of the conv and scan kernels (their WGSL `WG`).
const WORKGROUP: usize = 64;
/// The longest conv kernel (its window is held in registers; WGSL `MAX_KERNEL`).
pub const MAX_CONV_KERNEL: usize = 8;

/// Columns of the [`SeqStates`] table.
pub const SEQ_STATE_COLS: usize = 6;
/// The table's entry for "no snapshot slot".
pub const NO_SLOT: u32 = u32::MAX;

/// Which rows of a step belong to which sequence, and where its state lives: `seqs`
/// (num_seqs, 6) U32 holds, per sequence, its first row, its number of rows, its own state slot,
/// its start position (0: the state starts from zero), the slot its state is read from (its own,
/// or a prefix snapshot being restored) and a snapshot slot its final state is also written to
/// ([`NO_SLOT`]: none).
pub struct SeqStates<'a> {
    pub seqs: &'a GpuTensor,
    pub num_seqs: usize,
}

/// Columns `offset..offset + width` of every row of `t`, checked to exist.
fn columns(op: &'static str, name: &str, t: &GpuTensor, rows: usize, offset: usize, width: usize) -> Result<usize> {
    expect(op, name, t, DType::F32, &[Some(rows), None])?;
    let stride = t.shape()[1];
    if offset + width > stride {
        return Err(WeftError::shape(
            op,
            format!("{name} has {stride} columns; columns {offset}..{} were asked for", offset + width),
        ));
    }
    Ok(stride)
}

fn seq_table(op: &'static str, s: &SeqStates<'_>) -> Result<u32> {
    expect(op, "seqs", s.seqs, DType::U32, &[Some(s.num_seqs), Some(SEQ_STATE_COLS)])?;
    u32_of(op, "num_seqs", s.num_seqs)
}

/// What the convolution reads from its input columns and does with its sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvForm {
    /// Mamba2's: `u[t, c] = x[t, x_offset + c]`, `y = silu(conv(u))`.
    Silu,
    /// LFM2's short convolution: B, C and x side by side from column `x_offset` (each `channels`
    /// wide), `u = B · x` and `y = C · conv(u)`; the window keeps the products B · x.
    Gated,
}

/// Record `y[t, c] = silu(bias[c] + Σ_j weight[c, j] · u[t - kernel + 1 + j, c])` with
/// `u[t, c] = x[t, x_offset + c]` (or LFM2's gated form, see [`ConvForm`]), continuing each
/// sequence's window from `conv_state` (slots, kernel - 1, channels) and leaving its last
/// kernel - 1 inputs there (see [`SeqStates`]). x (tokens, _) F32, weight (channels, kernel)
/// F32, bias (channels) F32, y (tokens, channels) F32.
#[allow(clippy::too_many_arguments)]
pub fn ssm_conv(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    x_offset: usize,
    form: ConvForm,
    weight: &GpuTensor,
    bias: &GpuTensor,
    seqs: &SeqStates<'_>,
    conv_state: &GpuTensor,
    y: &GpuTensor,
) -> Result<()> {
    const OP: &str = "ssm_conv";
    expect(OP, "weight", weight, DType::F32, &[None, None])?;
    let (channels, kernel) = (weight.shape()[0], weight.shape()[1]);
    if !(2..=MAX_CONV_KERNEL).contains(&kernel) {
        return Err(WeftError::shape(OP, format!("conv kernel {kernel}; 2 to {MAX_CONV_KERNEL} are supported")));
    }
    expect(OP, "y", y, DType::F32, &[None, Some(channels)])?;
    let rows = y.shape()[0];
    let read = if form == ConvForm::Gated { 3 * channels } else { channels };
    let x_stride = columns(OP, "x", x, rows, x_offset, read)?;
    expect(OP, "bias", bias, DType::F32, &[Some(channels)])?;
    expect(OP, "conv_state", conv_state, DType::F32, &[None, Some(kernel - 1), Some(channels)])?;
    let num_seqs = seq_table(OP, seqs)?;
    let params = ConvParams {
        channels: u32_of(OP, "channels", channels)?,
        kernel: kernel as u32,
        x_stride: u32_of(OP, "x_stride", x_stride)?,
        x_offset: u32_of(OP, "x_offset", x_offset)?,
        gated: u32::from(form == ConvForm::Gated),
    };
    let bindings = [
        x.single_part(OP)?.resource(ctx)?,
        weight.single_part(OP)?.resource(ctx)?,
        bias.single_part(OP)?.resource(ctx)?,
        seqs.seqs.single_part(OP)?.resource(ctx)?,
        conv_state.single_part(OP)?.resource(ctx)?,
        y.single_part(OP)?.resource(ctx)?,
    ];
    let grid = [channels.div_ceil(WORKGROUP) as u32, num_seqs, 1];
    ctx.dispatch(rec, ShaderVariant::plain("ssm_conv"), bytemuck::bytes_of(&params), bindings.into(), None, grid)
}

/// The shape of a Gated DeltaNet layer's recurrence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaShape {
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    /// v head h reads q/k head h % num_k_heads (llama.cpp's GGUF order) rather than
    /// h / (num_v_heads / num_k_heads) (transformers').
    pub v_heads_tiled: bool,
}

/// Record the Gated DeltaNet recurrence (see `shaders/gated_delta_net.wgsl`): qkv (tokens,
/// 2 · k_heads · head_k + v_heads · head_v) F32 holds the convolved q, k and v; the raw β
/// logit of v head h is `ba[t, ba_offset + h]` and its raw decay input `ba[t, ba_offset +
/// v_heads + h]`; a_neg (-exp(A_log)) and dt_bias (v_heads) F32; the state (slots, v_heads,
/// head_v, head_k) F32 is continued per sequence; y (tokens, v_heads · head_v) F32.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net(
    ctx: &GpuContext,
    rec: &mut Recording,
    shape: DeltaShape,
    qkv: &GpuTensor,
    ba: &GpuTensor,
    ba_offset: usize,
    a_neg: &GpuTensor,
    dt_bias: &GpuTensor,
    seqs: &SeqStates<'_>,
    state: &GpuTensor,
    y: &GpuTensor,
) -> Result<()> {
    const OP: &str = "gated_delta_net";
    let DeltaShape { num_k_heads, num_v_heads, head_k_dim, head_v_dim, v_heads_tiled } = shape;
    // The kernel reads q, k and the state four at a time.
    let fours = head_k_dim % 4 == 0 && head_v_dim % 4 == 0 && head_k_dim > 0 && head_v_dim > 0;
    if !fours || num_k_heads == 0 || num_v_heads % num_k_heads != 0 {
        return Err(WeftError::shape(
            OP,
            format!(
                "{num_k_heads} k heads of {head_k_dim}, {num_v_heads} v heads of {head_v_dim}: the v heads must be a \
                 multiple of the k heads and both head sizes multiples of 4"
            ),
        ));
    }
    let width = num_v_heads * head_v_dim;
    expect(OP, "y", y, DType::F32, &[None, Some(width)])?;
    let rows = y.shape()[0];
    expect(OP, "qkv", qkv, DType::F32, &[Some(rows), Some(2 * num_k_heads * head_k_dim + width)])?;
    let ba_stride = columns(OP, "ba", ba, rows, ba_offset, 2 * num_v_heads)?;
    expect(OP, "a_neg", a_neg, DType::F32, &[Some(num_v_heads)])?;
    expect(OP, "dt_bias", dt_bias, DType::F32, &[Some(num_v_heads)])?;
    expect(OP, "state", state, DType::F32, &[None, Some(num_v_heads), Some(head_v_dim), Some(head_k_dim)])?;
    let num_seqs = seq_table(OP, seqs)?;
    let params = DeltaParams {
        k_heads: u32_of(OP, "k_heads", num_k_heads)?,
        v_heads: u32_of(OP, "v_heads", num_v_heads)?,
        head_k: u32_of(OP, "head_k", head_k_dim)?,
        head_v: u32_of(OP, "head_v", head_v_dim)?,
        ba_stride: u32_of(OP, "ba_stride", ba_stride)?,
        ba_offset: u32_of(OP, "ba_offset", ba_offset)?,
        tiled: u32::from(v_heads_tiled),
    };
    let bindings = [
        qkv.single_part(OP)?.resource(ctx)?,
        ba.single_part(OP)?.resource(ctx)?,
        a_neg.single_part(OP)?.resource(ctx)?,
        dt_bias.single_part(OP)?.resource(ctx)?,
        seqs.seqs.single_part(OP)?.resource(ctx)?,
        state.single_part(OP)?.resource(ctx)?,
        y.single_part(OP)?.resource(ctx)?,
    ];
    let grid = [width.div_ceil(WORKGROUP) as u32, num_seqs, 1];
    ctx.dispatch(rec, ShaderVariant::plain("gated_delta_net"), bytemuck::bytes_of(&params), bindings.into(), None, grid)
}

/// The shape of a Mamba2 layer's scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanShape {
    pub num_heads: usize,
    pub head_dim: usize,
    pub state_size: usize,
    pub num_groups: usize,
}

/// Per-head parameters of the scan: a = -exp(A_log), d (the skip), dt_bias; each (heads) F32.
pub struct ScanWeights<'a> {
    pub a: &'a GpuTensor,
    pub d: &'a GpuTensor,
    pub dt_bias: &'a GpuTensor,
}

/// Record the selective scan (see `shaders/ssm_scan.wgsl`): xbc (tokens, heads · head_dim +
/// 2 · groups · state_size) F32 holds x, B and C side by side; the raw dt of head h is
/// `dt[t, dt_offset + h]`; the state (slots, heads, head_dim, state_size) F32 is continued per
/// sequence; y (tokens, heads · head_dim) F32.
#[allow(clippy::too_many_arguments)]
pub fn ssm_scan(
    ctx: &GpuContext,
    rec: &mut Recording,
    shape: ScanShape,
    xbc: &GpuTensor,
    dt: &GpuTensor,
    dt_offset: usize,
    w: &ScanWeights<'_>,
    seqs: &SeqStates<'_>,
    state: &GpuTensor,
    y: &GpuTensor,
) -> Result<()> {
    const OP: &str = "ssm_scan";
    let ScanShape { num_heads, head_dim, state_size, num_groups } = shape;
    let dt_stride = check_scan(OP, shape, xbc, dt, dt_offset, w, state, y)?;
    let inner = num_heads * head_dim;
    let num_seqs = seq_table(OP, seqs)?;
    let params = ScanParams {
        heads: u32_of(OP, "heads", num_heads)?,
        head_dim: u32_of(OP, "head_dim", head_dim)?,
        state_size: state_size as u32,
        groups: u32_of(OP, "groups", num_groups)?,
        dt_stride: u32_of(OP, "dt_stride", dt_stride)?,
        dt_offset: u32_of(OP, "dt_offset", dt_offset)?,
    };
    let bindings = [
        xbc.single_part(OP)?.resource(ctx)?,
        dt.single_part(OP)?.resource(ctx)?,
        w.a.single_part(OP)?.resource(ctx)?,
        w.d.single_part(OP)?.resource(ctx)?,
        w.dt_bias.single_part(OP)?.resource(ctx)?,
        seqs.seqs.single_part(OP)?.resource(ctx)?,
        state.single_part(OP)?.resource(ctx)?,
        y.single_part(OP)?.resource(ctx)?,
    ];
    let grid = [(inner / 4).div_ceil(WORKGROUP) as u32, num_seqs, 1];
    ctx.dispatch(rec, ShaderVariant::plain("ssm_scan"), bytemuck::bytes_of(&params), bindings.into(), None, grid)
}

/// The checks both scans make of their operands; returns dt's row stride.
#[allow(clippy::too_many_arguments)]
fn check_scan(
    op: &'static str,
    shape: ScanShape,
    xbc: &GpuTensor,
    dt: &GpuTensor,
    dt_offset: usize,
    w: &ScanWeights<'_>,
    state: &GpuTensor,
    y: &GpuTensor,
) -> Result<usize> {
    let ScanShape { num_heads, head_dim, state_size, num_groups } = shape;
    // The kernels read states, B, C and x four at a time, and run four channels of one head
    // per invocation.
    let fours = state_size % 4 == 0 && head_dim % 4 == 0;
    if !fours || state_size == 0 || num_groups == 0 || num_heads % num_groups != 0 {
        return Err(WeftError::shape(
            op,
            format!(
                "state size {state_size} and head size {head_dim} (multiples of 4 supported) with {num_heads} heads in {num_groups} groups"
            ),
        ));
    }
    let inner = num_heads * head_dim;
    expect(op, "y", y, DType::F32, &[None, Some(inner)])?;
    let rows = y.shape()[0];
    expect(op, "xbc", xbc, DType::F32, &[Some(rows), Some(inner + 2 * num_groups * state_size)])?;
    let dt_stride = columns(op, "dt", dt, rows, dt_offset, num_heads)?;
    for (name, t) in [("a", w.a), ("d", w.d), ("dt_bias", w.dt_bias)] {
        expect(op, name, t, DType::F32, &[Some(num_heads)])?;
    }
    expect(op, "state", state, DType::F32, &[None, Some(num_heads), Some(head_dim), Some(state_size)])?;
    Ok(dt_stride)
}

/// The chunks of a step's chunked scan ([`ssd_scan`]). `chunks` (num_chunks) U32 holds each
/// chunk's first row; a chunk is `rows_per_chunk` consecutive rows of one sequence. `runs` is
/// a [`SeqStates`] table whose "first row" and "rows" columns count chunks instead: each run is
/// consecutive chunks of one sequence, continuing the state it names and leaving it in its
/// slot (and snapshot slot).
pub struct SsdChunks<'a> {
    pub chunks: &'a GpuTensor,
    pub num_chunks: usize,
    pub rows_per_chunk: usize,
    pub runs: SeqStates<'a>,
}

/// The chunked scan's scratch space, for up to `chunks` chunks of `rows_per_chunk` rows:
/// `dtcs` (chunks · heads · rows_per_chunk, 4) F32 each row's (dt, cumulative log decay, weight
/// into the chunk's end state, 0), `m` (chunks · heads · rows_per_chunk², 1) F32 how each row
/// reaches each later row of its chunk, `states` (chunks, heads, head_dim, state_size) F32 what
/// each chunk adds to the state, then the state it starts from.
#[derive(Clone, Debug)]
pub struct SsdScratch {
    pub dtcs: GpuTensor,
    pub m: GpuTensor,
    pub states: GpuTensor,
}

impl SsdScratch {
    pub fn new(
        factory: &dyn crate::tensor::TensorFactory,
        shape: ScanShape,
        chunks: usize,
        rows_per_chunk: usize,
    ) -> Result<Self> {
        let ScanShape { num_heads, head_dim, state_size, .. } = shape;
        let (chunks, q) = (chunks.max(1), rows_per_chunk);
        Ok(SsdScratch {
            dtcs: factory.zeros(&[chunks * num_heads * q, 4], DType::F32)?,
            m: factory.zeros(&[chunks * num_heads * q * q, 1], DType::F32)?,
            states: factory.zeros(&[chunks, num_heads, head_dim, state_size], DType::F32)?,
        })
    }
}

/// Record the selective scan over whole chunks of rows in its SSD form (see
/// `shaders/ssd_chunk_*.wgsl` and `ssd_state_pass.wgsl`): the same result as [`ssm_scan`] over
/// those rows, up to rounding, with operands as there. Five dispatches: each row's dt and
/// decays, how each row reaches the later rows of its chunk (decayed C·B), each chunk's own
/// contribution to the state, the states passed from chunk to chunk (ending in the runs'
/// slots), and the outputs.
#[allow(clippy::too_many_arguments)]
pub fn ssd_scan(
    ctx: &GpuContext,
    rec: &mut Recording,
    shape: ScanShape,
    xbc: &GpuTensor,
    dt: &GpuTensor,
    dt_offset: usize,
    w: &ScanWeights<'_>,
    chunks: &SsdChunks<'_>,
    scratch: &SsdScratch,
    state: &GpuTensor,
    y: &GpuTensor,
) -> Result<()> {
    const OP: &str = "ssd_scan";
    let ScanShape { num_heads, head_dim, state_size, num_groups } = shape;
    let dt_stride = check_scan(OP, shape, xbc, dt, dt_offset, w, state, y)?;
    let (num_chunks, q) = (chunks.num_chunks, chunks.rows_per_chunk);
    if q < 2 {
        return Err(WeftError::shape(OP, format!("chunks of {q} rows; at least 2")));
    }
    expect(OP, "chunks", chunks.chunks, DType::U32, &[Some(num_chunks)])?;
    let num_runs = seq_table(OP, &chunks.runs)?;
    expect(OP, "dtcs", &scratch.dtcs, DType::F32, &[None, Some(4)])?;
    expect(OP, "m", &scratch.m, DType::F32, &[None, Some(1)])?;
    expect(OP, "states", &scratch.states, DType::F32, &[None, Some(num_heads), Some(head_dim), Some(state_size)])?;
    let room = [
        scratch.dtcs.shape()[0] / (num_heads * q),
        scratch.m.shape()[0] / (num_heads * q * q),
        scratch.states.shape()[0],
    ];
    if room.iter().any(|&r| r < num_chunks) {
        return Err(WeftError::shape(OP, format!("scratch for {room:?} chunks of {q} rows; {num_chunks} asked for")));
    }
    if num_chunks == 0 {
        return Ok(());
    }
    let params = SsdParams {
        heads: u32_of(OP, "heads", num_heads)?,
        head_dim: u32_of(OP, "head_dim", head_dim)?,
        state_size: u32_of(OP, "state_size", state_size)?,
        groups: u32_of(OP, "groups", num_groups)?,
        q: u32_of(OP, "rows_per_chunk", q)?,
        num_chunks: u32_of(OP, "num_chunks", num_chunks)?,
        dt_stride: u32_of(OP, "dt_stride", dt_stride)?,
        dt_offset: u32_of(OP, "dt_offset", dt_offset)?,
    };
    let params = bytemuck::bytes_of(&params);
    let r = |t: &GpuTensor| t.single_part(OP)?.resource(ctx);
    let n = num_chunks as u32;
    let quads = (num_heads * head_dim * state_size / 4).div_ceil(WORKGROUP) as u32;
    let passes = [
        (
            "ssd_chunk_dt",
            vec![r(dt)?, r(w.a)?, r(w.dt_bias)?, r(chunks.chunks)?, r(&scratch.dtcs)?],
            [(num_chunks * num_heads).div_ceil(WORKGROUP) as u32, 1, 1],
        ),
        (
            "ssd_chunk_cb",
            vec![r(xbc)?, r(chunks.chunks)?, r(&scratch.dtcs)?, r(&scratch.m)?],
            [(q * q).div_ceil(WORKGROUP) as u32, num_heads as u32, n],
        ),
        ("ssd_chunk_state", vec![r(xbc)?, r(chunks.chunks)?, r(&scratch.dtcs)?, r(&scratch.states)?], [quads, n, 1]),
        (
            "ssd_state_pass",
            vec![r(chunks.runs.seqs)?, r(&scratch.dtcs)?, r(&scratch.states)?, r(state)?],
            [quads, num_runs, 1],
        ),
        (
            "ssd_chunk_scan",
            vec![r(xbc)?, r(chunks.chunks)?, r(&scratch.dtcs)?, r(&scratch.m)?, r(&scratch.states)?, r(w.d)?, r(y)?],
            [(q * head_dim / 4).div_ceil(WORKGROUP) as u32, num_heads as u32, n],
        ),
    ];
    for (kernel, bindings, grid) in passes {
        ctx.dispatch(rec, ShaderVariant::plain(kernel), params, bindings, None, grid)?;
    }
    Ok(())
}

/// Where [`gated_rms_norm`] applies its gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateAt {
    /// Mamba2's: `rms_norm(x · silu(z)) · weight`.
    Input,
    /// Qwen3.5's Gated DeltaNet: `rms_norm(x) · weight · silu(z)`.
    Output,
}

/// Record `y = rms_norm_per_group(x · silu(z)) · weight` over groups of `group_size` columns
/// (or with the gate after the norm, `at`), with the gate read from `z[r, z_offset + i]`: x
/// and y (rows, groups · group_size) F32, z (rows, _) F32, weight (groups · group_size) F32.
#[allow(clippy::too_many_arguments)]
pub fn gated_rms_norm(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    z: &GpuTensor,
    z_offset: usize,
    weight: &GpuTensor,
    group_size: usize,
    y: &GpuTensor,
    eps: f32,
    at: GateAt,
) -> Result<()> {
    const OP: &str = "gated_rms_norm";
    expect(OP, "x", x, DType::F32, &[None, None])?;
    let (rows, width) = (x.shape()[0], x.shape()[1]);
    if group_size == 0 || width % group_size != 0 {
        return Err(WeftError::shape(OP, format!("{width} columns do not split into groups of {group_size}")));
    }
    let z_stride = columns(OP, "z", z, rows, z_offset, width)?;
    expect(OP, "weight", weight, DType::F32, &[Some(width)])?;
    expect(OP, "y", y, DType::F32, &[Some(rows), Some(width)])?;
    let params = GatedNormParams {
        rows: u32_of(OP, "rows", rows)?,
        n: u32_of(OP, "group_size", group_size)?,
        z_stride: u32_of(OP, "z_stride", z_stride)?,
        z_offset: u32_of(OP, "z_offset", z_offset)?,
        eps,
        gate_after: u32::from(at == GateAt::Output),
    };
    let bindings = [
        x.single_part(OP)?.resource(ctx)?,
        z.single_part(OP)?.resource(ctx)?,
        weight.single_part(OP)?.resource(ctx)?,
        y.single_part(OP)?.resource(ctx)?,
    ];
    let grid = [params.rows, (width / group_size) as u32, 1];
    ctx.dispatch(rec, ShaderVariant::plain("gated_rms_norm"), bytemuck::bytes_of(&params), bindings.into(), None, grid)
}
