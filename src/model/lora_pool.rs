//! The GPU memory behind LoRA adapter slots: for every layer and projection, the A and B of
//! `max_loras` slots at `max_lora_rank`, made once when the executor is built; loading an
//! adapter into a slot is queued writes into them (nothing is created), and a step's rows pick
//! their slot through `kernels::lora`. Which adapter sits in which slot is decided elsewhere
//! (`kv::LoraSlots`); the pool only follows.
//!
//! Layout per projection of in × out, both transposed (`kernels::lora` reads them so): Aᵀ
//! (slots · in, max_rank), slot s's rows at s · in, rank columns used; Bᵀ (slots · max_rank,
//! out), slot s's rank rows at s · max_rank. Loading
//! writes a slot's whole extent (zeros past the adapter's rank and for projections it does not
//! target), so nothing of an evicted adapter survives in it.
//!
//! **Invariant:** a slot is written only between steps, and only when no sequence of the
//! running step uses it (the scheduler evicts idle adapters only).

use crate::error::{Result, WeftError};
use crate::gpu::kernels::lora::{LoraMatrices, LoraRows, SLOT_INFO_COLS, lora};
use crate::gpu::{GpuContext, GpuTensor, GpuTensorFactory, Recording};
use crate::lora::{LoraAdapter, LoraModule, LoraShape};
use crate::quant::DType;
use crate::tensor::TensorFactory;

/// How an architecture's projections take LoRA deltas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoraLayout {
    pub shape: LoraShape,
    pub head_dim: usize,
    /// q and k rows are stored as llama.cpp's converter permutes them for interleaved RoPE: an
    /// adapter in Hugging Face's order has B's q and k rows permuted the same way on load (and
    /// a GGUF adapter in that order over a Hugging Face checkpoint the other way).
    pub qk_interleaved: bool,
}

impl LoraLayout {
    /// A Llama-style layer of `c` (q, k, v, o, gate, up, down at its widths), its q and k rows
    /// stored `qk_interleaved` or not: every architecture that takes adapters has this shape.
    pub fn llama(c: &crate::model::config::ModelConfig, qk_interleaved: bool) -> LoraLayout {
        let shape = LoraShape::llama(
            c.num_layers,
            c.hidden_size,
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
            c.intermediate_size,
        );
        LoraLayout { shape, head_dim: c.head_dim, qk_interleaved }
    }
}

/// One projection's slots.
struct Matrices {
    a: GpuTensor, // (slots · in, max_rank) F32
    b: GpuTensor, // (slots · max_rank, out) F32
}

/// Every slot of every layer and projection.
pub struct LoraPool {
    layout: LoraLayout,
    max_loras: usize,
    max_rank: usize,
    layers: Vec<Vec<Matrices>>, // (layers, 7 projections)
    slot_info: GpuTensor,       // (max_loras, 2) U32: rank, scale bits
}

/// A step's view of the pool: what one layer's projections need.
#[derive(Clone, Copy)]
pub struct LoraStep<'a> {
    pub pool: &'a LoraPool,
    pub row_slots: &'a GpuTensor, // (tokens) U32
    pub u: &'a GpuTensor,         // (tokens, max_rank) F32
}

impl LoraPool {
    pub fn new(factory: &GpuTensorFactory, layout: LoraLayout, max_loras: usize, max_rank: usize) -> Result<Self> {
        if max_loras == 0 || max_rank == 0 {
            return Err(WeftError::Unsupported("a LoRA pool needs at least one slot of rank 1 or more".into()));
        }
        let layers = (0..layout.shape.num_layers)
            .map(|_| {
                LoraModule::ALL
                    .iter()
                    .map(|&m| {
                        let (in_dim, out_dim) = layout.shape.dims(m);
                        Ok(Matrices {
                            a: factory.zeros(&[max_loras * in_dim, max_rank], DType::F32)?,
                            b: factory.zeros(&[max_loras * max_rank, out_dim], DType::F32)?,
                        })
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let slot_info = factory.zeros(&[max_loras, SLOT_INFO_COLS], DType::U32)?;
        Ok(LoraPool { layout, max_loras, max_rank, layers, slot_info })
    }

    pub fn max_loras(&self) -> usize {
        self.max_loras
    }

    pub fn max_rank(&self) -> usize {
        self.max_rank
    }

    pub fn shape(&self) -> LoraShape {
        self.layout.shape
    }

    /// Bytes the pool holds on the device for `layout` (A and B in f32).
    pub fn bytes(shape: &LoraShape, max_loras: usize, max_rank: usize) -> u64 {
        let per_layer: usize = shape.dims.iter().map(|(i, o)| i + o).sum();
        (shape.num_layers * per_layer * max_loras * max_rank * 4) as u64
    }

    /// Write `adapter` into `slot` (queued writes).
    pub fn load(&self, factory: &GpuTensorFactory, slot: usize, adapter: &LoraAdapter) -> Result<()> {
        let (r, max_rank) = (adapter.rank, self.max_rank);
        if slot >= self.max_loras || r > max_rank || adapter.layers.len() != self.layout.shape.num_layers {
            return Err(WeftError::Unsupported(format!(
                "LoRA adapter {:?} (rank {r}, {} layers) does not fit slot {slot} of a pool of {} slots of rank \
                 {max_rank} over {} layers",
                adapter.name,
                adapter.layers.len(),
                self.max_loras,
                self.layout.shape.num_layers
            )));
        }
        for (layer, modules) in adapter.layers.iter().enumerate() {
            for m in LoraModule::ALL {
                let (in_dim, out_dim) = self.layout.shape.dims(m);
                // Aᵀ (in, max_rank) and Bᵀ (max_rank, out), zeros past the rank.
                let mut a = vec![0f32; in_dim * max_rank];
                let mut b = vec![0f32; max_rank * out_dim];
                if let Some(w) = &modules[m as usize] {
                    let qk = matches!(m, LoraModule::Q | LoraModule::K);
                    let d = self.layout.head_dim;
                    for rank_index in 0..r {
                        for k in 0..in_dim {
                            a[k * max_rank + rank_index] = w.a[rank_index * in_dim + k];
                        }
                        for row in 0..out_dim {
                            let from = match (self.layout.qk_interleaved, adapter.qk_interleaved) {
                                (true, false) if qk => interleaved_source_row(row, d),
                                (false, true) if qk => rotate_half_source_row(row, d),
                                _ => row,
                            };
                            b[rank_index * out_dim + row] = w.b[from * r + rank_index];
                        }
                    }
                }
                let t = &self.layers[layer][m as usize];
                factory.write(&t.a.slice_rows(slot * in_dim..(slot + 1) * in_dim)?, bytemuck::cast_slice(&a))?;
                factory.write(&t.b.slice_rows(slot * max_rank..(slot + 1) * max_rank)?, bytemuck::cast_slice(&b))?;
            }
        }
        let info = [r as u32, adapter.scale.to_bits()];
        factory.write(&self.slot_info.slice_rows(slot..slot + 1)?, bytemuck::cast_slice(&info))
    }

    /// Record `y[:, col ..] += delta` of projection `m` of `layer` for the rows of `step`.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &self,
        ctx: &GpuContext,
        rec: &mut Recording,
        step: &LoraStep<'_>,
        layer: usize,
        m: LoraModule,
        x: &GpuTensor,
        y: &GpuTensor,
        col: usize,
    ) -> Result<()> {
        let t = &self.layers[layer][m as usize];
        let rows = LoraRows { row_slots: step.row_slots, slot_info: &self.slot_info, u: step.u };
        lora(ctx, rec, x, &LoraMatrices { a: &t.a, b: &t.b }, &rows, y, col)
    }
}

/// The Hugging Face row that llama.cpp's converter moves to `row` of a q or k projection with
/// heads of `head_dim`: within a head, HF's rotate-half order (i, i + half) becomes pairs
/// (2i, 2i + 1).
fn interleaved_source_row(row: usize, head_dim: usize) -> usize {
    let (head, within) = (row / head_dim, row % head_dim);
    head * head_dim + (within % 2) * (head_dim / 2) + within / 2
}

/// The inverse: the interleaved row that goes back to Hugging Face's `row`.
fn rotate_half_source_row(row: usize, head_dim: usize) -> usize {
    let (head, within, half) = (row / head_dim, row % head_dim, head_dim / 2);
    head * head_dim + 2 * (within % half) + within / half
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_pairs_each_dimension_with_its_rotate_half_partner() {
        let rows: Vec<usize> = (0..8).map(|r| interleaved_source_row(r, 4)).collect();
        assert_eq!(rows, [0, 2, 1, 3, 4, 6, 5, 7]);
        for r in 0..32 {
            assert_eq!(rotate_half_source_row(interleaved_source_row(r, 8), 8), r);
        }
    }
}
