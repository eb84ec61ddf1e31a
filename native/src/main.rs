//! The `weft` command-line tool: `weft generate` streams a completion; `weft chat` holds a
//! conversation in the terminal; `weft serve` is an OpenAI-compatible server; `weft bench`
//! measures throughput and latency; `weft info` lists the architectures and tensor types weft
//! runs, then is a GPU self-check that prints the adapter, its features and limits and runs one
//! kernel (`weft info --model PATH` describes a model);
//! `weft pull hf:OWNER/REPO[:QUANT]` downloads a model from the Hugging Face hub, which every
//! `--model` also accepts.

use std::process::ExitCode;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod bench;
mod chat;
mod generate;
mod hub;
mod info;
mod metrics;
mod progress;
mod serve;

#[derive(Parser)]
#[command(name = "weft", version, about = "Continuous-batching LLM inference on WGSL compute shaders")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the architectures and tensor types weft runs, open the GPU, print the adapter, its
    /// features, limits and memory (and the default model's KV cache there, where it is
    /// present), and run a kernel self-check; or, with --model, describe a model and say
    /// whether weft can run it (and if not, everything it lacks).
    Info {
        /// Use only core WebGPU features (what every browser offers), as a web page would.
        #[arg(long)]
        baseline: bool,
        /// Describe this model (a .gguf file, a Hugging Face directory or hf:OWNER/REPO[:QUANT])
        /// instead, from its headers alone (nothing loaded): architecture, size, tensor types, tokenizer,
        /// and every reason weft would refuse it; then, where a GPU opens, how many KV-cache tokens
        /// `weft serve` would get there. Exits with an error when weft cannot run it.
        #[arg(long, conflicts_with = "baseline")]
        model: Option<PathBuf>,
        /// The fraction of the GPU's memory the KV-cache line assumes in use in all (as `weft serve`).
        #[arg(long, default_value_t = weft::gpu::DEFAULT_GPU_MEMORY_UTILIZATION, value_parser = serve::parse_utilization)]
        gpu_memory_utilization: f64,
        /// What the KV cache holds in the KV-cache line: f32 or f16 [default: f16 where the GPU
        /// has shader-f16, else f32]
        #[arg(long, value_parser = serve::parse_kv_dtype)]
        kv_cache_dtype: Option<weft::DType>,
        /// The max_model_len the KV-cache line checks (with --model).
        #[arg(long, default_value_t = 4096)]
        max_model_len: usize,
    },
    /// Generate a completion of a prompt, streaming the text to stdout (speeds go to stderr); or
    /// of every line of a --prompts-file as one batch, a JSON line each.
    Generate {
        /// A .gguf file, a Hugging Face model directory, or hf:OWNER/REPO[:QUANT] (a GGUF file
        /// from the Hugging Face hub, see `weft pull`) [default: the model `cargo xtask
        /// fetch-model` puts at models/SmolLM2-135M-Instruct.Q4_1.gguf]
        #[arg(long)]
        model: Option<PathBuf>,
        /// The prompt text.
        #[arg(long, required_unless_present = "prompts_file", conflicts_with = "prompts_file")]
        prompt: Option<String>,
        /// Complete every non-empty line of this file ("-": stdin) as concurrent requests that
        /// share the engine's steps, and print one JSON line per prompt, in the file's order:
        /// {"prompt", "text", "finish_reason", "prompt_tokens", "completion_tokens"}.
        #[arg(long)]
        prompts_file: Option<PathBuf>,
        /// Wrap the prompt as a user message in the model's chat template.
        #[arg(long)]
        chat: bool,
        /// A system message to put before the prompt (with --chat).
        #[arg(long, requires = "chat")]
        system: Option<String>,
        /// Stop after this many generated tokens (or at the end-of-sequence token).
        #[arg(long, default_value_t = 256)]
        max_tokens: usize,
        /// The longest sequence (prompt and reply) the KV cache must hold, as `weft serve`'s flag
        /// [default: 4096]
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_model_len: Option<u32>,
        #[command(flatten)]
        kv: KvCacheArgs,
        #[command(flatten)]
        sampling: SamplingArgs,
        #[command(flatten)]
        spec: SpecArgs,
    },
    /// Chat with the model in the terminal, streaming each reply; the conversation is kept.
    ///
    /// Each line read from stdin is a user message (stdin may be a pipe). `/reset` forgets the
    /// conversation but keeps the --system message; `/exit` or the end of stdin quits. Speeds of
    /// each reply go to stderr.
    Chat {
        /// A .gguf file, a Hugging Face model directory, or hf:OWNER/REPO[:QUANT] (it must have
        /// a chat template) [default: the model `cargo xtask fetch-model` puts at
        /// models/SmolLM2-135M-Instruct.Q4_1.gguf]
        #[arg(long)]
        model: Option<PathBuf>,
        /// A system message to start the conversation with (kept across /reset).
        #[arg(long)]
        system: Option<String>,
        /// Stop each reply after this many tokens (or at the end-of-sequence token).
        #[arg(long, default_value_t = 512)]
        max_tokens: usize,
        /// The longest conversation (every turn and reply) the KV cache must hold, as `weft
        /// serve`'s flag [default: 4096]
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        max_model_len: Option<u32>,
        #[command(flatten)]
        kv: KvCacheArgs,
        #[command(flatten)]
        sampling: SamplingArgs,
    },
    /// Measure throughput and latency at several concurrency levels, in-process or against a
    /// running `weft serve`.
    ///
    /// At each level, that many clients each send one request at once: a prompt of about
    /// --prompt-len tokens, greedy, generating exactly --gen-len tokens (end-of-sequence
    /// ignored). Reported per level: prefill tokens/s (all prompt tokens over the time until the
    /// last first token), decode tokens/s (tokens after each request's first, over the time from
    /// the first first token to the end), aggregate tokens/s (all generated tokens over the
    /// level's wall time), and time-to-first-token (TTFT) and inter-token latency (ITL)
    /// p50/p90/p99 in ms.
    Bench {
        /// Run in-process on this .gguf file, Hugging Face model directory or
        /// hf:OWNER/REPO[:QUANT] [default: the model `cargo xtask fetch-model` puts at
        /// models/SmolLM2-135M-Instruct.Q4_1.gguf]
        #[arg(long, conflicts_with = "url")]
        model: Option<PathBuf>,
        /// Benchmark a running `weft serve` (or other OpenAI-compatible server) at this http://
        /// URL instead, e.g. http://127.0.0.1:8000, through streaming /v1/completions with text
        /// prompts of random words (prompt tokens are counted from the server's usage).
        #[arg(long)]
        url: Option<String>,
        /// Send `Authorization: Bearer KEY` (with --url) [default: none]
        #[arg(long, requires = "url", env = "WEFT_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Concurrency levels to run, comma-separated; each level sends that many requests at once
        /// (in-process, the engine's max_num_seqs is the largest level).
        #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
        concurrency: Vec<usize>,
        /// Prompt lengths in tokens, comma-separated (with --url, about this many words).
        #[arg(long, value_delimiter = ',', default_value = "128")]
        prompt_len: Vec<usize>,
        /// Tokens to generate per request.
        #[arg(long, default_value_t = 128)]
        gen_len: usize,
        /// GPU memory for the KV cache in-process, e.g. 512MiB or 1GiB [default: room for
        /// every request of the largest level at once, so nothing is preempted, and for one
        /// sequence of max_model_len]
        #[arg(long, value_parser = serve::parse_size, conflicts_with = "url")]
        kv_memory: Option<usize>,
        /// What the KV cache holds in-process: f32, or f16 (half the memory per token; keys
        /// and values rounded to halves) [default: f16 where the GPU has shader-f16, else f32]
        #[arg(long, value_parser = serve::parse_kv_dtype, conflicts_with = "url")]
        kv_cache_dtype: Option<weft::DType>,
        /// Run each configuration this many times and report medians.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Print one JSON object ({adapter, model, repeats, runs: [...]}) instead of a table.
        #[arg(long)]
        json: bool,
        /// Also time every kernel of a few decode steps on the GPU (timestamp queries) and split
        /// the host's time per step into scheduling, recording, encoding and submission.
        #[arg(long, conflicts_with = "url")]
        profile: bool,
        /// The prompts (in-process): `random` token ids, `copy` (a chat request to repeat a
        /// numbered list of about --prompt-len tokens: prompt lookup's best case) or `chat`
        /// (ordinary questions in the chat template).
        #[arg(long, value_enum, default_value_t = bench::Task::Random, conflicts_with = "url")]
        task: bench::Task,
        /// With `--task random`: the requests of a run begin with the same N tokens, new to
        /// the run (a system prompt a burst of requests shares), and the prefix cache is on, so
        /// the engine can compute them once. 0 (the default): every prompt differs, no cache.
        #[arg(long, default_value_t = 0, conflicts_with = "url")]
        shared_prefix: usize,
        /// Send each run's requests this many per second, evenly spaced, instead of all at once
        /// (in-process): requests then arrive while the engine is busy with earlier ones.
        #[arg(long, conflicts_with = "url")]
        request_rate: Option<f64>,
        #[command(flatten)]
        spec: SpecArgs,
        /// Fraction (0 to 1) of each run's requests to generate under a JSON schema (structured
        /// output), to measure what token masks cost.
        #[arg(long, default_value_t = 0.0)]
        constrained: f64,
        /// Sampling temperature of every request; 0 (the default) is greedy. With --top-k and
        /// --top-p, measures what sampling costs (e.g. llama.cpp's defaults: --temperature 0.8
        /// --top-k 40 --top-p 0.95); each request is seeded, so runs repeat.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Keep only the k most likely tokens when sampling (0 = off).
        #[arg(long, default_value_t = 0)]
        top_k: u32,
        /// Nucleus sampling: keep the most likely tokens holding this much probability (1 = off).
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        /// Run on a fake discrete GPU (wgpu's no-op backend, the subgroup kernel family) whose
        /// work takes no time, and print where each decode step's host time goes (schedule,
        /// record, encode, submit, wait, output) and the submissions per step: the host's cost
        /// at GPU speed. Every generated token is id 0 there.
        #[arg(long, conflicts_with = "url")]
        host_only: bool,
        /// Also measure the adapter's memory bandwidth (buffer copies, reads and writes
        /// counted) and report it with the weight bytes a decode step reads, the two figures
        /// of a decode's bandwidth bound.
        #[arg(long, conflicts_with_all = ["url", "host_only"])]
        bandwidth: bool,
    },
    /// Serve an OpenAI-compatible HTTP API: /v1/chat/completions, /v1/completions, /v1/models,
    /// /tokenize and /detokenize (vLLM's), /health (liveness), /ready (readiness) and /metrics
    /// (Prometheus text, weft's names and vLLM's).
    ///
    /// A request without max_tokens gets the rest of the context, at most 256 tokens.
    /// temperature defaults to 1.0 (as OpenAI's). Requests are refused with 503 and Retry-After
    /// while 4 x --max-num-seqs requests already wait. Bodies over 4 MiB get 413.
    ///
    /// SIGTERM or SIGINT drains: /ready turns 503, new requests get 503 with Retry-After, the
    /// requests in flight finish (those still running after --drain-timeout are cancelled with
    /// finish_reason "abort"), then the process exits 0. A second signal exits at once.
    Serve {
        /// A .gguf file, a Hugging Face model directory, or hf:OWNER/REPO[:QUANT] (a GGUF file
        /// from the Hugging Face hub, see `weft pull`) [default: the model `cargo xtask
        /// fetch-model` puts at models/SmolLM2-135M-Instruct.Q4_1.gguf]
        #[arg(long)]
        model: Option<PathBuf>,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Port to listen on (0 picks a free one; the address is printed on stderr).
        #[arg(long, default_value_t = 8000)]
        port: u16,
        /// Require `Authorization: Bearer KEY` on /v1/*, /tokenize and /detokenize (/health, /ready
        /// and /metrics stay open) [default: none]
        #[arg(long, env = "WEFT_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Sequences in one engine step at most.
        #[arg(long, default_value_t = 64)]
        max_num_seqs: usize,
        /// Tokens (prefill chunks plus decodes) in one engine step at most.
        #[arg(long, default_value_t = 512)]
        max_num_batched_tokens: usize,
        /// Longest prompt plus generation (clamped to the model's context). The server refuses
        /// to start when the KV cache cannot hold one sequence this long.
        #[arg(long, default_value_t = 4096)]
        max_model_len: usize,
        #[command(flatten)]
        kv: KvCacheArgs,
        /// Keep full KV blocks of finished requests to reuse for shared prompt prefixes.
        #[arg(long)]
        enable_prefix_cache: bool,
        /// The model's name in requests, responses and the metrics' model_name label [default:
        /// the model file's name without its extension]
        #[arg(long)]
        served_model_name: Option<String>,
        /// Seconds the requests in flight may take to finish after SIGTERM or SIGINT before they
        /// are cancelled.
        #[arg(long, default_value = "30", value_parser = serve::parse_seconds)]
        drain_timeout: std::time::Duration,
        /// Render chat prompts with this Jinja chat template file instead of the model's own
        /// (read and checked at start).
        #[arg(long, value_name = "FILE")]
        chat_template: Option<PathBuf>,
        /// Let web pages from ORIGIN (e.g. http://localhost:5173; repeat for several, or `*`
        /// for any) call the server: answers CORS preflight requests and adds
        /// Access-Control-Allow-Origin [default: none, no CORS headers]
        #[arg(long, value_name = "ORIGIN", value_parser = serve::parse_origin)]
        cors_origin: Vec<String>,
        /// Separate a thinking model's reasoning from its answer (`reasoning_content`) with
        /// vLLM's parser NAME (qwen3, deepseek_r1), or `none` to leave it in the content
        /// [default: chosen from the model's chat template and vocabulary]
        #[arg(long, value_name = "NAME", value_parser = serve::parse_reasoning_parser)]
        reasoning_parser: Option<String>,
        /// Serve /v1/embeddings by pooling KIND (`last`: the last token's final hidden state,
        /// as Qwen3-Embedding is used; for encoders such as bge also `cls`, the first token's,
        /// and `mean`, all tokens' mean) even when the model's file names no pooling or
        /// another [default: the file's `pooling_type`; none: the model serves no embeddings]
        #[arg(long, value_name = "KIND", value_parser = serve::parse_pooling)]
        pooling: Option<weft::model::config::Pooling>,
        #[command(flatten)]
        spec: SpecArgs,
        /// Serve PEFT LoRA adapters (adapter_config.json + adapter_model.safetensors in PATH) as
        /// NAME: a request whose model is NAME runs with that adapter, beside requests for the
        /// base model and for other adapters in the same steps; /v1/models lists them
        #[arg(long, value_name = "NAME=PATH", num_args = 1.., value_parser = serve::parse_lora_module)]
        lora_modules: Vec<(String, PathBuf)>,
        /// Adapters resident on the GPU at once, hence distinct adapters in one step; others are
        /// loaded on demand in place of the least recently used idle one [default: 1 where
        /// adapters are served]
        #[arg(long)]
        max_loras: Option<usize>,
        /// The highest adapter rank served; an adapter of a higher rank is refused [default: 16
        /// where adapters are served]
        #[arg(long)]
        max_lora_rank: Option<usize>,
        /// Answer vLLM's POST /v1/load_lora_adapter ({"lora_name", "lora_path"}) and
        /// /v1/unload_lora_adapter ({"lora_name"}), which change the adapters served while
        /// running (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING) [default: off, both 404]
        #[arg(long, env = "WEFT_ALLOW_RUNTIME_LORA_UPDATING")]
        allow_runtime_lora_updating: bool,
    },
    /// Download a model from the Hugging Face hub into its local cache and print the file's
    /// path; every --model takes the same name and downloads on first use.
    ///
    /// The cache is the one the `huggingface_hub` Python package keeps ($HF_HUB_CACHE, else
    /// $HF_HOME/hub, else ~/.cache/huggingface/hub), so what either fetched is not fetched
    /// again. An interrupted download resumes; a file whose size or sha256 differs from the
    /// hub's is discarded. HF_ENDPOINT names a mirror, HF_TOKEN a token for private or gated
    /// repositories (else the one `huggingface-cli login` saved), and HF_HUB_OFFLINE=1 uses
    /// the cache alone.
    Pull {
        /// hf:OWNER/REPO[:QUANT]: the repository's GGUF file whose name contains QUANT
        /// (ignoring case), e.g. hf:bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M; without
        /// QUANT its Q4_K_M file, or else its first.
        model: String,
    },
}

/// Speculative decoding flags (`generate`, `serve`, `bench`): a draft model or prompt lookup
/// proposes tokens that the model verifies, several per step. Outputs are unchanged: greedy
/// and prompt lookup give exactly the same tokens, sampling with a draft model the same
/// distribution.
#[derive(clap::Args)]
struct SpecArgs {
    /// Draft with this smaller model (a .gguf file, Hugging Face directory or
    /// hf:OWNER/REPO[:QUANT] with the same tokenizer as --model) [default: no speculation]
    #[arg(long, conflicts_with = "spec_ngram")]
    draft_model: Option<PathBuf>,
    /// Draft by prompt lookup: the tokens that followed the latest earlier occurrence of the
    /// last 2 to 4 tokens in the prompt or output (no second model).
    #[arg(long)]
    spec_ngram: bool,
    /// Tokens drafted per sequence and step at most (adapted per sequence to its acceptance).
    #[arg(long, default_value_t = 4)]
    spec_tokens: usize,
}

impl SpecArgs {
    fn speculation(self) -> generate::Speculation {
        use weft::engine::{Drafter, SpeculationConfig};
        let config =
            |drafter| SpeculationConfig { num_speculative_tokens: self.spec_tokens, drafter, ..Default::default() };
        let drafter = match (&self.draft_model, self.spec_ngram) {
            (Some(_), _) => Some(Drafter::DraftModel),
            (None, true) => Some(Drafter::prompt_lookup()),
            (None, false) => None,
        };
        generate::Speculation { config: drafter.map(config), draft_model: self.draft_model }
    }
}

/// The KV cache flags `serve`, `generate` and `chat` share.
#[derive(clap::Args)]
struct KvCacheArgs {
    /// The fraction of the GPU's memory to use in all, as vLLM's flag: the KV cache gets it
    /// less the weights and a step's workspace. On the GPU's reported memory (Vulkan), or
    /// where none is reported (Metal, DX12) its largest buffer, then holding at most
    /// --max-num-seqs sequences of --max-model-len; on a CPU driver (lavapipe) at most 256 MiB,
    /// or one sequence of --max-model-len where that is more.
    #[arg(long, default_value_t = weft::gpu::DEFAULT_GPU_MEMORY_UTILIZATION, value_parser = serve::parse_utilization)]
    gpu_memory_utilization: f64,
    /// GPU memory for the KV cache, e.g. 256MiB or 1GiB, instead of what
    /// --gpu-memory-utilization leaves it.
    #[arg(long, value_parser = serve::parse_size)]
    kv_memory: Option<usize>,
    /// What the KV cache holds: f32, or f16 (half the memory per token, so twice the tokens;
    /// keys and values are rounded to halves, as llama.cpp's default cache does, which moves
    /// logits by about 1e-3) [default: f16 where the GPU has shader-f16, else f32]
    #[arg(long, value_parser = serve::parse_kv_dtype)]
    kv_cache_dtype: Option<weft::DType>,
}

impl KvCacheArgs {
    fn options(&self, max_model_len: Option<u32>) -> generate::KvOptions {
        generate::KvOptions {
            kv_memory_bytes: self.kv_memory,
            gpu_memory_utilization: self.gpu_memory_utilization,
            kv_cache_dtype: self.kv_cache_dtype,
            max_model_len: max_model_len.map(|n| n as usize),
        }
    }
}

/// The sampling flags `generate` and `chat` share.
#[derive(clap::Args)]
struct SamplingArgs {
    /// Sampling temperature; 0 means greedy (always the most likely token).
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens holding this much probability (1 = off).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    top_k: u32,
    /// Seed of the random draws, for reproducible sampling [default: from the clock]
    #[arg(long)]
    seed: Option<u64>,
}

/// On an x86-64 CPU with AVX-512, ask lavapipe (Mesa's Vulkan driver on the CPU) for 512-bit
/// vectors unless LP_NATIVE_VECTOR_WIDTH says otherwise: its default is 256 bits, and weft's
/// matmuls run 1.3-1.9x faster 16 lanes wide (bench/README.md); GPUs ignore the variable.
/// lavapipe reads it once, when it loads, so it is set first thing, while this is the only
/// thread. `cargo xtask` sets the same for the tests and benchmarks it runs.
fn wide_cpu_vectors() {
    #[cfg(target_arch = "x86_64")]
    if std::env::var_os("LP_NATIVE_VECTOR_WIDTH").is_none() && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: no other thread exists yet, so nothing reads the environment meanwhile.
        unsafe { std::env::set_var("LP_NATIVE_VECTOR_WIDTH", "512") };
    }
}

impl SamplingArgs {
    fn params(&self) -> weft::sampling::SamplingParams {
        let (temperature, top_p, top_k, seed) = (self.temperature, self.top_p, self.top_k, self.seed);
        weft::sampling::SamplingParams { temperature, top_k, top_p, seed, ..Default::default() }
    }
}

fn main() -> ExitCode {
    wide_cpu_vectors();
    tracing_subscriber::fmt()
        .with_env_filter(
            // weft's own progress lines (loading a model) show by default; everything else from warn.
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn,weft=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match Cli::parse().command {
        Command::Info { baseline, model, gpu_memory_utilization, kv_cache_dtype, max_model_len } => {
            let kv = info::KvLine { gpu_memory_utilization, kv_cache_dtype, max_model_len };
            match model {
                Some(path) => info::model(path, &kv),
                None => info::run(baseline, &kv),
            }
        }
        Command::Generate {
            model,
            prompt,
            prompts_file,
            chat,
            system,
            max_tokens,
            max_model_len,
            kv,
            sampling,
            spec,
        } => generate::Prompts::from_flags(prompt, prompts_file).and_then(|prompts| {
            generate::run(generate::Options {
                model,
                prompts,
                chat,
                system,
                max_tokens,
                kv: kv.options(max_model_len),
                sampling: sampling.params(),
                speculation: spec.speculation(),
            })
        }),
        Command::Chat { model, system, max_tokens, max_model_len, kv, sampling } => chat::run(chat::Options {
            model,
            system,
            max_tokens,
            kv: kv.options(max_model_len),
            sampling: sampling.params(),
        }),
        Command::Bench {
            model,
            url,
            api_key,
            concurrency,
            prompt_len,
            gen_len,
            kv_memory,
            kv_cache_dtype,
            repeats,
            json,
            profile,
            task,
            shared_prefix,
            request_rate,
            spec,
            constrained,
            temperature,
            top_k,
            top_p,
            host_only,
            bandwidth,
        } => bench::run(bench::Options {
            model,
            url,
            api_key,
            concurrency,
            prompt_len,
            gen_len,
            repeats,
            kv_memory_bytes: kv_memory,
            kv_cache_dtype,
            json,
            profile,
            task,
            shared_prefix,
            request_rate,
            speculation: spec.speculation(),
            constrained,
            sampling: weft::sampling::SamplingParams { temperature, top_k, top_p, ..Default::default() },
            host_only,
            bandwidth,
        }),
        Command::Serve {
            model,
            host,
            port,
            api_key,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len,
            kv,
            enable_prefix_cache,
            served_model_name,
            drain_timeout,
            chat_template,
            cors_origin,
            reasoning_parser,
            pooling,
            spec,
            lora_modules,
            max_loras,
            max_lora_rank,
            allow_runtime_lora_updating,
        } => serve::run(serve::Options {
            model,
            host,
            port,
            api_key,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len,
            kv: kv.options(None),
            enable_prefix_cache,
            served_model_name,
            drain_timeout,
            chat_template,
            cors_origins: cors_origin,
            reasoning_parser,
            pooling,
            speculation: spec.speculation(),
            lora_modules,
            max_loras,
            max_lora_rank,
            allow_runtime_lora_updating,
        }),
        Command::Pull { model } => hub::pull(&model),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
