//! Paged KV bookkeeping: which blocks each sequence holds, the prefix cache, and the pool's
//! shape; beside it, the recurrent-state slots of state-space layers (`state`). Plain data: the
//! GPU memory behind blocks and slots belongs to the executor (`model::kv_pool`), which only
//! follows the tables.
//!
//! **Invariant:** this module is the single owner of KV and state capacity. Executors read block
//! tables and state slots and write into what they name; they never allocate or free either.
//! **Invariant:** nothing here uses the GPU (a tidy test checks the imports).

mod manager;
mod state;
pub use manager::{KvCacheManager, KvUsage, PrefixCacheStats, SeqId};
pub use state::{RecurrentStateConfig, RecurrentStateManager, StateUsage};

use crate::error::{Result, WeftError};

/// Shape of the paged cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// Tokens per block.
    pub block_size: usize,
    pub num_blocks: usize,
}

impl KvCacheConfig {
    /// Bytes one block takes over all layers, K and V, in f32.
    pub fn block_bytes(block_size: usize, num_layers: usize, num_kv_heads: usize, head_dim: usize) -> usize {
        2 * num_layers * block_size * num_kv_heads * head_dim * 4
    }

    /// As many blocks as fit in `memory_bytes`.
    pub fn for_memory(
        memory_bytes: usize,
        block_size: usize,
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self> {
        let per_block = Self::block_bytes(block_size, num_layers, num_kv_heads, head_dim);
        if per_block == 0 {
            // No attention layers (a pure state-space model): blocks hold no memory, and only
            // count positions. Enough for 2^20 of them.
            return Ok(KvCacheConfig { block_size, num_blocks: (1usize << 20).div_ceil(block_size.max(1)) });
        }
        let num_blocks = memory_bytes / per_block;
        if num_blocks == 0 {
            return Err(WeftError::Unsupported(format!(
                "{memory_bytes} bytes of KV memory hold no block; one block of {block_size} tokens takes {per_block} bytes"
            )));
        }
        Ok(KvCacheConfig { block_size, num_blocks })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizing_from_memory() {
        let c = KvCacheConfig::for_memory(64 << 20, 16, 30, 3, 64).unwrap();
        assert_eq!(c.num_blocks, (64 << 20) / (2 * 30 * 16 * 192 * 4));
        assert!(KvCacheConfig::for_memory(1000, 16, 30, 3, 64).is_err());
    }
}
