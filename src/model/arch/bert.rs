//! BERT encoders — BAAI's bge, sentence-transformers' all-MiniLM and the like, as llama.cpp's
//! converter writes `BertModel` (`bert`) — as one forward pass recorded on the GPU, for
//! embeddings only.
//!
//! Reference: transformers' `models/bert/modeling_bert.py` (`BertModel`), and llama.cpp's
//! `bert` graph for the GGUF layout. The input is the sum of three learned embeddings, then a
//! LayerNorm; each layer is post-norm:
//!
//! ```text
//! x = LayerNorm(token_embd[id] + token_types[0] + position_embd[pos])
//! x = LayerNorm(x + o(attention(q(x), k(x), v(x))))          (biases on q, k, v and o)
//! x = LayerNorm(x + down(gelu(up(x))))                        (biases on up and down; erf GELU)
//! ```
//!
//! Attention is bidirectional ([`AttentionMask::Bidirectional`]): every token sees its whole
//! sequence, so the scheduler runs an encoder's prompt whole in one step and never reuses its
//! blocks from the prefix cache (a token's keys depend on the tokens after it). Positions are
//! absolute and learned: K and V go through the KV write unrotated (a one-row identity table,
//! as SmolLM3's NoPE layers). Every token of a request is type 0 (sentence A), as
//! sentence-transformers and llama.cpp embed single texts.
//!
//! There is no LM head: the final rows are pooled into each sampled row (`pool_rows`, the
//! spans `StepInputs::pool_spans` gives: CLS, mean or last), which the executor reads back as
//! the embedding; the logits stay as the workspace holds them, and the one token the engine
//! samples from them is never kept.
//!
//! [`AttentionMask::Bidirectional`]: crate::gpu::kernels::paged::AttentionMask::Bidirectional

use crate::error::{Result, WeftError};
use crate::gpu::kernels::elementwise::{add_bias, gelu};
use crate::gpu::kernels::embedding::embedding;
use crate::gpu::kernels::paged::QkvLayout;
use crate::gpu::kernels::reduce::{add_layer_norm, pool_rows};
use crate::gpu::kernels::rope::RopePairing;
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::Architecture;
use crate::model::config::ModelConfig;
use crate::model::kv_pool::KvPool;
use crate::model::layers::{Activations, Attention, AttentionSetup, Linear, StepInputs};
use crate::model::weights::{Checkpoint, Loader, WeightSource};
use crate::tensor::TensorFactory;

/// A LayerNorm's weight and bias, each (hidden).
struct LayerNorm {
    weight: GpuTensor,
    bias: GpuTensor,
}

struct Layer {
    attention: Attention,
    attn_norm: LayerNorm, // after attention's residual add
    up: Linear,           // (intermediate, hidden) with bias
    down: Linear,         // (hidden, intermediate) with bias
    out_norm: LayerNorm,  // after the MLP's residual add
}

pub struct BertModel {
    config: ModelConfig,
    token_embd: GpuTensor,    // (vocab, hidden)
    position_embd: GpuTensor, // (max_positions, hidden)
    token_type: GpuTensor,    // (hidden): type 0's row
    embd_norm: LayerNorm,
    layers: Vec<Layer>,
    identity: GpuTensor, // (1, head_dim / 2, 2): (1, 0), K and V unrotated
}

impl BertModel {
    /// Upload every weight of `config`'s model from `source` (llama.cpp's GGUF names),
    /// calling `progress(layers done, layers in all)` as layers arrive.
    pub fn load(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<BertModel> {
        if source.checkpoint() != Checkpoint::Gguf {
            return Err(WeftError::model(
                source.file(),
                "a BERT encoder is read from GGUF only; convert the directory with llama.cpp's convert_hf_to_gguf.py",
            ));
        }
        let c = &config;
        let (hidden, inter, hd) = (c.hidden_size, c.intermediate_size, c.head_dim);
        let (q_rows, kv_rows) = (c.num_heads * hd, c.num_kv_heads * hd);
        let w = Loader { source, factory };
        let vector = |name: &str, len: usize| factory.upload_f32(&[len], &w.named_values(name, len)?);
        let norm = |name: &str| -> Result<LayerNorm> {
            Ok(LayerNorm {
                weight: vector(&format!("{name}.weight"), hidden)?,
                bias: vector(&format!("{name}.bias"), hidden)?,
            })
        };
        // (name, rows) of projections of one input, with their biases.
        let linear = |names: &[(String, usize)], cols: usize| -> Result<Linear> {
            let weights: Vec<(String, usize)> = names.iter().map(|(n, r)| (format!("{n}.weight"), *r)).collect();
            let biases: Vec<String> = names.iter().map(|(n, _)| format!("{n}.bias")).collect();
            w.named_linear(&weights, Some(&biases), cols)
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            let blk = |name: &str| format!("blk.{i}.{name}");
            layers.push(Layer {
                attention: Attention {
                    qkv: linear(
                        &[(blk("attn_q"), q_rows), (blk("attn_k"), kv_rows), (blk("attn_v"), kv_rows)],
                        hidden,
                    )?,
                    o: linear(&[(blk("attn_output"), hidden)], q_rows)?,
                    qk_norm: None,
                    sinks: None,
                },
                attn_norm: norm(&blk("attn_output_norm"))?,
                up: linear(&[(blk("ffn_up"), inter)], hidden)?,
                down: linear(&[(blk("ffn_down"), hidden)], inter)?,
                out_norm: norm(&blk("layer_output_norm"))?,
            });
            progress(i + 1, c.num_layers);
        }
        // Type 0's row of the token-type table (rows of `hidden`; BERT has 2).
        let types_len = source.get_source("token_types.weight")?.map_or(hidden, |t| t.shape.iter().product());
        let types = w.named_values("token_types.weight", types_len)?;
        if types.len() < hidden {
            return Err(WeftError::model(source.file(), format!("tensor token_types.weight holds no row of {hidden}")));
        }
        Ok(BertModel {
            token_embd: w.named_matrix("token_embd.weight", &[c.vocab_size, hidden])?,
            position_embd: w.named_matrix("position_embd.weight", &[c.max_position_embeddings, hidden])?,
            token_type: factory.upload_f32(&[hidden], &types[..hidden])?,
            embd_norm: norm("token_embd_norm")?,
            layers,
            identity: factory.upload_f32(&[1, hd / 2, 2], &[1.0f32, 0.0].repeat(hd / 2))?,
            config,
        })
    }
}

impl Architecture for BertModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn max_context(&self) -> usize {
        self.position_embd.shape()[0]
    }

    fn bidirectional(&self) -> bool {
        true
    }

    fn record_forward(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        inputs: &StepInputs<'_>,
        a: &Activations,
        kv: &KvPool,
        _logits: &GpuTensor,
    ) -> Result<()> {
        let c = &self.config;
        let setup = AttentionSetup {
            layout: QkvLayout { num_heads: c.num_heads, num_kv_heads: c.num_kv_heads, head_dim: c.head_dim },
            cos_sin: &self.identity,
            pairing: RopePairing::Neox,
            sliding_window: None,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        let eps = c.rms_norm_eps;
        embedding(ctx, rec, &self.token_embd, inputs.token_ids, &a.x)?;
        add_bias(ctx, rec, &a.x, &self.token_type)?;
        embedding(ctx, rec, &self.position_embd, inputs.positions, &a.proj)?;
        let n = &self.embd_norm;
        add_layer_norm(ctx, rec, &a.x, &a.proj, &n.weight, &n.bias, &a.xn, eps)?;
        // The residual stream alternates between xn (each sub-layer's input, where attention
        // reads it) and x: a post-norm add writes the sum over its input and the norm into the
        // other buffer.
        for (i, layer) in self.layers.iter().enumerate() {
            layer.attention.forward(ctx, rec, a, inputs, &kv.layer(i)?, &setup, None)?;
            let n = &layer.attn_norm;
            add_layer_norm(ctx, rec, &a.xn, &a.proj, &n.weight, &n.bias, &a.x, eps)?;
            layer.up.forward(ctx, rec, &a.x, &a.act)?;
            gelu(ctx, rec, &a.act)?;
            layer.down.forward(ctx, rec, &a.act, &a.proj)?;
            let n = &layer.out_norm;
            add_layer_norm(ctx, rec, &a.x, &a.proj, &n.weight, &n.bias, &a.xn, eps)?;
        }
        pool_rows(ctx, rec, &a.xn, inputs.pool_spans, &a.rows)
    }
}
