//! `y = x · Wᵀ` over every weight format: shaders/matmul.wgsl in the CPU family;
//! shaders/matmul_rows.wgsl in the baseline family, and shaders/matmul_tiled.wgsl there from
//! the plan's `gemm_min_rows` rows, which sums every output in the same order;
//! shaders/matmul_subgroup.wgsl in the subgroup family (row-parallel, and from `gemm_min_rows`
//! register-blocked over 16 rows, in one order). One dispatch per weight part, and on
//! CPU drivers one per 64 KiB window of activation rows. A family multiplies every tensor, the
//! LM head included, with sums in one order at every batch size, so a row's result never
//! depends on its batch.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::pipelines::{Epilogue, WeightSource, XSource};
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant};
use crate::quant::DType;

shader_params!(Params {
    m: u32,
    k: u32,
    n_part: u32,
    n_offset: u32,
    n_total: u32,
    row_bytes: u32,
    y_row0: u32,
    w_base: u32,
});

/// Record `y = x · wᵀ`: x (m, k) F32, w (n, k) in any weight format, y (m, n) F32; k must be a
/// multiple of 32 (the kernels read whole 32-element blocks).
pub fn matmul(ctx: &GpuContext, rec: &mut Recording, x: &GpuTensor, w: &GpuTensor, y: &GpuTensor) -> Result<()> {
    record(ctx, rec, x, w, y, 0, true, Epilogue::None)
}

/// Record an MLP's gated projection in one pass: w (2n, k) holds the gate rows then the up
/// rows, and y (m, n) F32 receives act(x · gateᵀ) · (x · upᵀ), with `epilogue` naming the
/// activation (`SiluMul` or `GeluMul`), bit for bit what the matmul into (m, 2n) followed by
/// `silu_mul` / `gelu_mul` gives. Where [`supports_gated`] says so; w in one part.
pub fn matmul_gated(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    w: &GpuTensor,
    y: &GpuTensor,
    epilogue: Epilogue,
) -> Result<()> {
    const OP: &str = "matmul_gated";
    if !matches!(epilogue, Epilogue::SiluMul | Epilogue::GeluMul) {
        return Err(WeftError::Unsupported("the gated matmul needs a gate (SiluMul or GeluMul): use matmul".into()));
    }
    let m = x.shape().first().copied().unwrap_or(0);
    if !supports_gated(ctx, m) {
        return Err(WeftError::Unsupported(format!(
            "the {} kernel family gates {m} rows at once in two passes (its tiled matmul from {} rows has no \
             gate): use matmul and silu_mul or gelu_mul",
            ctx.kernel_family().name(),
            ctx.plan().gemm_min_rows
        )));
    }
    if w.parts().len() != 1 || w.shape().len() != 2 || !w.shape()[0].is_multiple_of(2) {
        return Err(WeftError::shape(
            OP,
            format!(
                "w must be one part of gate rows then up rows (2n, k), got {:?} in {} parts",
                w.shape(),
                w.parts().len()
            ),
        ));
    }
    record(ctx, rec, x, w, y, 0, true, epilogue)
}

/// Whether this device multiplies an MLP's gate and up projections for `m` rows and applies
/// its gate in one pass ([`matmul_gated`]): one dispatch fewer per layer (tens of microseconds
/// on CPU drivers, a few on a GPU). See [`DevicePlan::supports_gated`](crate::gpu::DevicePlan::supports_gated).
pub fn supports_gated(ctx: &GpuContext, m: usize) -> bool {
    ctx.plan().supports_gated(m)
}

/// Record `y[:, col..col + n] = x · wᵀ`: as [`matmul`], into columns of a wider y (m, n_total)
/// F32, so several projections of one input can land side by side in one buffer.
pub fn matmul_into(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    w: &GpuTensor,
    y: &GpuTensor,
    col: usize,
) -> Result<()> {
    record(ctx, rec, x, w, y, col, false, Epilogue::None)
}

/// `exact`: y must have exactly w's n columns (else at least col + n).
#[allow(clippy::too_many_arguments)]
fn record(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    w: &GpuTensor,
    y: &GpuTensor,
    col: usize,
    exact: bool,
    epilogue: Epilogue,
) -> Result<()> {
    const OP: &str = "matmul";
    if !DType::WEIGHTS.contains(&w.dtype()) || w.shape().len() != 2 {
        return Err(WeftError::shape(OP, format!("w must be a 2-D weight matrix, got {} {:?}", w.dtype(), w.shape())));
    }
    // Output columns: a gated epilogue reads two weight rows for each.
    let (n, k) = (w.shape()[0] / epilogue.rows_per_output(), w.shape()[1]);
    if k % 32 != 0 {
        return Err(WeftError::shape(
            OP,
            format!("k = {k}: weft's matmul reads whole blocks of 32, so k must be a multiple of 32"),
        ));
    }
    expect(OP, "x", x, DType::F32, &[None, Some(k)])?;
    let m = x.shape()[0];
    expect(OP, "y", y, DType::F32, &[Some(m), exact.then_some(n)])?;
    let n_total = y.shape()[1];
    if col + n > n_total {
        return Err(WeftError::shape(OP, format!("columns {col}..{} do not fit y's {n_total}", col + n)));
    }
    let x_part = x.single_part(OP)?;
    let y_res = y.single_part(OP)?.resource(ctx)?;
    let row_bytes = (k * 4) as u64;
    for part in w.parts() {
        // The output columns this part's weight rows make.
        let part_cols = part.num_rows() / epilogue.rows_per_output();
        let (kernel, tile) = ctx.plan().matmul_kernel(m, part_cols, k, epilogue);
        let (wg, tn, tm) = (tile[0] as usize, tile[1] as usize, tile[2] as usize);
        // A columns workgroup covers WG · TN rows of the weight; the others TN.
        let cols_per_group = if kernel == "matmul" { wg * tn } else { tn };
        let weights_in = if part.in_texture() { WeightSource::Texture } else { WeightSource::Storage };
        let variant = ShaderVariant { tile, epilogue, ..ShaderVariant::weights(kernel, w.dtype(), weights_in) };
        let params = |rows: usize, y_row0: usize| -> Result<Params> {
            Ok(Params {
                m: u32_of(OP, "m", rows)?,
                k: u32_of(OP, "k", k)?,
                n_part: u32_of(OP, "n", part_cols)?,
                n_offset: u32_of(OP, "n", col + part.rows.start)?,
                n_total: u32_of(OP, "n", n_total)?,
                row_bytes: u32_of(OP, "row bytes", w.row_bytes())?,
                y_row0: u32_of(OP, "row", y_row0)?,
                w_base: u32_of(OP, "weight offset", part.base_bytes(w.row_bytes())? as usize)?,
            })
        };
        let grid = |rows: usize| [part_cols.div_ceil(cols_per_group) as u32, rows.div_ceil(tm) as u32, 1];
        let w_res = part.resource(ctx)?;
        // Uniform windows on native CPU drivers, when a window holds whole tiles of rows and
        // every window start is a valid uniform offset; else all rows from a storage binding.
        let windows = if ctx.reads_textures() { x_part.window_rows(ctx, row_bytes, tm) } else { None };
        let Some(rows_per_window) = windows else {
            let v = ShaderVariant { x_in: XSource::Storage, ..variant };
            let p = params(m, 0)?;
            let resources = vec![x_part.resource(ctx)?, w_res.clone(), y_res.clone()];
            ctx.dispatch(rec, v, bytemuck::bytes_of(&p), resources, None, grid(m))?;
            continue;
        };
        let v = ShaderVariant { x_in: XSource::Uniform, ..variant };
        for first in (0..m).step_by(rows_per_window) {
            let rows = rows_per_window.min(m - first);
            let (window, offset) = x_part
                .window(ctx, first as u64 * row_bytes)
                .ok_or_else(|| WeftError::shape(OP, format!("x has no room for a uniform window at row {first}")))?;
            let p = params(rows, first)?;
            let resources = vec![window, w_res.clone(), y_res.clone()];
            ctx.dispatch(rec, v, bytemuck::bytes_of(&p), resources, Some(offset), grid(rows))?;
        }
    }
    Ok(())
}
