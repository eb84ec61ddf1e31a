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
//! then a final RMSNorm and the LM head on the sampled rows only. There is no attention and
//! no KV cache: a sequence's whole context lives in its recurrent-state slot (each layer's
//! conv window and SSM state), so a decode step costs the same at any context length.
//!
//! GGUF stores A as `-exp(A_log)` (llama.cpp's converter does it); a Hugging Face directory
//! stores `A_log`, converted here at load.

use crate::error::Result;
use crate::gpu::kernels::embedding::embedding;
use crate::gpu::kernels::matmul::lm_head;
use crate::gpu::kernels::reduce::{add_rms_norm, rms_norm};
use crate::gpu::kernels::ssm::{ScanShape, ScanWeights, gated_rms_norm, ssm_conv, ssm_scan};
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::arch::Architecture;
use crate::model::config::{ModelConfig, SsmConfig};
use crate::model::kv_pool::KvPool;
use crate::model::layers::{Activations, Linear, StepInputs};
use crate::model::weights::{Checkpoint, Loader, WeightSource};
use crate::tensor::TensorFactory;

struct Layer {
    norm: GpuTensor,        // (hidden)
    in_proj: Linear,        // (inner + conv_channels + heads, hidden)
    conv_weight: GpuTensor, // (conv_channels, conv_kernel) F32
    conv_bias: GpuTensor,   // (conv_channels)
    a: GpuTensor,           // (heads): -exp(A_log)
    d: GpuTensor,           // (heads)
    dt_bias: GpuTensor,     // (heads)
    ssm_norm: GpuTensor,    // (inner)
    out_proj: Linear,       // (hidden, inner)
}

pub struct Mamba2Model {
    config: ModelConfig,
    ssm: SsmConfig,
    embed: GpuTensor, // (vocab, hidden)
    layers: Vec<Layer>,
    norm: GpuTensor,            // (hidden)
    lm_head: Option<GpuTensor>, // (vocab, hidden); None when tied to `embed`
}

/// The checkpoint's names: (GGUF, Hugging Face).
fn name(checkpoint: Checkpoint, gguf: &str, hf: &str) -> String {
    match checkpoint {
        Checkpoint::Gguf => gguf.to_string(),
        Checkpoint::HuggingFace => hf.to_string(),
    }
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
        let ssm = c.ssm.ok_or_else(|| crate::error::WeftError::model(source.file(), "mamba2 without an ssm shape"))?;
        let (hidden, inner, heads, channels) = (c.hidden_size, ssm.inner_size(), ssm.num_heads, ssm.conv_channels());
        let w = Loader { source, factory };
        let cp = source.checkpoint();
        let f32s = |name: String, len: usize, shape: &[usize]| -> Result<GpuTensor> {
            factory.upload_f32(shape, &w.named_values(&name, len)?)
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        progress(0, c.num_layers);
        for i in 0..c.num_layers {
            let g = |suffix: &str| format!("blk.{i}.{suffix}");
            let h = |suffix: &str| format!("backbone.layers.{i}.{suffix}");
            let a_name = name(cp, &g("ssm_a"), &h("mixer.A_log"));
            let mut a = w.named_values(&a_name, heads)?;
            if cp == Checkpoint::HuggingFace {
                a.iter_mut().for_each(|v| *v = -v.exp());
            }
            layers.push(Layer {
                norm: f32s(name(cp, &g("attn_norm.weight"), &h("norm.weight")), hidden, &[hidden])?,
                in_proj: Linear {
                    weights: vec![w.named_matrix(
                        &name(cp, &g("ssm_in.weight"), &h("mixer.in_proj.weight")),
                        &[ssm.in_proj_size(), hidden],
                    )?],
                    bias: None,
                },
                conv_weight: f32s(
                    name(cp, &g("ssm_conv1d.weight"), &h("mixer.conv1d.weight")),
                    channels * ssm.conv_kernel,
                    &[channels, ssm.conv_kernel],
                )?,
                conv_bias: f32s(name(cp, &g("ssm_conv1d.bias"), &h("mixer.conv1d.bias")), channels, &[channels])?,
                a: factory.upload_f32(&[heads], &a)?,
                d: f32s(name(cp, &g("ssm_d"), &h("mixer.D")), heads, &[heads])?,
                dt_bias: f32s(name(cp, &g("ssm_dt.bias"), &h("mixer.dt_bias")), heads, &[heads])?,
                ssm_norm: f32s(name(cp, &g("ssm_norm.weight"), &h("mixer.norm.weight")), inner, &[inner])?,
                out_proj: Linear {
                    weights: vec![w.named_matrix(
                        &name(cp, &g("ssm_out.weight"), &h("mixer.out_proj.weight")),
                        &[hidden, inner],
                    )?],
                    bias: None,
                },
            });
            progress(i + 1, c.num_layers);
        }
        let embed =
            w.named_matrix(&name(cp, "token_embd.weight", "backbone.embeddings.weight"), &[c.vocab_size, hidden])?;
        let norm = f32s(name(cp, "output_norm.weight", "backbone.norm_f.weight"), hidden, &[hidden])?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            w.optional_named_matrix(&name(cp, "output.weight", "lm_head.weight"), &[c.vocab_size, hidden])?
        };
        Ok(Mamba2Model { config, ssm, embed, layers, norm, lm_head })
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
        let (c, ssm) = (&self.config, &self.ssm);
        let eps = c.rms_norm_eps;
        let acts = a.ssm()?;
        let states = kv.states()?;
        let shape = ScanShape {
            num_heads: ssm.num_heads,
            head_dim: ssm.head_dim,
            state_size: ssm.state_size,
            num_groups: ssm.num_groups,
        };
        let (inner, channels) = (ssm.inner_size(), ssm.conv_channels());
        embedding(ctx, rec, &self.embed, inputs.token_ids, &a.x)?;
        for (i, layer) in self.layers.iter().enumerate() {
            if i == 0 {
                rms_norm(ctx, rec, &a.x, &layer.norm, &a.xn, eps)?;
            } else {
                // The previous layer's residual connection, then this layer's norm.
                add_rms_norm(ctx, rec, &a.x, &a.proj, &layer.norm, &a.xn, eps)?;
            }
            let (conv_state, ssm_state) = states.layer(i)?;
            // z, xBC, dt side by side.
            layer.in_proj.forward(ctx, rec, &a.xn, &acts.zxbcdt)?;
            ssm_conv(
                ctx,
                rec,
                &acts.zxbcdt,
                inner,
                &layer.conv_weight,
                &layer.conv_bias,
                &inputs.seq_states,
                conv_state,
                &acts.xbc,
            )?;
            let weights = ScanWeights { a: &layer.a, d: &layer.d, dt_bias: &layer.dt_bias };
            ssm_scan(
                ctx,
                rec,
                shape,
                &acts.xbc,
                &acts.zxbcdt,
                inner + channels,
                &weights,
                &inputs.seq_states,
                ssm_state,
                &acts.y,
            )?;
            let group_size = inner / ssm.num_groups;
            gated_rms_norm(ctx, rec, &acts.y, &acts.zxbcdt, 0, &layer.ssm_norm, group_size, &acts.yn, eps)?;
            layer.out_proj.forward(ctx, rec, &acts.yn, &a.proj)?;
        }
        add_rms_norm(ctx, rec, &a.x, &a.proj, &self.norm, &a.xn, eps)?;
        // Only the sampled rows need logits: gather those rows, then the LM head.
        embedding(ctx, rec, &a.xn, inputs.logit_rows, &a.rows)?;
        lm_head(ctx, rec, &a.rows, self.lm_head.as_ref().unwrap_or(&self.embed), logits)
    }
}
