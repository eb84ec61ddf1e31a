//! The GPU memory behind the paged KV cache (one K and one V tensor per attention layer) and
//! behind the recurrent-state slots of recurrent layers (one conv-window tensor per recurrent
//! layer, and one SSM-state tensor per Mamba2 layer). `kv::` decides which blocks and slots a sequence holds; the
//! executor owns this pool and only follows the tables.

use crate::error::{Result, WeftError};
use crate::gpu::kernels::paged::PagedKv;
use crate::gpu::{GpuTensor, GpuTensorFactory};
use crate::kv::{KvCacheConfig, RecurrentStateConfig};
use crate::model::config::ModelConfig;
use crate::quant::DType;
use crate::tensor::TensorFactory;

/// The K and V caches of every layer that keeps its own: one (num_blocks · block_size,
/// num_kv_heads, head_dim) tensor of the config's dtype (F32 or F16) per layer and side (the
/// layer's own KV heads and head size: `ModelConfig::kv_shape`), so no binding grows with the
/// layer count (buffers, or rgba32float / rgba16float textures on CPU drivers).
pub struct KvPool {
    config: KvCacheConfig,
    /// Per model layer; `None` for a recurrent layer or one that reads an earlier layer's.
    k: Vec<Option<GpuTensor>>,
    v: Vec<Option<GpuTensor>>,
    /// The state slots, for a model with recurrent layers.
    states: Option<StatePool>,
}

/// Every recurrent layer's state over all slots, indexed by model layer.
pub struct StatePool {
    config: RecurrentStateConfig,
    conv: Vec<Option<GpuTensor>>, // per layer: (slots + snapshots, conv_kernel - 1, conv_channels) F32
    ssm: Vec<Option<GpuTensor>>,  // per Mamba2 layer: (slots + snapshots, heads, head_dim, state_size) F32
}

impl StatePool {
    /// Mamba2 layer `layer`'s (conv window, SSM state) tensors; an error for any other layer.
    pub fn layer(&self, layer: usize) -> Result<(&GpuTensor, &GpuTensor)> {
        match (self.conv.get(layer), self.ssm.get(layer)) {
            (Some(Some(conv)), Some(Some(ssm))) => Ok((conv, ssm)),
            _ => Err(WeftError::Unsupported(format!("layer {layer} has no Mamba2 state"))),
        }
    }

    /// Layer `layer`'s conv window (LFM2's short convolutions keep nothing else); an error for
    /// an attention layer.
    pub fn conv(&self, layer: usize) -> Result<&GpuTensor> {
        match self.conv.get(layer) {
            Some(Some(conv)) => Ok(conv),
            _ => Err(WeftError::Unsupported(format!("layer {layer} has no recurrent state"))),
        }
    }
}

impl KvPool {
    /// KV for `model`'s attention layers in `config`'s blocks, and `num_state_slots` state
    /// slots plus `num_snapshot_slots` prefix-state snapshot slots for its recurrent layers (none
    /// for a model without them).
    pub fn new(
        factory: &GpuTensorFactory,
        config: KvCacheConfig,
        model: &ModelConfig,
        num_state_slots: usize,
        num_snapshot_slots: usize,
    ) -> Result<KvPool> {
        let slots = config.num_blocks * config.block_size;
        let mut k = Vec::with_capacity(model.num_layers);
        let mut v = Vec::with_capacity(model.num_layers);
        for layer in 0..model.num_layers {
            // Only layers with a cache of their own: a recurrent layer has none, and a layer
            // that attends over an earlier layer's (Gemma 4's KV sharing) reads that one.
            let cache = |&(heads, dim): &(usize, usize)| factory.kv_cache(&[slots, heads, dim], config.dtype, None);
            k.push(model.kv_shape(layer).as_ref().map(cache).transpose()?);
            v.push(model.kv_shape(layer).as_ref().map(cache).transpose()?);
        }
        let states = match model.layer_state() {
            Some(shape) => {
                let (mut conv, mut states) = (Vec::new(), Vec::new());
                let rows = num_state_slots + num_snapshot_slots;
                for layer in 0..model.num_layers {
                    let recurrent = model.is_recurrent(layer);
                    let zeros = |shape: &[usize]| recurrent.then(|| factory.zeros(shape, DType::F32)).transpose();
                    conv.push(zeros(&[rows, shape.conv_kernel - 1, shape.conv_channels])?);
                    states.push(match shape.ssm {
                        Some([heads, head_dim, state_size]) => zeros(&[rows, heads, head_dim, state_size])?,
                        None => None,
                    });
                }
                let config = RecurrentStateConfig {
                    num_slots: num_state_slots,
                    num_snapshot_slots,
                    slot_size_bytes: model.num_recurrent_layers() * shape.bytes(),
                    // The executor reports its own scan chunk.
                    scan_chunk_tokens: 1,
                };
                Some(StatePool { config, conv, ssm: states })
            }
            None => None,
        };
        Ok(KvPool { config, k, v, states })
    }

    pub fn config(&self) -> KvCacheConfig {
        self.config
    }

    /// The state-slot pool's shape; `None` for a model without recurrent layers.
    pub fn state_config(&self) -> Option<RecurrentStateConfig> {
        self.states.as_ref().map(|s| s.config)
    }

    /// The state slots, or an error for a model without recurrent layers.
    pub fn states(&self) -> Result<&StatePool> {
        self.states.as_ref().ok_or_else(|| WeftError::Unsupported("this model has no recurrent-state slots".into()))
    }

    /// Layer `layer`'s view of the cache for the attention kernels; an error for a recurrent
    /// layer.
    pub fn layer(&self, layer: usize) -> Result<PagedKv<'_>> {
        let (Some(Some(k_cache)), Some(Some(v_cache))) = (self.k.get(layer), self.v.get(layer)) else {
            return Err(WeftError::Unsupported(format!("layer {layer} has no KV cache")));
        };
        Ok(PagedKv {
            k_cache,
            v_cache,
            block_size: self.config.block_size,
            first_slot: 0,
            num_slots: self.config.num_blocks * self.config.block_size,
        })
    }
}
