//! `cargo xtask bench-engine [--concurrency 1,4,16,32] [--prompt-len 16] [--gen-len 16]`: the
//! default model served by the engine at several concurrency levels, in one process and one
//! run. A benchmark, not a test: it prints a table.
//!
//! Each level submits `concurrency` distinct greedy requests at once to a running engine and
//! waits for all of them. Aggregate tokens/s is generated tokens over the level's wall time;
//! decode tokens/s counts the tokens after each request's first, over the time from the median
//! first token to the last token; time to first token is the median over the requests.

use std::time::Instant;

use futures::StreamExt;
use weft::EngineBuilder;
use weft::engine::EngineConfig;
use weft::engine::request::{GenerationParams, InferenceRequest, Prompt};
use weft::sampling::SamplingParams;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() -> weft::Result<()> {
    let levels: Vec<usize> = arg("--concurrency")
        .unwrap_or_else(|| "1,4,16,32".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let prompt_len: usize = arg("--prompt-len").and_then(|s| s.parse().ok()).unwrap_or(16);
    let gen_len: usize = arg("--gen-len").and_then(|s| s.parse().ok()).unwrap_or(16);
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let max_seqs = levels.iter().copied().max().unwrap_or(1);
    let builder = EngineBuilder::from_model(model)?
        .config(EngineConfig {
            max_num_seqs: max_seqs,
            max_num_batched_tokens: 512,
            enable_prefix_cache: false,
            // 64 MiB hold 1456 tokens of f32 K and V (2912 of f16): a context that fits them.
            max_model_len: 1024,
            ..Default::default()
        })
        .kv_memory_bytes(64 << 20);
    let engine = weft::rt::block_on(builder.build())?;
    engine.start_loop()?;
    let vocab = engine.executor().vocab_size() as u32;
    println!(
        "weft engine, default model, prompt {prompt_len} tokens, {gen_len} generated tokens per request, greedy\n"
    );
    println!(
        "{:>11} {:>10} {:>14} {:>14} {:>10} {:>9}",
        "concurrency", "requests", "aggregate t/s", "decode t/s", "TTFT p50", "wall s"
    );
    for (level_index, &n) in levels.iter().enumerate() {
        let started = Instant::now();
        let runs: Vec<_> = (0..n)
            .map(|i| {
                // Distinct token prompts (no prefix sharing), away from special ids.
                let tokens: Vec<u32> = (0..prompt_len)
                    .map(|j| 1000 + ((level_index * 7919 + i * 131 + j * 17) as u32 % (vocab - 2000)))
                    .collect();
                let params = GenerationParams {
                    sampling: SamplingParams::greedy(),
                    max_tokens: Some(gen_len),
                    ignore_eos: true,
                    ..Default::default()
                };
                let engine = engine.clone();
                async move {
                    let mut stream =
                        Box::pin(engine.infer_stream(InferenceRequest::new(Prompt::Tokens(tokens), params))?);
                    let (mut first, mut count) = (None, 0usize);
                    while let Some(chunk) = stream.next().await {
                        count += chunk?.token_ids.len();
                        first.get_or_insert_with(Instant::now);
                    }
                    Ok::<_, weft::WeftError>((first.unwrap_or_else(Instant::now), Instant::now(), count))
                }
            })
            .collect();
        let results: Vec<_> =
            weft::rt::block_on(futures::future::join_all(runs)).into_iter().collect::<weft::Result<Vec<_>>>()?;
        let wall = started.elapsed().as_secs_f64();
        let generated: usize = results.iter().map(|r| r.2).sum();
        let mut firsts: Vec<f64> = results.iter().map(|r| (r.0 - started).as_secs_f64()).collect();
        firsts.sort_by(f64::total_cmp);
        let ttft = firsts[firsts.len() / 2];
        let decode_tokens: usize = results.iter().map(|r| r.2.saturating_sub(1)).sum();
        let decode_seconds = wall - ttft;
        println!(
            "{:>11} {:>10} {:>14.2} {:>14.2} {:>9.1}s {:>9.1}",
            n,
            n,
            generated as f64 / wall,
            decode_tokens as f64 / decode_seconds.max(1e-9),
            ttft,
            wall
        );
    }
    engine.shutdown();
    Ok(())
}
