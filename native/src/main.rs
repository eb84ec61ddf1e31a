//! The `weft` command-line tool: `weft generate` streams a completion; `weft info` is a GPU
//! self-check that prints the adapter, its features and limits, then runs one kernel.

use std::process::ExitCode;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod generate;
mod info;

#[derive(Parser)]
#[command(name = "weft", version, about = "Continuous-batching LLM inference on WGSL compute shaders")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Open the GPU, print the adapter, its features and limits, and run a kernel self-check.
    Info {
        /// Use only core WebGPU features (what every browser offers), as a web page would.
        #[arg(long)]
        baseline: bool,
    },
    /// Generate a completion of a prompt, streaming the text to stdout (speeds go to stderr).
    Generate {
        /// A .gguf file or a Hugging Face model directory [default: the model `cargo xtask
        /// fetch-model` puts at models/SmolLM2-135M-Instruct.Q4_1.gguf]
        #[arg(long)]
        model: Option<PathBuf>,
        /// The prompt text.
        #[arg(long)]
        prompt: String,
        /// Wrap the prompt as a user message in the model's chat template.
        #[arg(long)]
        chat: bool,
        /// A system message to put before the prompt (with --chat).
        #[arg(long, requires = "chat")]
        system: Option<String>,
        /// Stop after this many generated tokens (or at the end-of-sequence token).
        #[arg(long, default_value_t = 256)]
        max_tokens: usize,
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
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Info { baseline } => info::run(baseline),
        Command::Generate { model, prompt, chat, system, max_tokens, temperature, top_p, top_k, seed } => {
            generate::run(generate::Options {
                model,
                prompt,
                chat,
                system,
                max_tokens,
                sampling: weft::sampling::SamplingParams { temperature, top_k, top_p, seed, ..Default::default() },
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
