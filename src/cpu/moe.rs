//! A mixture-of-experts layer: the router's top-k choice and the experts' SwiGLU MLPs, the
//! oracles of `moe_route`, `moe_group`, `moe_matmul` and `moe_combine` (transformers'
//! `Qwen3MoeTopKRouter` and `Qwen3MoeExperts`; gpt-oss's `GptOssTopKRouter` and
//! `GptOssExperts`; LFM2-MoE's `Lfm2MoeTopKRouter`).

pub use crate::gpu::kernels::moe::Routing;

/// Each token's routing from its row of `num_experts` router logits, as `moe_route` does by
/// `routing`: the experts of the `k` largest softmax probabilities (largest first, ties to the
/// lower expert), weighted by them, divided by their sum when normalised; the experts of the
/// `k` largest logits, weighted by a softmax over those k (gpt-oss's `GptOssTopKRouter`); or
/// the experts of the `k` largest sigmoid(logit) + `bias`, weighted by their sigmoid, divided
/// by (their sum + 1e-6) when normalised (LFM2-MoE's `Lfm2MoeTopKRouter`); each weight then
/// times its expert's `scale` where there is one (Gemma 4's `Gemma4TextRouter`). Returns (ids,
/// weights), each (tokens, k).
pub fn moe_route(
    logits: &[f32],
    num_experts: usize,
    k: usize,
    routing: Routing,
    bias: Option<&[f32]>,
    scale: Option<&[f32]>,
) -> (Vec<u32>, Vec<f32>) {
    let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
    let scores = match routing {
        Routing::Softmax { .. } => super::softmax(logits, num_experts),
        Routing::TopKSoftmax => logits.to_vec(),
        Routing::Sigmoid { .. } => logits.iter().map(|&x| sigmoid(x)).collect(),
    };
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for row in scores.chunks(num_experts) {
        let key = |e: usize| row[e] + bias.map_or(0.0, |b| b[e]);
        let mut order: Vec<usize> = (0..num_experts).collect();
        // Stable: equal scores keep the lower expert first.
        order.sort_by(|&a, &b| key(b).total_cmp(&key(a)));
        let top = &order[..k];
        let max = f64::from(row[top[0]]);
        let sum: f64 = match routing {
            Routing::Softmax { .. } | Routing::Sigmoid { .. } => top.iter().map(|&e| f64::from(row[e])).sum(),
            Routing::TopKSoftmax => top.iter().map(|&e| (f64::from(row[e]) - max).exp()).sum(),
        };
        for &e in top {
            ids.push(e as u32);
            let weight = match routing {
                Routing::Softmax { normalize: true } => (f64::from(row[e]) / sum) as f32,
                Routing::Softmax { normalize: false } => row[e],
                Routing::TopKSoftmax => ((f64::from(row[e]) - max).exp() / sum) as f32,
                Routing::Sigmoid { normalize: true } => (f64::from(row[e]) / (sum + 1e-6)) as f32,
                Routing::Sigmoid { normalize: false } => row[e],
            };
            weights.push(weight * scale.map_or(1.0, |s| s[e]));
        }
    }
    (ids, weights)
}

/// The tiles `moe_group` makes of each (token, slot) row's expert `ids`: in expert order, each
/// expert's rows in ascending order, `tile_rows` a tile (its last tile holding the rest), as
/// (expert, rows); rows whose id is not below `num_experts` are in no tile. (The GPU places an
/// expert's rows in its tiles in any order.)
pub fn moe_group(ids: &[u32], num_experts: usize, tile_rows: usize) -> Vec<(u32, Vec<u32>)> {
    let mut tiles = Vec::new();
    for e in 0..num_experts as u32 {
        let rows: Vec<u32> = (0..ids.len() as u32).filter(|&r| ids[r as usize] == e).collect();
        tiles.extend(rows.chunks(tile_rows).map(|c| (e, c.to_vec())));
    }
    tiles
}

/// The experts' output of each token: `Σ_s weights[t, s] · down_e(silu(gate_e(x_t)) · up_e(x_t))`
/// with e = ids[t, s]; x (tokens, hidden), ids and weights (tokens, k), gate_up (experts, 2 ·
/// ff, hidden) (each expert's gate rows, then its up rows), down (experts, hidden, ff).
pub fn moe_mlp(
    x: &[f32],
    ids: &[u32],
    weights: &[f32],
    gate_up: &[f32],
    down: &[f32],
    hidden: usize,
    ff: usize,
) -> Vec<f32> {
    moe_mlp_with(x, ids, weights, gate_up, down, hidden, ff, None)
}

/// gpt-oss's experts' biases: gate_up (experts, 2 · ff) in the weights' row order, down
/// (experts, hidden).
pub struct ExpertBiases<'a> {
    pub gate_up: &'a [f32],
    pub down: &'a [f32],
}

/// [`moe_mlp`], or with `biases` gpt-oss's experts: each projection biased and the clamped
/// SwiGLU [`swiglu_oai`] in place of silu(gate) · up.
#[allow(clippy::too_many_arguments)]
pub fn moe_mlp_with(
    x: &[f32],
    ids: &[u32],
    weights: &[f32],
    gate_up: &[f32],
    down: &[f32],
    hidden: usize,
    ff: usize,
    biases: Option<&ExpertBiases<'_>>,
) -> Vec<f32> {
    let k = ids.len() / (x.len() / hidden);
    let mut out = Vec::with_capacity(x.len());
    for (t, row) in x.chunks(hidden).enumerate() {
        let mut acc = vec![0f64; hidden];
        for s in 0..k {
            let e = ids[t * k + s] as usize;
            let mut gu = super::matmul(row, &gate_up[e * 2 * ff * hidden..][..2 * ff * hidden], 1, hidden, 2 * ff);
            let act = match biases {
                None => super::silu_mul(&gu[..ff], &gu[ff..]),
                Some(b) => {
                    gu.iter_mut().zip(&b.gate_up[e * 2 * ff..][..2 * ff]).for_each(|(v, b)| *v += b);
                    (0..ff).map(|j| swiglu_oai(gu[j], gu[ff + j])).collect()
                }
            };
            let mut y = super::matmul(&act, &down[e * hidden * ff..][..hidden * ff], 1, ff, hidden);
            if let Some(b) = biases {
                y.iter_mut().zip(&b.down[e * hidden..][..hidden]).for_each(|(v, b)| *v += b);
            }
            for (a, v) in acc.iter_mut().zip(y) {
                *a += f64::from(weights[t * k + s]) * f64::from(v);
            }
        }
        out.extend(acc.into_iter().map(|v| v as f32));
    }
    out
}

/// gpt-oss's clamped SwiGLU (transformers' `GptOssExperts._apply_gate`, llama.cpp's
/// `swiglu_oai`, alpha 1.702 and limit 7 fixed in both): g · σ(1.702 g) · (u + 1) with
/// g = min(gate, 7), u = clamp(up, -7, 7).
pub fn swiglu_oai(gate: f32, up: f32) -> f32 {
    const ALPHA: f64 = 1.702;
    const LIMIT: f64 = 7.0;
    let g = f64::from(gate).min(LIMIT);
    let u = f64::from(up).clamp(-LIMIT, LIMIT);
    (g / (1.0 + (-ALPHA * g).exp()) * (u + 1.0)) as f32
}
