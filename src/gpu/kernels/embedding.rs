//! Gather rows of a table in any weight format (shaders/embedding.wgsl): token embeddings, and
//! the rows of activations that need logits. One dispatch per table part.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::pipelines::WeightSource;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(Params {
    num_tokens: u32,
    k: u32,
    row_bytes: u32,
    first_row: u32,
    part_rows: u32,
    w_base: u32,
    scale: f32,
    table_rows: u32
});

/// Record `out[t] = table[ids[t]]`: table (rows, k) in any weight format with k a multiple of
/// 32, ids (num_tokens) U32, out (num_tokens, k) F32. An id at or past the table's rows reads
/// row 0 (as transformers gathers Gemma 3n's per-layer table, shorter than the vocabulary).
pub fn embedding(
    ctx: &GpuContext,
    rec: &mut Recording,
    table: &GpuTensor,
    ids: &GpuTensor,
    out: &GpuTensor,
) -> Result<()> {
    embedding_scaled(ctx, rec, table, ids, out, 1.0)
}

/// [`embedding`] times `scale` (Granite's embedding multiplier; a scale of 1 changes no bit).
pub fn embedding_scaled(
    ctx: &GpuContext,
    rec: &mut Recording,
    table: &GpuTensor,
    ids: &GpuTensor,
    out: &GpuTensor,
    scale: f32,
) -> Result<()> {
    const OP: &str = "embedding";
    if !DType::WEIGHTS.contains(&table.dtype()) || table.shape().len() != 2 {
        return Err(WeftError::shape(
            OP,
            format!("table must be a 2-D weight matrix, got {} {:?}", table.dtype(), table.shape()),
        ));
    }
    let k = table.shape()[1];
    if !k.is_multiple_of(32) {
        return Err(WeftError::shape(
            OP,
            format!("k = {k}: rows are read in whole blocks of 32, so k must be a multiple of 32"),
        ));
    }
    expect(OP, "ids", ids, DType::U32, &[None])?;
    let num_tokens = ids.shape()[0];
    expect(OP, "out", out, DType::F32, &[Some(num_tokens), Some(k)])?;
    let ids_res = ids.single_part(OP)?.resource(ctx)?;
    let out_res = out.single_part(OP)?.resource(ctx)?;
    for part in table.parts() {
        let source = if part.in_texture() { WeightSource::Texture } else { WeightSource::Storage };
        let variant = ShaderVariant::weights("embedding", table.dtype(), source);
        let params = Params {
            num_tokens: u32_of(OP, "num_tokens", num_tokens)?,
            k: u32_of(OP, "k", k)?,
            row_bytes: u32_of(OP, "row bytes", table.row_bytes())?,
            first_row: u32_of(OP, "row", part.rows.start)?,
            part_rows: u32_of(OP, "rows", part.num_rows())?,
            w_base: u32_of(OP, "table offset", part.base_bytes(table.row_bytes())? as usize)?,
            scale,
            table_rows: u32_of(OP, "table rows", table.shape()[0])?,
        };
        let grid = [(k / 32).div_ceil(64) as u32, params.num_tokens, 1];
        let resources = vec![ids_res.clone(), part.resource(ctx)?, out_res.clone()];
        ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), resources, None, grid)?;
    }
    Ok(())
}
