//! The paged KV cache on the GPU: writing new K/V rows into their slots (shaders/kv_write.wgsl)
//! and attention over the pages (shaders/paged_attention.wgsl).
//!
//! A slot is one token's K (or V) row: `slot = block * block_size + offset`. Block tables come
//! from `kv/`, the single owner of KV memory, and are trusted here: the kernels do not re-check
//! that a table's blocks belong to the layer's slot range.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::recording::flat_grid;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(KvWriteParams { num_tokens: u32, kv_dim: u32, cache_offset: u32, num_slots: u32 });
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
});

/// Largest head_dim the attention kernel holds in registers (`MAX_HEAD_DIM` in the shader).
pub const MAX_HEAD_DIM: usize = 128;

/// One layer's view of the paged cache: K and V tensors of shape (total_slots, num_kv_heads,
/// head_dim) F32, of which this layer owns slots `first_slot .. first_slot + num_slots`.
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
        expect(op, "k_cache", self.k_cache, DType::F32, &[None, None, None])?;
        let shape = self.k_cache.shape();
        expect(op, "v_cache", self.v_cache, DType::F32, &[Some(shape[0]), Some(shape[1]), Some(shape[2])])?;
        if self.block_size == 0 || !self.num_slots.is_multiple_of(self.block_size) || self.first_slot + self.num_slots > shape[0]
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

    fn cache_offset(&self, op: &'static str) -> Result<u32> {
        u32_of(op, "cache offset", self.first_slot * self.k_cache.row_elems())
    }
}

/// Record writing k and v (num_tokens, num_kv_heads, head_dim) F32 into the slots named by
/// slots (num_tokens) U32; a slot of `u32::MAX` (padding) writes nothing.
pub fn kv_write(
    ctx: &GpuContext,
    rec: &mut Recording,
    k: &GpuTensor,
    v: &GpuTensor,
    slots: &GpuTensor,
    cache: &PagedKv<'_>,
) -> Result<()> {
    const OP: &str = "kv_write";
    let (num_kv_heads, head_dim) = cache.check(OP)?;
    expect(OP, "k", k, DType::F32, &[None, Some(num_kv_heads), Some(head_dim)])?;
    let num_tokens = k.shape()[0];
    expect(OP, "v", v, DType::F32, &[Some(num_tokens), Some(num_kv_heads), Some(head_dim)])?;
    expect(OP, "slots", slots, DType::U32, &[Some(num_tokens)])?;
    let kv_dim = num_kv_heads * head_dim;
    let params = KvWriteParams {
        num_tokens: u32_of(OP, "num_tokens", num_tokens)?,
        kv_dim: u32_of(OP, "kv_dim", kv_dim)?,
        cache_offset: cache.cache_offset(OP)?,
        num_slots: u32_of(OP, "num_slots", cache.num_slots)?,
    };
    let bindings = [
        k.single_part(OP)?.binding(ctx, k.row_bytes())?,
        v.single_part(OP)?.binding(ctx, v.row_bytes())?,
        slots.single_part(OP)?.binding(ctx, slots.row_bytes())?,
        cache.k_cache.single_part(OP)?.binding(ctx, cache.k_cache.row_bytes())?,
        cache.v_cache.single_part(OP)?.binding(ctx, cache.v_cache.row_bytes())?,
    ];
    let variant = ShaderVariant { kernel: "kv_write", weight: None };
    rec.push(ctx.dispatch(variant, bytemuck::bytes_of(&params), &bindings, flat_grid(num_tokens * kv_dim, 256))?);
    Ok(())
}

/// Record causal attention of q (num_tokens, num_heads, head_dim) F32 over the paged cache into
/// out (same shape). block_tables (num_seqs, max_blocks_per_seq) U32 maps each sequence's
/// logical blocks to physical ones; token_info (num_tokens, 2) U32 gives each query token's
/// (sequence index, position). `window` limits attention to the last `window` positions.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    ctx: &GpuContext,
    rec: &mut Recording,
    q: &GpuTensor,
    cache: &PagedKv<'_>,
    block_tables: &GpuTensor,
    token_info: &GpuTensor,
    out: &GpuTensor,
    window: Option<usize>,
    scale: f32,
) -> Result<()> {
    const OP: &str = "paged_attention";
    let (num_kv_heads, head_dim) = cache.check(OP)?;
    expect(OP, "q", q, DType::F32, &[None, None, Some(head_dim)])?;
    let (num_tokens, num_heads) = (q.shape()[0], q.shape()[1]);
    if head_dim > MAX_HEAD_DIM || num_heads % num_kv_heads != 0 {
        return Err(WeftError::shape(
            OP,
            format!(
                "needs head_dim <= {MAX_HEAD_DIM} and num_heads a multiple of num_kv_heads; got \
                 head_dim {head_dim}, {num_heads} heads, {num_kv_heads} KV heads"
            ),
        ));
    }
    expect(OP, "out", out, DType::F32, &[Some(num_tokens), Some(num_heads), Some(head_dim)])?;
    expect(OP, "block_tables", block_tables, DType::U32, &[None, None])?;
    expect(OP, "token_info", token_info, DType::U32, &[Some(num_tokens), Some(2)])?;
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
    };
    let bindings = [
        q.single_part(OP)?.binding(ctx, q.row_bytes())?,
        cache.k_cache.single_part(OP)?.binding(ctx, cache.k_cache.row_bytes())?,
        cache.v_cache.single_part(OP)?.binding(ctx, cache.v_cache.row_bytes())?,
        block_tables.single_part(OP)?.binding(ctx, block_tables.row_bytes())?,
        token_info.single_part(OP)?.binding(ctx, token_info.row_bytes())?,
        out.single_part(OP)?.binding(ctx, out.row_bytes())?,
    ];
    let variant = ShaderVariant { kernel: "paged_attention", weight: None };
    let grid = [params.num_heads, params.num_tokens, 1];
    rec.push(ctx.dispatch(variant, bytemuck::bytes_of(&params), &bindings, grid)?);
    Ok(())
}
