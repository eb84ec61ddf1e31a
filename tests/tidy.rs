//! Tidy rules that keep the tree consistent, run by plain `cargo test`: every Rust file opens
//! with a `//!` doc line, no source line ends in whitespace, the portable-code boundaries hold
//! (`cfg(target_arch)` and blocking polls only in `src/gpu/` and `src/rt.rs`), and the layering
//! holds: the engine, KV bookkeeping, host-side sampling and the tokenizer never reach the GPU,
//! and the library never reaches the binaries built on it.

use std::path::{Path, PathBuf};

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | "models" | "node_modules" | "dist" | ".git" | "fixtures") {
                files(&path, ext, out);
            }
        } else if name.ends_with(ext) {
            out.push(path);
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_rust_file_opens_with_a_module_doc() {
    let mut rs = Vec::new();
    for dir in ["src", "native", "web", "xtask", "tests", "benches"] {
        files(&root().join(dir), ".rs", &mut rs);
    }
    assert!(rs.len() > 40);
    for path in rs {
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("//!"), "{} does not start with a //! line", path.display());
    }
}

#[test]
fn no_line_ends_in_whitespace() {
    let mut all = Vec::new();
    for (dir, ext) in [
        ("src", ".rs"),
        ("shaders", ".wgsl"),
        ("native", ".rs"),
        ("xtask", ".rs"),
        ("tests", ".rs"),
        ("benches", ".rs"),
    ] {
        files(&root().join(dir), ext, &mut all);
    }
    for path in all {
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            assert!(!line.ends_with(' ') && !line.ends_with('\t'), "{}:{} ends in whitespace", path.display(), i + 1);
        }
    }
}

#[test]
fn platform_code_stays_in_gpu_and_rt() {
    let mut rs = Vec::new();
    files(&root().join("src"), ".rs", &mut rs);
    for path in rs {
        let rel = path.strip_prefix(root()).unwrap().to_string_lossy().replace('\\', "/");
        let text = std::fs::read_to_string(&path).unwrap();
        let code: String = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
        if !(rel.starts_with("src/gpu/") || rel == "src/rt.rs") {
            assert!(!code.contains("target_arch"), "{rel}: cfg(target_arch) belongs in src/gpu/ or src/rt.rs");
            assert!(!code.contains("PollType"), "{rel}: blocking polls belong in src/gpu/");
        }
    }
}

/// Every path a file's code names, `use` lines and paths in expressions alike: each run of
/// identifiers joined by `::` (comments and string literals removed first).
fn paths_named(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        // Drop string literals, so messages and doc strings may name anything.
        let mut plain = String::new();
        let mut in_string = false;
        let mut prev = ' ';
        for c in code.chars() {
            if c == '"' && prev != '\\' {
                in_string = !in_string;
            } else if !in_string {
                plain.push(c);
            }
            prev = c;
        }
        // `use a::{b, c::d}` names a::b and a::c::d: expand one level of braces.
        let expanded = match (plain.find("::{"), plain.rfind('}')) {
            (Some(open), Some(close)) if close > open => {
                let (head, inner) = (&plain[..open], &plain[open + 3..close]);
                let root = head.rsplit(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).next().unwrap_or("");
                inner.split(',').map(|item| format!("{root}::{}", item.trim())).collect::<Vec<_>>().join(" ")
                    + " "
                    + &plain
            }
            _ => plain.clone(),
        };
        for token in expanded.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
            if token.contains("::") || token == "wgpu" {
                out.push((number + 1, token.trim_matches(':').to_string()));
            }
        }
    }
    out
}

/// The layering, as imports: `(directory, forbidden path prefixes, why)`.
const LAYERS: &[(&str, &[&str], &str)] = &[
    (
        "src/engine",
        &["crate::gpu", "wgpu", "crate::model", "crate::builder"],
        "the engine sees a step::ModelExecutor and plain data, never the GPU or a model",
    ),
    ("src/kv", &["crate::gpu", "wgpu", "crate::model", "crate::engine"], "KV bookkeeping is plain data"),
    (
        "src/sampling",
        &["crate::gpu", "wgpu", "crate::model", "crate::engine"],
        "host-side sampling is plain data; its GPU half is model::sampler",
    ),
    ("src/tokenizer", &["crate::gpu", "wgpu", "crate::engine", "crate::model::arch"], "the tokenizer is host-side"),
    (
        "src/constraint",
        &["crate::gpu", "wgpu", "crate::model", "crate::engine", "crate::openai"],
        "structured output is host-side plain data: the GPU sees only its masks",
    ),
    ("src/step.rs", &["crate::gpu", "wgpu", "crate::model", "crate::engine"], "the step contract is plain data"),
    ("src", &["weft_native", "weft_web", "axum", "tokio", "wasm_bindgen"], "the library never uses its doors"),
];

/// Where `rel` breaks the layering, as messages.
fn layering_violations(rel: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (dir, forbidden, why) in LAYERS {
        if !(rel == *dir || rel.starts_with(&format!("{dir}/"))) {
            continue;
        }
        for (line, path) in paths_named(text) {
            // The tokenizer reads GGUF metadata, which is plain data.
            let allowed = path.starts_with("crate::model::gguf");
            if let Some(bad) = forbidden.iter().find(|f| path == **f || path.starts_with(&format!("{f}::"))) {
                if !(allowed && bad.starts_with("crate::model")) {
                    out.push(format!("{rel}:{line}: uses {path}: {why}"));
                }
            }
        }
    }
    out
}

#[test]
fn the_layering_holds() {
    let mut rs = Vec::new();
    files(&root().join("src"), ".rs", &mut rs);
    let mut violations = Vec::new();
    for path in rs {
        let rel = path.strip_prefix(root()).unwrap().to_string_lossy().replace('\\', "/");
        violations.extend(layering_violations(&rel, &std::fs::read_to_string(&path).unwrap()));
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_layering_check_sees_imports_in_every_form() {
    let bad = |rel: &str, code: &str| layering_violations(rel, code);
    assert_eq!(bad("src/engine/x.rs", "use crate::gpu::GpuTensor;").len(), 1);
    assert_eq!(bad("src/engine/x.rs", "use crate::{gpu::GpuTensor, step::StepBatch};").len(), 1);
    assert_eq!(bad("src/kv/x.rs", "let d = wgpu::Device::default();").len(), 1);
    assert_eq!(bad("src/sampling/mod.rs", "    crate::model::sampler::read(&b, &w)").len(), 1);
    assert_eq!(bad("src/model/x.rs", "use weft_native::serve;").len(), 1);
    assert!(bad("src/engine/x.rs", "// crate::gpu is not used here").is_empty());
    assert!(bad("src/engine/x.rs", "let m = \"crate::gpu\";").is_empty());
    assert!(bad("src/tokenizer/gguf.rs", "use crate::model::gguf::Metadata;").is_empty());
    assert!(bad("src/model/executor.rs", "use crate::gpu::GpuTensor;").is_empty());
}
