//! `cargo xtask bench-recurrent [--shapes mamba2-130m,llama-135m] [--contexts 64,512,2048]
//! [--dtype q8_0]`: decode step time against context length for a Mamba2 shape and a Llama
//! shape of similar size (random weights, `model::synthetic`), aggregate decode tokens/s at 1
//! and 16 sequences, and the prefill speed of one 512-token prompt. A recurrent shape is run
//! twice, side by side: its prefill scanned token by token, and in the executor's chunks (the
//! SSD form). A benchmark, not a test: it prints a table.
//!
//! For each context, one sequence is prefilled to that length (chunks of 512 tokens), then 8
//! decode steps are timed; the median is reported. A recurrent model's step reads a fixed-size
//! state whatever the context; an attention model's reads every cached position. Prefill is
//! 512 tokens over the median of 3 one-step prefills (after one to warm up). `--profile` also
//! prints that prefill's GPU time by kernel (timestamp queries), for each way of scanning.

use std::time::Instant;

use weft::DType;
use weft::gpu::{GpuOptions, GpuTensorFactory};
use weft::kv::KvCacheConfig;
use weft::model::executor::GpuExecutor;
use weft::model::load::ModelFiles;
use weft::step::{SeqStep, StepBatch};

const BLOCK: usize = 16;
const DECODE_STEPS: usize = 8;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn list<T: std::str::FromStr>(name: &str, default: &str) -> Vec<T> {
    arg(name).unwrap_or_else(|| default.into()).split(',').filter_map(|s| s.trim().parse().ok()).collect()
}

/// Sequence `i`'s step over its own run of `blocks_per_seq` blocks (and state slot `i`).
fn step(exec: &GpuExecutor, i: usize, tokens: &[u32], start_pos: usize, blocks_per_seq: usize) -> SeqStep {
    let recurrent = weft::step::ModelExecutor::state_config(exec).is_some();
    SeqStep {
        id: i as u64,
        tokens: tokens.to_vec(),
        start_pos,
        block_table: (0..blocks_per_seq as u32).map(|b| (i * blocks_per_seq) as u32 + b).collect(),
        num_logits: 1,
        sampling: None,
        state_slot: recurrent.then_some(i as u32),
        state_restore: None,
        state_save: None,
        lora_slot: None,
        embed: false,
    }
}

fn run(exec: &GpuExecutor, seqs: Vec<SeqStep>) -> weft::Result<Vec<Vec<f32>>> {
    weft::rt::block_on(exec.logits(&StepBatch { seqs, ..Default::default() }))
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i as u32)
}

/// Prefill `num_seqs` sequences to `context` tokens, then time `DECODE_STEPS` decode steps of
/// all of them together: the median step in seconds.
fn decode_step_seconds(
    exec: &GpuExecutor,
    num_seqs: usize,
    context: usize,
    blocks_per_seq: usize,
) -> weft::Result<f64> {
    let mut last: Vec<u32> = vec![0; num_seqs];
    let mut pos = 0;
    while pos < context {
        let end = (pos + 512).min(context);
        let seqs = (0..num_seqs)
            .map(|i| {
                let tokens: Vec<u32> = (pos..end).map(|t| 300 + ((i * 7919 + t * 31) % 40000) as u32).collect();
                step(exec, i, &tokens, pos, blocks_per_seq)
            })
            .collect();
        let logits = run(exec, seqs)?;
        last = logits.iter().map(|l| argmax(l)).collect();
        pos = end;
    }
    let mut times = Vec::new();
    for n in 0..DECODE_STEPS {
        let seqs = (0..num_seqs).map(|i| step(exec, i, &[last[i]], context + n, blocks_per_seq)).collect();
        let started = Instant::now();
        let logits = run(exec, seqs)?;
        times.push(started.elapsed().as_secs_f64());
        last = logits.iter().map(|l| argmax(l)).collect();
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// The prompt the prefill figures time.
const PROMPT: usize = 512;

/// A lone `PROMPT`-token prefill as one step.
fn prefill_step(exec: &GpuExecutor, blocks_per_seq: usize) -> SeqStep {
    let tokens: Vec<u32> = (0..PROMPT).map(|t| 300 + ((t * 31) % 40000) as u32).collect();
    step(exec, 0, &tokens, 0, blocks_per_seq)
}

/// Tokens/s of a lone 512-token prefill in one step: the median of 3, after a warm-up.
fn prefill_tok_s(exec: &GpuExecutor, blocks_per_seq: usize) -> weft::Result<f64> {
    let mut times = Vec::new();
    for _ in 0..4 {
        let started = Instant::now();
        run(exec, vec![prefill_step(exec, blocks_per_seq)])?;
        times.push(started.elapsed().as_secs_f64());
    }
    let mut times = times.split_off(1);
    times.sort_by(f64::total_cmp);
    Ok(PROMPT as f64 / times[times.len() / 2])
}

/// The GPU time by kernel of one 512-token prefill step (largest first), where the adapter
/// has timestamps.
fn prefill_profile(exec: &GpuExecutor, blocks_per_seq: usize) -> weft::Result<Vec<(String, f64)>> {
    use weft::step::ModelExecutor;
    exec.set_profiling(true);
    let out = weft::rt::block_on(
        exec.execute(&StepBatch { seqs: vec![prefill_step(exec, blocks_per_seq)], ..Default::default() }),
    );
    exec.set_profiling(false);
    let mut kernels = out?.timings.kernels;
    kernels.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(kernels)
}

fn main() -> weft::Result<()> {
    let shapes: Vec<String> = list("--shapes", "mamba2-130m,llama-135m");
    let contexts: Vec<usize> = list("--contexts", "64,512,2048");
    let dtype = match arg("--dtype").as_deref() {
        Some("f32") => DType::F32,
        Some("q4_0") => DType::Q4_0,
        _ => DType::Q8_0,
    };
    let Some(ctx) = weft::gpu::open_or_skip(GpuOptions::default())? else { return Ok(()) };
    let f = GpuTensorFactory::new(ctx);
    let max_context = contexts.iter().copied().max().unwrap_or(64).max(PROMPT) + DECODE_STEPS;
    let blocks_per_seq = max_context.div_ceil(BLOCK);
    println!("weft decode step time by context, random weights in {dtype}, median of {DECODE_STEPS} steps\n");
    print!("{:>12}", "shape");
    for c in &contexts {
        print!(" {:>12}", format!("ctx {c} ms"));
    }
    println!(" {:>14} {:>14} {:>18}  scan", "1 seq tok/s", "16 seqs tok/s", "prefill 512 tok/s");
    for shape in &shapes {
        let files = ModelFiles::from_gguf_bytes(shape, weft::model::synthetic_ssm::gguf_bytes(shape, dtype)?)?;
        let recurrent = files.config.ssm.is_some();
        let scans = if recurrent { vec![None, Some(weft::model::executor::SCAN_CHUNK_ROWS)] } else { vec![None] };
        for scan in scans {
            let kv = KvCacheConfig::new(BLOCK, 16 * blocks_per_seq);
            let exec = files.executor(&f, kv)?.with_scan_chunk(scan)?;
            print!("{shape:>12}");
            for &c in &contexts {
                print!(" {:>12.1}", decode_step_seconds(&exec, 1, c, blocks_per_seq)? * 1e3);
            }
            let one = 1.0 / decode_step_seconds(&exec, 1, 64, blocks_per_seq)?;
            let sixteen = 16.0 / decode_step_seconds(&exec, 16, 64, blocks_per_seq)?;
            let prefill = prefill_tok_s(&exec, blocks_per_seq)?;
            let how = match (recurrent, scan) {
                (false, _) => "-".to_string(),
                (true, None) => "token by token".to_string(),
                (true, Some(q)) => format!("chunks of {q}"),
            };
            println!(" {one:>14.1} {sixteen:>14.1} {prefill:>18.1}  {how}");
            if std::env::args().any(|a| a == "--profile") {
                let kernels = prefill_profile(&exec, blocks_per_seq)?;
                let total: f64 = kernels.iter().map(|k| k.1).sum();
                for (name, secs) in kernels.iter().take(12) {
                    println!("    {name:<40} {:>9.1} ms {:>5.1}%", secs * 1e3, 100.0 * secs / total);
                }
            }
        }
    }
    Ok(())
}
