//! The per-layer embeddings Gemma 3n and Gemma 4's small "E" models share: a second token
//! table whose row holds a slice for every layer, mixed with a projection of the scaled token
//! embedding before the first layer, and in each layer a branch that gates the layer's slice by
//! its hidden state and projects it back. Also the checkpoint names of tensors the `Part` table
//! does not hold, which both architectures spell alike.
//!
//! Before the layers, from the scaled token embeddings `x` (hidden wide):
//!
//! ```text
//! inputs = (rms_norm_per_layer(per_layer_model_proj(x) / √hidden) + per_layer_token_embd[t] · √per_layer) / √2
//! ```
//!
//! and layer i's branch, of its hidden state h, is `post_norm(proj(gelu_tanh(inp_gate(h)) ·
//! inputs[i]))`.

use crate::error::Result;
use crate::gpu::kernels::elementwise::{add, gelu_mul_at, scale};
use crate::gpu::kernels::embedding::embedding_scaled;
use crate::gpu::kernels::matmul::matmul;
use crate::gpu::kernels::reduce::rms_norm;
use crate::gpu::{GpuContext, GpuTensor, Recording};
use crate::model::layers::{PerLayerActivations, StepInputs};
use crate::model::weights::{Checkpoint, Loader};

/// Workgroups one dimension of a dispatch holds (row kernels take one per row).
const MAX_WORKGROUPS: usize = 65535;

/// A checkpoint's name of a Gemma tensor the `Part` table does not hold: (GGUF, Hugging Face)
/// suffixes of layer `layer`'s tensor, or of a model-level one.
pub fn own_name(checkpoint: Checkpoint, layer: Option<usize>, gguf: &str, hf: &str) -> String {
    match (checkpoint, layer) {
        (Checkpoint::Gguf, Some(i)) => format!("blk.{i}.{gguf}"),
        (Checkpoint::Gguf, None) => gguf.to_string(),
        (Checkpoint::HuggingFace, Some(i)) => format!("model.layers.{i}.{hf}"),
        (Checkpoint::HuggingFace, None) => format!("model.{hf}"),
    }
}

/// A layer's per-layer-embedding branch.
pub struct PerLayerBranch {
    gate: GpuTensor, // (per_layer, hidden): inp_gate
    proj: GpuTensor, // (hidden, per_layer)
    norm: GpuTensor, // (hidden): post_norm
}

impl PerLayerBranch {
    /// Layer `layer`'s branch, `per_layer` wide.
    pub fn load(w: &Loader<'_>, layer: usize, hidden: usize, per_layer: usize) -> Result<PerLayerBranch> {
        let named = |gguf, hf| own_name(w.source.checkpoint(), Some(layer), gguf, hf);
        Ok(PerLayerBranch {
            gate: w.named_matrix(&named("inp_gate.weight", "per_layer_input_gate.weight"), &[per_layer, hidden])?,
            proj: w.named_matrix(&named("proj.weight", "per_layer_projection.weight"), &[hidden, per_layer])?,
            norm: w.factory.upload_f32(
                &[hidden],
                &w.named_values(&named("post_norm.weight", "post_per_layer_input_norm.weight"), hidden)?,
            )?,
        })
    }

    /// `normed = post_norm(proj(gelu_tanh(inp_gate(h)) · inputs[layer]))`, through `proj`
    /// (tokens, hidden) and `buffers.gate`.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        layer: usize,
        h: &GpuTensor,
        buffers: &PerLayerActivations,
        proj: &GpuTensor,
        normed: &GpuTensor,
        eps: f32,
    ) -> Result<()> {
        matmul(ctx, rec, h, &self.gate, &buffers.gate)?;
        gelu_mul_at(ctx, rec, &buffers.gate, &buffers.inputs, layer * buffers.gate.shape()[1])?;
        matmul(ctx, rec, &buffers.gate, &self.proj, proj)?;
        rms_norm(ctx, rec, proj, &self.norm, normed, eps)
    }
}

/// The model-level half of the per-layer embeddings.
pub struct PerLayerInputs {
    embed: GpuTensor,      // (per_layer_vocab, layers · per_layer): per_layer_token_embd, any format
    model_proj: GpuTensor, // (layers · per_layer, hidden)
    proj_norm: GpuTensor,  // (per_layer)
}

impl PerLayerInputs {
    /// The token table of `vocab` rows and the projection, for `layers` layers `per_layer` wide.
    pub fn load(
        w: &Loader<'_>,
        layers: usize,
        hidden: usize,
        per_layer: usize,
        vocab: usize,
    ) -> Result<PerLayerInputs> {
        let named = |gguf, hf| own_name(w.source.checkpoint(), None, gguf, hf);
        let all = layers * per_layer;
        Ok(PerLayerInputs {
            embed: w
                .named_matrix(&named("per_layer_token_embd.weight", "embed_tokens_per_layer.weight"), &[vocab, all])?,
            model_proj: w.named_matrix(
                &named("per_layer_model_proj.weight", "per_layer_model_projection.weight"),
                &[all, hidden],
            )?,
            proj_norm: w.factory.upload_f32(
                &[per_layer],
                &w.named_values(&named("per_layer_proj_norm.weight", "per_layer_projection_norm.weight"), per_layer)?,
            )?,
        })
    }

    /// Every layer's per-layer input, side by side in `buffers.inputs` (tokens, layers ·
    /// per_layer), from `x` (tokens, hidden: the scaled token embeddings) and the token table.
    pub fn record(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        inputs: &StepInputs<'_>,
        x: &GpuTensor,
        buffers: &PerLayerActivations,
        eps: f32,
    ) -> Result<()> {
        let (tokens, hidden) = (x.shape()[0], x.shape()[1]);
        let per_layer = self.proj_norm.shape()[0];
        let num_layers = self.model_proj.shape()[0] / per_layer;
        matmul(ctx, rec, x, &self.model_proj, &buffers.scratch)?;
        scale(ctx, rec, &buffers.scratch, (hidden as f64).powf(-0.5) as f32)?;
        // Each layer's slice normed on its own, as rows of per_layer: tokens · layers rows, a
        // workgroup each, so a long prefill takes several dispatches of at most 65535.
        let tokens_per_dispatch = (MAX_WORKGROUPS / num_layers).max(1);
        for first in (0..tokens).step_by(tokens_per_dispatch) {
            let range = first..(first + tokens_per_dispatch).min(tokens);
            let rows = [range.len() * num_layers, per_layer];
            let (x, y) = (buffers.scratch.slice_rows(range.clone())?, buffers.inputs.slice_rows(range)?);
            rms_norm(ctx, rec, &x.reshape(&rows)?, &self.proj_norm, &y.reshape(&rows)?, eps)?;
        }
        let token_scale = (per_layer as f64).sqrt() as f32;
        embedding_scaled(ctx, rec, &self.embed, inputs.token_ids, &buffers.scratch, token_scale)?;
        add(ctx, rec, &buffers.inputs, &buffers.scratch)?;
        scale(ctx, rec, &buffers.inputs, std::f64::consts::FRAC_1_SQRT_2 as f32)
    }
}
