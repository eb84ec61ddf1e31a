//! Phi-3 (text), from llama.cpp's GGUF layout or a Hugging Face directory: Llama's forward
//! pass (`LlamaModel`) over Phi-3's fused checkpoints and LongRoPE table.
//!
//! Reference: transformers' `models/phi3/modeling_phi3.py` (`Phi3ForCausalLM`) and llama.cpp's
//! `phi3` graph (`src/models/phi3.cpp`). Each layer is Llama's
//!
//! ```text
//! h = x + o_proj(attention(rope(q), rope(k), v)),  (q, k, v) = qkv_proj(rms_norm(x)) by rows
//! x = h + down_proj(silu(gate) * up),              (gate, up) = gate_up_proj(rms_norm(h)) by rows
//! ```
//!
//! so only loading differs: the two fused projections are one matrix each as the checkpoint
//! stores them, q, k and v rows (`attn_qkv` / `qkv_proj`), and gate then up rows (llama.cpp
//! keeps the name `ffn_up` for that stack; `gate_up_proj` in transformers), which are exactly
//! the row orders weft's `Attention` and `Mlp` read. RoPE pairs (i, i + head_dim/2) in both
//! checkpoints (llama.cpp does not permute Phi-3's rows). LongRoPE (Phi-3 128k, Phi-3.5):
//! per-frequency divisors, short or long by the context served (`RopeScaling::LongRope`), and
//! cos/sin scaled by the attention factor, baked into the RoPE table. Phi-3's sliding window is
//! not applied, as llama.cpp does not (its converted files do not describe it faithfully).

use crate::error::Result;
use crate::gpu::kernels::rope::{RopePairing, cos_sin_table};
use crate::model::arch::llama::{Layer, LlamaModel, MAX_TABLE_POSITIONS};
use crate::model::config::ModelConfig;
use crate::model::layers::{Attention, Gate, Mlp};
use crate::model::weights::{Loader, Part, WeightSource};
use crate::tensor::TensorFactory;

/// Upload every weight of `config`'s Phi-3 from `source`, calling `progress(layers done,
/// layers in all)` as layers arrive.
pub fn load(
    mut config: ModelConfig,
    source: &dyn WeightSource,
    factory: &dyn TensorFactory,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<LlamaModel> {
    // Phi-3's window is not applied (see above); transformers' config may still name one.
    config.sliding_window = None;
    let c = &config;
    let (hidden, q_rows, kv_rows) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let w = Loader { source, factory };
    let inter = c.intermediate_size;
    let mut layers = Vec::with_capacity(c.num_layers);
    progress(0, c.num_layers);
    for i in 0..c.num_layers {
        layers.push(Layer {
            attn_norm: w.vector(Some(i), Part::AttnNorm, hidden)?,
            // (q_rows + 2 · kv_rows, hidden): q, k, v rows stacked.
            attention: Attention {
                qkv: w.linear(i, &[(Part::Qkv, q_rows + 2 * kv_rows)], None, hidden)?,
                o: w.linear(i, &[(Part::O, hidden)], None, q_rows)?,
                qk_norm: None,
            },
            ffn_norm: w.vector(Some(i), Part::FfnNorm, hidden)?,
            // (2 · intermediate, hidden): gate rows, then up rows.
            mlp: Mlp {
                gate_up: w.linear(i, &[(Part::GateUp, 2 * inter)], None, hidden)?,
                down: w.linear(i, &[(Part::Down, hidden)], None, inter)?,
                gate: Gate::Silu,
            },
        });
        progress(i + 1, c.num_layers);
    }
    let embed = w.matrix(None, Part::Q, &[c.vocab_size, hidden])?;
    let norm = w.vector(None, Part::AttnNorm, hidden)?;
    let lm_head = if c.tie_word_embeddings { None } else { Some(w.matrix(None, Part::O, &[c.vocab_size, hidden])?) };
    // The context served (the table's length) picks LongRoPE's factors.
    let positions = c.max_position_embeddings.min(MAX_TABLE_POSITIONS);
    let attention_factor = c.rope_attention_factor();
    let table: Vec<f32> = cos_sin_table(&c.inv_freq_for_context(positions), positions)
        .into_iter()
        .map(|v| v * attention_factor)
        .collect();
    // (positions, head_dim / 2, 2)
    let cos_sin = factory.upload_f32(&[positions, c.head_dim / 2, 2], &table)?;
    Ok(LlamaModel { config, embed, layers, norm, lm_head, cos_sin, pairing: RopePairing::Neox })
}
