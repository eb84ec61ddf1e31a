//! `y = x · Wᵀ` over every weight format (shaders/matmul.wgsl). One dispatch per weight part.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(Params { m: u32, k: u32, n_part: u32, n_offset: u32, n_total: u32, row_bytes: u32 });

/// Rows of x per invocation (`TM` in the shader).
const ROWS_PER_INVOCATION: usize = 4;
const WORKGROUP: usize = 64;

/// Record `y = x · wᵀ`: x (m, k) F32, w (n, k) in any weight format, y (m, n) F32.
pub fn matmul(ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor, w: &GpuTensor, y: &GpuTensor) -> Result<()> {
    const OP: &str = "matmul";
    if !DType::WEIGHTS.contains(&w.dtype()) || w.shape().len() != 2 {
        return Err(WeftError::shape(OP, format!("w must be a 2-D weight matrix, got {} {:?}", w.dtype(), w.shape())));
    }
    let (n, k) = (w.shape()[0], w.shape()[1]);
    expect(OP, "x", x, DType::F32, &[None, Some(k)])?;
    let m = x.shape()[0];
    expect(OP, "y", y, DType::F32, &[Some(m), Some(n)])?;
    let x_bind = x.single_part(OP)?.binding(ctx, x.row_bytes())?;
    let y_bind = y.single_part(OP)?.binding(ctx, y.row_bytes())?;
    let variant = ShaderVariant { kernel: "matmul", weight: Some(w.dtype()) };
    for part in w.parts() {
        let params = Params {
            m: u32_of(OP, "m", m)?,
            k: u32_of(OP, "k", k)?,
            n_part: u32_of(OP, "n", part.num_rows())?,
            n_offset: u32_of(OP, "n", part.rows.start)?,
            n_total: u32_of(OP, "n", n)?,
            row_bytes: u32_of(OP, "row bytes", w.row_bytes())?,
        };
        let grid = [part.num_rows().div_ceil(WORKGROUP) as u32, m.div_ceil(ROWS_PER_INVOCATION) as u32, 1];
        let bindings = [x_bind.clone(), part.binding(ctx, w.row_bytes())?, y_bind.clone()];
        rec.push(ctx.dispatch(variant, bytemuck::bytes_of(&params), &bindings, grid)?);
    }
    Ok(())
}
