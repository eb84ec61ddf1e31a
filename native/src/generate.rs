//! `weft generate`: stream one completion of a prompt to stdout, speeds to stderr.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use weft::gpu::{GpuContext, GpuOptions, GpuTensorFactory};
use weft::kv::{BlockAllocator, KvCacheConfig};
use weft::model::executor::{ModelExecutor, SampleSpec, SeqInput};
use weft::model::load::ModelFiles;
use weft::sampling::{SamplerRng, SamplingParams};
use weft::tokenizer::{ChatMessage, DecodeStream, Tokenizer};
use weft::{Result, WeftError};

/// Where `cargo xtask fetch-model` puts the default model.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

const BLOCK_SIZE: usize = 16;
/// Prompt tokens per prefill step.
const PREFILL_CHUNK: usize = 256;

pub struct Options {
    pub model: Option<PathBuf>,
    pub prompt: String,
    pub chat: bool,
    pub system: Option<String>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
}

/// The model path to use: the one given, or the default model with advice when it is missing.
pub fn model_path(given: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path);
    }
    let default = Path::new(DEFAULT_MODEL);
    if default.exists() {
        return Ok(default.to_path_buf());
    }
    Err(WeftError::model(
        DEFAULT_MODEL,
        "the default model is missing: run `cargo xtask fetch-model` in the weft checkout, or pass \
         --model PATH (a .gguf file or a Hugging Face model directory)",
    ))
}

pub fn run(opts: Options) -> Result<()> {
    opts.sampling.validate()?;
    let path = model_path(opts.model)?;
    let files = ModelFiles::open(&path)?;
    let tokenizer: Arc<dyn Tokenizer> = files.tokenizer.clone();
    let prompt_ids = if opts.chat {
        let template = tokenizer.chat_template().ok_or_else(|| {
            WeftError::model(path.display().to_string(), "has no chat template; drop --chat to send the prompt as raw text")
        })?;
        let mut messages = Vec::new();
        if let Some(system) = opts.system {
            messages.push(ChatMessage::system(system));
        }
        messages.push(ChatMessage::user(opts.prompt));
        // The template writes the special tokens itself (BOS included where the model wants it).
        tokenizer.encode(&template.render(&messages, true)?, false)?
    } else {
        tokenizer.encode(&opts.prompt, true)?
    };
    let total = prompt_ids.len() + opts.max_tokens;
    let ctx = weft::rt::block_on(GpuContext::new(GpuOptions::default()))?;
    let factory = GpuTensorFactory::new(ctx);
    let num_blocks = total.div_ceil(BLOCK_SIZE);
    let exec = files.executor(&factory, KvCacheConfig { block_size: BLOCK_SIZE, num_blocks })?;
    if total > exec.max_context() {
        return Err(WeftError::Unsupported(format!(
            "the prompt ({} tokens) plus --max-tokens {} exceeds the model's context of {} tokens",
            prompt_ids.len(),
            opts.max_tokens,
            exec.max_context()
        )));
    }
    let block_table = BlockAllocator::new(num_blocks).allocate(num_blocks).expect("a fresh pool has every block");
    let seed = opts.sampling.seed.unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64));
    let mut rng = SamplerRng::new(seed);
    let mut decoder = DecodeStream::new(tokenizer.clone(), true);
    let stdout = std::io::stdout();
    let eos = tokenizer.eos_token_ids().to_vec();

    let started = Instant::now();
    let mut pos = 0;
    let mut next = None;
    while pos < prompt_ids.len() {
        let chunk = &prompt_ids[pos..(pos + PREFILL_CHUNK).min(prompt_ids.len())];
        let last = pos + chunk.len() == prompt_ids.len();
        let sample = last.then(|| SampleSpec { params: opts.sampling.clone(), uniform: rng.next_uniform() });
        let out = weft::rt::block_on(exec.execute(&[SeqInput { tokens: chunk.to_vec(), start_pos: pos, block_table: block_table.clone(), sample }]))?;
        pos += chunk.len();
        next = out[0].as_ref().map(|s| s.token);
    }
    let prefill_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut generated = 0;
    while let Some(token) = next {
        generated += 1;
        if eos.contains(&token) {
            break;
        }
        if let Some(text) = decoder.step(token)? {
            let mut out = stdout.lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
        if generated == opts.max_tokens {
            break;
        }
        let sample = Some(SampleSpec { params: opts.sampling.clone(), uniform: rng.next_uniform() });
        let out = weft::rt::block_on(exec.execute(&[SeqInput { tokens: vec![token], start_pos: pos, block_table: block_table.clone(), sample }]))?;
        pos += 1;
        next = out[0].as_ref().map(|s| s.token);
    }
    {
        let mut out = stdout.lock();
        if let Some(text) = decoder.finish()? {
            let _ = out.write_all(text.as_bytes());
        }
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    }
    let decode_seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "prompt: {} tokens in {:.2} s ({:.1} tokens/s); generation: {generated} tokens in {:.2} s ({:.2} tokens/s)",
        prompt_ids.len(),
        prefill_seconds,
        prompt_ids.len() as f64 / prefill_seconds,
        decode_seconds,
        generated as f64 / decode_seconds.max(1e-9),
    );
    Ok(())
}
