//! `cargo xtask bench-kernels`: GFLOP/s and GB/s of matmul for every weight format at decode
//! (M = 1) and batched (M = 16, 64) shapes, and of the default model's LM head (576 x 49152,
//! the vocabulary); then the time of one layer's attention in the default model's shape at a
//! decode of 1 and of 16 sequences and a 128-token prefill, and at head sizes 64 and 128 at a
//! decode over 2048 positions and a 512-token prefill; of its residual add and RMSNorm
//! (`add_rms_norm`) at 1, 16 and 128 rows; and of the sampler over its 49152-token vocabulary,
//! greedy, at temperature 0.8 alone, with top-k 40, with top-p 0.95, and with both (llama.cpp's
//! default filters), at 1 and 16 rows; and one layer's LoRA deltas (`lora`) over 1 and 4
//! adapters. A benchmark, not a test: it prints tables.
//!
//! `gemm` (only when named): the baseline or subgroup family's row-parallel matmul (GEMV) against
//! its tiled one (GEMM), each forced at every M of 1 to 512 on the default model's shapes that
//! see every row of a step, and the batch size from which the GEMM wins: the row of
//! `weft::gpu::GEMM_MIN_ROWS` for this adapter, which the device check prints.
//!
//! `moe` (only when named): one mixture-of-experts layer's experts in Qwen3-30B-A3B's shape
//! (hidden 2048, 128 experts of width 768, top 8; Q4_0 weights, random routing) at 1, 16 and
//! 128 tokens: gate and up with the SwiGLU, then down, row by row (`moe_matmul` without tiles)
//! and grouped by expert (`moe_group`, then `moe_matmul` by tiles), in the adapter's family.
//!
//! Weights and activations are uploaded as a model's are (`upload_weight`, `upload_activations`:
//! textures and uniform windows on CPU drivers). Each cell records the same matmul `reps` times
//! in one submission (reps chosen so one run takes about 50 ms), times the pass with GPU
//! timestamp queries where the adapter has them (wall clock otherwise), and reports the median
//! of 5 runs. GB/s counts the bytes a matmul must move once: weights as stored, plus x and y in
//! f32.

use std::time::Instant;

use weft::DType;
use weft::gpu::kernels::lora::{LoraMatrices, LoraRows, lora};
use weft::gpu::kernels::matmul::matmul;
use weft::gpu::kernels::moe::{Routing, TILE_WORDS, max_tiles, moe_group, moe_matmul};
use weft::gpu::kernels::paged::{PagedKv, QkvLayout, attention_partials_cols, paged_attention};
use weft::gpu::kernels::reduce::add_rms_norm;
use weft::gpu::kernels::sample::{OUT_PER_ROW, SETTINGS_PER_ROW, sample};
use weft::gpu::kernels::spec_sample::{SPEC_PER_ROW, spec_sample};
use weft::gpu::{Epilogue, GpuContext, GpuOptions, GpuTensorFactory, KernelFamily, Recording};
use weft::lora::LoraShape;
use weft::model::sampler::{settings_row, spec_row};
use weft::sampling::{DraftRow, SamplingParams};
use weft::tensor::TensorFactory;

const MS: [usize; 3] = [1, 16, 64];
/// (k, n): the default model's MLP up and down, two square layers, and its LM head.
const KNS: [(usize, usize); 5] = [(576, 1536), (1536, 576), (2048, 2048), (4096, 4096), (576, 49152)];
/// Rows of x the GEMV-or-GEMM comparison times.
const CROSSOVER_MS: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 512];
/// (k, n) of the default model's (SmolLM2-135M, Q4_1) matmuls that see every row of a step:
/// attention's query and output projections, its MLP's gate and up (one matrix) and down.
const MODEL_KNS: [(usize, usize); 3] = [(576, 576), (576, 3072), (1536, 576)];
const RUNS: usize = 5;
const TARGET_SECONDS: f64 = 0.05;

fn main() -> weft::Result<()> {
    // `cargo bench` passes `--bench`; a name filters the formats (e.g. `q4_1`), or `attention`,
    // `norm` or `sample`.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-')).map(|a| a.to_uppercase());
    let ctx = weft::rt::block_on(GpuContext::new(GpuOptions::default()))?;
    let factory = GpuTensorFactory::new(ctx.clone());
    println!("{}", ctx.describe());
    if filter.as_deref() == Some("GEMM") {
        return gemv_or_gemm(&ctx);
    }
    if filter.as_deref() == Some("MOE") {
        return moe_layer(&ctx, &factory);
    }
    println!("matmul y = x·Wᵀ, median of {RUNS} runs, {}\n", clock(&ctx));
    println!("{:<6} {:>4} {:>11} {:>9} {:>9} {:>10}", "format", "M", "K x N", "GFLOP/s", "GB/s", "us/matmul");
    for dtype in DType::WEIGHTS {
        if filter.as_ref().is_some_and(|f| f != dtype.name()) {
            continue;
        }
        for (k, n) in KNS {
            // Rows of the super-block formats are whole 256-element blocks.
            let k = k.next_multiple_of(dtype.block_elems());
            let w_values: Vec<f32> = (0..n * k).map(|i| ((i * 104_729) % 997) as f32 / 498.5 - 1.0).collect();
            let w = factory.upload_weight(&[n, k], dtype, &weft::quant::quantize(dtype, &w_values)?)?;
            for m in MS {
                let x = factory.upload_activations(&[m, k], &vec![0.5; m * k])?;
                let y = factory.zeros(&[m, n], DType::F32)?;
                let seconds = median_seconds(&ctx, |rec| matmul(&ctx, rec, &x, &w, &y))?;
                let flops = 2.0 * (m * n * k) as f64;
                let bytes = (w.size_bytes() + 4 * m * k + 4 * m * n) as f64;
                println!(
                    "{:<6} {:>4} {:>11} {:>9.1} {:>9.2} {:>10.1}",
                    dtype.name(),
                    m,
                    format!("{k}x{n}"),
                    flops / seconds * 1e-9,
                    bytes / seconds * 1e-9,
                    seconds * 1e6
                );
            }
        }
    }
    if filter.as_ref().is_none_or(|f| f == "ATTENTION") {
        attention(&ctx, &factory)?;
    }
    if filter.as_ref().is_none_or(|f| f == "NORM") {
        norm(&ctx, &factory)?;
    }
    if filter.as_ref().is_none_or(|f| f == "SAMPLE") {
        sampler(&ctx, &factory)?;
    }
    if filter.as_ref().is_none_or(|f| f == "LORA") {
        lora_layer(&ctx, &factory)?;
    }
    Ok(())
}

/// One layer's LoRA deltas in the default model's shape (q, k, v, o, gate, up and down of
/// hidden 576, KV 192, MLP 1536) at rank 16 from a pool of 4 slots, as a step records them:
/// 16 decoding sequences and a 128-token prefill, their rows over 1 adapter and over 4 (a step
/// with none records no LoRA dispatch: 0), beside the same layer's base projections in Q4_1
/// (the default model's format). The step's cost is 30 times the layer's.
fn lora_layer(ctx: &GpuContext, factory: &GpuTensorFactory) -> weft::Result<()> {
    const RANK: usize = 16;
    const SLOTS: usize = 4;
    let dims = LoraShape::llama(30, 576, 576, 192, 1536).dims;
    println!(
        "
LoRA, one layer's 7 projections at rank {RANK}, {SLOTS} slots, median of {RUNS} runs, {}",
        clock(ctx)
    );
    let values = |len: usize| (0..len).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect::<Vec<f32>>();
    let matrices = dims
        .iter()
        .map(|&(i, o)| {
            Ok((
                factory.upload_f32(&[SLOTS * i, RANK], &values(SLOTS * RANK * i))?,
                factory.upload_f32(&[SLOTS * RANK, o], &values(SLOTS * o * RANK))?,
            ))
        })
        .collect::<weft::Result<Vec<_>>>()?;
    let info: Vec<u32> = (0..SLOTS).flat_map(|_| [RANK as u32, 0.5f32.to_bits()]).collect();
    let info = factory.upload_u32(&[SLOTS, 2], &info)?;
    let weights = dims
        .iter()
        .map(|&(i, o)| {
            factory.upload_weight(&[o, i], DType::Q4_1, &weft::quant::quantize(DType::Q4_1, &values(o * i))?)
        })
        .collect::<weft::Result<Vec<_>>>()?;
    println!("{:<28} {:>12} {:>12} {:>12}", "rows", "base (Q4_1)", "1 adapter", "4 adapters");
    for (label, rows) in [("decode, 16 sequences", 16), ("prefill, 128 tokens", 128)] {
        let u = factory.zeros(&[rows, RANK], DType::F32)?;
        let xs = dims
            .iter()
            .map(|&(i, _)| factory.upload_f32(&[rows, i], &values(rows * i)))
            .collect::<weft::Result<Vec<_>>>()?;
        let ys = dims.iter().map(|&(_, o)| factory.zeros(&[rows, o], DType::F32)).collect::<weft::Result<Vec<_>>>()?;
        let activations = dims
            .iter()
            .map(|&(i, _)| factory.upload_activations(&[rows, i], &values(rows * i)))
            .collect::<weft::Result<Vec<_>>>()?;
        let mut cells = vec![median_seconds(ctx, |rec| {
            for ((w, x), y) in weights.iter().zip(&activations).zip(&ys) {
                matmul(ctx, rec, x, w, y)?;
            }
            Ok(())
        })?];
        for adapters in [1, SLOTS] {
            let slots: Vec<u32> = (0..rows).map(|r| (r % adapters) as u32).collect();
            let slots = factory.upload_u32(&[rows], &slots)?;
            let step = LoraRows { row_slots: &slots, slot_info: &info, u: &u };
            let seconds = median_seconds(ctx, |rec| {
                for (((a, b), x), y) in matrices.iter().zip(&xs).zip(&ys) {
                    lora(ctx, rec, x, &LoraMatrices { a, b }, &step, y, 0)?;
                }
                Ok(())
            })?;
            cells.push(seconds);
        }
        println!("{label:<28} {:>9.1} us {:>9.1} us {:>9.1} us", cells[0] * 1e6, cells[1] * 1e6, cells[2] * 1e6);
    }
    Ok(())
}

/// One layer's attention over an f16 cache, as a model's step records it (queries in
/// activations, the cache in the driver's KV source, room for split-K partials where the
/// family splits): in the default model's shape (9 query heads over 3 KV heads of 64) one and
/// 16 sequences decoding at position 143 and a 128-token prefill; then at head sizes 64 (9 over
/// 3), 128 (32 over 8, Llama 3.1 8B's) and 512 (8 over 2: a Gemma 4 full-attention layer's
/// heads) one sequence decoding at 2048 (split-K on GPUs) and a 512-token prefill from
/// position 0.
fn attention(ctx: &GpuContext, factory: &GpuTensorFactory) -> weft::Result<()> {
    println!("\nattention, f16 cache, median of {RUNS} runs, {}", clock(ctx));
    let decode16: Vec<(usize, usize)> = (0..16).map(|s| (s, 143)).collect();
    let prefill = |n: usize| (0..n).map(|p| (0, p)).collect::<Vec<_>>();
    let small = QkvLayout { num_heads: 9, num_kv_heads: 3, head_dim: 64 };
    let wide = QkvLayout { num_heads: 32, num_kv_heads: 8, head_dim: 128 };
    let full = QkvLayout { num_heads: 8, num_kv_heads: 2, head_dim: 512 };
    let cases = [
        ("head 64, decode, 1 sequence at 144", small, 144, vec![(0, 143)]),
        ("head 64, decode, 16 sequences at 144", small, 144, decode16),
        ("head 64, prefill, 128 tokens", small, 144, prefill(128)),
        ("head 64, decode, 1 sequence at 2048", small, 2048, vec![(0, 2047)]),
        ("head 64, prefill, 512 tokens", small, 2048, prefill(512)),
        ("head 128, decode, 1 sequence at 2048", wide, 2048, vec![(0, 2047)]),
        ("head 128, prefill, 512 tokens", wide, 2048, prefill(512)),
        ("head 512, decode, 1 sequence at 2048", full, 2048, vec![(0, 2047)]),
        ("head 512, prefill, 512 tokens", full, 2048, prefill(512)),
    ];
    for (label, layout, len, tokens) in cases {
        let seconds = attention_case(ctx, factory, layout, len, &tokens)?;
        println!("{label:<40} {:>10.1} us", seconds * 1e6);
    }
    Ok(())
}

/// The median time of one attention over `tokens` (sequence, position) queries, each of 16
/// sequences holding `len` positions of the cache.
fn attention_case(
    ctx: &GpuContext,
    factory: &GpuTensorFactory,
    layout: QkvLayout,
    len: usize,
    tokens: &[(usize, usize)],
) -> weft::Result<f64> {
    let (seqs, block) = (16, 16);
    let (kv_heads, head_dim) = (layout.num_kv_heads, layout.head_dim);
    let slots = seqs * len;
    let kv_values: Vec<f32> =
        (0..slots * kv_heads * head_dim).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let k = factory.kv_cache(&[slots, kv_heads, head_dim], DType::F16, Some(&kv_values))?;
    let v = factory.kv_cache(&[slots, kv_heads, head_dim], DType::F16, Some(&kv_values))?;
    let cache = PagedKv { k_cache: &k, v_cache: &v, block_size: block, first_slot: 0, num_slots: slots };
    let tables: Vec<u32> = (0..(slots / block) as u32).collect();
    let tables = factory.upload_u32(&[seqs, len / block], &tables)?;
    let n = tokens.len();
    let info: Vec<u32> = tokens.iter().flat_map(|&(s, p)| [s as u32, p as u32]).collect();
    let info = factory.upload_u32(&[n, 2], &info)?;
    let qkv = factory.upload_activations(&[n, layout.row_stride()], &vec![0.01; n * layout.row_stride()])?;
    let out = factory.zeros(&[n, layout.num_heads * head_dim], DType::F32)?;
    let split = ctx.kernel_family().splits_attention();
    let partials = factory.zeros(&[n, attention_partials_cols(split, layout.num_heads, head_dim)], DType::F32)?;
    let scale = 1.0 / (head_dim as f32).sqrt();
    median_seconds(ctx, |rec| {
        paged_attention(ctx, rec, &qkv, layout, &cache, &tables, &info, &out, &partials, None, scale, None)
    })
}

/// The residual add and RMSNorm between two of the default model's layers (576 wide), as a
/// step records it: 1 and 16 decoding sequences, a 128-token prefill.
fn norm(ctx: &GpuContext, factory: &GpuTensorFactory) -> weft::Result<()> {
    const N: usize = 576;
    println!("\nadd_rms_norm, rows of {N}, median of {RUNS} runs, {}", clock(ctx));
    let weight = factory.upload_f32(&[N], &vec![1.0; N])?;
    for rows in [1, 16, 128] {
        let values =
            |salt: usize| -> Vec<f32> { (0..rows * N).map(|i| ((i * salt) % 1000) as f32 / 1000.0 - 0.5).collect() };
        let x = factory.upload_f32(&[rows, N], &values(7919))?;
        let delta = factory.upload_f32(&[rows, N], &values(104_729))?;
        let y = factory.zeros(&[rows, N], DType::F32)?;
        let seconds = median_seconds(ctx, |rec| add_rms_norm(ctx, rec, &x, &delta, &weight, &y, 1e-5))?;
        println!("{:<28} {:>10.1} us", format!("{rows} rows"), seconds * 1e6);
    }
    Ok(())
}

/// The sampler over the default model's vocabulary: greedy, and at temperature 0.8 unfiltered
/// and filtered (top-k and top-p are what llama.cpp's CLI applies by default); then the
/// speculative rule's rows at temperature 0.8, unfiltered and filtered: a draft's row keeping
/// its distribution, a target's row verifying a drafted token.
fn sampler(ctx: &GpuContext, factory: &GpuTensorFactory) -> weft::Result<()> {
    const VOCAB: usize = 49152;
    println!("\nsample, vocabulary of {VOCAB}, median of {RUNS} runs, {}", clock(ctx));
    let filtered = |top_k, top_p| SamplingParams { temperature: 0.8, top_k, top_p, ..Default::default() };
    let cases = [
        ("greedy", SamplingParams::greedy()),
        ("t 0.8", filtered(0, 1.0)),
        ("t 0.8, top-k 40", filtered(40, 1.0)),
        ("t 0.8, top-p 0.95", filtered(0, 0.95)),
        ("t 0.8, top-k 40, top-p 0.95", filtered(40, 0.95)),
    ];
    for (label, params) in cases {
        for rows in [1, 16] {
            let logits = model_like_logits(rows * VOCAB);
            let settings: Vec<u32> =
                (0..rows).flat_map(|r| settings_row(&params, (r as f32 + 0.5) / rows as f32)).collect();
            let logits = factory.upload_f32(&[rows, VOCAB], &logits)?;
            let settings = factory.upload_u32(&[rows, SETTINGS_PER_ROW], &settings)?;
            let out = factory.zeros(&[rows, OUT_PER_ROW], DType::U32)?;
            let seconds = median_seconds(ctx, |rec| sample(ctx, rec, &logits, &settings, &out))?;
            println!("{:<52} {:>10.1} us", format!("{label}, {rows} rows"), seconds * 1e6);
        }
    }
    // (label, setting, a target's verify row rather than a draft's keep row)
    let draft_rows = [
        ("spec keep, t 0.8", filtered(0, 1.0), false),
        ("spec keep, t 0.8, top-k 40, top-p 0.95", filtered(40, 0.95), false),
        ("spec verify, t 0.8", filtered(0, 1.0), true),
        ("spec verify, t 0.8, top-k 40, top-p 0.95", filtered(40, 0.95), true),
    ];
    for (label, params, verify) in draft_rows {
        for rows in [1, 16] {
            let logits = factory.upload_f32(&[rows, VOCAB], &model_like_logits(rows * VOCAB))?;
            // Each row its own slot, as the engine hands them out.
            let spec: Vec<u32> = (0..rows as u32)
                .flat_map(|slot| {
                    let draft = if verify {
                        DraftRow::Verify { slot, token: 7, accept_uniform: 0.5 }
                    } else {
                        DraftRow::Keep { slot }
                    };
                    spec_row(slot, &params, 0.5, draft)
                })
                .collect();
            let spec = factory.upload_u32(&[rows, SPEC_PER_ROW], &spec)?;
            let probs = factory.upload_f32(&[rows, VOCAB], &vec![1.0 / VOCAB as f32; rows * VOCAB])?;
            let out = factory.zeros(&[rows, OUT_PER_ROW], DType::U32)?;
            let seconds = median_seconds(ctx, |rec| spec_sample(ctx, rec, &logits, &spec, &probs, &out))?;
            println!("{:<52} {:>10.1} us", format!("{label}, {rows} rows"), seconds * 1e6);
        }
    }
    Ok(())
}

/// One layer's experts in Qwen3-30B-A3B's shape, row by row and grouped by expert (see the
/// module's doc). The weights are random Q4_0 blocks made in place (quantizing 600M values
/// would take longer than the bench), each projection uploaded in parts of whole experts as a
/// model's are.
fn moe_layer(ctx: &GpuContext, factory: &GpuTensorFactory) -> weft::Result<()> {
    const HIDDEN: usize = 2048;
    const EXPERTS: usize = 128;
    const FF: usize = 768;
    const TOP_K: usize = 8;
    let q4_0 = |rows: usize, cols: usize| -> Vec<u8> {
        let blocks = rows * cols / 32;
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut bytes = Vec::with_capacity(blocks * 18);
        for _ in 0..blocks {
            // Scale 1/64 (f16), then 16 bytes of random nibbles.
            bytes.extend_from_slice(&0x2400u16.to_le_bytes());
            for _ in 0..2 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bytes.extend_from_slice(&state.to_le_bytes());
            }
        }
        bytes
    };
    let upload = |name: &str, rows: usize, cols: usize| {
        let bytes = q4_0(rows, cols);
        weft::model::weights::upload_experts(
            "bench",
            name,
            [rows, cols],
            DType::Q4_0,
            &bytes.as_slice(),
            EXPERTS,
            factory,
        )
    };
    let gate_up = upload("gate_up", EXPERTS * 2 * FF, HIDDEN)?;
    let down = upload("down", EXPERTS * HIDDEN, FF)?;
    println!(
        "\nMoE experts, hidden {HIDDEN}, {EXPERTS} experts of {FF}, top {TOP_K}, Q4_0 ({} + {} parts), {} family, \
         median of {RUNS} runs, {}\n",
        gate_up.parts().len(),
        down.parts().len(),
        ctx.kernel_family().name(),
        clock(ctx)
    );
    println!("{:>6} {:>12} {:>12} {:>9}", "tokens", "per row us", "grouped us", "speedup");
    for tokens in [1, 16, 128] {
        let rows = tokens * TOP_K;
        let logits: Vec<f32> = (0..tokens * EXPERTS).map(|i| ((i * 7919 + 13) % 1009) as f32 / 100.0).collect();
        let (ids, _) =
            weft::cpu::moe::moe_route(&logits, EXPERTS, TOP_K, Routing::Softmax { normalize: false }, None, None);
        let ids = factory.upload_u32(&[tokens, TOP_K], &ids)?;
        let x = factory.upload_f32(&[tokens, HIDDEN], &vec![0.5; tokens * HIDDEN])?;
        let act = factory.zeros(&[rows, FF], DType::F32)?;
        let out = factory.zeros(&[rows, HIDDEN], DType::F32)?;
        let tiles = factory.zeros(&[1 + max_tiles(rows, EXPERTS), TILE_WORDS], DType::U32)?;
        let layer = |rec: &mut Recording, tiles: Option<&weft::gpu::GpuTensor>| -> weft::Result<()> {
            if let Some(t) = tiles {
                moe_group(ctx, rec, &ids, EXPERTS, t)?;
            }
            moe_matmul(ctx, rec, &x, &gate_up, EXPERTS, &ids, tiles, &act, Epilogue::SiluMul, None)?;
            moe_matmul(ctx, rec, &act, &down, EXPERTS, &ids, tiles, &out, Epilogue::None, None)
        };
        let per_row = median_seconds(ctx, |rec| layer(rec, None))?;
        let grouped = median_seconds(ctx, |rec| layer(rec, Some(&tiles)))?;
        println!("{tokens:>6} {:>12.1} {:>12.1} {:>8.2}x", per_row * 1e6, grouped * 1e6, per_row / grouped);
    }
    Ok(())
}

/// The family's GEMV against its GEMM at every M of CROSSOVER_MS, and the smallest M from which
/// the GEMM is faster at that M and every larger one, on every shape (the threshold to record).
fn gemv_or_gemm(ctx: &GpuContext) -> weft::Result<()> {
    let family = ctx.kernel_family();
    if family == KernelFamily::Cpu {
        println!("gemm: the cpu family runs one matmul at every M; time WEFT_KERNELS=baseline or subgroup");
        return Ok(());
    }
    let open = |gemm_min_rows: usize| -> weft::Result<GpuTensorFactory> {
        let options = GpuOptions { kernels: Some(family), gemm_min_rows: Some(gemm_min_rows), ..Default::default() };
        Ok(GpuTensorFactory::new(weft::rt::block_on(GpuContext::new(options))?))
    };
    let kinds = [("GEMV", open(usize::MAX)?), ("GEMM", open(1)?)];
    let dtype = DType::Q4_1;
    println!("\n{} family: GEMV or GEMM, {dtype}, median of {RUNS} runs, {}\n", family.name(), clock(ctx));
    println!(
        "{:>11} {:>4} {:>10} {:>10} {:>10} {:>10} {:>6}",
        "K x N", "M", "GEMV GF/s", "GEMM GF/s", "GEMV us", "GEMM us", "GEMM/GEMV"
    );
    let mut crossover = 1;
    for (k, n) in MODEL_KNS {
        let w_values: Vec<f32> = (0..n * k).map(|i| ((i * 104_729) % 997) as f32 / 498.5 - 1.0).collect();
        let w_bytes = weft::quant::quantize(dtype, &w_values)?;
        let mut wins = Vec::new();
        for m in CROSSOVER_MS {
            let mut seconds = [0.0; 2];
            for (s, (_, f)) in seconds.iter_mut().zip(&kinds) {
                let c = f.context();
                let w = f.upload_weight(&[n, k], dtype, &w_bytes)?;
                let x = f.upload_activations(&[m, k], &vec![0.5; m * k])?;
                let y = f.zeros(&[m, n], DType::F32)?;
                *s = median_seconds(c, |rec| matmul(c, rec, &x, &w, &y))?;
            }
            let gflops = |s: f64| 2.0 * (m * n * k) as f64 / s * 1e-9;
            println!(
                "{:>11} {:>4} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>6.2}",
                format!("{k}x{n}"),
                m,
                gflops(seconds[0]),
                gflops(seconds[1]),
                seconds[0] * 1e6,
                seconds[1] * 1e6,
                seconds[0] / seconds[1]
            );
            wins.push((m, seconds[1] < seconds[0]));
        }
        // The smallest M from which the GEMM wins at every larger M (none: past the largest).
        let from = wins.iter().rev().take_while(|(_, won)| *won).last().map_or(usize::MAX, |(m, _)| *m);
        match from {
            usize::MAX => println!("{k}x{n}: the GEMM wins at no M up to 512"),
            m => println!("{k}x{n}: the GEMM wins from M = {m}"),
        }
        crossover = crossover.max(from);
    }
    let info = ctx.adapter_info();
    match crossover {
        usize::MAX => println!("crossover: none up to 512 rows on {}: keep the GEMV (min_rows above 512)", info.name),
        m => println!(
            "crossover: GemmMinRows {{ vendor: {:#x}, family: KernelFamily::{family:?}, min_rows: {m} }}, // {}",
            info.vendor, info.name
        ),
    }
    Ok(())
}

/// Logits shaped like a model's: a few large, a long tail.
fn model_like_logits(len: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 10.0 + ((i * 31) % 97 == 0) as u8 as f32 * 8.0).collect()
}

/// The median time of what `dispatch` records, recorded over and over into one submission that
/// takes about TARGET_SECONDS.
fn median_seconds(ctx: &GpuContext, dispatch: impl Fn(&mut Recording) -> weft::Result<()>) -> weft::Result<f64> {
    let record = |reps: usize| -> weft::Result<Recording> {
        let mut rec = Recording::new();
        for _ in 0..reps {
            dispatch(&mut rec)?;
        }
        Ok(rec)
    };
    let once = time(ctx, &record(1)?)?; // also warms the pipeline
    let reps = ((TARGET_SECONDS / once.max(1e-6)) as usize).clamp(1, 200);
    let rec = record(reps)?;
    let mut samples = (0..RUNS).map(|_| time(ctx, &rec)).collect::<weft::Result<Vec<f64>>>()?;
    samples.sort_by(f64::total_cmp);
    Ok(samples[RUNS / 2] / reps as f64)
}

fn clock(ctx: &GpuContext) -> &'static str {
    if ctx.features().timestamp_query { "GPU timestamps" } else { "wall clock" }
}

fn time(ctx: &GpuContext, rec: &Recording) -> weft::Result<f64> {
    let started = Instant::now();
    let gpu = weft::rt::block_on(ctx.submit_timed(rec))?;
    Ok(gpu.unwrap_or_else(|| started.elapsed().as_secs_f64()))
}
