//! The GPU executor: one engine step — a batch of sequences, each with its new tokens — as one
//! submission whose only readback is the sampled tokens (and log-probabilities). It owns the
//! GPU memory behind the KV blocks ([`KvPool`]) and drives any [`Architecture`].
//!
//! A step is persistent: the executor keeps a workspace sized for the largest step so far (the
//! step inputs, the activations, the logits and the sampler's buffers) and one [`Recording`]
//! that it clears and refills, so bind groups and the parameter buffer are made once. Each
//! step only writes its inputs into the workspace and records dispatches over views of it; a
//! decode step shaped like the one before reuses the recording itself. Once warm, a step
//! creates no buffer, texture or bind group (`GpuContext::creations`; a test checks).
//!
//! **Invariant:** the executor trusts its input. The engine validated every request at
//! submission and the scheduler's block tables fit the pool; debug builds assert it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use web_time::Instant;

use crate::error::{Result, WeftError};
use crate::gpu::kernels::lora::NO_SLOT as NO_LORA;
use crate::gpu::kernels::paged::AttentionMask;
use crate::gpu::kernels::sample::OUT_PER_ROW;
use crate::gpu::kernels::ssm::{NO_SLOT, SEQ_STATE_COLS, SeqStates, SsdChunks};
use crate::gpu::{GpuContext, GpuTensor, GpuTensorFactory, Recording};
use crate::kv::{KvCacheConfig, RecurrentStateConfig};
use crate::lora::{LoraAdapter, LoraConfig};
use crate::model::arch::Architecture;
use crate::model::config::Pooling;
use crate::model::draft::DraftDistributions;
use crate::model::kv_pool::KvPool;
use crate::model::layers::{Activations, ScanTables, StepInputs};
use crate::model::lora_pool::{LoraPool, LoraStep};
use crate::model::sampler::{self, SamplerBuffers, SamplerInputs};
use crate::model::scan_plan::ScanPlan;
use crate::quant::DType;
use crate::rt::BoxFuture;
use crate::sampling::{GpuSampler, MAX_LOGIT_BIAS, Sampler, SamplingParams};
use crate::step::{DraftStore, ModelExecutor, SeqStep, StepBatch, StepOutput, StepTimings};
use crate::tensor::TensorFactory;

/// State slots of an executor for a model with recurrent layers: each holds one sequence's
/// whole state (for a small model a few hundred KiB, for Mamba2-370M about 50 MiB), and the
/// scheduler admits no more sequences than there are slots.
pub const NUM_STATE_SLOTS: usize = 16;
/// Prefix-state snapshot slots beside them (the prefix cache's states), as many.
pub const NUM_STATE_SNAPSHOTS: usize = 16;
/// Rows per chunk of the chunked (SSD) scan of recurrent layers: whole chunks of a prefill are
/// scanned in parallel over their rows, the rest token by token (see `model::scan_plan`).
/// Equal to the prefix cache's snapshot interval at the default block size (4 blocks of 16),
/// so snapshot boundaries are chunk boundaries. GPUs use it (a head's state is spread over
/// head_dim · state_size / 4 invocations instead of head_dim / 4 walking every token); CPU
/// drivers scan token by token, which measured faster there (lavapipe, Mamba2-130M, a
/// 512-token prefill: 68 tokens/s token by token, 55 in chunks of 64; `cargo xtask
/// bench-recurrent --profile`).
pub const SCAN_CHUNK_ROWS: usize = 64;

/// The wgpu executor of a model.
pub struct GpuExecutor {
    factory: GpuTensorFactory,
    model: Box<dyn Architecture>,
    kv: KvPool,
    /// The workspace and the recording, one step at a time.
    arena: futures::lock::Mutex<StepArena>,
    profiling: AtomicBool,
    /// Shared with a draft model (or its target) for speculative decoding of sampled requests.
    draft_distributions: Option<Arc<DraftDistributions>>,
    /// Rows per chunk of recurrent layers' chunked scan; `None`: token by token only.
    scan_chunk: Option<usize>,
    /// The LoRA adapter slots, where adapters are served.
    lora: Option<LoraPool>,
}

/// The most a step may hold, for sizing the workspace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepCapacity {
    pub tokens: usize,
    pub seqs: usize,
    /// Block-table entries over all sequences (sequences × the longest table).
    pub table_entries: usize,
    pub logits: usize,
    /// The sampler's logit-bias and penalty entries over all rows.
    pub sampler_entries: usize,
}

impl StepCapacity {
    fn covers(&self, other: &StepCapacity) -> bool {
        self.tokens >= other.tokens
            && self.seqs >= other.seqs
            && self.table_entries >= other.table_entries
            && self.logits >= other.logits
            && self.sampler_entries >= other.sampler_entries
    }

    /// Room for `need` and for this, each dimension rounded up to a power of two so that a
    /// workload growing step by step regrows rarely.
    fn grown_to(&self, need: &StepCapacity) -> StepCapacity {
        let grow = |have: usize, need: usize| have.max(need.next_power_of_two()).max(1);
        StepCapacity {
            tokens: grow(self.tokens, need.tokens),
            seqs: grow(self.seqs, need.seqs),
            table_entries: grow(self.table_entries, need.table_entries),
            logits: grow(self.logits, need.logits),
            sampler_entries: grow(self.sampler_entries, need.sampler_entries),
        }
    }
}

/// Buffers every step writes into, made for `capacity`.
struct Workspace {
    capacity: StepCapacity,
    token_ids: GpuTensor,    // (tokens, 1) U32
    positions: GpuTensor,    // (tokens, 1) U32
    token_info: GpuTensor,   // (tokens, 2) U32: sequence index, position
    slots: GpuTensor,        // (tokens, 1) U32
    block_tables: GpuTensor, // (table entries, 1) U32
    logit_rows: GpuTensor,   // (logits, 1) U32
    pool_spans: GpuTensor,   // (logits, 2) U32: the rows each logit row's embedding pools
    seq_states: GpuTensor,   // (seqs, 6) U32: kernels::ssm::SeqStates' table
    scan_before: GpuTensor,  // (seqs, 6) U32: ScanPlan::before
    scan_after: GpuTensor,   // (seqs, 6) U32: ScanPlan::after
    ssd_runs: GpuTensor,     // (seqs, 6) U32: ScanPlan::runs
    ssd_chunks: GpuTensor,   // (tokens / scan chunk, 1) U32: ScanPlan::chunks
    /// With a LoRA pool: each row's slot (tokens, 1) U32, and the shrink's output (tokens,
    /// max rank) F32.
    lora: Option<(GpuTensor, GpuTensor)>,
    acts: Activations,
    logits: GpuTensor, // (logits, vocab) F32
    sampler: SamplerBuffers,
}

impl Workspace {
    fn new(
        factory: &GpuTensorFactory,
        model: &dyn Architecture,
        capacity: StepCapacity,
        scan_chunk: Option<usize>,
        lora_rank: Option<usize>,
    ) -> Result<Self> {
        let c = model.config();
        let u32s = |shape: &[usize]| factory.zeros(shape, DType::U32);
        let max_chunks = scan_chunk.map_or(0, |q| capacity.tokens / q).max(1);
        Ok(Workspace {
            capacity,
            token_ids: u32s(&[capacity.tokens, 1])?,
            positions: u32s(&[capacity.tokens, 1])?,
            token_info: u32s(&[capacity.tokens, 2])?,
            slots: u32s(&[capacity.tokens, 1])?,
            block_tables: u32s(&[capacity.table_entries, 1])?,
            logit_rows: u32s(&[capacity.logits, 1])?,
            pool_spans: u32s(&[capacity.logits, 2])?,
            seq_states: u32s(&[capacity.seqs, SEQ_STATE_COLS])?,
            scan_before: u32s(&[capacity.seqs, SEQ_STATE_COLS])?,
            scan_after: u32s(&[capacity.seqs, SEQ_STATE_COLS])?,
            ssd_runs: u32s(&[capacity.seqs, SEQ_STATE_COLS])?,
            ssd_chunks: u32s(&[max_chunks, 1])?,
            lora: match lora_rank {
                Some(r) => Some((u32s(&[capacity.tokens, 1])?, factory.zeros(&[capacity.tokens, r], DType::F32)?)),
                None => None,
            },
            acts: Activations::new(
                factory,
                c,
                capacity.tokens,
                capacity.logits,
                factory.context().kernel_family().splits_attention(),
                scan_chunk,
            )?,
            logits: factory.zeros(&[capacity.logits, c.vocab_size], DType::F32)?,
            sampler: SamplerBuffers::new(
                factory,
                capacity.logits,
                capacity.sampler_entries,
                model.config().vocab_size,
            )?,
        })
    }
}

/// One step's inputs, laid out as the kernels read them.
struct HostInputs {
    ids: Vec<u32>,
    positions: Vec<u32>,
    info: Vec<u32>,
    slots: Vec<u32>,
    tables: Vec<u32>,
    max_blocks: usize,
    logit_rows: Vec<u32>,
    /// (logits, 2): per logit row, the (first row, rows) its embedding pools.
    pool_spans: Vec<u32>,
    /// (seqs, 6): first row, rows, state slot (0 without one), start position, slot read from,
    /// snapshot slot written.
    seq_states: Vec<u32>,
    /// How recurrent layers scan those rows (empty for models without them).
    scan: ScanPlan,
    /// Each row's LoRA slot (`NO_LORA` for the base model); empty when no row has one.
    lora_rows: Vec<u32>,
    sampler: SamplerInputs,
}

impl HostInputs {
    fn of(batch: &StepBatch, block_size: usize, model: &StepModel) -> Self {
        let max_blocks = batch.seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(1).max(1);
        let num_tokens = batch.num_batched_tokens();
        let mut inputs = HostInputs {
            ids: Vec::with_capacity(num_tokens),
            positions: Vec::with_capacity(num_tokens),
            info: Vec::with_capacity(2 * num_tokens),
            slots: Vec::with_capacity(num_tokens),
            tables: vec![0u32; batch.seqs.len() * max_blocks],
            max_blocks,
            logit_rows: Vec::with_capacity(batch.num_logits()),
            pool_spans: Vec::with_capacity(2 * batch.num_logits()),
            seq_states: Vec::with_capacity(SEQ_STATE_COLS * batch.seqs.len()),
            scan: ScanPlan::default(),
            lora_rows: Vec::new(),
            sampler: SamplerInputs::of(batch),
        };
        if batch.seqs.iter().any(|s| s.lora_slot.is_some()) {
            for seq in &batch.seqs {
                inputs.lora_rows.extend(std::iter::repeat_n(seq.lora_slot.unwrap_or(NO_LORA), seq.tokens.len()));
            }
        }
        for (s, seq) in batch.seqs.iter().enumerate() {
            let (first_row, num_rows) = (inputs.ids.len() as u32, seq.tokens.len() as u32);
            let slot = seq.state_slot.unwrap_or(0);
            let (read, save) = (seq.state_restore.unwrap_or(slot), seq.state_save.unwrap_or(NO_SLOT));
            inputs.seq_states.extend([first_row, num_rows, slot, seq.start_pos as u32, read, save]);
            inputs.tables[s * max_blocks..s * max_blocks + seq.block_table.len()].copy_from_slice(&seq.block_table);
            for (i, &token) in seq.tokens.iter().enumerate() {
                let pos = seq.start_pos + i;
                inputs.ids.push(token);
                inputs.positions.push(pos as u32);
                inputs.info.extend(model.mask.token_info(s, pos, seq.end_pos()));
                inputs.slots.push(seq.block_table[pos / block_size] * block_size as u32 + (pos % block_size) as u32);
            }
            let end = inputs.ids.len() as u32;
            for row in end - seq.num_logits as u32..end {
                inputs.logit_rows.push(row);
                let span = match (seq.embed, model.pooling) {
                    (true, Some(Pooling::Cls)) => [first_row, 1],
                    (true, Some(Pooling::Mean)) => [first_row, num_rows],
                    _ => [row, 1],
                };
                inputs.pool_spans.extend(span);
            }
        }
        if inputs.logit_rows.is_empty() {
            // Nothing is sampled this step (only prefill chunks): the LM head still needs a row.
            inputs.logit_rows.push(0);
            inputs.pool_spans.extend([0, 1]);
        }
        if model.recurrent {
            inputs.scan = ScanPlan::of(&inputs.seq_states, model.scan_chunk);
        }
        inputs
    }

    fn capacity(&self, num_seqs: usize) -> StepCapacity {
        StepCapacity {
            tokens: self.ids.len(),
            seqs: num_seqs,
            table_entries: self.tables.len(),
            logits: self.logit_rows.len(),
            sampler_entries: self.sampler.num_entries(),
        }
    }

    /// What decides the dispatches and their parameters: equal shapes record equal steps.
    fn shape(&self, num_seqs: usize) -> StepShape {
        let sampler = &self.sampler;
        let sampled = (sampler.num_entries(), sampler.num_spec_rows(), sampler.num_mask_rows());
        let lora = !self.lora_rows.is_empty();
        (self.ids.len(), num_seqs, self.max_blocks, self.logit_rows.len(), sampled, self.scan.shape(), lora)
    }
}

/// What of the model shapes a step's inputs.
struct StepModel {
    recurrent: bool,
    scan_chunk: Option<usize>,
    mask: AttentionMask,
    pooling: Option<Pooling>,
}

/// Tokens, sequences, blocks per sequence, logit rows, (penalty entries, draft rows, masked
/// rows), the scans' (heads, chunks, runs, sequences after), and whether LoRA runs.
type StepShape = (usize, usize, usize, usize, (usize, usize, usize), (usize, usize, usize, usize), bool);

/// The executor's state between steps.
#[derive(Default)]
struct StepArena {
    rec: Recording,
    ws: Option<Workspace>,
    /// The shape of the step `rec` holds, and whether it samples.
    recorded: Option<(StepShape, bool)>,
}

impl GpuExecutor {
    /// About how many bytes the workspace of steps of up to `max_tokens` tokens and `max_seqs`
    /// sampled rows takes on the device (what [`warm_up`](Self::warm_up) makes), from the
    /// model's shape alone, for sizing the KV pool beside it before anything is created:
    /// the activations, the logits and the sampler's rows with room for whole logit biases,
    /// plus a quarter and 16 MiB for what is not counted (uniform windows, the parameter and
    /// readback buffers, the chunked scan's scratch, the drafted rows a step may add). A test
    /// holds it above what warming up creates.
    pub fn workspace_bytes_estimate(
        c: &crate::model::config::ModelConfig,
        max_tokens: usize,
        max_seqs: usize,
        split_attention: bool,
    ) -> u64 {
        use crate::gpu::kernels::paged::attention_partials_cols;
        let (qkv_cols, attn_cols, head_dim) = c.widest_attention();
        let widest_mlp = (0..c.num_layers).map(|i| c.layer_intermediate_size(i)).max().unwrap_or(0);
        let token_cols = 4 * c.hidden_size
            + qkv_cols
            + attn_cols
            + attention_partials_cols(split_attention, c.num_heads, head_dim)
            + 3 * c.intermediate_size.max(widest_mlp)
            + c.gemma4.as_ref().map_or(0, |g| (2 * c.num_layers + 1) * g.per_layer_input_size)
            + c.gemma4
                .as_ref()
                .and_then(|g| g.gemma3n.as_ref())
                .map_or(0, |x| 2 * x.altup_num_inputs * c.hidden_size + x.altup_num_inputs + x.laurel_rank)
            + c.ssm.map_or(0, |s| s.in_proj_size() + s.conv_channels() + 2 * s.inner_size())
            + c.short_conv.map_or(0, |_| 4 * c.hidden_size)
            + c.delta_net.map_or(0, |d| d.in_proj_size() + d.conv_channels() + 2 * d.value_size())
            + c.delta_net.map_or(0, |_| c.num_heads * c.head_dim)
            + 8;
        let logits = max_seqs.max(1);
        let row_cols = c.hidden_size + c.vocab_size + c.vocab_size.div_ceil(32) + 64;
        let bias_bytes = logits * MAX_LOGIT_BIAS * crate::gpu::kernels::penalize::ENTRY_WORDS * 4;
        let counted = (max_tokens.max(1) * token_cols + logits * row_cols) * 4 + bias_bytes;
        (counted as u64) * 5 / 4 + (16 << 20)
    }

    /// `model` with a KV pool of `kv`'s shape (and, for recurrent layers, [`NUM_STATE_SLOTS`]
    /// state slots), made on `factory`'s device.
    pub fn new(factory: GpuTensorFactory, model: Box<dyn Architecture>, kv: KvCacheConfig) -> Result<Self> {
        Self::with_state_slots(factory, model, kv, NUM_STATE_SLOTS, NUM_STATE_SNAPSHOTS)
    }

    /// [`new`](Self::new) with `num_slots` recurrent-state slots and `num_snapshots` snapshot
    /// slots (for a model with recurrent layers; at least one slot is made).
    pub fn with_state_slots(
        factory: GpuTensorFactory,
        model: Box<dyn Architecture>,
        kv: KvCacheConfig,
        num_slots: usize,
        num_snapshots: usize,
    ) -> Result<Self> {
        if let Some(pooling) = model.config().pooling.filter(|p| p.needs_whole_prompt() && !model.bidirectional()) {
            return Err(WeftError::Unsupported(format!(
                "{pooling:?} pooling of a {} model: a causal model's prompt may run in chunks, so weft pools its \
                 last token only (--pooling last); CLS and mean pooling are for encoders (bert)",
                model.config().architecture
            )));
        }
        let pool = KvPool::new(&factory, kv, model.config(), num_slots.max(1), num_snapshots)?;
        let cpu_driver = factory.context().kernel_family() == crate::gpu::KernelFamily::Cpu;
        let scan_chunk = (model.config().ssm.is_some() && !cpu_driver).then_some(SCAN_CHUNK_ROWS);
        Ok(GpuExecutor {
            factory,
            model,
            kv: pool,
            arena: futures::lock::Mutex::new(StepArena::default()),
            profiling: AtomicBool::new(false),
            draft_distributions: None,
            scan_chunk,
            lora: None,
        })
    }

    /// Serve LoRA adapters from a pool of `max_loras` slots of rank up to `max_rank`, made now
    /// (before the first step). Refused for an architecture that takes no adapters.
    pub fn with_lora(mut self, max_loras: usize, max_rank: usize) -> Result<Self> {
        let layout = self.model.lora_layout().ok_or_else(|| {
            WeftError::Unsupported(format!(
                "LoRA adapters are not supported for the {} architecture yet",
                self.model.config().architecture
            ))
        })?;
        self.lora = Some(LoraPool::new(&self.factory, layout, max_loras, max_rank)?);
        self.arena = futures::lock::Mutex::new(StepArena::default());
        Ok(self)
    }

    /// Write `adapter` into LoRA slot `slot` (queued; the next step sees it). The slot must be
    /// idle: no sequence of a step in flight uses it.
    pub fn load_lora(&self, slot: usize, adapter: &LoraAdapter) -> Result<()> {
        let pool = self.lora.as_ref().ok_or_else(|| WeftError::Unsupported("this executor has no LoRA pool".into()))?;
        pool.load(&self.factory, slot, adapter)
    }

    /// Scan recurrent layers' prefill in chunks of `rows` rows (the SSD form; at least 2), or
    /// token by token only (`None`). For a model with recurrent layers, before the first step;
    /// the scheduler cuts prefills to match (`RecurrentStateConfig::scan_chunk_tokens`).
    pub fn with_scan_chunk(mut self, rows: Option<usize>) -> Result<Self> {
        if rows.is_some_and(|q| q < 2) {
            return Err(WeftError::Unsupported(format!("scan chunks of {rows:?} rows; use at least 2, or none")));
        }
        self.scan_chunk = rows.filter(|_| self.model.config().ssm.is_some());
        self.arena = futures::lock::Mutex::new(StepArena::default());
        Ok(self)
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

    fn capacity_for(&self, tokens: usize, seqs: usize, logits: usize) -> StepCapacity {
        // A block table may reach the longest context the pool holds (4 bytes an entry).
        let kv = self.kv.config();
        let blocks_per_seq = self.max_context().div_ceil(kv.block_size).min(kv.num_blocks);
        // Every row may carry a request's whole logit bias: biasing never grows the workspace
        // (penalties, whose entries grow with the context, still may).
        let sampler_entries = logits * MAX_LOGIT_BIAS;
        StepCapacity { tokens, seqs, table_entries: seqs * blocks_per_seq, logits, sampler_entries }
    }

    fn ensure_workspace(&self, arena: &mut StepArena, need: &StepCapacity) -> Result<()> {
        let have = arena.ws.as_ref().map(|w| w.capacity).unwrap_or_default();
        if arena.ws.is_none() || !have.covers(need) {
            let capacity = have.grown_to(need);
            let lora_rank = self.lora.as_ref().map(LoraPool::max_rank);
            arena.ws = Some(Workspace::new(&self.factory, self.model.as_ref(), capacity, self.scan_chunk, lora_rank)?);
            arena.recorded = None;
        }
        Ok(())
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
            let (slots, snapshots) = self.kv.state_config().map_or((0, 0), |s| (s.num_slots, s.num_snapshot_slots));
            debug_assert!(seq.state_slot.is_none_or(|slot| (slot as usize) < slots));
            let snapshot = |s: Option<u32>| s.is_none_or(|s| (slots..slots + snapshots).contains(&(s as usize)));
            debug_assert!(snapshot(seq.state_restore) && snapshot(seq.state_save));
            debug_assert_eq!(seq.state_slot.is_some(), slots > 0, "a state slot exactly for recurrent models");
            debug_assert!(
                seq.lora_slot.is_none_or(|s| self.lora.as_ref().is_some_and(|p| (s as usize) < p.max_loras()))
            );
        }
    }

    /// Record, without running, steps shaped like the ones serving runs (one sequence decoding,
    /// up to four and up to eight decoding together, a prefill of up to 64 of `max_tokens`
    /// tokens, a decode in a context long enough to split), so that every kernel they dispatch is compiled now, and
    /// only those: a browser's SwiftShader takes about half a second a kernel, and a model's
    /// weight formats have over a hundred variants. Kernels of rarer steps (speculation,
    /// penalties, structured output) compile when first dispatched. The workspace is made for
    /// a full step (`max_tokens` tokens, `max_seqs` sampled rows) first. Leaves nothing
    /// recorded; returns how many kernels the steps use.
    pub fn warm_up(&self, max_tokens: usize, max_seqs: usize) -> Result<usize> {
        let kv = self.kv.config();
        let slots = self.kv.state_config().map_or(0, |s| s.num_slots);
        let prefill = max_tokens.min(64).min(self.max_context()).min(kv.num_blocks * kv.block_size).max(1);
        let together =
            |n: usize| n.min(max_seqs).min(kv.num_blocks).min(if slots > 0 { slots } else { usize::MAX }).max(1);
        let seq = |i: usize, num_tokens: usize| SeqStep {
            id: i as u64,
            tokens: vec![0; num_tokens],
            start_pos: 0,
            block_table: (i..i + num_tokens.div_ceil(kv.block_size)).map(|b| b as u32).collect(),
            num_logits: 1,
            sampling: Some(GpuSampler.prepare(&SamplingParams::default(), 0, &[], &[], &[])),
            state_slot: (slots > 0).then_some(i as u32),
            state_restore: None,
            state_save: None,
            lora_slot: None,
            embed: false,
        };
        // Decodes of 1, up to 4 and up to 8 sequences: each class of rows the matmul tiles take
        // (the LM head sees only these: a prefill samples one row); in the GPU families also as
        // many as their matmul tiles from (its GEMM tile for the LM head).
        let mut decodes = vec![1, 4, 8];
        if self.ctx().kernel_family() != crate::gpu::KernelFamily::Cpu {
            decodes.push(self.ctx().plan().gemm_min_rows);
        }
        let mut shapes: Vec<Vec<SeqStep>> =
            decodes.into_iter().map(|n| (0..together(n)).map(|i| seq(i, 1)).collect()).collect();
        // Fewer sequences than that allowed: record each decode once.
        shapes.dedup_by_key(|decode| decode.len());
        shapes.push(vec![seq(0, prefill)]);
        if self.lora.is_some() {
            // A decode and a prefill with an adapter: the LoRA kernels, and the MLP's unfused
            // gate they need.
            shapes.push(vec![SeqStep { lora_slot: Some(0), ..seq(0, 1) }]);
            shapes.push(vec![SeqStep { lora_slot: Some(0), ..seq(0, prefill) }]);
        }
        // A decode whose context passes SPLIT_MIN_POSITIONS, where the pool holds one: split-K
        // attention and its merge, in the families that split.
        let long = crate::gpu::kernels::paged::SPLIT_MIN_POSITIONS + 1;
        let long_blocks = long.div_ceil(kv.block_size);
        if long <= self.max_context() && long_blocks <= kv.num_blocks {
            let table = (0..long_blocks as u32).collect();
            shapes.push(vec![SeqStep { start_pos: long - 1, block_table: table, ..seq(0, 1) }]);
        }
        let mut arena = self
            .arena
            .try_lock()
            .ok_or_else(|| WeftError::Unsupported("warm_up while a step runs; warm up before serving".into()))?;
        // The workspace at the size serving fills (a full token budget, a sampled row per
        // sequence) from the start: growing into it would drop the smaller one mid-serving and
        // leave its memory behind in the allocator's blocks. Block tables are sized for the
        // longest context the pool holds; drafted rows and penalties may still grow it.
        self.ensure_workspace(&mut arena, &self.capacity_for(max_tokens, max_seqs, max_seqs))?;
        // The readback at its largest: a sampled row per sequence, and each row's final hidden
        // state when the model serves embeddings (`step` reads them together).
        let ws = arena.ws.as_ref().expect("sized above");
        let mut largest = ws.sampler.out(max_seqs)?;
        if self.model.config().pooling.is_some() {
            let flat = |t: &GpuTensor| t.reshape(&[t.num_elems(), 1]);
            largest = flat(&largest)?.then_rows(&flat(&ws.acts.rows.slice_rows(0..max_seqs)?)?)?;
        }
        self.ctx().reserve_readback(&arena.rec, &largest);
        let mut kernels = std::collections::HashSet::new();
        for seqs in shapes {
            let num_batched_tokens = seqs.iter().map(|s| s.tokens.len()).sum();
            let batch = StepBatch { seqs, num_batched_tokens, ..Default::default() };
            self.record(&mut arena, &batch, true)?;
            kernels.extend(arena.rec.kernels());
        }
        arena.rec.clear();
        arena.recorded = None;
        Ok(kernels.len())
    }

    /// Write the step's inputs into the workspace and (unless the recording already holds a
    /// step of this shape) record its forward pass and, when `sample`, its sampler. Returns the
    /// logits, the sampler's output rows and the final hidden states of the logit rows, viewed
    /// at the step's size.
    fn record(
        &self,
        arena: &mut StepArena,
        batch: &StepBatch,
        sample: bool,
    ) -> Result<(GpuTensor, GpuTensor, GpuTensor)> {
        self.debug_check(batch);
        for load in &batch.lora_loads {
            self.load_lora(load.slot as usize, &load.adapter)?;
        }
        let model = StepModel {
            recurrent: self.kv.state_config().is_some(),
            scan_chunk: self.scan_chunk,
            mask: if self.model.bidirectional() { AttentionMask::Bidirectional } else { AttentionMask::Causal },
            pooling: self.model.config().pooling,
        };
        let inputs = HostInputs::of(batch, self.kv.config().block_size, &model);
        let store = self.draft_distributions.as_deref();
        sampler::check_draft_slots(&inputs.sampler, store)?;
        self.ensure_workspace(arena, &inputs.capacity(batch.seqs.len()))?;
        let StepArena { rec, ws, recorded } = arena;
        let ws = ws.as_ref().expect("ensured above");
        let (num_tokens, num_logits) = (inputs.ids.len(), inputs.logit_rows.len());
        let view = |t: &GpuTensor, rows: usize| t.slice_rows(0..rows);
        // The first n entries of an (entries, 1) buffer, as a vector.
        let first = |t: &GpuTensor, n: usize| t.slice_rows(0..n)?.reshape(&[n]);
        let f = &self.factory;
        f.write(&ws.token_ids, bytemuck::cast_slice(&inputs.ids))?;
        f.write(&ws.positions, bytemuck::cast_slice(&inputs.positions))?;
        f.write(&ws.token_info, bytemuck::cast_slice(&inputs.info))?;
        f.write(&ws.slots, bytemuck::cast_slice(&inputs.slots))?;
        f.write(&ws.block_tables, bytemuck::cast_slice(&inputs.tables))?;
        f.write(&ws.logit_rows, bytemuck::cast_slice(&inputs.logit_rows))?;
        f.write(&ws.pool_spans, bytemuck::cast_slice(&inputs.pool_spans))?;
        f.write(&ws.seq_states, bytemuck::cast_slice(&inputs.seq_states))?;
        let plan = &inputs.scan;
        for (t, table) in [(&ws.scan_before, &plan.before), (&ws.scan_after, &plan.after), (&ws.ssd_runs, &plan.runs)] {
            f.write(t, bytemuck::cast_slice(table))?;
        }
        f.write(&ws.ssd_chunks, bytemuck::cast_slice(&plan.chunks))?;
        let lora = match (&self.lora, &ws.lora, inputs.lora_rows.is_empty()) {
            (Some(pool), Some((rows, u)), false) => {
                f.write(rows, bytemuck::cast_slice(&inputs.lora_rows))?;
                Some((pool, first(rows, num_tokens)?, view(u, num_tokens)?))
            }
            (_, _, true) => None,
            _ => return Err(WeftError::Unsupported("a step names LoRA slots, but this executor has no pool".into())),
        };
        let logits = view(&ws.logits, num_logits)?;
        let out = ws.sampler.out(num_logits)?;
        let hidden = ws.acts.rows.slice_rows(0..num_logits)?;
        let shape = (inputs.shape(batch.seqs.len()), sample);
        if *recorded == Some(shape) {
            if sample {
                // Same dispatches, same parameters: only the sampler's inputs are new.
                sampler::write(f, &inputs.sampler, &ws.sampler, num_logits)?;
            }
            return Ok((logits, out, hidden));
        }
        rec.clear();
        *recorded = None;
        let (num_before, num_chunks, num_runs, num_after) = plan.shape();
        let step_inputs = StepInputs {
            token_ids: &first(&ws.token_ids, num_tokens)?,
            positions: &first(&ws.positions, num_tokens)?,
            token_info: &view(&ws.token_info, num_tokens)?,
            slots: &first(&ws.slots, num_tokens)?,
            block_tables: &first(&ws.block_tables, inputs.tables.len())?
                .reshape(&[batch.seqs.len(), inputs.max_blocks])?,
            logit_rows: &first(&ws.logit_rows, num_logits)?,
            pool_spans: &view(&ws.pool_spans, num_logits)?,
            seq_states: SeqStates { seqs: &view(&ws.seq_states, batch.seqs.len())?, num_seqs: batch.seqs.len() },
            scan: ScanTables {
                before: SeqStates { seqs: &view(&ws.scan_before, num_before)?, num_seqs: num_before },
                ssd: match (self.scan_chunk, num_chunks) {
                    (Some(q), 1..) => Some(SsdChunks {
                        chunks: &first(&ws.ssd_chunks, num_chunks)?,
                        num_chunks,
                        rows_per_chunk: q,
                        runs: SeqStates { seqs: &view(&ws.ssd_runs, num_runs)?, num_seqs: num_runs },
                    }),
                    _ => None,
                },
                after: SeqStates { seqs: &view(&ws.scan_after, num_after)?, num_seqs: num_after },
            },
            lora: lora.as_ref().map(|(pool, row_slots, u)| LoraStep { pool, row_slots, u }),
        };
        let acts = ws.acts.view(num_tokens, num_logits)?;
        self.model.record_forward(self.ctx(), rec, &step_inputs, &acts, &self.kv, &logits)?;
        if sample {
            sampler::write(f, &inputs.sampler, &ws.sampler, num_logits)?;
            sampler::record(self.ctx(), rec, &logits, &inputs.sampler, &ws.sampler, store)?;
        }
        *recorded = Some(shape);
        Ok((logits, out, hidden))
    }

    /// Run a step and return the logits of every sampled row, in batch order (for tests and
    /// tools; the serving path never reads logits back).
    pub async fn logits(&self, batch: &StepBatch) -> Result<Vec<Vec<f32>>> {
        let mut arena = self.arena.lock().await;
        let (logits, ..) = self.record(&mut arena, batch, false)?;
        let bytes = self.ctx().submit_and_read(&arena.rec, &logits).await?;
        let values: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
        Ok(values.chunks(self.vocab_size()).take(batch.num_logits()).map(<[f32]>::to_vec).collect())
    }

    async fn step(&self, batch: &StepBatch) -> Result<StepOutput> {
        let started = Instant::now();
        let mut arena = self.arena.lock().await;
        let sample = batch.num_logits() > 0;
        let (_, out, hidden) = self.record(&mut arena, batch, sample)?;
        // An embedding request's hidden state rides in the samples' readback (its sequence has
        // a logit row: `embed` marks a prompt's last chunk).
        let out = if batch.seqs.iter().any(|s| s.embed) {
            let flat = |t: &GpuTensor| t.reshape(&[t.num_elems(), 1]);
            flat(&out)?.then_rows(&flat(&hidden)?)?
        } else {
            out
        };
        let hidden_size = self.model.config().hidden_size;
        let mut timings = StepTimings {
            record_s: started.elapsed().as_secs_f64(),
            dispatches: arena.rec.len(),
            ..Default::default()
        };
        if self.profiling.load(Ordering::Relaxed) {
            let waited = Instant::now();
            let kernels = self.ctx().submit_profiled(&arena.rec).await?.unwrap_or_default();
            timings.wait_s = waited.elapsed().as_secs_f64();
            let mut by_kernel: Vec<(String, f64)> = Vec::new();
            for (variant, seconds) in kernels {
                let name = variant.to_string();
                match by_kernel.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, total)) => *total += seconds,
                    None => by_kernel.push((name, seconds)),
                }
            }
            timings.gpu_s = Some(by_kernel.iter().map(|(_, t)| t).sum());
            timings.kernels = by_kernel;
            if !sample {
                return Ok(StepOutput { samples: vec![Vec::new(); batch.seqs.len()], timings, ..Default::default() });
            }
            // Profiling times the step on its own; the samples come back in a second submission.
            let bytes = self.ctx().read_tensor(&out).await?;
            return Ok(StepOutput {
                timings,
                ..read_output(batch, &bytemuck::pod_collect_to_vec(&bytes), hidden_size)
            });
        }
        if !sample {
            let waited = Instant::now();
            self.ctx().submit(&arena.rec).await?;
            timings.wait_s = waited.elapsed().as_secs_f64();
            return Ok(StepOutput { samples: vec![Vec::new(); batch.seqs.len()], timings, ..Default::default() });
        }
        let (bytes, times) = self.ctx().submit_and_read_timed(&arena.rec, &out).await?;
        (timings.encode_s, timings.submit_s, timings.wait_s, timings.ahead_s) =
            (times.encode_s, times.submit_s, times.wait_s, times.ahead_s);
        timings.gpu_s = times.gpu_s;
        Ok(StepOutput { timings, ..read_output(batch, &bytemuck::pod_collect_to_vec(&bytes), hidden_size) })
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

/// A step's readback: the sampler's rows, then (when a sequence asked, `SeqStep::embed`) the
/// final hidden state of every logit row, of which each such sequence takes its last.
fn read_output(batch: &StepBatch, words: &[u32], hidden_size: usize) -> StepOutput {
    let (sampled, hidden) = words.split_at((batch.num_logits() * OUT_PER_ROW).min(words.len()));
    let mut end = 0;
    let hidden = batch
        .seqs
        .iter()
        .map(|s| {
            end += s.num_logits;
            match s.embed {
                true => hidden[(end - 1) * hidden_size..end * hidden_size].iter().map(|&w| f32::from_bits(w)).collect(),
                false => Vec::new(),
            }
        })
        .collect();
    StepOutput { hidden, ..sampler::read(batch, sampled) }
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

    fn bidirectional(&self) -> bool {
        self.model.bidirectional()
    }

    fn embedding_size(&self) -> Option<usize> {
        let c = self.model.config();
        c.pooling.map(|_| c.hidden_size)
    }

    fn state_config(&self) -> Option<RecurrentStateConfig> {
        let scan_chunk_tokens = self.scan_chunk.unwrap_or(1);
        self.kv.state_config().map(|c| RecurrentStateConfig { scan_chunk_tokens, ..c })
    }

    fn health_check(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(self.round_trip())
    }

    fn set_profiling(&self, on: bool) {
        self.profiling.store(on, Ordering::Relaxed);
    }

    fn cautious_tokens_per_second(&self) -> Option<f64> {
        // Two FLOPs per weight of the attention and MLP matrices; attention over the context
        // and recurrent layers are left to the measured steps.
        let c = self.model.config();
        let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let per_layer = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size;
        let flops = 2.0 * (c.num_layers * per_layer) as f64;
        let device = self.factory.context().plan().cautious_flops_per_s?;
        (flops > 0.0).then(|| device / flops)
    }

    fn draft_store(&self) -> Option<DraftStore> {
        self.draft_distributions.as_ref().map(|d| d.store())
    }

    fn lora_config(&self) -> Option<LoraConfig> {
        self.lora.as_ref().map(|p| LoraConfig { max_loras: p.max_loras(), max_rank: p.max_rank(), shape: p.shape() })
    }
}
