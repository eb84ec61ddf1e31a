//! Plain-loop CPU versions of the Mamba2 kernels (`shaders/ssm_*.wgsl`, `gated_rms_norm.wgsl`),
//! one sequence at a time, following transformers' `modeling_mamba2.py` (its recurrent form:
//! `causal_conv1d_update` and `mamba2_selective_state_update`), and of LFM2's gated short
//! convolution (`modeling_lfm2.py`), which `ssm_conv` also runs, and of Qwen3.5's Gated
//! DeltaNet recurrence (`modeling_qwen3_5.py`'s `torch_recurrent_gated_delta_rule` with its
//! L2-normalised q and k). Sums are carried in f64.

/// The causal depthwise convolution with SiLU, continuing `conv_state` (kernel - 1, channels),
/// the inputs before `u`'s first row, and leaving the last kernel - 1 inputs there.
/// u (num_rows, channels), weight (channels, kernel), bias (channels) -> (num_rows, channels).
pub fn conv1d_silu(u: &[f32], weight: &[f32], bias: &[f32], kernel: usize, conv_state: &mut [f32]) -> Vec<f32> {
    let sums = conv1d(u, weight, Some(bias), kernel, conv_state);
    sums.iter().map(|&acc| (acc / (1.0 + (-acc).exp())) as f32).collect()
}

/// LFM2's gated short convolution (transformers' `Lfm2ShortConv` between its projections):
/// each row of `bcx` (num_rows, 3 · channels) holds B, C and x side by side, and
/// `y = C · conv(B · x)` with no bias and no activation, continuing `conv_state` (kernel - 1,
/// channels) of past B · x and leaving the last kernel - 1 there. weight (channels, kernel)
/// -> (num_rows, channels).
pub fn short_conv(bcx: &[f32], weight: &[f32], kernel: usize, conv_state: &mut [f32]) -> Vec<f32> {
    let channels = weight.len() / kernel;
    let rows = || bcx.chunks(3 * channels);
    // B · x rounded to f32, as transformers and the kernel keep it in the window.
    let bx: Vec<f32> = rows().flat_map(|r| (0..channels).map(move |c| r[c] * r[2 * channels + c])).collect();
    let sums = conv1d(&bx, weight, None, kernel, conv_state);
    let gates = rows().flat_map(|r| r[channels..2 * channels].iter());
    sums.iter().zip(gates).map(|(&acc, &gate)| (f64::from(gate) * acc) as f32).collect()
}

/// The sums of the causal depthwise convolution (f64), continuing and leaving `conv_state` as
/// [`conv1d_silu`] does.
fn conv1d(u: &[f32], weight: &[f32], bias: Option<&[f32]>, kernel: usize, conv_state: &mut [f32]) -> Vec<f64> {
    let channels = weight.len() / kernel;
    let num_rows = u.len() / channels;
    // (num_past + num_rows, channels): the window then the new inputs.
    let mut all = conv_state.to_vec();
    all.extend_from_slice(u);
    let mut sums = vec![0.0; u.len()];
    for t in 0..num_rows {
        for c in 0..channels {
            let mut acc = bias.map_or(0.0, |b| f64::from(b[c]));
            for j in 0..kernel {
                acc += f64::from(weight[c * kernel + j]) * f64::from(all[(t + j) * channels + c]);
            }
            sums[t * channels + c] = acc;
        }
    }
    conv_state.copy_from_slice(&all[num_rows * channels..]);
    sums
}

/// Shapes of one Mamba2 scan.
#[derive(Clone, Copy, Debug)]
pub struct ScanDims {
    pub num_heads: usize,
    pub head_dim: usize,
    pub state_size: usize,
    pub num_groups: usize,
}

/// The selective scan of one sequence, token by token from `state` (heads, head_dim,
/// state_size), which it leaves after the last token. xbc (num_rows, heads · head_dim + 2 ·
/// groups · state_size) holds x, B, C; dt_raw (num_rows, heads); a, d, dt_bias (heads).
/// Returns y (num_rows, heads · head_dim).
#[allow(clippy::too_many_arguments)]
pub fn ssm_scan(
    dims: ScanDims,
    xbc: &[f32],
    dt_raw: &[f32],
    a: &[f32],
    d: &[f32],
    dt_bias: &[f32],
    state: &mut [f32],
) -> Vec<f32> {
    let ScanDims { num_heads, head_dim, state_size, num_groups } = dims;
    let inner = num_heads * head_dim;
    let width = inner + 2 * num_groups * state_size;
    let num_rows = xbc.len() / width;
    let mut y = vec![0.0; num_rows * inner];
    for t in 0..num_rows {
        let row = &xbc[t * width..(t + 1) * width];
        for h in 0..num_heads {
            let g = h / (num_heads / num_groups);
            let v = f64::from(dt_raw[t * num_heads + h]) + f64::from(dt_bias[h]);
            let step = if v > 20.0 { v } else { v.exp().ln_1p() };
            let decay = (step * f64::from(a[h])).exp();
            let b = &row[inner + g * state_size..inner + (g + 1) * state_size];
            let c = &row[inner + (num_groups + g) * state_size..inner + (num_groups + g + 1) * state_size];
            for p in 0..head_dim {
                let x = f64::from(row[h * head_dim + p]);
                let s = &mut state[(h * head_dim + p) * state_size..(h * head_dim + p + 1) * state_size];
                let mut acc = 0.0f64;
                for n in 0..state_size {
                    let next = f64::from(s[n]) * decay + step * f64::from(b[n]) * x;
                    s[n] = next as f32;
                    acc += next * f64::from(c[n]);
                }
                y[t * inner + h * head_dim + p] = (acc + f64::from(d[h]) * x) as f32;
            }
        }
    }
    y
}

/// `y = rms_norm_per_group(x · silu(z)) · weight` over groups of `group_size` columns, or
/// with `gate_after` (Qwen3.5's `Qwen3_5RMSNormGated`) `rms_norm_per_group(x) · weight ·
/// silu(z)`; x and z (rows, weight.len()).
pub fn gated_rms_norm(x: &[f32], z: &[f32], weight: &[f32], group_size: usize, eps: f32, gate_after: bool) -> Vec<f32> {
    let silu = |z: f32| {
        let z = f64::from(z);
        z / (1.0 + (-z).exp())
    };
    let v: Vec<f64> =
        x.iter().zip(z).map(|(&x, &z)| if gate_after { f64::from(x) } else { f64::from(x) * silu(z) }).collect();
    let mut y = vec![0.0; x.len()];
    for (g, group) in v.chunks(group_size).enumerate() {
        let ms = group.iter().map(|v| v * v).sum::<f64>() / group_size as f64;
        let scale = 1.0 / (ms + f64::from(eps)).sqrt();
        for (i, v) in group.iter().enumerate() {
            let at = g * group_size + i;
            let normed = v * scale * f64::from(weight[at % weight.len()]);
            y[at] = (if gate_after { normed * silu(z[at]) } else { normed }) as f32;
        }
    }
    y
}

/// Shapes of one Gated DeltaNet layer's recurrence.
#[derive(Clone, Copy, Debug)]
pub struct DeltaDims {
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    /// v head h reads q/k head h % num_k_heads (llama.cpp's GGUF order), else h / (num_v_heads
    /// / num_k_heads) (transformers' `repeat_interleave`).
    pub v_heads_tiled: bool,
}

/// The Gated DeltaNet recurrence of one sequence, token by token from `state` (v_heads,
/// head_v, head_k: column j of each head's S), which it leaves after the last token. qkv
/// (num_rows, 2 · k_heads · head_k + v_heads · head_v) holds the convolved q, k, v; b and a
/// (num_rows, v_heads) the raw β logits and decay inputs; a_neg (-exp(A_log)) and dt_bias
/// (v_heads). Returns y (num_rows, v_heads · head_v).
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    dims: DeltaDims,
    qkv: &[f32],
    b: &[f32],
    a: &[f32],
    a_neg: &[f32],
    dt_bias: &[f32],
    state: &mut [f32],
) -> Vec<f32> {
    let DeltaDims { num_k_heads, num_v_heads, head_k_dim: dk, head_v_dim: dv, v_heads_tiled } = dims;
    let key = num_k_heads * dk;
    let width = 2 * key + num_v_heads * dv;
    let num_rows = qkv.len() / width;
    let mut y = vec![0.0; num_rows * num_v_heads * dv];
    // transformers' l2norm: x · rsqrt(Σ x² + 1e-6).
    let l2 = |x: &[f32]| -> Vec<f64> {
        let inv = 1.0 / (x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() + 1e-6).sqrt();
        x.iter().map(|&v| f64::from(v) * inv).collect()
    };
    for t in 0..num_rows {
        let row = &qkv[t * width..(t + 1) * width];
        for h in 0..num_v_heads {
            let g = if v_heads_tiled { h % num_k_heads } else { h / (num_v_heads / num_k_heads) };
            let q: Vec<f64> = l2(&row[g * dk..(g + 1) * dk]).iter().map(|q| q / (dk as f64).sqrt()).collect();
            let k = l2(&row[key + g * dk..key + (g + 1) * dk]);
            let v = &row[2 * key + h * dv..2 * key + (h + 1) * dv];
            let x = f64::from(a[t * num_v_heads + h]) + f64::from(dt_bias[h]);
            let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
            let decay = (f64::from(a_neg[h]) * softplus).exp();
            let beta = 1.0 / (1.0 + (-f64::from(b[t * num_v_heads + h])).exp());
            for j in 0..dv {
                let s = &mut state[(h * dv + j) * dk..(h * dv + j + 1) * dk];
                let decayed: Vec<f64> = s.iter().map(|&v| f64::from(v) * decay).collect();
                let kv: f64 = decayed.iter().zip(&k).map(|(s, k)| s * k).sum();
                let delta = beta * (f64::from(v[j]) - kv);
                let mut out = 0.0;
                for i in 0..dk {
                    let next = decayed[i] + k[i] * delta;
                    s[i] = next as f32;
                    out += next * q[i];
                }
                y[(t * num_v_heads + h) * dv + j] = out as f32;
            }
        }
    }
    y
}
