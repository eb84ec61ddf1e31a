//! Embedding row gather from a table in any weight format (shaders/embedding.wgsl).

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(Params { num_tokens: u32, k: u32, row_bytes: u32, first_row: u32, part_rows: u32 });

/// Record `out[t, :] = table[ids[t], :]`: table (vocab, k), ids (num_tokens) U32, out
/// (num_tokens, k) F32. Ids at or past `vocab` leave their row of `out` untouched, so callers
/// validate token ids before they reach the GPU.
pub fn embedding(
    ctx: &GpuContext,
    rec: &mut Recording,
    table: &GpuTensor,
    ids: &GpuTensor,
    out: &GpuTensor,
) -> Result<()> {
    const OP: &str = "embedding";
    if !DType::WEIGHTS.contains(&table.dtype()) || table.shape().len() != 2 {
        return Err(WeftError::shape(
            OP,
            format!("table must be a 2-D weight matrix, got {} {:?}", table.dtype(), table.shape()),
        ));
    }
    let k = table.shape()[1];
    expect(OP, "ids", ids, DType::U32, &[None])?;
    let num_tokens = ids.shape()[0];
    expect(OP, "out", out, DType::F32, &[Some(num_tokens), Some(k)])?;
    let ids_bind = ids.single_part(OP)?.binding(ctx, ids.row_bytes())?;
    let out_bind = out.single_part(OP)?.binding(ctx, out.row_bytes())?;
    let variant = ShaderVariant { kernel: "embedding", weight: Some(table.dtype()) };
    let chunks = k.div_ceil(super::decode_block_elems(table.dtype())) * super::decode_chunks(table.dtype());
    for part in table.parts() {
        let params = Params {
            num_tokens: u32_of(OP, "num_tokens", num_tokens)?,
            k: u32_of(OP, "k", k)?,
            row_bytes: u32_of(OP, "row bytes", table.row_bytes())?,
            first_row: u32_of(OP, "row", part.rows.start)?,
            part_rows: u32_of(OP, "rows", part.num_rows())?,
        };
        let grid = [chunks.div_ceil(64) as u32, u32_of(OP, "num_tokens", num_tokens)?, 1];
        let bindings = [ids_bind.clone(), part.binding(ctx, table.row_bytes())?, out_bind.clone()];
        rec.push(ctx.dispatch(variant, bytemuck::bytes_of(&params), &bindings, grid)?);
    }
    Ok(())
}
