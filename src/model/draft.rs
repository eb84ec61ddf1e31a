//! The draft distributions: for each token a draft model drafts for a sampled request, the
//! distribution it drew the token from, kept on the GPU so that the target's verifying row can
//! apply the rejection-sampling rule there (`shaders/spec_sample.wgsl`) without reading
//! anything back. One store is shared by a draft executor (which writes it) and its target
//! (which reads it); the engine sees only its id and size (`step::DraftStore`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, WeftError};
use crate::gpu::{GpuTensor, GpuTensorFactory};
use crate::quant::DType;
use crate::step::DraftStore;
use crate::tensor::TensorFactory;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The shared store of one draft/target pair.
pub struct DraftDistributions {
    id: u64,
    /// (slots, vocab) F32: one probability row per drafted token of a step.
    probs: GpuTensor,
}

impl DraftDistributions {
    /// Room for `slots` drafted rows per step over a vocabulary of `vocab` tokens, made once.
    pub fn new(factory: &GpuTensorFactory, slots: usize, vocab: usize) -> Result<Arc<Self>> {
        if slots == 0 || vocab == 0 {
            return Err(WeftError::Unsupported("the draft distributions need at least one slot and one token".into()));
        }
        let size_bytes = slots as u64 * vocab as u64 * 4;
        let max = factory.context().max_binding_bytes();
        if size_bytes > max {
            return Err(WeftError::Unsupported(format!(
                "{slots} draft distributions of {vocab} tokens take {size_bytes} bytes, more than this device binds at once \
                 ({max}); speculate with fewer sequences or fewer tokens"
            )));
        }
        let probs = factory.zeros(&[slots, vocab], DType::F32)?;
        Ok(Arc::new(DraftDistributions { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), probs }))
    }

    /// What the engine sees of it.
    pub fn store(&self) -> DraftStore {
        DraftStore { id: self.id, slots: self.probs.shape()[0] }
    }

    pub fn vocab_size(&self) -> usize {
        self.probs.shape()[1]
    }

    /// The probability rows, (slots, vocab) F32.
    pub fn probs(&self) -> &GpuTensor {
        &self.probs
    }
}
