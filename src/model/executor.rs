//! The model executor: one engine step — a batch of sequences, each with its new tokens — as
//! one GPU submission whose only readback is the sampled tokens (and log-probabilities).

use std::sync::Arc;

use crate::error::{Result, WeftError};
use crate::gpu::kernels::penalize::penalize;
use crate::gpu::kernels::sample::{OUT_PER_ROW, SETTINGS_PER_ROW, sample};
use crate::gpu::{GpuContext, GpuTensor, GpuTensorFactory, Recording, TensorFactory};
use crate::kv::{KvCacheConfig, KvPool};
use crate::model::llama::{LlamaModel, StepInputs};
use crate::quant::DType;
use crate::rt::BoxFuture;
use crate::sampling::{Sampled, SamplingParams, read_sampled, settings_row};

/// One sequence's share of a step.
#[derive(Clone, Debug)]
pub struct SeqInput {
    /// The tokens to run: one for a decode, a chunk for prefill.
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]` (how many tokens of this sequence are already in the KV cache).
    pub start_pos: usize,
    /// Physical KV block of each logical block, covering at least `start_pos + tokens.len()`.
    pub block_table: Vec<u32>,
    /// Sample a next token after the last of `tokens` (None for a prefill chunk that is not the
    /// prompt's last).
    pub sample: Option<SampleSpec>,
}

/// How to pick this step's token: the request's parameters and this step's uniform draw.
#[derive(Clone, Debug)]
pub struct SampleSpec {
    pub params: SamplingParams,
    pub uniform: f32,
    /// With penalties on: the sequence's distinct tokens so far and how often each was
    /// generated (`sampling::penalty_entries`); empty otherwise.
    pub penalty_entries: Vec<(u32, u32)>,
}

/// Runs forward steps of a model. The engine holds one as `Arc<dyn ModelExecutor>`.
pub trait ModelExecutor: Send + Sync {
    /// Run one step; the result has one entry per sequence, `Some` where it asked to sample.
    fn execute<'a>(&'a self, batch: &'a [SeqInput]) -> BoxFuture<'a, Result<Vec<Option<Sampled>>>>;
    fn vocab_size(&self) -> usize;
    /// Positions a sequence may reach.
    fn max_context(&self) -> usize;
    fn kv_config(&self) -> KvCacheConfig;
}

/// The wgpu executor of a [`LlamaModel`].
pub struct GpuExecutor {
    factory: GpuTensorFactory,
    model: LlamaModel,
    kv: Arc<KvPool>,
}

/// A step's inputs, uploaded.
struct Uploaded {
    token_ids: GpuTensor,
    positions: GpuTensor,
    token_info: GpuTensor,
    slots: GpuTensor,
    block_tables: GpuTensor,
    last_rows: GpuTensor,
}

impl GpuExecutor {
    pub fn new(factory: GpuTensorFactory, model: LlamaModel, kv: Arc<KvPool>) -> Self {
        GpuExecutor { factory, model, kv }
    }

    pub fn model(&self) -> &LlamaModel {
        &self.model
    }

    fn ctx(&self) -> &GpuContext {
        self.factory.context()
    }

    fn check(&self, batch: &[SeqInput]) -> Result<()> {
        let bad = |s: usize, why: String| Err(WeftError::Unsupported(format!("step input of sequence {s}: {why}")));
        if batch.is_empty() {
            return Err(WeftError::Unsupported("a step needs at least one sequence".into()));
        }
        let kv = self.kv.config();
        for (s, seq) in batch.iter().enumerate() {
            let end = seq.start_pos + seq.tokens.len();
            if seq.tokens.is_empty() {
                return bad(s, "no tokens".into());
            }
            if let Some(&t) = seq.tokens.iter().find(|&&t| t as usize >= self.model.config.vocab_size) {
                return bad(s, format!("token id {t} is outside the vocabulary of {}", self.model.config.vocab_size));
            }
            if end > self.max_context() {
                return bad(s, format!("position {} is past the model's context of {}", end - 1, self.max_context()));
            }
            if seq.block_table.len() * kv.block_size < end {
                return bad(
                    s,
                    format!("{} blocks of {} tokens cannot hold {end} positions", seq.block_table.len(), kv.block_size),
                );
            }
            if let Some(&b) = seq.block_table.iter().find(|&&b| b as usize >= kv.num_blocks) {
                return bad(s, format!("block {b} does not exist (the pool has {})", kv.num_blocks));
            }
            if let Some(spec) = &seq.sample {
                spec.params.validate()?;
            }
        }
        Ok(())
    }

    fn upload(&self, batch: &[SeqInput]) -> Result<Uploaded> {
        let block_size = self.kv.config().block_size;
        let max_blocks = batch.iter().map(|s| s.block_table.len()).max().unwrap_or(1);
        let (mut ids, mut positions, mut info, mut slots, mut last_rows) = (vec![], vec![], vec![], vec![], vec![]);
        let mut tables = vec![0u32; batch.len() * max_blocks];
        for (s, seq) in batch.iter().enumerate() {
            tables[s * max_blocks..s * max_blocks + seq.block_table.len()].copy_from_slice(&seq.block_table);
            for (i, &token) in seq.tokens.iter().enumerate() {
                let pos = seq.start_pos + i;
                ids.push(token);
                positions.push(pos as u32);
                info.extend([s as u32, pos as u32]);
                slots.push(seq.block_table[pos / block_size] * block_size as u32 + (pos % block_size) as u32);
            }
            last_rows.push(ids.len() as u32 - 1);
        }
        let f = &self.factory;
        Ok(Uploaded {
            token_ids: f.upload_u32(&[ids.len()], &ids)?,
            positions: f.upload_u32(&[ids.len()], &positions)?,
            token_info: f.upload_u32(&[ids.len(), 2], &info)?,
            slots: f.upload_u32(&[ids.len()], &slots)?,
            block_tables: f.upload_u32(&[batch.len(), max_blocks], &tables)?,
            last_rows: f.upload_u32(&[batch.len()], &last_rows)?,
        })
    }

    fn record(&self, batch: &[SeqInput], rec: &mut Recording) -> Result<GpuTensor> {
        self.check(batch)?;
        let up = self.upload(batch)?;
        let inputs = StepInputs {
            token_ids: &up.token_ids,
            positions: &up.positions,
            token_info: &up.token_info,
            slots: &up.slots,
            block_tables: &up.block_tables,
            last_rows: &up.last_rows,
        };
        self.model.record_forward(self.ctx(), &self.factory, rec, &inputs, &self.kv)
    }

    /// Run a step and return the logits of each sequence's last token (for tests and tools;
    /// the serving path never reads logits back).
    pub async fn last_logits(&self, batch: &[SeqInput]) -> Result<Vec<Vec<f32>>> {
        let mut rec = Recording::new();
        let logits = self.record(batch, &mut rec)?;
        let bytes = self.ctx().submit_and_read(&rec, &logits).await?;
        let values: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
        Ok(values.chunks(self.model.config.vocab_size).map(<[f32]>::to_vec).collect())
    }

    async fn step(&self, batch: &[SeqInput]) -> Result<Vec<Option<Sampled>>> {
        let mut rec = Recording::new();
        let logits = self.record(batch, &mut rec)?;
        let greedy = SamplingParams::greedy();
        let settings: Vec<u32> = batch
            .iter()
            .flat_map(|s| match &s.sample {
                Some(spec) => settings_row(&spec.params, spec.uniform),
                None => settings_row(&greedy, 0.0),
            })
            .collect();
        let settings = self.factory.upload_u32(&[batch.len(), SETTINGS_PER_ROW], &settings)?;
        let mut entries = Vec::new();
        let mut penalties = [1.0f32, 0.0, 0.0].repeat(batch.len());
        for (row, spec) in batch.iter().enumerate().filter_map(|(r, s)| s.sample.as_ref().map(|spec| (r, spec))) {
            if spec.params.has_penalties() {
                penalties[3 * row..3 * row + 3].copy_from_slice(&[
                    spec.params.repetition_penalty,
                    spec.params.presence_penalty,
                    spec.params.frequency_penalty,
                ]);
                entries.extend(spec.penalty_entries.iter().flat_map(|&(token, count)| [row as u32, token, count]));
            }
        }
        if !entries.is_empty() {
            let entries = self.factory.upload_u32(&[entries.len() / 3, 3], &entries)?;
            let penalties = self.factory.upload_f32(&[batch.len(), 3], &penalties)?;
            penalize(self.ctx(), &mut rec, &logits, &entries, &penalties)?;
        }
        let out = self.factory.zeros(&[batch.len(), OUT_PER_ROW], DType::U32)?;
        sample(self.ctx(), &mut rec, &logits, &settings, &out)?;
        let bytes = self.ctx().submit_and_read(&rec, &out).await?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
        Ok(batch
            .iter()
            .zip(words.chunks(OUT_PER_ROW))
            .map(|(seq, row)| seq.sample.as_ref().map(|spec| read_sampled(row, spec.params.top_logprobs)))
            .collect())
    }
}

impl ModelExecutor for GpuExecutor {
    fn execute<'a>(&'a self, batch: &'a [SeqInput]) -> BoxFuture<'a, Result<Vec<Option<Sampled>>>> {
        Box::pin(self.step(batch))
    }

    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn max_context(&self) -> usize {
        self.model.max_context()
    }

    fn kv_config(&self) -> KvCacheConfig {
        self.kv.config()
    }
}
