//! A mixture-of-experts layer: the router's top-k choice and the experts' SwiGLU MLPs, the
//! oracles of `moe_route`, `moe_matmul` and `moe_combine` (transformers'
//! `Qwen3MoeTopKRouter` and `Qwen3MoeExperts`).

/// Each token's routing from its row of `num_experts` router logits: the experts of the `k`
/// largest softmax probabilities, largest first (ties to the lower expert), and those
/// probabilities, divided by their sum when `normalize`. Returns (ids, weights), each
/// (tokens, k).
pub fn moe_route(logits: &[f32], num_experts: usize, k: usize, normalize: bool) -> (Vec<u32>, Vec<f32>) {
    let probs = super::softmax(logits, num_experts);
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for row in probs.chunks(num_experts) {
        let mut order: Vec<usize> = (0..num_experts).collect();
        // Stable: equal probabilities keep the lower expert first.
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let top = &order[..k];
        let sum: f64 = top.iter().map(|&e| f64::from(row[e])).sum();
        for &e in top {
            ids.push(e as u32);
            weights.push(if normalize { (f64::from(row[e]) / sum) as f32 } else { row[e] });
        }
    }
    (ids, weights)
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
    let k = ids.len() / (x.len() / hidden);
    let mut out = Vec::with_capacity(x.len());
    for (t, row) in x.chunks(hidden).enumerate() {
        let mut acc = vec![0f64; hidden];
        for s in 0..k {
            let e = ids[t * k + s] as usize;
            let gu = super::matmul(row, &gate_up[e * 2 * ff * hidden..][..2 * ff * hidden], 1, hidden, 2 * ff);
            let act = super::silu_mul(&gu[..ff], &gu[ff..]);
            let y = super::matmul(&act, &down[e * hidden * ff..][..hidden * ff], 1, ff, hidden);
            for (a, v) in acc.iter_mut().zip(y) {
                *a += f64::from(weights[t * k + s]) * f64::from(v);
            }
        }
        out.extend(acc.into_iter().map(|v| v as f32));
    }
    out
}
