//! `weft generate`: stream one completion of a prompt to stdout, speeds to stderr, through the
//! engine (the same path the server and the browser take); or, with `--prompts-file`, complete
//! every line of a file as concurrent requests sharing the engine's steps (offline batch
//! generation), a JSON line each in the file's order.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use futures::StreamExt;
use weft::EngineBuilder;
use weft::engine::metrics::EngineMetrics;
use weft::engine::request::{GenerationParams, InferenceRequest, Prompt, Usage};
use weft::engine::{ContinuousBatchEngine, SpeculationConfig};
use weft::sampling::SamplingParams;
use weft::tokenizer::ChatMessage;
use weft::{Result, WeftError};

/// Where `cargo xtask fetch-model` puts the default model.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

pub struct Options {
    pub model: Option<PathBuf>,
    pub prompts: Prompts,
    pub chat: bool,
    pub system: Option<String>,
    pub max_tokens: usize,
    pub kv: KvOptions,
    pub sampling: SamplingParams,
    pub speculation: Speculation,
}

/// What to complete: `--prompt`, or every non-empty line of `--prompts-file` ("-": stdin).
pub enum Prompts {
    One(String),
    File(PathBuf),
}

impl Prompts {
    /// From `--prompt` and `--prompts-file`, of which clap lets exactly one through.
    pub fn from_flags(prompt: Option<String>, file: Option<PathBuf>) -> Result<Self> {
        match (prompt, file) {
            (Some(prompt), None) => Ok(Prompts::One(prompt)),
            (None, Some(path)) => Ok(Prompts::File(path)),
            _ => Err(WeftError::invalid_request("give --prompt TEXT or --prompts-file PATH, not both")),
        }
    }

    /// The prompts, in order (one for `--prompt`).
    fn read(&self) -> Result<Vec<String>> {
        let path = match self {
            Prompts::One(prompt) => return Ok(vec![prompt.clone()]),
            Prompts::File(path) => path,
        };
        let text = if path.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin())
        } else {
            std::fs::read_to_string(path)
        }
        .map_err(|e| WeftError::invalid_request(format!("--prompts-file {}: {e}", path.display())))?;
        let prompts: Vec<String> = text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect();
        if prompts.is_empty() {
            return Err(WeftError::invalid_request(format!(
                "--prompts-file {} has no prompts: write one prompt a line",
                path.display()
            )));
        }
        Ok(prompts)
    }
}

/// The KV cache as the flags ask for it (`--kv-memory`, `--gpu-memory-utilization`,
/// `--kv-cache-dtype`, and for one-shot commands `--max-model-len`): what is not given is the
/// builder's choice for the device.
#[derive(Clone, Debug)]
pub struct KvOptions {
    pub kv_memory_bytes: Option<usize>,
    pub gpu_memory_utilization: f64,
    pub kv_cache_dtype: Option<weft::DType>,
    pub max_model_len: Option<usize>,
}

impl KvOptions {
    /// Add it to an engine builder.
    pub fn apply(&self, builder: EngineBuilder) -> EngineBuilder {
        let mut builder = builder.gpu_memory_utilization(self.gpu_memory_utilization);
        if let Some(max_model_len) = self.max_model_len {
            builder = builder.config(weft::engine::EngineConfig { max_model_len, ..Default::default() });
        }
        if let Some(bytes) = self.kv_memory_bytes {
            builder = builder.kv_memory_bytes(bytes);
        }
        if let Some(dtype) = self.kv_cache_dtype {
            builder = builder.kv_cache_dtype(dtype);
        }
        builder
    }
}

/// Speculative decoding as the flags ask for it (`--draft-model`, `--spec-ngram`,
/// `--spec-tokens`): nothing, prompt lookup, or a draft model.
#[derive(Clone, Debug, Default)]
pub struct Speculation {
    pub config: Option<SpeculationConfig>,
    pub draft_model: Option<PathBuf>,
}

impl Speculation {
    /// Add it to an engine builder (opening the draft model's files).
    pub fn apply(&self, builder: EngineBuilder) -> Result<EngineBuilder> {
        let Some(config) = &self.config else { return Ok(builder) };
        let builder = builder.speculation(config.clone());
        match &self.draft_model {
            Some(path) => builder.draft_model(crate::hub::local_path(path.clone())?),
            None => Ok(builder),
        }
    }

    /// "speculation: k drafted, a accepted (r%), m tokens per verifying step" for stderr, or
    /// nothing without speculation.
    pub fn summary(&self, metrics: &EngineMetrics) -> Option<String> {
        self.config.as_ref()?;
        Some(format!(
            "speculation: {} drafted, {} accepted ({:.0}%), {:.2} tokens per verifying step",
            metrics.spec_drafted_tokens,
            metrics.spec_accepted_tokens,
            100.0 * metrics.spec_acceptance_rate(),
            metrics.spec_mean_accepted_len()
        ))
    }
}

/// The model path to use: the one given (an `hf:` name fetched into the hub's cache), or the
/// default model with advice when it is missing.
pub fn model_path(given: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(path) = given {
        return crate::hub::local_path(path);
    }
    let default = Path::new(DEFAULT_MODEL);
    if default.exists() {
        return Ok(default.to_path_buf());
    }
    Err(WeftError::model(
        DEFAULT_MODEL,
        "the default model is missing: run `cargo xtask fetch-model` in the weft checkout, or pass \
         --model PATH (a .gguf file or a Hugging Face model directory) or --model hf:OWNER/REPO[:QUANT]",
    ))
}

pub fn run(opts: Options) -> Result<()> {
    opts.sampling.validate()?;
    let prompts = opts.prompts.read()?;
    let path = model_path(opts.model)?;
    let builder = opts
        .kv
        .apply(EngineBuilder::from_model(&path)?)
        .on_progress(crate::progress::loading(path.display().to_string()));
    let engine = weft::rt::block_on(opts.speculation.apply(builder)?.build())?;
    if opts.chat && engine.tokenizer().chat_template().is_none() {
        return Err(WeftError::model(
            path.display().to_string(),
            "has no chat template; drop --chat to send the prompt as raw text",
        ));
    }
    let request = |text: &str| {
        let prompt = if opts.chat {
            let mut messages = Vec::new();
            if let Some(system) = &opts.system {
                messages.push(ChatMessage::system(system.clone()));
            }
            messages.push(ChatMessage::user(text.to_string()));
            Prompt::Chat(messages)
        } else {
            Prompt::Text(text.to_string())
        };
        let params = GenerationParams {
            sampling: opts.sampling.clone(),
            max_tokens: Some(opts.max_tokens),
            ..Default::default()
        };
        InferenceRequest::new(prompt, params)
    };
    match opts.prompts {
        Prompts::One(_) => {
            let streamed = stream_to_stdout(&engine, request(&prompts[0]))?;
            eprintln!("{}", speeds("generation", streamed.usage, streamed.started, streamed.first_token_at));
        }
        Prompts::File(_) => {
            let started = Instant::now();
            let replies =
                weft::rt::block_on(futures::future::join_all(prompts.iter().map(|p| engine.infer(request(p)))));
            let mut usage = Usage::default();
            let mut out = std::io::stdout().lock();
            for (prompt, reply) in prompts.iter().zip(replies) {
                let reply = reply?;
                usage.prompt_tokens += reply.usage.prompt_tokens;
                usage.completion_tokens += reply.usage.completion_tokens;
                let line = serde_json::json!({
                    "prompt": prompt,
                    "text": reply.text,
                    "finish_reason": reply.finish_reason.as_str(),
                    "prompt_tokens": reply.usage.prompt_tokens,
                    "completion_tokens": reply.usage.completion_tokens,
                });
                let _ = writeln!(out, "{line}");
            }
            let seconds = started.elapsed().as_secs_f64();
            eprintln!(
                "{} prompts: {} prompt and {} generated tokens in {seconds:.2} s ({:.1} tokens/s)",
                prompts.len(),
                usage.prompt_tokens,
                usage.completion_tokens,
                (usage.prompt_tokens + usage.completion_tokens) as f64 / seconds.max(1e-9)
            );
        }
    }
    if let Some(summary) = opts.speculation.summary(&engine.metrics()) {
        eprintln!("{summary}");
    }
    Ok(())
}

/// One request's streamed reply: its text, usage and timing.
pub struct Streamed {
    pub text: String,
    pub usage: Usage,
    pub started: Instant,
    pub first_token_at: Option<Instant>,
}

/// Run `request`, writing its text to stdout as it streams and a newline at the end.
pub fn stream_to_stdout(engine: &ContinuousBatchEngine, request: InferenceRequest) -> Result<Streamed> {
    let stdout = std::io::stdout();
    let mut streamed =
        Streamed { text: String::new(), usage: Usage::default(), started: Instant::now(), first_token_at: None };
    weft::rt::block_on(async {
        let mut stream = Box::pin(engine.infer_stream(request)?);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            streamed.first_token_at.get_or_insert_with(Instant::now);
            streamed.text.push_str(&chunk.text);
            let mut out = stdout.lock();
            let _ = out.write_all(chunk.text.as_bytes());
            let _ = out.flush();
            if let Some(usage) = chunk.usage {
                streamed.usage = usage;
            }
        }
        Ok::<(), WeftError>(())
    })?;
    let mut out = stdout.lock();
    let _ = out.write_all(b"\n");
    let _ = out.flush();
    Ok(streamed)
}

/// "prompt: … tokens/s; <what>: … tokens/s" for one request that started at `started` and got
/// its first token at `first_token_at`: prefill speed up to the first token, decode after it.
pub fn speeds(what: &str, usage: Usage, started: Instant, first_token_at: Option<Instant>) -> String {
    let first = first_token_at.unwrap_or_else(Instant::now);
    let prefill_seconds = (first - started).as_secs_f64();
    let decode_seconds = first.elapsed().as_secs_f64();
    format!(
        "prompt: {} tokens in {:.2} s ({:.1} tokens/s); {what}: {} tokens in {:.2} s ({:.2} tokens/s)",
        usage.prompt_tokens,
        prefill_seconds,
        usage.prompt_tokens as f64 / prefill_seconds.max(1e-9),
        usage.completion_tokens,
        decode_seconds,
        usage.completion_tokens.saturating_sub(1) as f64 / decode_seconds.max(1e-9),
    )
}
