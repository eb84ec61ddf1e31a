//! Rotary position embedding (shaders/rope.wgsl) and the CPU-built angle table it reads.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::recording::flat_grid;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(Params { num_tokens: u32, num_heads: u32, head_dim: u32, neox: u32, table_rows: u32 });

/// Which dimensions of a head rotate together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairing {
    /// (i, i + head_dim/2): "rotate half", Hugging Face Llama, NeoX.
    Neox,
    /// (2i, 2i + 1): GPT-J and Meta's original Llama layout.
    Interleaved,
}

/// The plain RoPE frequencies `theta^(-2i / head_dim)`, in f32 as transformers computes them.
pub fn inv_freq(head_dim: usize, theta: f32) -> Vec<f32> {
    (0..head_dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32)).collect()
}

/// The (num_positions, inv_freq.len(), 2) table of cos and sin of `pos * inv_freq[i]`. The angle
/// is an f32 product as in transformers; cos and sin are then rounded once from f64.
pub fn cos_sin_table(inv_freq: &[f32], num_positions: usize) -> Vec<f32> {
    let mut table = Vec::with_capacity(num_positions * inv_freq.len() * 2);
    for pos in 0..num_positions {
        for &f in inv_freq {
            let angle = f64::from(pos as f32 * f);
            table.push(angle.cos() as f32);
            table.push(angle.sin() as f32);
        }
    }
    table
}

/// Rotate x (num_tokens, num_heads, head_dim) F32 in place by positions (num_tokens) U32 with
/// angles from cos_sin (table_rows, head_dim / 2, 2) F32.
pub fn rope(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    positions: &GpuTensor,
    cos_sin: &GpuTensor,
    pairing: RopePairing,
) -> Result<()> {
    const OP: &str = "rope";
    expect(OP, "x", x, DType::F32, &[None, None, None])?;
    let (num_tokens, num_heads, head_dim) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    if head_dim % 2 != 0 {
        return Err(WeftError::shape(OP, format!("head_dim must be even, got {head_dim}")));
    }
    expect(OP, "positions", positions, DType::U32, &[Some(num_tokens)])?;
    expect(OP, "cos_sin", cos_sin, DType::F32, &[None, Some(head_dim / 2), Some(2)])?;
    let params = Params {
        num_tokens: u32_of(OP, "num_tokens", num_tokens)?,
        num_heads: u32_of(OP, "num_heads", num_heads)?,
        head_dim: u32_of(OP, "head_dim", head_dim)?,
        neox: u32::from(pairing == RopePairing::Neox),
        table_rows: u32_of(OP, "table rows", cos_sin.shape()[0])?,
    };
    let bindings = [
        x.single_part(OP)?.resource(ctx)?,
        positions.single_part(OP)?.resource(ctx)?,
        cos_sin.single_part(OP)?.resource(ctx)?,
    ];
    let grid = flat_grid(num_tokens * num_heads * head_dim / 2, 64);
    let variant = ShaderVariant::plain("rope");
    ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings.into(), None, grid)?;
    Ok(())
}
