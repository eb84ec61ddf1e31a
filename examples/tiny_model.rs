//! Write weft's tiny random test model as a GGUF file: 2 layers, hidden 64, Q8_0 matrices, a
//! byte-level tokenizer and a ChatML chat template, from a fixed seed, so every run writes the
//! same bytes. The browser tests (`cargo xtask test-web`) compare the page's output on it with
//! `weft generate`'s.
//!
//! ```sh
//! cargo run --release --example tiny_model -- target/web-test/tiny.gguf
//! ```

use weft::DType;
use weft::model::tiny::{gguf_bytes, random_weights, tiny_config};

/// The seed and weight format of the file. Seed 6 is picked because its greedy replies differ
/// from prompt to prompt (runs of `>`, `*`, newlines, U+FFFD from lone UTF-8 bytes), which makes
/// a browser-versus-native comparison mean something; most seeds answer only newlines.
const SEED: u64 = 6;
const DTYPE: DType = DType::Q8_0;

fn main() -> std::process::ExitCode {
    let Some(out) = std::env::args_os().nth(1) else {
        eprintln!("usage: cargo run --release --example tiny_model -- <out.gguf>");
        return std::process::ExitCode::FAILURE;
    };
    let config = tiny_config();
    let weights = random_weights(&config, SEED, DTYPE);
    let bytes = gguf_bytes(&config, &weights, DTYPE);
    let out = std::path::PathBuf::from(out);
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("tiny_model: creating {}: {e}", dir.display());
            return std::process::ExitCode::FAILURE;
        }
    }
    if let Err(e) = std::fs::write(&out, &bytes) {
        eprintln!("tiny_model: writing {}: {e}", out.display());
        return std::process::ExitCode::FAILURE;
    }
    eprintln!("tiny_model: wrote {} ({} bytes)", out.display(), bytes.len());
    std::process::ExitCode::SUCCESS
}
