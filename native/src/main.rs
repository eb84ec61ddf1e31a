//! The `weft` command-line tool. For now: `weft info`, a GPU self-check that prints the adapter,
//! its features and limits, then runs one kernel and checks it against the CPU.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
