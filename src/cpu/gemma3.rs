//! A plain-loop CPU forward pass of Gemma 3 (transformers' `Gemma3ForCausalLM`): the oracle the
//! GPU model is tested against on tiny models. Weights are keyed by their GGUF names, whose norm
//! weights already hold transformers' 1 + w. No cache, no batching.

use super::llama::HfWeights;
use crate::model::config::ModelConfig;

/// y (out) = W (out, in) · x (in).
fn linear(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks(x.len())
        .map(|row| row.iter().zip(x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() as f32)
        .collect()
}

/// Logits (vocab) at every position of `tokens`; `w` keyed by GGUF tensor names.
pub fn forward(config: &ModelConfig, w: &HfWeights, tokens: &[u32]) -> Vec<Vec<f32>> {
    let c = config;
    let (hd, heads, kv_heads, eps) = (c.head_dim, c.num_heads, c.num_kv_heads, c.rms_norm_eps);
    let get = |name: &str| w.get(name).unwrap_or_else(|| panic!("missing {name}"));
    let global = c.rope_table(c.max_position_embeddings, tokens.len());
    let local = crate::gpu::kernels::rope::cos_sin_table(&c.local_inv_freq(), tokens.len());
    let embed = get("token_embd.weight");
    let embed_scale = (c.hidden_size as f32).sqrt();
    let mut xs: Vec<Vec<f32>> = tokens
        .iter()
        .map(|&t| {
            embed[t as usize * c.hidden_size..(t as usize + 1) * c.hidden_size]
                .iter()
                .map(|v| v * embed_scale)
                .collect()
        })
        .collect();
    let scale = 1.0 / c.query_pre_attn_scalar.unwrap_or(hd as f32).sqrt();
    for l in 0..c.num_layers {
        let p = |s: &str| format!("blk.{l}.{s}");
        let sliding = c.is_sliding(l);
        let table = if sliding { &local } else { &global };
        let (mut keys, mut values, mut queries) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, x) in xs.iter().enumerate() {
            let xn = super::rms_norm(x, get(&p("attn_norm.weight")), eps);
            let q = linear(get(&p("attn_q.weight")), &xn);
            let k = linear(get(&p("attn_k.weight")), &xn);
            let v = linear(get(&p("attn_v.weight")), &xn);
            let mut q = super::rms_norm(&q, get(&p("attn_q_norm.weight")), eps);
            let mut k = super::rms_norm(&k, get(&p("attn_k_norm.weight")), eps);
            super::rope(&mut q, heads, hd, c.rope_dim(), &[pos as u32], table, true);
            super::rope(&mut k, kv_heads, hd, c.rope_dim(), &[pos as u32], table, true);
            queries.push(q);
            keys.push(k);
            values.push(v);
        }
        for (pos, x) in xs.iter_mut().enumerate() {
            let window = if sliding { c.sliding_window } else { None };
            let first = window.map_or(0, |win| (pos + 1).saturating_sub(win));
            let ks: Vec<&[f32]> = keys[first..=pos].iter().map(|k| &k[..]).collect();
            let vs: Vec<&[f32]> = values[first..=pos].iter().map(|v| &v[..]).collect();
            let attn = super::attention_one(&queries[pos], &ks, &vs, heads, kv_heads, scale);
            let o = linear(get(&p("attn_output.weight")), &attn);
            let o = super::rms_norm(&o, get(&p("post_attention_norm.weight")), eps);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b); // residual connection
            let xn = super::rms_norm(x, get(&p("ffn_norm.weight")), eps);
            let gate = linear(get(&p("ffn_gate.weight")), &xn);
            let up = linear(get(&p("ffn_up.weight")), &xn);
            let down = linear(get(&p("ffn_down.weight")), &super::gelu_tanh_mul(&gate, &up));
            let down = super::rms_norm(&down, get(&p("post_ffw_norm.weight")), eps);
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b); // residual connection
        }
    }
    xs.iter().map(|x| linear(embed, &super::rms_norm(x, get("output_norm.weight"), eps))).collect()
}
