//! Paged KV memory: the GPU pool of K/V blocks and the allocator of its blocks.
//!
//! **Invariant:** this module is the single owner of KV memory. Executors read block tables and
//! write K/V into the slots those tables name; they never allocate or free blocks.
//! **Invariant:** the allocator is pure logic (no wgpu); only `KvPool` touches GPU tensors.

mod manager;
pub use manager::{KvCacheManager, KvUsage, PrefixCacheStats, SeqId};

use std::sync::Arc;

use crate::error::{Result, WeftError};
use crate::gpu::kernels::paged::PagedKv;
use crate::gpu::{GpuTensor, TensorFactory};
use crate::quant::DType;

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
        let num_blocks = memory_bytes / per_block;
        if num_blocks == 0 {
            return Err(WeftError::Unsupported(format!(
                "{memory_bytes} bytes of KV memory hold no block; one block of {block_size} tokens takes {per_block} bytes"
            )));
        }
        Ok(KvCacheConfig { block_size, num_blocks })
    }
}

/// The K and V caches of every layer: one (num_blocks · block_size, num_kv_heads, head_dim)
/// F32 tensor per layer and side, so no binding grows with the layer count.
pub struct KvPool {
    config: KvCacheConfig,
    k: Vec<GpuTensor>,
    v: Vec<GpuTensor>,
}

impl KvPool {
    pub fn new(
        factory: &dyn TensorFactory,
        config: KvCacheConfig,
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Arc<KvPool>> {
        let shape = [config.num_blocks * config.block_size, num_kv_heads, head_dim];
        let mut k = Vec::with_capacity(num_layers);
        let mut v = Vec::with_capacity(num_layers);
        for _ in 0..num_layers {
            k.push(factory.zeros(&shape, DType::F32)?);
            v.push(factory.zeros(&shape, DType::F32)?);
        }
        Ok(Arc::new(KvPool { config, k, v }))
    }

    pub fn config(&self) -> KvCacheConfig {
        self.config
    }

    /// Layer `layer`'s view of the cache for the attention kernels.
    pub fn layer(&self, layer: usize) -> PagedKv<'_> {
        PagedKv {
            k_cache: &self.k[layer],
            v_cache: &self.v[layer],
            block_size: self.config.block_size,
            first_slot: 0,
            num_slots: self.config.num_blocks * self.config.block_size,
        }
    }
}

/// Free-list allocator of block ids. Pure logic.
#[derive(Clone, Debug)]
pub struct BlockAllocator {
    free: Vec<u32>,
    num_blocks: usize,
}

impl BlockAllocator {
    pub fn new(num_blocks: usize) -> Self {
        // Reversed so blocks are handed out from 0 upwards.
        BlockAllocator { free: (0..num_blocks as u32).rev().collect(), num_blocks }
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// `count` blocks, or `None` (nothing taken) when fewer are free.
    pub fn allocate(&mut self, count: usize) -> Option<Vec<u32>> {
        if count > self.free.len() {
            return None;
        }
        Some(self.free.split_off(self.free.len() - count).into_iter().rev().collect())
    }

    pub fn release(&mut self, blocks: &[u32]) {
        self.free.extend(blocks.iter().rev());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_all_or_nothing_and_release_returns_blocks() {
        let mut a = BlockAllocator::new(4);
        let first = a.allocate(3).unwrap();
        assert_eq!(first, vec![0, 1, 2]);
        assert!(a.allocate(2).is_none());
        assert_eq!(a.num_free(), 1);
        a.release(&first);
        assert_eq!(a.num_free(), 4);
        assert_eq!(a.allocate(4).unwrap().len(), 4);
    }

    #[test]
    fn sizing_from_memory() {
        let c = KvCacheConfig::for_memory(64 << 20, 16, 30, 3, 64).unwrap();
        assert_eq!(c.num_blocks, (64 << 20) / (2 * 30 * 16 * 192 * 4));
        assert!(KvCacheConfig::for_memory(1000, 16, 30, 3, 64).is_err());
    }
}
