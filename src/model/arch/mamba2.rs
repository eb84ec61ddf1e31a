//! Mamba2 — a pure state-space model — as one forward pass recorded on the GPU.
//!
//! Reference: transformers' `models/mamba2/modeling_mamba2.py` (`Mamba2ForCausalLM`, its
//! recurrent form `causal_conv1d_update` + `mamba2_selective_state_update`), and llama.cpp's
//! `mamba2` graph and `convert_hf_to_gguf.py` for the GGUF layout. Each layer is
//!
//! ```text
//! z, xBC, dt = in_proj(rms_norm(x))                       side by side in one row
//! xBC        = silu(conv1d(xBC))                          causal, depthwise, over the slot's window
//! y          = scan(x, dt, A, B, C, D)                    from and back to the slot's state
//! x          = x + out_proj(rms_norm_per_group(y · silu(z)))
//! ```
//!
//! (the mixer is `layers::SsmMixer`), then a final RMSNorm and the LM head on the sampled rows
//! only. There is no attention and no KV cache: a sequence's whole context lives in its
//! recurrent-state slot (each layer's conv window and SSM state), so a decode step costs the
//! same at any context length.

use crate::error::{Result, WeftError};
use crate::gpu::kernels::embedding::embedding;
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::reduce::{add_rms_norm, rms_norm};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::Architecture;
use crate::model::config::ModelConfig;
use crate::model::kv_pool::KvPool;
use crate::model::layers::{Activations, SsmMixer, StepInputs};
use crate::model::weights::{Checkpoint, Loader, WeightSource};
use crate::tensor::TensorFactory;

struct Layer {
    norm: GpuTensor, // (hidden)
    mixer: SsmMixer,
}

pub struct Mamba2Model {
    config: ModelConfig,
    embed: GpuTensor, // (vocab, hidden)
    layers: Vec<Layer>,
    norm: GpuTensor,            // (hidden)
    lm_head: Option<GpuTensor>, // (vocab, hidden); None when tied to `embed`
}

impl Mamba2Model {
    /// Upload every weight of `config`'s model from `source`, calling `progress(layers done,
    /// layers in all)` as layers arrive.
    pub fn load(
        config: ModelConfig,
        source: &dyn WeightSource,
        factory: &dyn TensorFactory,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Mamba2Model> {
        let c = &config;
        let ssm = c.ssm.ok_or_else(|| WeftError::model(source.file(), "mamba2 without an ssm shape"))?;
        let hidden = c.hidden_size;
        let w = Loader { source, factory };
        let gguf = source.checkpoint() == Checkpoint::Gguf;
        let name = |gguf_name: &str, hf_name: &str| if gguf { gguf_name.to_string() } else { hf_name.to_string() };
        let vector = |name: String| factory.upload_f32(&[hidden], &w.named_values(&name, hidden)?);
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            layers.push(Layer {
                norm: vector(name(&format!("blk.{i}.attn_norm.weight"), &format!("backbone.layers.{i}.norm.weight")))?,
                mixer: SsmMixer::load(&w, ssm, hidden, i, &format!("backbone.layers.{i}.mixer"))?,
            });
            progress(i + 1, c.num_layers);
        }
        let embed =
            w.named_matrix(&name("token_embd.weight", "backbone.embeddings.weight"), &[c.vocab_size, hidden])?;
        let norm = vector(name("output_norm.weight", "backbone.norm_f.weight"))?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            w.optional_named_matrix(&name("output.weight", "lm_head.weight"), &[c.vocab_size, hidden])?
        };
        Ok(Mamba2Model { config, embed, layers, norm, lm_head })
    }
}

impl Architecture for Mamba2Model {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn max_context(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn record_forward(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        inputs: &StepInputs<'_>,
        a: &Activations,
        kv: &KvPool,
        logits: &GpuTensor,
    ) -> Result<()> {
        let eps = self.config.rms_norm_eps;
        let states = kv.states()?;
        embedding(ctx, rec, &self.embed, inputs.token_ids, &a.x)?;
        for (i, layer) in self.layers.iter().enumerate() {
            if i == 0 {
                rms_norm(ctx, rec, &a.x, &layer.norm, &a.xn, eps)?;
            } else {
                // The previous layer's residual connection, then this layer's norm.
                add_rms_norm(ctx, rec, &a.x, &a.proj, &layer.norm, &a.xn, eps)?;
            }
            let (conv_state, ssm_state) = states.layer(i)?;
            layer.mixer.forward(ctx, rec, a, inputs, conv_state, ssm_state, eps)?;
        }
        add_rms_norm(ctx, rec, &a.x, &a.proj, &self.norm, &a.xn, eps)?;
        // Only the sampled rows need logits: gather those rows, then the LM head.
        embedding(ctx, rec, &a.xn, inputs.logit_rows, &a.rows)?;
        matmul(ctx, rec, &a.rows, self.lm_head.as_ref().unwrap_or(&self.embed), logits)
    }
}
