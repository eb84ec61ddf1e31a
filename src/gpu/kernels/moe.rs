//! A mixture-of-experts layer's kernels: `moe_route` (each token's top-k experts and their
//! weights, from the router's logits), `moe_group` (the (token, slot) rows sorted by expert
//! into tiles), `moe_matmul` (each row through its expert's projection, reading the stacked
//! experts of one projection in any weight format, by tiles of one expert's rows or row by
//! row; with a gated epilogue, gate, up and SwiGLU in one pass) and `moe_combine` (the weighted
//! sum of a token's slots). The routing stays on the GPU: the grouping reads the expert ids the
//! router wrote and the matmul the tiles, so a layer records its dispatches without a host
//! round trip.
//!
//! Every (token, slot) row is summed alone, in an order that depends on the shapes only, so a
//! token's result never depends on its batch nor on the rows that share its tile.

use super::{expect, shader_params, u32_of};
use crate::error::{Result, WeftError};
use crate::gpu::pipelines::{Epilogue, MOE_TILE_ROWS, WeightSource};
use crate::gpu::recording::flat_grid;
use crate::gpu::{GpuContext, GpuTensor, Recording, ShaderVariant, TensorPart};
use crate::quant::DType;

shader_params!(RouteParams { tokens: u32, experts: u32, top_k: u32, mode: u32, has_bias: u32, has_scale: u32 });
shader_params!(MatmulParams {
    rows: u32,
    k: u32,
    n: u32,
    x_div: u32,
    row_bytes: u32,
    first_expert: u32,
    part_experts: u32,
    w_base: u32,
    has_bias: u32,
});
shader_params!(CombineParams { len: u32, cols: u32, top_k: u32, accumulate: u32 });
shader_params!(GroupParams { rows: u32, experts: u32, tile_rows: u32 });

const ROUTE_WORKGROUP: usize = 64;
const MATMUL_WORKGROUP: usize = 64;
const COMBINE_WORKGROUP: usize = 256;

/// The most experts [`moe_group`] sorts rows over (its tables live in workgroup memory:
/// shaders/moe_group.wgsl's MAX_EXPERTS).
pub const MAX_EXPERTS: usize = 1024;

/// Rows of one expert a tile of [`moe_group`]'s table holds, and [`moe_matmul`] by tiles sums
/// together (`MOE_TILE_ROWS`, the TM of its tile).
pub const TILE_ROWS: usize = MOE_TILE_ROWS as usize;

/// Words of one row of the tile table: a tile's expert, its row count and its rows.
pub const TILE_WORDS: usize = 2 + TILE_ROWS;

/// The most tiles `rows` (token, slot) rows over `experts` experts make: each expert's rows
/// fill ⌈c / TILE_ROWS⌉ tiles, at most (rows + used · (TILE_ROWS - 1)) / TILE_ROWS over the
/// `used` ≤ min(experts, rows) experts that have any, and never more tiles than rows. A tile
/// table of [`moe_group`] has this many rows plus its header.
pub fn max_tiles(rows: usize, experts: usize) -> usize {
    let used = experts.min(rows);
    ((rows + used * (TILE_ROWS - 1)) / TILE_ROWS).min(rows)
}

/// How a router's logits become each token's experts and weights (`moe_route`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// The experts of the k largest softmax probabilities over all experts, weighted by those
    /// probabilities, divided by their sum when `normalize` (Qwen3-MoE's `norm_topk_prob`).
    Softmax { normalize: bool },
    /// The experts of the k largest logits, weighted by a softmax over those k logits alone
    /// (gpt-oss; llama.cpp's `SOFTMAX_WEIGHT` gating).
    TopKSoftmax,
    /// The experts of the k largest sigmoid(logit) + the choice's bias (when `moe_route` gets
    /// one: it steers the choice only), weighted by their sigmoid(logit), divided by (their
    /// sum + 1e-6) when `normalize` (LFM2-MoE; llama.cpp's `SIGMOID` gating).
    Sigmoid { normalize: bool },
}

impl Routing {
    fn mode(self) -> u32 {
        match self {
            Routing::Softmax { normalize } => u32::from(normalize),
            Routing::TopKSoftmax => 2,
            Routing::Sigmoid { normalize } => 3 + u32::from(normalize),
        }
    }
}

/// Record each token's routing: `logits` (tokens, experts) F32 → `ids` (tokens, top_k) U32,
/// the top_k experts by `routing`, largest first (ties to the lower expert), and `weights`
/// (tokens, top_k) F32, their weights. `bias` (experts) F32 steers a sigmoid routing's choice;
/// `scale` (experts) F32 multiplies each chosen expert's weight last (Gemma 4's
/// `per_expert_scale`).
#[allow(clippy::too_many_arguments)]
pub fn moe_route(
    ctx: &GpuContext,
    rec: &mut Recording,
    logits: &GpuTensor,
    ids: &GpuTensor,
    weights: &GpuTensor,
    routing: Routing,
    bias: Option<&GpuTensor>,
    scale: Option<&GpuTensor>,
) -> Result<()> {
    const OP: &str = "moe_route";
    expect(OP, "logits", logits, DType::F32, &[None, None])?;
    let (tokens, experts) = (logits.shape()[0], logits.shape()[1]);
    expect(OP, "ids", ids, DType::U32, &[Some(tokens), None])?;
    let top_k = ids.shape()[1];
    expect(OP, "weights", weights, DType::F32, &[Some(tokens), Some(top_k)])?;
    if top_k == 0 || top_k > experts {
        return Err(WeftError::shape(OP, format!("top_k = {top_k} must be 1 to the {experts} experts")));
    }
    let params = RouteParams {
        tokens: u32_of(OP, "tokens", tokens)?,
        experts: u32_of(OP, "experts", experts)?,
        top_k: u32_of(OP, "top_k", top_k)?,
        mode: routing.mode(),
        has_bias: u32::from(bias.is_some()),
        has_scale: u32::from(scale.is_some()),
    };
    if let Some(b) = bias {
        if !matches!(routing, Routing::Sigmoid { .. }) {
            return Err(WeftError::shape(OP, "a choice bias is taken by sigmoid routing only".to_string()));
        }
        expect(OP, "bias", b, DType::F32, &[Some(experts)])?;
    }
    if let Some(s) = scale {
        expect(OP, "scale", s, DType::F32, &[Some(experts)])?;
    }
    let res = |t: &GpuTensor| t.single_part(OP)?.resource(ctx);
    // Without a bias or scale the kernel reads none: the logits stand in for the binding.
    let (bias, scale) = (bias.unwrap_or(logits), scale.unwrap_or(logits));
    let bindings = vec![res(logits)?, res(ids)?, res(weights)?, res(bias)?, res(scale)?];
    let grid = flat_grid(tokens, ROUTE_WORKGROUP);
    ctx.dispatch(rec, ShaderVariant::plain("moe_route"), bytemuck::bytes_of(&params), bindings, None, grid)
}

/// Record the grouping of each (token, slot) row by its expert: `ids` (tokens, top_k) U32 from
/// [`moe_route`] → `tiles` (at least 1 + [`max_tiles`] rows, [`TILE_WORDS`]) U32: row 0 holds
/// the number of tiles, row 1 + i tile i (in expert order): its expert, its row count c
/// (1 to [`TILE_ROWS`]), then its c rows (r = token · top_k + slot), in no particular order.
/// Every tile of an expert is full but its last. At most [`MAX_EXPERTS`] experts.
pub fn moe_group(
    ctx: &GpuContext,
    rec: &mut Recording,
    ids: &GpuTensor,
    num_experts: usize,
    tiles: &GpuTensor,
) -> Result<()> {
    const OP: &str = "moe_group";
    expect(OP, "ids", ids, DType::U32, &[None, None])?;
    let rows = ids.shape()[0] * ids.shape()[1];
    if num_experts == 0 || num_experts > MAX_EXPERTS {
        return Err(WeftError::shape(
            OP,
            format!("{num_experts} experts: the grouping sorts rows over 1 to {MAX_EXPERTS} experts"),
        ));
    }
    expect(OP, "tiles", tiles, DType::U32, &[None, Some(TILE_WORDS)])?;
    let need = 1 + max_tiles(rows, num_experts);
    if tiles.shape()[0] < need {
        return Err(WeftError::shape(
            OP,
            format!("tiles has {} rows; {rows} rows over {num_experts} experts need {need}", tiles.shape()[0]),
        ));
    }
    let params = GroupParams {
        rows: u32_of(OP, "rows", rows)?,
        experts: u32_of(OP, "experts", num_experts)?,
        tile_rows: TILE_ROWS as u32,
    };
    let res = |t: &GpuTensor| t.single_part(OP)?.resource(ctx);
    let bindings = vec![res(ids)?, res(tiles)?];
    ctx.dispatch(rec, ShaderVariant::plain("moe_group"), bytemuck::bytes_of(&params), bindings, None, [1, 1, 1])
}

/// Record `y[r, :] = x[r / x_div, :] · experts[ids[r]]ᵀ` for each (token, slot) row r:
/// `experts` (num_experts · G · n, k) in any weight format holds each expert's G · n rows in
/// turn (G = 2 with a gated `epilogue`: the expert's gate rows then its up rows, and y receives
/// act(gate) · up); `ids` (tokens, top_k) U32 from [`moe_route`]; y (tokens · top_k, n) F32;
/// x (tokens, k) F32 (each token's row serves all its slots) or (tokens · top_k, k) (a row per
/// slot). `bias` (num_experts, G · n) F32, when given, is added to each sum before the
/// epilogue (each expert's bias in its rows' order). Each part of `experts` must hold whole
/// experts; k a multiple of 32.
///
/// With `tiles` from [`moe_group`] over the same `ids`, the rows are taken by tiles of one
/// expert (shaders/moe_matmul_grouped.wgsl): each weight block is decoded once for up to
/// [`TILE_ROWS`] rows, the grid sized for the most tiles the rows can make (workgroups past
/// the table's tiles leave at once). Without, each row decodes its expert's weights for itself
/// (shaders/moe_matmul.wgsl). Both sum every output in one order: the same bits. One dispatch
/// per part of `experts` (a workgroup whose expert another part holds leaves at once).
#[allow(clippy::too_many_arguments)]
pub fn moe_matmul(
    ctx: &GpuContext,
    rec: &mut Recording,
    x: &GpuTensor,
    experts: &GpuTensor,
    num_experts: usize,
    ids: &GpuTensor,
    tiles: Option<&GpuTensor>,
    y: &GpuTensor,
    epilogue: Epilogue,
    bias: Option<&GpuTensor>,
) -> Result<()> {
    const OP: &str = "moe_matmul";
    let s = ExpertShapes::check(OP, x, experts, num_experts, ids, y, epilogue, bias)?;
    if let Some(t) = tiles {
        expect(OP, "tiles", t, DType::U32, &[None, Some(TILE_WORDS)])?;
        let need = 1 + max_tiles(s.rows, num_experts);
        if t.shape()[0] < need {
            return Err(WeftError::shape(
                OP,
                format!("tiles has {} rows; {} rows over {num_experts} experts need {need}", t.shape()[0], s.rows),
            ));
        }
    }
    if s.rows == 0 {
        return Ok(());
    }
    let res = |t: &GpuTensor| t.single_part(OP)?.resource(ctx);
    let (x_res, y_res) = (res(x)?, res(y)?);
    // Which rows a workgroup takes: a tile of the table, or row gy + gz · (workgroups in y).
    let (kernel, tile, rows_res, grid) = match tiles {
        Some(t) => {
            let tile = ctx.plan().moe_tile(epilogue);
            let cols = s.n.div_ceil(usize::from(tile[0] * tile[1]));
            (
                "moe_matmul_grouped",
                tile,
                res(t)?,
                [cols as u32, u32_of(OP, "tiles", max_tiles(s.rows, num_experts))?, 1],
            )
        }
        None => {
            let down = s.rows.min(65535);
            let cols = s.n.div_ceil(MATMUL_WORKGROUP);
            ("moe_matmul", [0; 3], res(ids)?, [cols as u32, down as u32, s.rows.div_ceil(down) as u32])
        }
    };
    // Without a bias the binding is never read: the rows' binding fills it.
    let bias_res = match bias {
        Some(b) => res(b)?,
        None => rows_res.clone(),
    };
    for part in experts.parts() {
        let (weights_in, params) = s.part(OP, experts, part, bias.is_some())?;
        let variant = ShaderVariant { epilogue, tile, ..ShaderVariant::weights(kernel, experts.dtype(), weights_in) };
        let bindings = vec![x_res.clone(), part.resource(ctx)?, y_res.clone(), rows_res.clone(), bias_res.clone()];
        ctx.dispatch(rec, variant, bytemuck::bytes_of(&params), bindings, None, grid)?;
    }
    Ok(())
}

/// What the experts' matmuls read from their operands' shapes.
struct ExpertShapes {
    k: usize,
    n: usize,
    /// (token, slot) rows: tokens · top_k.
    rows: usize,
    /// Rows of y a row of x serves: top_k (x a row per token), or 1 (a row per slot).
    x_div: usize,
    /// Weight rows of one expert: G · n.
    expert_rows: usize,
}

impl ExpertShapes {
    #[allow(clippy::too_many_arguments)]
    fn check(
        op: &'static str,
        x: &GpuTensor,
        experts: &GpuTensor,
        num_experts: usize,
        ids: &GpuTensor,
        y: &GpuTensor,
        epilogue: Epilogue,
        bias: Option<&GpuTensor>,
    ) -> Result<ExpertShapes> {
        if !DType::WEIGHTS.contains(&experts.dtype()) || experts.shape().len() != 2 {
            return Err(WeftError::shape(
                op,
                format!("experts must be a 2-D weight matrix, got {} {:?}", experts.dtype(), experts.shape()),
            ));
        }
        let g = epilogue.rows_per_output();
        let k = experts.shape()[1];
        if !k.is_multiple_of(32) || num_experts == 0 || !experts.shape()[0].is_multiple_of(num_experts * g) {
            return Err(WeftError::shape(
                op,
                format!(
                    "experts {:?} must stack {num_experts} experts of {g} · n rows each, with k a multiple of 32",
                    experts.shape()
                ),
            ));
        }
        let expert_rows = experts.shape()[0] / num_experts;
        let n = expert_rows / g;
        expect(op, "ids", ids, DType::U32, &[None, None])?;
        let (tokens, top_k) = (ids.shape()[0], ids.shape()[1]);
        let rows = tokens * top_k;
        expect(op, "y", y, DType::F32, &[Some(rows), Some(n)])?;
        expect(op, "x", x, DType::F32, &[None, Some(k)])?;
        let x_div = match x.shape()[0] {
            r if r == rows => 1,
            r if r == tokens => top_k,
            r => {
                return Err(WeftError::shape(
                    op,
                    format!("x has {r} rows; it needs one per token ({tokens}) or one per slot ({rows})"),
                ));
            }
        };
        if let Some(b) = bias {
            expect(op, "bias", b, DType::F32, &[Some(num_experts), Some(expert_rows)])?;
        }
        Ok(ExpertShapes { k, n, rows, x_div, expert_rows })
    }

    /// Where a part of `experts` is read from, and the parameters a dispatch over it takes.
    fn part(
        &self,
        op: &'static str,
        experts: &GpuTensor,
        part: &TensorPart,
        has_bias: bool,
    ) -> Result<(WeightSource, MatmulParams)> {
        let expert_rows = self.expert_rows;
        if !part.rows.start.is_multiple_of(expert_rows) || !part.num_rows().is_multiple_of(expert_rows) {
            return Err(WeftError::shape(
                op,
                format!(
                    "a part of the experts holds rows {:?}, not whole experts of {expert_rows} rows; upload experts \
                     in groups of whole experts",
                    part.rows
                ),
            ));
        }
        let weights_in = if part.in_texture() { WeightSource::Texture } else { WeightSource::Storage };
        let params = MatmulParams {
            rows: u32_of(op, "rows", self.rows)?,
            k: u32_of(op, "k", self.k)?,
            n: u32_of(op, "n", self.n)?,
            x_div: u32_of(op, "top_k", self.x_div)?,
            row_bytes: u32_of(op, "row bytes", experts.row_bytes())?,
            first_expert: u32_of(op, "expert", part.rows.start / expert_rows)?,
            part_experts: u32_of(op, "experts", part.num_rows() / expert_rows)?,
            w_base: u32_of(op, "weight offset", part.base_bytes(experts.row_bytes())? as usize)?,
            has_bias: u32::from(has_bias),
        };
        Ok((weights_in, params))
    }
}

/// Record `out[t, :] = Σ_s weights[t, s] · y[t · top_k + s, :]`, slots in order, plus out's
/// old value with `accumulate` (added last): y (tokens · top_k, cols) F32, weights (tokens,
/// top_k) F32, out (tokens, cols) F32.
pub fn moe_combine(
    ctx: &GpuContext,
    rec: &mut Recording,
    y: &GpuTensor,
    weights: &GpuTensor,
    out: &GpuTensor,
    accumulate: bool,
) -> Result<()> {
    const OP: &str = "moe_combine";
    expect(OP, "out", out, DType::F32, &[None, None])?;
    let (tokens, cols) = (out.shape()[0], out.shape()[1]);
    expect(OP, "weights", weights, DType::F32, &[Some(tokens), None])?;
    let top_k = weights.shape()[1];
    expect(OP, "y", y, DType::F32, &[Some(tokens * top_k), Some(cols)])?;
    let params = CombineParams {
        len: u32_of(OP, "len", tokens * cols)?,
        cols: u32_of(OP, "cols", cols)?,
        top_k: u32_of(OP, "top_k", top_k)?,
        accumulate: u32::from(accumulate),
    };
    let res = |t: &GpuTensor| t.single_part(OP)?.resource(ctx);
    let bindings = vec![res(y)?, res(weights)?, res(out)?];
    let grid = flat_grid(tokens * cols, COMBINE_WORKGROUP);
    ctx.dispatch(rec, ShaderVariant::plain("moe_combine"), bytemuck::bytes_of(&params), bindings, None, grid)
}
