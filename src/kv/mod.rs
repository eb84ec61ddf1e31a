//! Paged KV bookkeeping: which blocks each sequence holds, the prefix cache, and the pool's
//! shape; beside it, the recurrent-state slots of state-space layers (`state`) and the LoRA
//! adapter slots (`lora`). Plain data: the
//! GPU memory behind blocks and slots belongs to the executor (`model::kv_pool`), which only
//! follows the tables.
//!
//! **Invariant:** this module is the single owner of KV and state capacity. Executors read block
//! tables and state slots and write into what they name; they never allocate or free either.
//! **Invariant:** nothing here uses the GPU (a tidy test checks the imports).

mod lora;
mod manager;
mod state;
pub use lora::LoraSlots;
pub use manager::{KvCacheManager, KvUsage, PrefixCacheStats, SeqId};
pub use state::{RecurrentStateConfig, RecurrentStateManager, StateUsage};

use crate::error::{Result, WeftError};
use crate::quant::DType;

/// Shape of the paged cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// Tokens per block.
    pub block_size: usize,
    pub num_blocks: usize,
    /// What the cache holds: `DType::F32`, or `DType::F16` (half the memory per token; keys and
    /// values rounded to halves as they are written, as llama.cpp's default cache does).
    pub dtype: DType,
}

impl KvCacheConfig {
    /// An f32 cache of `num_blocks` blocks of `block_size` tokens.
    pub fn new(block_size: usize, num_blocks: usize) -> Self {
        KvCacheConfig { block_size, num_blocks, dtype: DType::F32 }
    }

    /// The same cache holding `dtype` (F32 or F16; others are refused when the pool is made).
    pub fn with_dtype(self, dtype: DType) -> Self {
        KvCacheConfig { dtype, ..self }
    }

    /// Bytes of one cached value of `dtype`.
    fn value_bytes(dtype: DType) -> usize {
        if dtype == DType::F16 { 2 } else { 4 }
    }

    /// Bytes one block takes over all layers, K and V, holding `dtype` values, where a token
    /// keeps `token_values` K values over all layers (`ModelConfig::kv_token_values`: layers ·
    /// KV heads · head_dim, summed per layer where layers differ) and as many V values.
    pub fn block_bytes(block_size: usize, token_values: usize, dtype: DType) -> usize {
        2 * block_size * token_values * Self::value_bytes(dtype)
    }

    /// Bytes of one layer's K (or V) tensor: every slot of the pool, `layer_values` values a
    /// slot (KV heads · head_dim).
    pub fn layer_bytes(&self, layer_values: usize) -> usize {
        self.num_blocks * self.block_size * layer_values * Self::value_bytes(self.dtype)
    }

    /// As many blocks of `dtype` values as fit in `memory_bytes` (`token_values` as in
    /// [`block_bytes`](Self::block_bytes)).
    pub fn for_memory(memory_bytes: usize, block_size: usize, token_values: usize, dtype: DType) -> Result<Self> {
        if dtype != DType::F32 && dtype != DType::F16 {
            return Err(WeftError::Unsupported(format!("a KV cache holds f32 or f16 values, not {dtype}")));
        }
        let per_block = Self::block_bytes(block_size, token_values, dtype);
        if per_block == 0 {
            // No attention layers (a pure state-space model): blocks hold no memory, and only
            // count positions. Enough for 2^20 of them.
            return Ok(KvCacheConfig { block_size, num_blocks: (1usize << 20).div_ceil(block_size.max(1)), dtype });
        }
        let num_blocks = memory_bytes / per_block;
        if num_blocks == 0 {
            return Err(WeftError::Unsupported(format!(
                "{memory_bytes} bytes of KV memory hold no block; one block of {block_size} tokens takes {per_block} bytes"
            )));
        }
        Ok(KvCacheConfig { block_size, num_blocks, dtype })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizing_from_memory() {
        // 30 layers of 3 KV heads of 64.
        let values = 30 * 3 * 64;
        let c = KvCacheConfig::for_memory(64 << 20, 16, values, DType::F32).unwrap();
        assert_eq!(c.num_blocks, (64 << 20) / (2 * 30 * 16 * 192 * 4));
        let half = KvCacheConfig::for_memory(64 << 20, 16, values, DType::F16).unwrap();
        assert_eq!((half.num_blocks, half.dtype), ((64 << 20) / (2 * 30 * 16 * 192 * 2), DType::F16));
        assert!(KvCacheConfig::for_memory(1000, 16, values, DType::F32).is_err());
        let err = KvCacheConfig::for_memory(64 << 20, 16, values, DType::Q8_0).unwrap_err().to_string();
        assert!(err.contains("f32 or f16"), "{err}");
    }
}
