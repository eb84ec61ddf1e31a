//! Write a random-weight GGUF with a real checkpoint's shape (see `weft::model::synthetic`), for
//! benchmarking big models without downloading them. `cargo xtask make-model` runs it.
//!
//! ```sh
//! cargo run --release --example make_model -- --shape llama-3.1-8b --quant q4_1 \
//!     --tokenizer-from models/SmolLM2-135M-Instruct.Q4_1.gguf --out models/synthetic/llama-3.1-8b.q4_1.gguf
//! ```
//!
//! `--tokenizer-only` writes just the source's vocabulary (`tokenizer.*` metadata, no tensors):
//! a 2 MB file from which the device check's packed folder makes its models on the spot.

use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use weft::model::gguf::{GgufFile, GgufWriter};
use weft::model::synthetic::{shape, weight_format, write_gguf};

const USAGE: &str =
    "usage: make_model --shape NAME --quant q4_1|q8_0|f16|... --tokenizer-from FILE.gguf --out FILE.gguf [--seed N]
       make_model --tokenizer-only --tokenizer-from FILE.gguf --out FILE.gguf";

/// The weights' seed unless `--seed` says otherwise: the same command writes the same file.
const DEFAULT_SEED: u64 = 11;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("make_model: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (mut shape_name, mut quant, mut tokenizer_from, mut out, mut seed) = (None, None, None, None, DEFAULT_SEED);
    let mut tokenizer_only = false;
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"));
        match flag.as_str() {
            "--shape" => shape_name = Some(value()?),
            "--quant" => quant = Some(value()?),
            "--tokenizer-from" => tokenizer_from = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--seed" => seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--tokenizer-only" => tokenizer_only = true,
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let missing = |what: &str| format!("{what} is required\n{USAGE}");
    if tokenizer_only {
        let from = tokenizer_from.ok_or_else(|| missing("--tokenizer-from"))?;
        return write_tokenizer_only(&from, &out.ok_or_else(|| missing("--out"))?);
    }
    let shape = shape(&shape_name.ok_or_else(|| missing("--shape"))?).map_err(|e| e.to_string())?;
    let dtype = weight_format(&quant.ok_or_else(|| missing("--quant"))?).map_err(|e| e.to_string())?;
    let tokenizer_from = tokenizer_from.ok_or_else(|| missing("--tokenizer-from"))?;
    let out = out.ok_or_else(|| missing("--out"))?;

    let source = GgufFile::open(&tokenizer_from).map_err(|e| e.to_string())?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    // Written under another name and renamed at the end, so a file at `out` is always whole.
    let partial = out.with_extension("gguf.part");
    let file = std::fs::File::create(&partial).map_err(|e| format!("creating {}: {e}", partial.display()))?;
    let total = shape.data_bytes(dtype).map_err(|e| e.to_string())?;
    eprintln!(
        "make_model: {} ({:.2}B parameters) in {dtype}: {:.2} GB of tensor data, vocabulary of {} padded to {}",
        shape.name,
        shape.num_params() as f64 / 1e9,
        total as f64 / 1e9,
        tokenizer_from.display(),
        shape.vocab_size
    );
    let started = Instant::now();
    let mut last_shown = 0u64;
    let mut progress = |done: u64, total: u64| {
        // About every 5% of the file.
        if done == total || done - last_shown >= total / 20 {
            last_shown = done;
            eprint!("\rmake_model: {:5.1}%", 100.0 * done as f64 / total.max(1) as f64);
        }
    };
    let result =
        write_gguf(&shape, dtype, &source.metadata, seed, BufWriter::with_capacity(1 << 22, file), &mut progress);
    eprintln!();
    let written = match result {
        Ok(bytes) => bytes,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e.to_string());
        }
    };
    std::fs::rename(&partial, &out).map_err(|e| format!("renaming {} to {}: {e}", partial.display(), out.display()))?;
    eprintln!(
        "make_model: wrote {} ({:.2} GB) in {:.0} s",
        out.display(),
        written as f64 / 1e9,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The `tokenizer.*` metadata of `from` alone, as a GGUF without tensors.
fn write_tokenizer_only(from: &std::path::Path, out: &std::path::Path) -> Result<(), String> {
    let source = GgufFile::open(from).map_err(|e| e.to_string())?;
    let mut writer = GgufWriter::new();
    let entries: Vec<_> = source.metadata.iter().filter(|(k, _)| k.starts_with("tokenizer.")).collect();
    if entries.is_empty() {
        return Err(format!("{} has no tokenizer.* metadata to copy", from.display()));
    }
    for (key, value) in entries {
        writer.metadata(key, value.clone());
    }
    std::fs::write(out, writer.to_bytes()).map_err(|e| format!("writing {}: {e}", out.display()))?;
    eprintln!("make_model: wrote the vocabulary of {} to {}", from.display(), out.display());
    Ok(())
}
