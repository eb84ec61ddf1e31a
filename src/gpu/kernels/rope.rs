//! Rotary position embedding: the pairings and the CPU-built angle table the GPU reads (the
//! rotation itself runs in `paged::rope_kv_write`, fused with the KV write).

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
