//! Write a random-weight model of a realistic shape as a GGUF file (`weft::model::synthetic_ssm`):
//! Mamba2 130M/370M, the Granite-4.0-H-1B hybrid or SmolLM2-135M's Llama shape, for benchmarks
//! on real sizes without downloading weights (`cargo xtask make-model`).
//!
//! ```sh
//! cargo run --release --example make_ssm_model -- --shape mamba2-370m [--dtype q8_0|q4_0|f32] --out mamba2-370m.gguf
//! ```

use weft::DType;
use weft::model::synthetic_ssm::{SHAPES, gguf_bytes};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() -> std::process::ExitCode {
    let (Some(shape), Some(out)) = (arg("--shape"), arg("--out")) else {
        eprintln!("usage: make_model --shape {} [--dtype q8_0|q4_0|f32] --out FILE", SHAPES.join("|"));
        return std::process::ExitCode::FAILURE;
    };
    let dtype = match arg("--dtype").as_deref() {
        None | Some("q8_0") => DType::Q8_0,
        Some("q4_0") => DType::Q4_0,
        Some("f32") => DType::F32,
        Some(other) => {
            eprintln!("make_model: unknown --dtype {other:?} (q8_0, q4_0, f32)");
            return std::process::ExitCode::FAILURE;
        }
    };
    match gguf_bytes(&shape, dtype).map(|bytes| std::fs::write(&out, bytes)) {
        Ok(Ok(())) => std::process::ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("make_model: cannot write {out}: {e}");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("make_model: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
