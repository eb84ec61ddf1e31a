//! The paged KV cache on the GPU: writing new K/V rows into their slots (shaders/kv_write.wgsl)
//! and attention over the pages: flash attention in the GPU families, whose cache is in
//! storage buffers (shaders/flash_attention.wgsl), and the CPU family's kernel over textures
//! (shaders/paged_attention.wgsl).
//!
//! A slot is one token's K (or V) row: `slot = block * block_size + offset`. Block tables come
//! from `kv/`, the single owner of KV memory, and are trusted here: the kernels do not re-check
//! that a table's blocks belong to the layer's slot range.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::kernels::rope::RopePairing;
use crate::gpu::pipelines::{KvSource, XSource, attention_query_heads};
use crate::gpu::recording::{Resource, flat_grid};
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant, TensorPart};
use crate::quant::DType;

shader_params!(RopeKvParams {
    num_tokens: u32,
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    row_stride: u32,
    k_col: u32,
    v_col: u32,
    neox: u32,
    table_rows: u32,
    cache_offset: u32,
    num_slots: u32,
    rope_dim: u32,
});
shader_params!(AttentionParams {
    num_tokens: u32,
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    max_blocks_per_seq: u32,
    cache_offset: u32,
    window: u32,
    scale: f32,
    q_stride: u32,
    split_min: u32,
    token0: u32,
    q_row0: u32,
    has_sinks: u32,
    rows: u32, // query rows a workgroup of flash attention takes (at most its tile's)
});
shader_params!(MergeParams { num_heads: u32, head_dim: u32, window: u32, split_min: u32, has_sinks: u32 });

/// Split-K attention: the most workgroups one query token's context is shared among
/// (`SPLITS` in shaders/shared/attention_splits.wgsl), and the fewest positions each takes.
/// On a GPU a decode step has only heads × sequences workgroups of attention; splitting a long
/// context fills the device. A token with at most `SPLIT_MIN_POSITIONS` positions is not split.
pub const ATTENTION_SPLITS: usize = 8;
pub const SPLIT_MIN_POSITIONS: usize = 256;

/// Columns of the (tokens, _) F32 tensor [`paged_attention`] leaves split partial results in:
/// with `split`, one (max, sum, 0, 0) and a head_dim-wide sum per head and split; without, 4
/// (bound, never written).
pub fn attention_partials_cols(split: bool, num_heads: usize, head_dim: usize) -> usize {
    if split { num_heads * ATTENTION_SPLITS * (head_dim + 4) } else { 4 }
}

/// Largest head_dim attention is compiled for (Gemma 4's full-attention layers): the CPU
/// family's query and output live in HD/4 vec4 registers per lane, merged 64 vec4s at a time;
/// flash attention's tiles are sized for it within WebGPU's 16 KiB of workgroup memory
/// ([`crate::gpu::flash_tile`]), and its split-K merge joins a head's vec4s in turns of 64.
pub const MAX_HEAD_DIM: usize = 512;

/// One layer's view of the paged cache: K and V tensors of shape (total_slots, num_kv_heads,
/// head_dim), both F32 or both F16, of which this layer owns slots `first_slot .. first_slot +
/// num_slots`.
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'a> {
    pub k_cache: &'a GpuTensor,
    pub v_cache: &'a GpuTensor,
    pub block_size: usize,
    pub first_slot: usize,
    pub num_slots: usize,
}

impl PagedKv<'_> {
    fn check(&self, op: &'static str) -> Result<(usize, usize)> {
        // An f32 cache, or an f16 one (half the memory; the kernels widen on load).
        let dtype = if self.k_cache.dtype() == DType::F16 { DType::F16 } else { DType::F32 };
        expect(op, "k_cache", self.k_cache, dtype, &[None, None, None])?;
        let shape = self.k_cache.shape();
        expect(op, "v_cache", self.v_cache, dtype, &[Some(shape[0]), Some(shape[1]), Some(shape[2])])?;
        if !shape[2].is_multiple_of(4) {
            return Err(WeftError::shape(op, format!("head_dim must be a multiple of 4, got {}", shape[2])));
        }
        if self.block_size == 0
            || !self.num_slots.is_multiple_of(self.block_size)
            || self.first_slot + self.num_slots > shape[0]
        {
            return Err(WeftError::shape(
                op,
                format!(
                    "slots {}..{} in blocks of {} do not fit a cache of {} slots",
                    self.first_slot,
                    self.first_slot + self.num_slots,
                    self.block_size,
                    shape[0]
                ),
            ));
        }
        Ok((shape[1], shape[2]))
    }

    /// Where the layer starts, in vec4s (the kernels read and write the cache four floats at a
    /// time).
    fn cache_offset(&self, op: &'static str) -> Result<u32> {
        u32_of(op, "cache offset", self.first_slot * self.k_cache.row_elems() / 4)
    }

    /// The cache's storage, as the KV kernels' variant names it.
    fn source(&self) -> KvSource {
        if self.k_cache.parts().first().is_some_and(|p| p.in_texture()) { KvSource::Texture } else { KvSource::Storage }
    }

    /// Whether the cache holds halves.
    fn f16(&self) -> bool {
        self.k_cache.dtype() == DType::F16
    }
}

/// Which keys a query token attends to: the mask mode of [`paged_attention`], carried by each
/// token's `token_info` row, (sequence, last position it sees).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionMask {
    /// Positions up to the token's own (decoders).
    Causal,
    /// Every position of its sequence, before and after it (encoders, whose whole prompt runs
    /// in one step, so the keys after a token are in the cache when it attends).
    Bidirectional,
}

impl AttentionMask {
    /// The `token_info` row of the token at `pos` of sequence `seq` (its index in the step),
    /// whose positions in this step end before `end`.
    pub fn token_info(self, seq: usize, pos: usize, end: usize) -> [u32; 2] {
        match self {
            AttentionMask::Causal => [seq as u32, pos as u32],
            AttentionMask::Bidirectional => [seq as u32, end.saturating_sub(1) as u32],
        }
    }
}

/// The layout of a step's fused q/k/v activations: each token's row holds `num_heads` query
/// heads from column 0, then `num_kv_heads` key heads, then as many value heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QkvLayout {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl QkvLayout {
    /// Columns of one token's row.
    pub fn row_stride(&self) -> usize {
        (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
    }
}

/// Record RoPE on qkv's query heads (in place) and key heads, and write the rotated keys and
/// the values into the cache slots named by slots (num_tokens) U32 (a slot past the cache
/// writes nothing). qkv (num_tokens, layout.row_stride()) F32; positions (num_tokens) U32;
/// angles from cos_sin (table_rows, rope_dim / 2, 2) F32: its width says how many leading
/// dimensions of each head rotate (rope_dim, even, at most head_dim); the rest pass through.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write(
    ctx: &GpuContext,
    rec: &mut Recording,
    qkv: &GpuTensor,
    layout: QkvLayout,
    positions: &GpuTensor,
    cos_sin: &GpuTensor,
    pairing: RopePairing,
    slots: &GpuTensor,
    cache: &PagedKv<'_>,
) -> Result<()> {
    const OP: &str = "rope_kv_write";
    let (num_kv_heads, head_dim) = cache.check(OP)?;
    if layout.num_kv_heads != num_kv_heads || layout.head_dim != head_dim {
        return Err(WeftError::shape(
            OP,
            format!(
                "qkv has {} KV heads of {} dims; the cache holds {num_kv_heads} of {head_dim}",
                layout.num_kv_heads, layout.head_dim
            ),
        ));
    }
    expect(OP, "qkv", qkv, DType::F32, &[None, Some(layout.row_stride())])?;
    let num_tokens = qkv.shape()[0];
    expect(OP, "positions", positions, DType::U32, &[Some(num_tokens)])?;
    expect(OP, "cos_sin", cos_sin, DType::F32, &[None, None, Some(2)])?;
    let rope_dim = 2 * cos_sin.shape()[1];
    if rope_dim == 0 || rope_dim > head_dim {
        return Err(WeftError::shape(
            OP,
            format!(
                "cos_sin rotates {rope_dim} dimensions (its width · 2); a head has {head_dim}, and 2 at least rotate"
            ),
        ));
    }
    expect(OP, "slots", slots, DType::U32, &[Some(num_tokens)])?;
    let q_cols = layout.num_heads * head_dim;
    let params = RopeKvParams {
        num_tokens: u32_of(OP, "num_tokens", num_tokens)?,
        num_heads: u32_of(OP, "num_heads", layout.num_heads)?,
        num_kv_heads: u32_of(OP, "num_kv_heads", num_kv_heads)?,
        head_dim: u32_of(OP, "head_dim", head_dim)?,
        row_stride: u32_of(OP, "row stride", layout.row_stride())?,
        k_col: u32_of(OP, "k column", q_cols)?,
        v_col: u32_of(OP, "v column", q_cols + num_kv_heads * head_dim)?,
        neox: u32::from(pairing == RopePairing::Neox),
        table_rows: u32_of(OP, "table rows", cos_sin.shape()[0])?,
        cache_offset: cache.cache_offset(OP)?,
        num_slots: u32_of(OP, "num_slots", cache.num_slots)?,
        rope_dim: u32_of(OP, "rope_dim", rope_dim)?,
    };
    let bindings = [
        qkv.single_part(OP)?.resource(ctx)?,
        positions.single_part(OP)?.resource(ctx)?,
        cos_sin.single_part(OP)?.resource(ctx)?,
        slots.single_part(OP)?.resource(ctx)?,
        cache.k_cache.single_part(OP)?.resource(ctx)?,
        cache.v_cache.single_part(OP)?.resource(ctx)?,
    ];
    let pairs = num_tokens * (layout.num_heads * rope_dim / 2 + num_kv_heads * head_dim / 4);
    let variant = ShaderVariant::kv("rope_kv_write", cache.source(), cache.f16());
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, flat_grid(pairs, 64))?;
    Ok(())
}

/// How many tokens' queries one uniform window holds, where attention reads them from windows:
/// on CPU drivers, which keep the cache in textures (a workgroup-uniform load from a uniform
/// binding is one load and a broadcast there, a storage load a loop over the lanes), when `qkv`
/// has room for windows. Windows take a multiple of the rows whose bytes make a uniform offset,
/// so every window starts at one.
fn q_window_tokens(ctx: &GpuContext, kv_in: KvSource, qkv: &TensorPart, row_stride: usize) -> Option<usize> {
    if kv_in != KvSource::Texture {
        return None;
    }
    let row_bytes = (row_stride * 4) as u64;
    let align = u64::from(ctx.limits().min_uniform_buffer_offset_alignment);
    qkv.window_rows(ctx, row_bytes, (align / gcd(align, row_bytes)) as usize)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Record attention of the query heads of qkv (num_tokens, layout.row_stride()) F32 (as
/// [`rope_kv_write`] left them) over the paged cache into out (num_tokens, num_heads · head_dim). block_tables (num_seqs, max_blocks_per_seq) U32 maps each sequence's
/// logical blocks to physical ones; token_info (num_tokens, 2) U32 gives each query token's
/// (sequence index, last position it sees): its own position for causal attention, its
/// sequence's last for bidirectional ([`AttentionMask::token_info`]). `window` limits attention
/// to the `window` positions up to that last one.
/// `partials` (num_tokens, [`attention_partials_cols`]) chooses split-K for a cache in storage
/// buffers: with room for the splits, contexts over [`SPLIT_MIN_POSITIONS`] are shared among
/// workgroups and joined by a second pass (shaders/attention_merge.wgsl); with 4 columns every
/// context takes one. A cache in textures (the CPU family, whose driver's threads the heads and
/// tokens keep busy) never splits, and leaves the partials alone. When the
/// block tables are too narrow for any context to pass [`SPLIT_MIN_POSITIONS`], nothing would
/// split: one pass without the idle split workgroups, and no merge (the same bits).
/// `sinks` (num_heads) F32, when given, is each head's attention-sink logit (gpt-oss): it joins
/// the softmax's denominator with no value; without it the kernels compute what they did
/// before sinks existed, bit for bit.
/// A cache in storage buffers (the GPU families) takes flash attention, refused where the
/// device's workgroup memory is too small for its tile ([`check_flash_memory`]); a cache in
/// textures (the CPU family) the CPU drivers' kernel. The two sum in different orders: each is
/// batch and chunk invariant, and they agree within the CPU reference's bound.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    ctx: &GpuContext,
    rec: &mut Recording,
    qkv: &GpuTensor,
    layout: QkvLayout,
    cache: &PagedKv<'_>,
    block_tables: &GpuTensor,
    token_info: &GpuTensor,
    out: &GpuTensor,
    partials: &GpuTensor,
    window: Option<usize>,
    scale: f32,
    sinks: Option<&GpuTensor>,
) -> Result<()> {
    const OP: &str = "paged_attention";
    let (num_kv_heads, head_dim) = cache.check(OP)?;
    expect(OP, "qkv", qkv, DType::F32, &[None, Some(layout.row_stride())])?;
    let (num_tokens, num_heads) = (qkv.shape()[0], layout.num_heads);
    if layout.num_kv_heads != num_kv_heads || layout.head_dim != head_dim {
        return Err(WeftError::shape(
            OP,
            format!("qkv's heads do not match the cache's {num_kv_heads} KV heads of {head_dim}"),
        ));
    }
    if head_dim > MAX_HEAD_DIM || num_heads % num_kv_heads != 0 {
        return Err(WeftError::shape(
            OP,
            format!(
                "needs head_dim <= {MAX_HEAD_DIM} and num_heads a multiple of num_kv_heads; got \
                 head_dim {head_dim}, {num_heads} heads, {num_kv_heads} KV heads"
            ),
        ));
    }
    expect(OP, "out", out, DType::F32, &[Some(num_tokens), Some(num_heads * head_dim)])?;
    expect(OP, "block_tables", block_tables, DType::U32, &[None, None])?;
    expect(OP, "token_info", token_info, DType::U32, &[Some(num_tokens), Some(2)])?;
    expect(OP, "partials", partials, DType::F32, &[Some(num_tokens), None])?;
    if let Some(sinks) = sinks {
        expect(OP, "sinks", sinks, DType::F32, &[Some(num_heads)])?;
    }
    let room = partials.shape()[1] == attention_partials_cols(true, num_heads, head_dim);
    if !room && partials.shape()[1] != attention_partials_cols(false, num_heads, head_dim) {
        return Err(WeftError::shape(
            OP,
            format!(
                "partials need {} columns to split contexts or 4 not to; got {}",
                attention_partials_cols(true, num_heads, head_dim),
                partials.shape()[1]
            ),
        ));
    }
    // A token sees at most its sequence's blocks: the tables' width bounds every context.
    let split =
        room && cache.source() == KvSource::Storage && block_tables.shape()[1] * cache.block_size > SPLIT_MIN_POSITIONS;
    let split_min = if split { u32_of(OP, "split_min", SPLIT_MIN_POSITIONS)? } else { 0 };
    let params = AttentionParams {
        num_tokens: u32_of(OP, "num_tokens", num_tokens)?,
        num_heads: u32_of(OP, "num_heads", num_heads)?,
        num_kv_heads: u32_of(OP, "num_kv_heads", num_kv_heads)?,
        head_dim: u32_of(OP, "head_dim", head_dim)?,
        block_size: u32_of(OP, "block_size", cache.block_size)?,
        max_blocks_per_seq: u32_of(OP, "max_blocks_per_seq", block_tables.shape()[1])?,
        cache_offset: cache.cache_offset(OP)?,
        window: u32_of(OP, "window", window.unwrap_or(0))?,
        scale,
        q_stride: u32_of(OP, "row stride", layout.row_stride())?,
        split_min,
        token0: 0,
        q_row0: 0,
        has_sinks: u32::from(sinks.is_some()),
        rows: 0,
    };
    // Without sinks the binding is never read: any read-only buffer of the dispatch fills it.
    let sinks_res = sinks.unwrap_or(token_info).single_part(OP)?.resource(ctx)?;
    // Bindings 2..=6 of both kernels: the cache, the tables and the output.
    let kv = [
        cache.k_cache.single_part(OP)?.resource(ctx)?,
        cache.v_cache.single_part(OP)?.resource(ctx)?,
        block_tables.single_part(OP)?.resource(ctx)?,
        token_info.single_part(OP)?.resource(ctx)?,
        out.single_part(OP)?.resource(ctx)?,
    ];
    let head_dim16 = u16::try_from(head_dim).unwrap_or(u16::MAX);
    let splits = if split { ATTENTION_SPLITS as u32 } else { 1 };
    let qkv_part = qkv.single_part(OP)?;
    if cache.source() == KvSource::Storage {
        // The GPU families: flash attention, R rows of (token, query head) a workgroup.
        check_flash_memory(head_dim, ctx.limits().max_compute_workgroup_storage_size)?;
        let variant = ShaderVariant::flash(cache.f16(), head_dim16);
        let group = num_heads / num_kv_heads;
        // A decode step (a token a sequence) takes a token's G rows a workgroup: rows of several
        // sequences in one workgroup would walk their keys in turn, with most rows idle. Other
        // steps fill the tile, whose rows share each staged tile. Rows change no bits.
        let decode = num_tokens <= block_tables.shape()[0];
        let rows = if decode { group.min(usize::from(variant.tile[2])) } else { usize::from(variant.tile[2]) };
        let groups = u32_of(OP, "row blocks", (num_tokens * group).div_ceil(rows))?;
        let grid = [groups, params.num_kv_heads, splits];
        let params = AttentionParams { rows: rows as u32, ..params };
        let tail = [partials.single_part(OP)?.resource(ctx)?, sinks_res.clone()];
        let bindings = std::iter::once(qkv_part.resource(ctx)?).chain(kv).chain(tail).collect();
        ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings, None, grid)?;
    } else {
        // Its binding 7 is the sinks: it has no partials.
        let with = |q: Resource| -> Vec<Resource> {
            std::iter::once(q).chain(kv.iter().cloned()).chain([sinks_res.clone()]).collect()
        };
        attention_on_cpu_driver(ctx, rec, &params, qkv_part, layout, cache, &with)?;
    }
    if split {
        let merge = MergeParams {
            num_heads: params.num_heads,
            head_dim: params.head_dim,
            window: params.window,
            split_min,
            has_sinks: params.has_sinks,
        };
        let bindings = [
            token_info.single_part(OP)?.resource(ctx)?,
            partials.single_part(OP)?.resource(ctx)?,
            out.single_part(OP)?.resource(ctx)?,
            sinks_res,
        ];
        let grid = [params.num_heads, params.num_tokens, 1];
        let variant = ShaderVariant::plain("attention_merge");
        ctx.dispatch(rec, variant, bytemuck::bytes_of(&merge), bindings.into(), None, grid)?;
    }
    Ok(())
}

/// The CPU family's attention (shaders/paged_attention.wgsl) over a cache in textures: the
/// query heads of a KV head grouped where the driver's threads stay busy, and the queries read
/// from uniform windows of whole rows where qkv has room for them, a dispatch each.
#[allow(clippy::too_many_arguments)]
fn attention_on_cpu_driver(
    ctx: &GpuContext,
    rec: &mut Recording,
    params: &AttentionParams,
    qkv_part: &TensorPart,
    layout: QkvLayout,
    cache: &PagedKv<'_>,
    with: &dyn Fn(Resource) -> Vec<Resource>,
) -> Result<()> {
    const OP: &str = "paged_attention";
    let num_tokens = params.num_tokens as usize;
    let group = layout.num_heads / layout.num_kv_heads;
    let threads = ctx.cpu_driver().threads;
    let heads = attention_query_heads(layout.num_heads, group, layout.head_dim, num_tokens, threads);
    let head_dim16 = u16::try_from(layout.head_dim).unwrap_or(u16::MAX);
    let variant = ShaderVariant::attention(cache.source(), cache.f16(), head_dim16, heads);
    let grid = |tokens: usize| [params.num_heads / u32::from(heads), tokens as u32, 1];
    match q_window_tokens(ctx, cache.source(), qkv_part, layout.row_stride()) {
        Some(per_window) => {
            let row_bytes = (layout.row_stride() * 4) as u64;
            let variant = ShaderVariant { x_in: XSource::Uniform, ..variant };
            for token0 in (0..num_tokens).step_by(per_window) {
                let (window, offset) = qkv_part.window(ctx, token0 as u64 * row_bytes).ok_or_else(|| {
                    WeftError::shape(OP, format!("qkv has no room for a uniform window at row {token0}"))
                })?;
                let token0 = u32_of(OP, "token", token0)?;
                let p = AttentionParams { token0, q_row0: token0, ..*params };
                let tokens = per_window.min(num_tokens - token0 as usize);
                ctx.dispatch(rec, variant, bytemuck::bytes_of(&p), with(window), Some(offset), grid(tokens))?;
            }
        }
        None => {
            let q = qkv_part.resource(ctx)?;
            ctx.dispatch(rec, variant, bytemuck::bytes_of(params), with(q), None, grid(num_tokens))?;
        }
    }
    Ok(())
}

/// Fails unless flash attention's workgroup memory at `head_dim`
/// ([`crate::gpu::flash_workgroup_bytes`]) fits a device's `limit` of bytes a workgroup.
pub fn check_flash_memory(head_dim: usize, limit: u32) -> Result<()> {
    let need = crate::gpu::flash_workgroup_bytes(head_dim);
    if need > limit as usize {
        return Err(WeftError::Unsupported(format!(
            "flash attention at head size {head_dim} needs {need} bytes of workgroup memory; this device allows {limit}"
        )));
    }
    Ok(())
}
