//! Plain-loop CPU versions of every GPU kernel: the oracle the kernel tests compare against.
//!
//! Written for clarity, not speed, and independent of the shaders: sums are carried in f64 so
//! they are closer to the exact value than any f32 kernel, and tests bound the GPU's distance.
//! Shapes are row-major and named as in the kernel headers.

pub mod gemma3;
pub mod gemma3n;
pub mod llama;
pub mod moe;
pub mod ssm;

/// `y (m, n) = x (m, k) · w (n, k)ᵀ`.
pub fn matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f64;
            for p in 0..k {
                s += f64::from(x[i * k + p]) * f64::from(w[j * k + p]);
            }
            y[i * n + j] = s as f32;
        }
    }
    y
}

/// One row's LoRA delta, `scale · (x · Aᵀ) · Bᵀ`: x (in), a (rank, in), b (out, rank); the
/// oracle of `lora_shrink` then `lora_expand` (which add it to the row's projection output).
pub fn lora_delta(x: &[f32], a: &[f32], b: &[f32], rank: usize, scale: f32) -> Vec<f32> {
    let u = matmul(x, a, 1, x.len(), rank);
    matmul(&u, b, 1, rank, b.len() / rank.max(1))
        .into_iter()
        .map(|v| (f64::from(v) * f64::from(scale)) as f32)
        .collect()
}

/// `out (ids.len(), k) = table[ids[t], :]`, an id past the table reading row 0 (as the GPU does).
pub fn embedding(table: &[f32], k: usize, ids: &[u32]) -> Vec<f32> {
    let rows = table.len() / k;
    let row = |id: u32| if (id as usize) < rows { id as usize } else { 0 };
    ids.iter().flat_map(|&id| table[row(id) * k..(row(id) + 1) * k].iter().copied()).collect()
}

/// `y = x / sqrt(mean(x²) + eps) * weight`, row by row over rows of length `weight.len()`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let n = weight.len();
    x.chunks(n)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / n as f64;
            let scale = 1.0 / (ms + f64::from(eps)).sqrt();
            row.iter().zip(weight).map(move |(&v, &w)| (f64::from(v) * scale * f64::from(w)) as f32)
        })
        .collect()
}

/// `y = (x - mean) / sqrt(var + eps) * weight + bias`, row by row over rows of length
/// `weight.len()` (torch's LayerNorm: the biased variance).
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32) -> Vec<f32> {
    let n = weight.len();
    x.chunks(n)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
            let var = row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n as f64;
            let scale = 1.0 / (var + f64::from(eps)).sqrt();
            row.iter()
                .zip(weight.iter().zip(bias))
                .map(move |(&v, (&w, &b))| ((f64::from(v) - mean) * scale * f64::from(w) + f64::from(b)) as f32)
        })
        .collect()
}

/// The exact GELU, `v · (1 + erf(v / √2)) / 2` (transformers' "gelu").
pub fn gelu(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            let v = f64::from(v);
            (0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2))) as f32
        })
        .collect()
}

/// Each output row the mean of x's rows `first .. first + count` (`spans`: (first, count)),
/// rows of length `cols`: an embedding's pooling.
pub fn pool_rows(x: &[f32], cols: usize, spans: &[(usize, usize)]) -> Vec<f32> {
    spans
        .iter()
        .flat_map(|&(first, count)| {
            (0..cols).map(move |c| {
                let sum: f64 = (first..first + count).map(|r| f64::from(x[r * cols + c])).sum();
                (sum / count as f64) as f32
            })
        })
        .collect()
}

/// Softmax of each row of length `n`.
pub fn softmax(x: &[f32], n: usize) -> Vec<f32> {
    x.chunks(n)
        .flat_map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f64> = row.iter().map(|&v| (f64::from(v) - f64::from(max)).exp()).collect();
            let sum: f64 = exps.iter().sum();
            exps.into_iter().map(move |e| (e / sum) as f32)
        })
        .collect()
}

/// Index of the largest value of each row of length `n`; ties to the lowest index, NaN ignored.
pub fn argmax(x: &[f32], n: usize) -> Vec<u32> {
    x.chunks(n)
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] || row[best].is_nan() && !v.is_nan() {
                    best = i;
                }
            }
            best as u32
        })
        .collect()
}

/// Rotate the first `rope_dim` dimensions of each head of x (num_tokens, num_heads, head_dim)
/// in place by the angle table (positions, rope_dim / 2, 2) of
/// `gpu::kernels::rope::cos_sin_table`; `neox` pairs (i, i + rope_dim/2), otherwise
/// (2i, 2i + 1). The other dimensions pass through.
pub fn rope(
    x: &mut [f32],
    num_heads: usize,
    head_dim: usize,
    rope_dim: usize,
    positions: &[u32],
    cos_sin: &[f32],
    neox: bool,
) {
    let half = rope_dim / 2;
    for (t, &pos) in positions.iter().enumerate() {
        for h in 0..num_heads {
            let base = (t * num_heads + h) * head_dim;
            for i in 0..half {
                let (c, s) = (cos_sin[(pos as usize * half + i) * 2], cos_sin[(pos as usize * half + i) * 2 + 1]);
                let (a, b) = if neox { (base + i, base + i + half) } else { (base + 2 * i, base + 2 * i + 1) };
                let (xa, xb) = (f64::from(x[a]), f64::from(x[b]));
                x[a] = (xa * f64::from(c) - xb * f64::from(s)) as f32;
                x[b] = (xb * f64::from(c) + xa * f64::from(s)) as f32;
            }
        }
    }
}

/// `x · sigmoid(gate)`, each gate value scaling `x.len() / gate.len()` consecutive values of
/// x: one each (Qwen3.5's attention output gate) or a row each (Qwen3.5-MoE's shared-expert
/// gate, one a token).
pub fn sigmoid_mul(x: &[f32], gate: &[f32]) -> Vec<f32> {
    let group = x.len() / gate.len().max(1);
    x.iter().enumerate().map(|(i, &x)| (f64::from(x) / (1.0 + (-f64::from(gate[i / group])).exp())) as f32).collect()
}

/// `silu(gate) * up`, element by element.
pub fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = f64::from(g);
            (g / (1.0 + (-g).exp()) * f64::from(u)) as f32
        })
        .collect()
}

/// `gelu_tanh(gate) * up`, element by element (transformers' "gelu_pytorch_tanh").
pub fn gelu_tanh_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = f64::from(g);
            let t = ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh();
            (0.5 * g * (1.0 + t) * f64::from(u)) as f32
        })
        .collect()
}

/// cap · tanh(x / cap), element by element (Gemma 4's final logit soft-capping).
pub fn softcap(x: &[f32], cap: f32) -> Vec<f32> {
    x.iter().map(|&v| ((f64::from(v) / f64::from(cap)).tanh() * f64::from(cap)) as f32).collect()
}

/// RMSNorm of each query and key head of fused qkv rows (num_tokens, (num_heads + 2 ·
/// num_kv_heads) · head_dim), as `gpu::kernels::reduce::head_rms_norm` does in place.
pub fn head_rms_norm(
    qkv: &[f32],
    num_heads: usize,
    num_kv_heads: usize,
    q_weight: &[f32],
    k_weight: &[f32],
    eps: f32,
) -> Vec<f32> {
    qk_rms_norm(qkv, num_heads, num_kv_heads, q_weight.len(), q_weight, k_weight, eps)
}

/// RMSNorm of the query and key parts of fused qkv rows in groups as wide as their weights:
/// each head (a weight head_dim wide) or all of q's or k's heads as one (OLMo 2), as
/// `gpu::kernels::reduce::head_rms_norm` does in place.
pub fn qk_rms_norm(
    qkv: &[f32],
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    q_weight: &[f32],
    k_weight: &[f32],
    eps: f32,
) -> Vec<f32> {
    let stride = (num_heads + 2 * num_kv_heads) * head_dim;
    let q_cols = num_heads * head_dim;
    let mut out = qkv.to_vec();
    for row in out.chunks_mut(stride) {
        let (q, rest) = row.split_at_mut(q_cols);
        let k = &mut rest[..num_kv_heads * head_dim];
        for (part, w) in [(q, q_weight), (k, k_weight)] {
            for group in part.chunks_mut(w.len()) {
                let normed = rms_norm(group, w, eps);
                group.copy_from_slice(&normed);
            }
        }
    }
    out
}

/// Causal grouped-query attention of one query row against the keys and values it may see.
///
/// `q` is (num_heads, head_dim); `keys` and `values` are the visible positions in order, each
/// (num_kv_heads, head_dim). Returns (num_heads, head_dim).
pub fn attention_one(
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    num_heads: usize,
    num_kv_heads: usize,
    scale: f32,
) -> Vec<f32> {
    attention_one_with_sinks(q, keys, values, num_heads, num_kv_heads, scale, None)
}

/// [`attention_one`] where each head may have an attention-sink logit, `sinks` (num_heads)
/// (gpt-oss, transformers' `s_aux`): a score that joins the softmax's denominator and carries
/// no value.
pub fn attention_one_with_sinks(
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    num_heads: usize,
    num_kv_heads: usize,
    scale: f32,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let head_dim = q.len() / num_heads;
    let group = num_heads / num_kv_heads;
    let mut out = vec![0.0; q.len()];
    for h in 0..num_heads {
        let kvh = h / group;
        let qh = &q[h * head_dim..(h + 1) * head_dim];
        let scores: Vec<f64> = keys
            .iter()
            .map(|k| {
                let kh = &k[kvh * head_dim..(kvh + 1) * head_dim];
                qh.iter().zip(kh).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() * f64::from(scale)
            })
            .collect();
        let sink = sinks.map(|s| f64::from(s[h]));
        let max = scores.iter().copied().chain(sink).fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
        for d in 0..head_dim {
            let o: f64 = weights.iter().zip(values).map(|(w, v)| w * f64::from(v[kvh * head_dim + d])).sum();
            out[h * head_dim + d] = (o / total) as f32;
        }
    }
    out
}

/// The sampler's CPU reference: pick a token from `logits` given (temperature, top_k, top_p,
/// min_p) and a uniform draw `u`, with exact sort-based thresholds. Returns the token and the
/// cumulative kept mass just before it over the total (for tests to see how close `u` was to a
/// boundary).
pub fn sample(logits: &[f32], temperature: f32, top_k: usize, top_p: f32, min_p: f32, u: f32) -> (u32, f64, f64) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if temperature <= 0.0 {
        return (argmax(logits, logits.len())[0], 0.0, 0.0);
    }
    let s: Vec<f64> = logits.iter().map(|&l| f64::from(l - max) / f64::from(temperature)).collect();
    let tau = threshold(&s, top_k, top_p, min_p);
    let total: f64 = s.iter().filter(|&&v| v >= tau).map(|v| v.exp()).sum();
    let target = f64::from(u) * total;
    let mut running = 0.0;
    let mut last = 0;
    for (i, &v) in s.iter().enumerate() {
        if v >= tau {
            let before = running;
            running += v.exp();
            last = i;
            if running > target {
                return (i as u32, before / total, running / total);
            }
        }
    }
    (last as u32, 1.0, 1.0)
}

/// The sampler's kept set over scaled logits `s` (each (logit - max) / temperature): tokens with
/// `s >= threshold`, after top-k, top-p and min-p with exact sort-based thresholds.
fn threshold(s: &[f64], top_k: usize, top_p: f32, min_p: f32) -> f64 {
    let mut sorted = s.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let mut tau = f64::NEG_INFINITY;
    if top_k > 0 && top_k < s.len() {
        tau = sorted[top_k - 1];
    }
    if top_p < 1.0 {
        let kept: Vec<f64> = sorted.iter().copied().filter(|&v| v >= tau).collect();
        let total: f64 = kept.iter().map(|v| v.exp()).sum();
        let mut mass = 0.0;
        for v in kept {
            mass += v.exp();
            if mass >= f64::from(top_p) * total {
                tau = v;
                break;
            }
        }
    }
    if min_p > 0.0 {
        tau = tau.max(f64::from(min_p).ln());
    }
    tau
}

/// The distribution [`sample`] draws from: temperature, top-k, top-p and min-p with exact
/// thresholds, normalised; greedy (temperature 0) is a point mass at the argmax.
pub fn filtered_probs(logits: &[f32], temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> Vec<f64> {
    if temperature <= 0.0 {
        let best = argmax(logits, logits.len())[0] as usize;
        return (0..logits.len()).map(|i| if i == best { 1.0 } else { 0.0 }).collect();
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let s: Vec<f64> = logits.iter().map(|&l| f64::from(l - max) / f64::from(temperature)).collect();
    let tau = threshold(&s, top_k, top_p, min_p);
    let weights: Vec<f64> = s.iter().map(|&v| if v >= tau { v.exp() } else { 0.0 }).collect();
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

/// The rejection-sampling rule of speculative decoding (`shaders/spec_sample.wgsl`): keep
/// `drafted`, drawn from `q`, when `ua · q(d) < p(d)`; otherwise draw with `ur` by inverse CDF
/// from max(0, p − q) (from `p` when that is all zero). Returns the token and the normalised
/// cumulative weight just before and after it (for tests to see how close `ur` was to a
/// boundary; (0, 0) when the draft was kept).
pub fn spec_verify(p: &[f64], q: &[f64], drafted: u32, ua: f32, ur: f32) -> (u32, f64, f64) {
    let d = drafted as usize;
    if f64::from(ua) * q[d] < p[d] {
        return (drafted, 0.0, 0.0);
    }
    let mut weights: Vec<f64> = p.iter().zip(q).map(|(&p, &q)| (p - q).max(0.0)).collect();
    if weights.iter().sum::<f64>() <= 0.0 {
        weights = p.to_vec();
    }
    let total: f64 = weights.iter().sum();
    let goal = f64::from(ur) * total;
    let (mut running, mut last) = (0.0, 0);
    for (i, &w) in weights.iter().enumerate().filter(|(_, w)| **w > 0.0) {
        let before = running;
        running += w;
        last = i;
        if running > goal {
            return (i as u32, before / total, running / total);
        }
    }
    (last as u32, 1.0, 1.0)
}

/// Logit biases and penalties (`shaders/penalize.wgsl`): each entry of `entries` (row, token,
/// times generated or `unseen`, bias as f32 bits) adds its bias to the logit of `token` in row
/// `row` of `logits` (rows, vocab), then, for a token seen before, applies the row's penalties
/// (`penalties`: repetition, presence, frequency per row).
pub fn penalize(logits: &mut [f32], vocab: usize, entries: &[u32], penalties: &[f32], unseen: u32) {
    for e in entries.chunks(4) {
        let (row, token, seen, bias) = (e[0] as usize, e[1] as usize, e[2], f32::from_bits(e[3]));
        let l = &mut logits[row * vocab + token];
        *l += bias;
        if seen != unseen {
            let (rep, pres, freq) = (penalties[3 * row], penalties[3 * row + 1], penalties[3 * row + 2]);
            *l = if *l > 0.0 { *l / rep } else { *l * rep };
            *l -= pres * if seen > 0 { 1.0 } else { 0.0 } + freq * seen as f32;
        }
    }
}

/// Structured output's token masks (`shaders/token_mask.wgsl`): in each row of `logits` (rows,
/// vocab) named by `mask_rows`, every token whose bit in its mask (`masks`: one row of
/// ceil(vocab / 32) words per entry of `mask_rows`, 1 = allowed) is clear gets `masked`.
pub fn token_mask(logits: &mut [f32], vocab: usize, masks: &[u32], mask_rows: &[u32], masked: f32) {
    let words = vocab.div_ceil(32);
    for (m, &row) in mask_rows.iter().enumerate() {
        let mask = &masks[m * words..(m + 1) * words];
        let logits = &mut logits[row as usize * vocab..(row as usize + 1) * vocab];
        for (token, logit) in logits.iter_mut().enumerate() {
            if mask[token / 32] >> (token % 32) & 1 == 0 {
                *logit = masked;
            }
        }
    }
}

/// log softmax of a row, in f64.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_z = logits.iter().map(|&l| f64::from(l - max).exp()).sum::<f64>().ln();
    logits.iter().map(|&l| f64::from(l - max) - log_z).collect()
}
