//! Write weft's tiny random test model as a GGUF file: 2 layers, hidden 64, Q8_0 matrices, a
//! byte-level tokenizer and a ChatML chat template, from a fixed seed, so every run writes the
//! same bytes. The browser tests (`cargo xtask test-web`) compare the page's output on it with
//! `weft generate`'s.
//!
//! Beside it, `<name>-qwen3.gguf`: the tiny Qwen3 (`weft::model::tiny::qwen3_gguf`: `<think>`
//! and `</think>` in the vocabulary, Qwen3's real chat template), which the server tests
//! (tests/server/test_reasoning.py) separate reasoning on.
//!
//! ```sh
//! cargo run --release --example tiny_model -- target/web-test/tiny.gguf
//! ```

use weft::DType;
use weft::model::tiny::{gguf_bytes, qwen3_gguf, random_weights, tiny_config};

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
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let qwen3 = out.with_file_name(format!("{stem}-qwen3.gguf"));
    for (path, bytes) in [(&out, bytes), (&qwen3, qwen3_gguf(SEED, DTYPE))] {
        if let Err(e) = std::fs::write(path, &bytes) {
            eprintln!("tiny_model: writing {}: {e}", path.display());
            return std::process::ExitCode::FAILURE;
        }
        eprintln!("tiny_model: wrote {} ({} bytes)", path.display(), bytes.len());
    }
    std::process::ExitCode::SUCCESS
}
