//! A plain-loop CPU forward pass of the Llama family (Qwen3's q/k norms included), in Hugging
//! Face's conventions (rotate-half
//! RoPE, unpermuted q/k rows): the oracle the GPU model is tested against on tiny models.
//! No cache, no batching: every call recomputes the whole sequence.

use std::collections::HashMap;

use crate::model::config::ModelConfig;

/// f32 weights by their Hugging Face names, each row-major (out, in).
pub type HfWeights = HashMap<String, Vec<f32>>;

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    super::rms_norm(x, w, eps)
}

/// y (out) = W (out, in) · x (in), plus an optional bias.
fn linear(w: &[f32], x: &[f32], bias: Option<&Vec<f32>>) -> Vec<f32> {
    let n_in = x.len();
    let mut y: Vec<f32> = w
        .chunks(n_in)
        .map(|row| row.iter().zip(x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() as f32)
        .collect();
    if let Some(b) = bias {
        y.iter_mut().zip(b).for_each(|(v, b)| *v += b);
    }
    y
}

/// Logits (vocab) at every position of `tokens`.
pub fn forward(config: &ModelConfig, w: &HfWeights, tokens: &[u32]) -> Vec<Vec<f32>> {
    let c = config;
    let (hd, heads, kv_heads) = (c.head_dim, c.num_heads, c.num_kv_heads);
    let get = |name: &str| w.get(name).unwrap_or_else(|| panic!("missing {name}"));
    // Partial rotary, LongRoPE and YaRN (attention factor included) as the GPU model's table.
    let (table, rot) = (c.rope_table(c.max_position_embeddings, tokens.len()), c.rope_dim());
    let embed = get("model.embed_tokens.weight");
    let mut xs: Vec<Vec<f32>> =
        tokens.iter().map(|&t| embed[t as usize * c.hidden_size..(t as usize + 1) * c.hidden_size].to_vec()).collect();
    for l in 0..c.num_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        // Attention: every position's q against keys 0..=pos.
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut queries = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let xn = rms_norm(x, get(&p("input_layernorm.weight")), c.rms_norm_eps);
            let mut q = linear(get(&p("self_attn.q_proj.weight")), &xn, w.get(&p("self_attn.q_proj.bias")));
            let mut k = linear(get(&p("self_attn.k_proj.weight")), &xn, w.get(&p("self_attn.k_proj.bias")));
            let v = linear(get(&p("self_attn.v_proj.weight")), &xn, w.get(&p("self_attn.v_proj.bias")));
            // Qwen3: RMSNorm of each query and key head before RoPE.
            if let (Some(qn), Some(kn)) = (w.get(&p("self_attn.q_norm.weight")), w.get(&p("self_attn.k_norm.weight"))) {
                q = rms_norm(&q, qn, c.rms_norm_eps);
                k = rms_norm(&k, kn, c.rms_norm_eps);
            }
            super::rope(&mut q, heads, hd, rot, &[pos as u32], &table, true);
            super::rope(&mut k, kv_heads, hd, rot, &[pos as u32], &table, true);
            queries.push(q);
            keys.push(k);
            values.push(v);
        }
        for (pos, x) in xs.iter_mut().enumerate() {
            let first = c.sliding_window.map_or(0, |win| (pos + 1).saturating_sub(win));
            let ks: Vec<&[f32]> = keys[first..=pos].iter().map(|k| &k[..]).collect();
            let vs: Vec<&[f32]> = values[first..=pos].iter().map(|v| &v[..]).collect();
            let attn = super::attention_one(&queries[pos], &ks, &vs, heads, kv_heads, 1.0 / (hd as f32).sqrt());
            let o = linear(get(&p("self_attn.o_proj.weight")), &attn, None);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b); // residual connection
            let xn = rms_norm(x, get(&p("post_attention_layernorm.weight")), c.rms_norm_eps);
            let gate = linear(get(&p("mlp.gate_proj.weight")), &xn, None);
            let up = linear(get(&p("mlp.up_proj.weight")), &xn, None);
            let down = linear(get(&p("mlp.down_proj.weight")), &super::silu_mul(&gate, &up), None);
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b); // residual connection
        }
    }
    let head = if c.tie_word_embeddings { embed } else { get("lm_head.weight") };
    xs.iter().map(|x| linear(head, &rms_norm(x, get("model.norm.weight"), c.rms_norm_eps), None)).collect()
}
