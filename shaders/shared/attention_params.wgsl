// SPDX-License-Identifier: Apache-2.0
// What the two kernels of attention over the paged cache, the CPU family's (paged_attention)
// and the GPU families' (flash_attention), share: their parameters (mirroring
// gpu::kernels::paged::AttentionParams) and their bindings up to the output, but the queries
// and the cache (x_source and kv_read's); each kernel declares the rest (flash_attention's
// split-K partials, then the sinks) and its header lists them all.
struct Params {
    num_tokens: u32,
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    max_blocks_per_seq: u32,
    cache_offset: u32,
    window: u32,
    scale: f32,
    q_stride: u32,
    split_min: u32,
    token0: u32,
    q_row0: u32,
    has_sinks: u32,
    // Query rows a workgroup of flash_attention takes (at most its tile's R).
    rows: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> block_tables: array<u32>;
@group(0) @binding(5) var<storage, read> token_info: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>;
