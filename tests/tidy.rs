//! Tidy rules that keep the tree consistent, run by plain `cargo test`: every Rust file opens
//! with a `//!` doc line, no source line ends in whitespace, the portable-code boundaries hold
//! (`cfg(target_arch)` and blocking polls only in `src/gpu/` and `src/rt.rs`; `wgpu` never in
//! the scheduler or the KV manager).

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
        if rel == "src/engine/scheduler.rs" || rel.starts_with("src/kv/manager") {
            assert!(!code.contains("wgpu"), "{rel} must stay pure logic");
        }
    }
}
