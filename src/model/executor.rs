//! The GPU executor: one engine step — a batch of sequences, each with its new tokens — as one
//! submission whose only readback is the sampled tokens (and log-probabilities). It owns the
//! GPU memory behind the KV blocks ([`KvPool`]) and drives any [`Architecture`].
//!
//! **Invariant:** the executor trusts its input. The engine validated every request at
//! submission and the scheduler's block tables fit the pool; debug builds assert it.

use std::sync::Arc;

use crate::error::{Result, WeftError};
use crate::gpu::{GpuContext, GpuTensor, GpuTensorFactory, Recording};
use crate::kv::KvCacheConfig;
use crate::model::arch::Architecture;
use crate::model::draft::DraftDistributions;
use crate::model::kv_pool::KvPool;
use crate::model::layers::StepInputs;
use crate::model::sampler;
use crate::rt::BoxFuture;
use crate::step::{DraftStore, ModelExecutor, StepBatch, StepOutput};
use crate::tensor::TensorFactory;

/// The wgpu executor of a model.
pub struct GpuExecutor {
    factory: GpuTensorFactory,
    model: Box<dyn Architecture>,
    kv: KvPool,
    /// Shared with a draft model (or its target) for speculative decoding of sampled requests.
    draft_distributions: Option<Arc<DraftDistributions>>,
}

/// A step's inputs, uploaded.
struct Uploaded {
    token_ids: GpuTensor,
    positions: GpuTensor,
    token_info: GpuTensor,
    slots: GpuTensor,
    block_tables: GpuTensor,
    logit_rows: GpuTensor,
}

impl GpuExecutor {
    /// `model` with a KV pool of `kv`'s shape, made on `factory`'s device.
    pub fn new(factory: GpuTensorFactory, model: Box<dyn Architecture>, kv: KvCacheConfig) -> Result<Self> {
        let c = model.config();
        let pool = KvPool::new(&factory, kv, c.num_layers, c.num_kv_heads, c.head_dim)?;
        Ok(GpuExecutor { factory, model, kv: pool, draft_distributions: None })
    }

    /// Share `store` with a draft model (or its target): the draft keeps there the
    /// distributions it drafts from, the target verifies against them.
    pub fn share_draft_distributions(&mut self, store: Arc<DraftDistributions>) -> Result<()> {
        if store.vocab_size() != self.vocab_size() {
            return Err(WeftError::Unsupported(format!(
                "the draft distributions cover {} tokens but this model's vocabulary has {}",
                store.vocab_size(),
                self.vocab_size()
            )));
        }
        self.draft_distributions = Some(store);
        Ok(())
    }

    pub fn model(&self) -> &dyn Architecture {
        self.model.as_ref()
    }

    fn ctx(&self) -> &GpuContext {
        self.factory.context()
    }

    fn debug_check(&self, batch: &StepBatch) {
        let kv = self.kv.config();
        debug_assert!(!batch.seqs.is_empty(), "a step needs at least one sequence");
        for seq in &batch.seqs {
            debug_assert!(!seq.tokens.is_empty() && seq.num_logits <= seq.tokens.len());
            debug_assert!(seq.tokens.iter().all(|&t| (t as usize) < self.model.config().vocab_size));
            debug_assert!(seq.end_pos() <= self.max_context());
            debug_assert!(seq.block_table.len() * kv.block_size >= seq.end_pos());
            debug_assert!(seq.block_table.iter().all(|&b| (b as usize) < kv.num_blocks));
        }
    }

    fn upload(&self, batch: &StepBatch) -> Result<Uploaded> {
        let block_size = self.kv.config().block_size;
        let max_blocks = batch.seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(1);
        let (mut ids, mut positions, mut info, mut slots, mut logit_rows) = (vec![], vec![], vec![], vec![], vec![]);
        let mut tables = vec![0u32; batch.seqs.len() * max_blocks];
        for (s, seq) in batch.seqs.iter().enumerate() {
            tables[s * max_blocks..s * max_blocks + seq.block_table.len()].copy_from_slice(&seq.block_table);
            for (i, &token) in seq.tokens.iter().enumerate() {
                let pos = seq.start_pos + i;
                ids.push(token);
                positions.push(pos as u32);
                info.extend([s as u32, pos as u32]);
                slots.push(seq.block_table[pos / block_size] * block_size as u32 + (pos % block_size) as u32);
            }
            let end = ids.len() as u32;
            logit_rows.extend(end - seq.num_logits as u32..end);
        }
        if logit_rows.is_empty() {
            // Nothing is sampled this step (only prefill chunks): the LM head still needs a row.
            logit_rows.push(0);
        }
        let f = &self.factory;
        Ok(Uploaded {
            token_ids: f.upload_u32(&[ids.len()], &ids)?,
            positions: f.upload_u32(&[ids.len()], &positions)?,
            token_info: f.upload_u32(&[ids.len(), 2], &info)?,
            slots: f.upload_u32(&[ids.len()], &slots)?,
            block_tables: f.upload_u32(&[batch.seqs.len(), max_blocks], &tables)?,
            logit_rows: f.upload_u32(&[logit_rows.len()], &logit_rows)?,
        })
    }

    fn record(&self, batch: &StepBatch, rec: &mut Recording) -> Result<GpuTensor> {
        self.debug_check(batch);
        let up = self.upload(batch)?;
        let inputs = StepInputs {
            token_ids: &up.token_ids,
            positions: &up.positions,
            token_info: &up.token_info,
            slots: &up.slots,
            block_tables: &up.block_tables,
            logit_rows: &up.logit_rows,
        };
        self.model.record_forward(self.ctx(), &self.factory, rec, &inputs, &self.kv)
    }

    /// Run a step and return the logits of every sampled row, in batch order (for tests and
    /// tools; the serving path never reads logits back).
    pub async fn logits(&self, batch: &StepBatch) -> Result<Vec<Vec<f32>>> {
        let mut rec = Recording::new();
        let logits = self.record(batch, &mut rec)?;
        let bytes = self.ctx().submit_and_read(&rec, &logits).await?;
        let values: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
        Ok(values.chunks(self.vocab_size()).take(batch.num_logits()).map(<[f32]>::to_vec).collect())
    }

    async fn step(&self, batch: &StepBatch) -> Result<StepOutput> {
        let mut rec = Recording::new();
        let logits = self.record(batch, &mut rec)?;
        if batch.num_logits() == 0 {
            self.ctx().submit(&rec).await?;
            return Ok(StepOutput { samples: vec![Vec::new(); batch.seqs.len()] });
        }
        let out = sampler::record(self.ctx(), &self.factory, &mut rec, &logits, batch)?;
        let store = self.draft_distributions.as_deref();
        sampler::record_draft_rows(self.ctx(), &self.factory, &mut rec, &logits, batch, &out, store)?;
        let bytes = self.ctx().submit_and_read(&rec, &out).await?;
        Ok(sampler::read(batch, &bytemuck::pod_collect_to_vec(&bytes)))
    }

    /// Upload and read back a small tensor: proof the device still answers.
    async fn round_trip(&self) -> Result<()> {
        let probe = [1.0f32, -2.0, 3.5, 0.25];
        let t = self.factory.upload_f32(&[4], &probe)?;
        let back = self.factory.download_f32(&t).await?;
        if back != probe {
            return Err(WeftError::Readback(format!("the device returned {back:?} for {probe:?}")));
        }
        Ok(())
    }
}

impl ModelExecutor for GpuExecutor {
    fn execute<'a>(&'a self, batch: &'a StepBatch) -> BoxFuture<'a, Result<StepOutput>> {
        Box::pin(self.step(batch))
    }

    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn max_context(&self) -> usize {
        self.model.max_context()
    }

    fn kv_config(&self) -> KvCacheConfig {
        self.kv.config()
    }

    fn health_check(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(self.round_trip())
    }

    fn draft_store(&self) -> Option<DraftStore> {
        self.draft_distributions.as_ref().map(|d| d.store())
    }
}
