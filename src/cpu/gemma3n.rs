//! Gemma 3n's kernels on the CPU (`gpu::kernels::altup`): AltUp's predict and correct steps,
//! the magnitude match and the activation sparsity. Streams are `n` slices of (tokens, hidden).

/// Each stream's prediction: out[j][t] = Σ_k c_t[j, k] · s[k][t] + s[j][t] with
/// c_t[j, k] = Σ_m coefs[j · n + k, m] · modal[t, m]; modal (tokens, n), coefs (n · n, n).
pub fn altup_predict(streams: &[Vec<f32>], modal: &[f32], coefs: &[f32], hidden: usize) -> Vec<Vec<f32>> {
    let n = streams.len();
    let tokens = modal.len() / n;
    let mut out = vec![vec![0.0f32; tokens * hidden]; n];
    for t in 0..tokens {
        for j in 0..n {
            let c: Vec<f64> = (0..n)
                .map(|k| (0..n).map(|m| f64::from(coefs[(j * n + k) * n + m]) * f64::from(modal[t * n + m])).sum())
                .collect();
            for h in 0..hidden {
                let i = t * hidden + h;
                let mixed: f64 = (0..n).map(|k| c[k] * f64::from(streams[k][i])).sum();
                out[j][i] = (mixed + f64::from(streams[j][i])) as f32;
            }
        }
    }
    out
}

/// Each stream corrected by the active one's innovation, and the corrected active stream
/// scaled: (out, scaled) with out[j][t] = (1 + Σ_m coefs[j, m] · modal[t, m]) · (activated[t] -
/// pred[active][t]) + pred[j][t] and scaled[t] = out[active][t] · out_scale; coefs (n, n).
pub fn altup_correct(
    pred: &[Vec<f32>],
    activated: &[f32],
    modal: &[f32],
    coefs: &[f32],
    out_scale: &[f32],
    active: usize,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let (n, hidden) = (pred.len(), out_scale.len());
    let tokens = activated.len() / hidden;
    let mut out = vec![vec![0.0f32; tokens * hidden]; n];
    for t in 0..tokens {
        for j in 0..n {
            let c: f64 = (0..n).map(|m| f64::from(coefs[j * n + m]) * f64::from(modal[t * n + m])).sum();
            for h in 0..hidden {
                let i = t * hidden + h;
                let innovation = f64::from(activated[i]) - f64::from(pred[active][i]);
                out[j][i] = (innovation * (c + 1.0) + f64::from(pred[j][i])) as f32;
            }
        }
    }
    let scaled = out[active].iter().enumerate().map(|(i, &v)| v * out_scale[i % hidden]).collect();
    (out, scaled)
}

/// Each row of x (rows, n) scaled to target's row's root mean square: x · rms(target) /
/// sqrt(max(mean(x²), min_square)).
pub fn magnitude_match(x: &[f32], target: &[f32], n: usize, min_square: f32) -> Vec<f32> {
    let mean_square = |row: &[f32]| row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / n as f64;
    x.chunks(n)
        .zip(target.chunks(n))
        .flat_map(|(xr, tr)| {
            let scale = mean_square(tr).sqrt() / mean_square(xr).max(f64::from(min_square)).sqrt();
            xr.iter().map(move |&v| (f64::from(v) * scale) as f32)
        })
        .collect()
}

/// The activation sparsity of each row of x (rows, n): max(x - (mean + std · multiplier), 0),
/// the population standard deviation.
pub fn gaussian_topk(x: &[f32], n: usize, multiplier: f32) -> Vec<f32> {
    x.chunks(n)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
            let var = row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n as f64;
            let cutoff = mean + var.sqrt() * f64::from(multiplier);
            row.iter().map(move |&v| (f64::from(v) - cutoff).max(0.0) as f32)
        })
        .collect()
}
