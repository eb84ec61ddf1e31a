//! Logit biases, then repetition / presence / frequency penalties, on logits (shaders/penalize.wgsl).

use super::{expect, shader_params, u32_of};
use crate::error::Result;
use crate::gpu::recording::flat_grid;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(Params { num_entries: u32, vocab: u32 });

/// Words per entry: row, token, times generated (or [`UNSEEN`]), bias (f32 bits).
pub const ENTRY_WORDS: usize = 4;

/// An entry's times generated for a token only biased, never seen in the sequence: no
/// penalty applies to it (`UNSEEN` in shaders/penalize.wgsl).
pub const UNSEEN: u32 = u32::MAX;

/// Record biases and penalties: logits (rows, vocab) F32 in place; entries (num_entries,
/// [`ENTRY_WORDS`]) U32, each (row, token) at most once; penalties (rows, 3) F32 of
/// (repetition, presence, frequency).
pub fn penalize(
    ctx: &GpuContext,
    rec: &mut Recording,
    logits: &GpuTensor,
    entries: &GpuTensor,
    penalties: &GpuTensor,
) -> Result<()> {
    const OP: &str = "penalize";
    expect(OP, "logits", logits, DType::F32, &[None, None])?;
    let (rows, vocab) = (logits.shape()[0], logits.shape()[1]);
    expect(OP, "entries", entries, DType::U32, &[None, Some(ENTRY_WORDS)])?;
    expect(OP, "penalties", penalties, DType::F32, &[Some(rows), Some(3)])?;
    let num_entries = entries.shape()[0];
    let params = Params { num_entries: u32_of(OP, "entries", num_entries)?, vocab: u32_of(OP, "vocab", vocab)? };
    let bindings = [
        logits.single_part(OP)?.resource(ctx)?,
        entries.single_part(OP)?.resource(ctx)?,
        penalties.single_part(OP)?.resource(ctx)?,
    ];
    let variant = ShaderVariant::plain("penalize");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, flat_grid(num_entries, 64))?;
    Ok(())
}
