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
//! the row orders weft's `Attention` and `Mlp` read. RoPE pairs (i, i + rope_dim/2) in both
//! checkpoints (llama.cpp does not permute Phi-3's rows). Phi-4-mini rotates only the first
//! rope_dim = 96 of each head's 128 dimensions (`partial_rotary_factor` 0.75, GGUF
//! `rope.dimension_count`; transformers' `q[..., :rotary_dim]`), the rest passing through, and
//! its LongRoPE tables have rope_dim / 2 entries. LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini):
//! per-frequency divisors, short or long by the context served (`RopeScaling::LongRope`), and
//! cos/sin scaled by the attention factor, baked into the RoPE table. Phi-3's sliding window is
//! not applied, as llama.cpp does not (its converted files do not describe it faithfully).

use crate::error::Result;
use crate::model::arch::llama::{LlamaModel, Projections};
use crate::model::config::ModelConfig;
use crate::model::weights::WeightSource;
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
    LlamaModel::load_projections(config, source, factory, progress, Projections::Fused)
}
