//! Batched LoRA over the adapter pool's slots: `lora_shrink` (u = x · Aᵀ) then `lora_expand`
//! (y[:, col..] += scale · u · Bᵀ), each row with the A, B and scale of its own slot, rows of the
//! base model untouched. punica's BGMV: the slot is looked up per row, so one pair of dispatches
//! serves every adapter of a step.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::recording::flat_grid;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(ShrinkParams { rows: u32, in_dim: u32, max_rank: u32 });
shader_params!(ExpandParams { rows: u32, out_dim: u32, y_cols: u32, col: u32, max_rank: u32 });

/// A row's slot when it runs the base model.
pub const NO_SLOT: u32 = u32::MAX;
/// Columns of the slot table: rank, scale's f32 bits.
pub const SLOT_INFO_COLS: usize = 2;

const WORKGROUP: usize = 64;

/// One projection's slots: A and B of every slot, each transposed (so that neighbouring
/// invocations read neighbouring words), slot after slot in two tensors.
pub struct LoraMatrices<'a> {
    pub a: &'a GpuTensor, // (slots · in, max_rank) F32: slot s's Aᵀ at rows s · in
    pub b: &'a GpuTensor, // (slots · max_rank, out) F32: slot s's Bᵀ at rows s · max_rank
}

/// What every LoRA dispatch of a step shares.
pub struct LoraRows<'a> {
    pub row_slots: &'a GpuTensor, // (rows) U32: each row's slot, NO_SLOT for none
    pub slot_info: &'a GpuTensor, // (slots, 2) U32: rank, scale bits
    pub u: &'a GpuTensor,         // (rows, max_rank) F32: scratch between the two passes
}

/// Record `y[:, col .. col + out] += scale · (x · Aᵀ) · Bᵀ` per row with its slot's matrices:
/// x (rows, in) F32, y (rows, ≥ col + out) F32.
pub fn lora(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    m: &LoraMatrices<'_>,
    rows: &LoraRows<'_>,
    y: &GpuTensor,
    col: usize,
) -> Result<()> {
    const OP: &str = "lora";
    expect(OP, "x", x, DType::F32, &[None, None])?;
    let (num_rows, in_dim) = (x.shape()[0], x.shape()[1]);
    expect(OP, "u", rows.u, DType::F32, &[Some(num_rows), None])?;
    let max_rank = rows.u.shape()[1];
    expect(OP, "slot_info", rows.slot_info, DType::U32, &[None, Some(SLOT_INFO_COLS)])?;
    let num_slots = rows.slot_info.shape()[0];
    expect(OP, "a", m.a, DType::F32, &[Some(num_slots * in_dim), Some(max_rank)])?;
    expect(OP, "b", m.b, DType::F32, &[Some(num_slots * max_rank), None])?;
    let out_dim = m.b.shape()[1];
    expect(OP, "y", y, DType::F32, &[Some(num_rows), None])?;
    if rows.row_slots.dtype() != DType::U32 || rows.row_slots.num_elems() != num_rows {
        return Err(WeftError::shape(
            OP,
            format!("row_slots must be {num_rows} U32, got {:?}", rows.row_slots.shape()),
        ));
    }
    let y_cols = y.shape()[1];
    if col + out_dim > y_cols {
        return Err(WeftError::shape(OP, format!("columns {col}..{} do not fit y's {y_cols}", col + out_dim)));
    }
    let shrink = ShrinkParams {
        rows: u32_of(OP, "rows", num_rows)?,
        in_dim: u32_of(OP, "in_dim", in_dim)?,
        max_rank: u32_of(OP, "max_rank", max_rank)?,
    };
    let res = |t: &GpuTensor| t.single_part(OP)?.resource(ctx);
    let (slots, info) = (res(rows.row_slots)?, res(rows.slot_info)?);
    let bindings = [res(x)?, res(m.a)?, slots.clone(), info.clone(), res(rows.u)?];
    let grid = flat_grid(num_rows * max_rank, WORKGROUP);
    ctx.dispatch(rec, ShaderVariant::plain("lora_shrink"), bytemuck::bytes_of(&shrink), bindings.into(), None, grid)?;
    let expand = ExpandParams {
        rows: shrink.rows,
        out_dim: u32_of(OP, "out_dim", out_dim)?,
        y_cols: u32_of(OP, "y_cols", y_cols)?,
        col: u32_of(OP, "col", col)?,
        max_rank: shrink.max_rank,
    };
    let bindings = [res(rows.u)?, res(m.b)?, slots, info, res(y)?];
    let grid = flat_grid(num_rows * out_dim, WORKGROUP);
    ctx.dispatch(rec, ShaderVariant::plain("lora_expand"), bytemuck::bytes_of(&expand), bindings.into(), None, grid)?;
    Ok(())
}
