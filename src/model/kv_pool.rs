//! The GPU memory behind the paged KV cache: one K and one V tensor per layer. `kv::` decides
//! which blocks a sequence holds; the executor owns this pool and only follows the tables.

use crate::error::Result;
use crate::gpu::kernels::paged::PagedKv;
use crate::gpu::{GpuTensor, GpuTensorFactory};
use crate::kv::KvCacheConfig;

/// The K and V caches of every layer: one (num_blocks · block_size, num_kv_heads, head_dim)
/// F32 tensor per layer and side, so no binding grows with the layer count (buffers, or
/// rgba32float textures on CPU drivers).
pub struct KvPool {
    config: KvCacheConfig,
    k: Vec<GpuTensor>,
    v: Vec<GpuTensor>,
}

impl KvPool {
    pub fn new(
        factory: &GpuTensorFactory,
        config: KvCacheConfig,
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Result<KvPool> {
        let shape = [config.num_blocks * config.block_size, num_kv_heads, head_dim];
        let mut k = Vec::with_capacity(num_layers);
        let mut v = Vec::with_capacity(num_layers);
        for _ in 0..num_layers {
            k.push(factory.kv_cache(&shape, None)?);
            v.push(factory.kv_cache(&shape, None)?);
        }
        Ok(KvPool { config, k, v })
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
