//! `cargo xtask device-check`: the GPU check, packed for a machine that has a GPU and nothing
//! else. `--pack DIR` builds here, into one folder under 60 MiB, everything the check runs: the
//! release `weft`, the binaries of the correctness gate (`tests/device_gate.rs`) and of the
//! kernel tests, the kernels bench (`benches/kernels.rs`), `make_model`, the default model's vocabulary alone (2 MB) from which the Llama
//! 3.2 1B and Llama 3.1 8B shapes are written with random weights on the spot, this program,
//! and `run.sh`. There, with no cargo, no network and no toolchain, `DIR/run.sh`:
//!
//! 1. finds the Vulkan driver: `VK_ICD_FILENAMES` when set (any driver, lavapipe included),
//!    else NVIDIA's manifest wherever drivers and container images put it, else a manifest it
//!    writes for NVIDIA's library when only the library is installed;
//! 2. checks correctness first: the gate (every kernel family the adapter runs against the CPU
//!    model at the shapes' widths) and the kernel tests;
//! 3. times each GPU kernel family's row-parallel matmul (GEMV) against its tiled one (GEMM) at
//!    M = 1 to 512 on the default model's shapes (the kernels bench's `gemm`), and prints the
//!    batch size from which the GEMM wins, the row of `weft::gpu::GEMM_MIN_ROWS` to record;
//!    then times each GPU family's attention layer (the kernels bench's `attention`: decodes
//!    and prefills at head sizes 64, 128 and 512, up to 2048 positions);
//!    then times each GPU family's experts' matmul row by row against grouped by expert on
//!    a Qwen3-30B-A3B-shaped layer at 1, 16 and 128 tokens (the kernels bench's `moe`);
//! 4. benchmarks each shape in each kernel family the gate ran, at 1, 16 and 64 sequences;
//! 5. prints one table and writes it to `OUT/device-check.md`, beside each part's log and JSON.
//!
//! Every part is ended when it runs past its share of what is left of the budget (default 480
//! s for the whole run), and the table names the parts that did not finish. The run fails
//! (exit status 1) when correctness does. Without `--pack`, the folder is packed under target/
//! and run here at once (`--run` options pass through).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::bench::utc_now;
use crate::{MODEL_FILE, Result, cargo, fetch_model, root, run, target_dir};

const USAGE: &str = "cargo xtask device-check [--pack DIR] [RUN OPTIONS]
DIR/run.sh [RUN OPTIONS]
  run options: [--out DIR] [--budget SECONDS] [--shapes llama-3.2-1b,llama-3.1-8b] [--concurrency 1,16,64]
               [--prompt-len 128] [--gen-len 64] [--quick]";

/// The packed folder's size limit: small enough to copy onto any machine in seconds.
const PACK_LIMIT: u64 = 60 << 20;

/// The test binaries a pack holds under bin/, beside `weft`, `make_model` and `xtask`.
const TEST_BINARIES: [&str; 2] = ["device_gate", "kernels"];

/// Kernel tests that read the repository's sources (lints of the shader files), not the device.
const SOURCE_TESTS: [&str; 2] = ["every_shader_file_is_embedded_and_has_a_header", "nested_vars_are_initialized"];

/// Where Vulkan drivers' manifests live: the loader's standard folders, then the places NVIDIA's
/// installers and container images use. `XDG_*` folders are added at run time.
const ICD_DIRS: &[&str] = &[
    "/etc/vulkan/icd.d",
    "/usr/share/vulkan/icd.d",
    "/usr/local/etc/vulkan/icd.d",
    "/usr/local/share/vulkan/icd.d",
    "/usr/share/nvidia",
    "/etc/nvidia",
    "/usr/local/nvidia/share/vulkan/icd.d",
    "/usr/local/nvidia/etc/vulkan/icd.d",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib64/nvidia",
];

/// Where NVIDIA's Vulkan library may be when no manifest names it.
const NVIDIA_LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
];
const NVIDIA_VULKAN_LIB: &str = "libGLX_nvidia.so.0";

/// What the run measures; `run.sh`'s options.
#[derive(Clone, Debug, PartialEq)]
struct RunOptions {
    out: Option<PathBuf>,
    budget: Duration,
    shapes: Vec<String>,
    concurrency: Vec<usize>,
    prompt_len: usize,
    gen_len: usize,
    /// Without `WEFT_FULL=1`: the gate leaves out the 8B widths on CPU drivers and the kernel
    /// tests compile a sample of the shader variants (for a software driver, where all of it
    /// takes many minutes).
    quick: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            out: None,
            budget: Duration::from_secs(480),
            shapes: vec!["llama-3.2-1b".into(), "llama-3.1-8b".into()],
            concurrency: vec![1, 16, 64],
            prompt_len: 128,
            gen_len: 64,
            quick: false,
        }
    }
}

fn parse_run_options(args: &[String]) -> Result<RunOptions> {
    let mut o = RunOptions::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value\nusage: {USAGE}"));
        let number = |v: &str| match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{flag} takes positive whole numbers, not {v:?}")),
        };
        match flag.as_str() {
            "--out" => o.out = Some(PathBuf::from(value()?)),
            "--budget" => o.budget = Duration::from_secs(number(value()?)? as u64),
            "--shapes" => o.shapes = value()?.split(',').map(|s| s.trim().to_string()).collect(),
            "--concurrency" => o.concurrency = value()?.split(',').map(number).collect::<Result<_>>()?,
            "--prompt-len" => o.prompt_len = number(value()?)?,
            "--gen-len" => o.gen_len = number(value()?)?,
            "--quick" => o.quick = true,
            "--help" | "-h" => return Err(format!("usage: {USAGE}")),
            other => return Err(format!("unknown argument {other:?}\nusage: {USAGE}")),
        }
    }
    Ok(o)
}

/// `cargo xtask device-check ...` and, from a pack, `bin/xtask device-check --run DIR ...`.
pub fn device_check(args: &[String]) -> Result {
    match args.first().map(String::as_str) {
        Some("--pack") => {
            let dir = args.get(1).ok_or_else(|| format!("--pack needs a folder\nusage: {USAGE}"))?;
            if args.len() > 2 {
                return Err(format!("--pack takes no run options (give them to run.sh)\nusage: {USAGE}"));
            }
            pack(Path::new(dir))?;
            eprintln!("xtask: packed {dir}; copy it to the GPU machine and run {dir}/run.sh there");
            Ok(())
        }
        Some("--run") => {
            let dir = args.get(1).ok_or_else(|| format!("--run needs the packed folder\nusage: {USAGE}"))?;
            run_pack(Path::new(dir), &parse_run_options(&args[2..])?)
        }
        _ => {
            let options = parse_run_options(args)?;
            let dir = target_dir().join("device-check").join("pack");
            pack(&dir)?;
            run_pack(&dir, &options)
        }
    }
}

/// Builds everything the check runs into `dir` (replacing what a former pack left there).
fn pack(dir: &Path) -> Result {
    fetch_model()?;
    let mut build = cargo();
    build.args(["build", "--release", "--workspace", "--bin", "weft", "--bin", "xtask", "--example", "make_model"]);
    run(build)?;
    let release = target_dir().join("release");
    let mut binaries = vec![
        ("weft".to_string(), release.join("weft")),
        ("xtask".to_string(), release.join("xtask")),
        ("make_model".to_string(), release.join("examples").join("make_model")),
    ];
    binaries.extend(test_binaries()?);
    binaries.push(("bench_kernels".to_string(), kernels_bench()?));
    let bin = dir.join("bin");
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("emptying {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(&bin).map_err(|e| format!("creating {}: {e}", bin.display()))?;
    for (name, from) in &binaries {
        let to = bin.join(name);
        std::fs::copy(from, &to).map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
        // Symbols are most of a test binary's size; without `strip` the pack is only bigger.
        let _ = Command::new("strip").arg(&to).status();
    }
    let mut vocab = Command::new(bin.join("make_model"));
    vocab.arg("--tokenizer-only").arg("--tokenizer-from").arg(root().join(MODEL_FILE));
    vocab.arg("--out").arg(dir.join("tokenizer.gguf"));
    run(vocab)?;
    let script = dir.join("run.sh");
    std::fs::write(&script, RUN_SH).map_err(|e| format!("writing {}: {e}", script.display()))?;
    make_executable(&script)?;
    let size = folder_size(dir);
    eprintln!("xtask: the pack holds {:.1} MiB", size as f64 / (1 << 20) as f64);
    if size > PACK_LIMIT {
        return Err(format!(
            "the pack in {} is {:.1} MiB, over its {} MiB limit",
            dir.display(),
            size as f64 / (1 << 20) as f64,
            PACK_LIMIT >> 20
        ));
    }
    Ok(())
}

const RUN_SH: &str = r#"#!/bin/sh
# weft's device check, packed by `cargo xtask device-check --pack`: correctness first (every
# kernel family against the CPU model, then the kernel tests), then one table of prefill and
# decode speed per family and model shape. Needs a Vulkan driver and nothing else: no cargo,
# no network. ./run.sh --help lists the options; results go to ./results unless --out.
# Shell built-ins only: the check runs where PATH holds nothing useful.
case $0 in */*) here=${0%/*} ;; *) here=. ;; esac
here=$(cd "$here" && pwd)
exec "$here/bin/xtask" device-check --run "$here" "$@"
"#;

#[cfg(unix)]
fn make_executable(path: &Path) -> Result {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("making {} executable: {e}", path.display()))
}

#[cfg(not(unix))]
fn make_executable(_: &Path) -> Result {
    Ok(())
}

fn folder_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir).into_iter().flatten().flatten().fold(0, |sum, e| {
        let path = e.path();
        sum + if path.is_dir() { folder_size(&path) } else { e.metadata().map_or(0, |m| m.len()) }
    })
}

/// The release test binaries of [`TEST_BINARIES`], built if needed: (name, path).
fn test_binaries() -> Result<Vec<(String, PathBuf)>> {
    let mut build = cargo();
    build.args(["test", "--release", "--workspace", "--no-run", "--message-format", "json"]);
    for name in TEST_BINARIES {
        build.args(["--test", name]);
    }
    let output = build.stderr(Stdio::inherit()).output().map_err(|e| format!("could not start {build:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!("{build:?} failed ({})", output.status));
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<Value>(line) else { continue };
        let name = msg["target"]["name"].as_str().unwrap_or("");
        // The library's own tests: another package may have a test target of the same name.
        let ours = msg["target"]["src_path"].as_str().is_some_and(|p| Path::new(p).starts_with(root().join("tests")));
        if let (true, Some(exe)) = (ours && TEST_BINARIES.contains(&name), msg["executable"].as_str()) {
            found.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    for name in TEST_BINARIES {
        if !found.iter().any(|(n, _)| n == name) {
            return Err(format!("cargo built no test binary named {name}"));
        }
    }
    Ok(found)
}

/// Builds the kernels bench (`benches/kernels.rs`) and returns its executable.
fn kernels_bench() -> Result<PathBuf> {
    let mut build = cargo();
    build.args(["bench", "--bench", "kernels", "--no-run", "--message-format", "json"]);
    let output = build.stderr(Stdio::inherit()).output().map_err(|e| format!("could not start {build:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!("{build:?} failed ({})", output.status));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|msg| msg["target"]["name"] == "kernels" && msg["target"]["kind"][0] == "bench")
        .and_then(|msg| msg["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo built no bench named kernels".to_string())
}

/// The Vulkan driver's manifest and how it was found.
fn find_driver(out: &Path) -> Result<(String, String)> {
    if let Some(given) = std::env::var_os("VK_ICD_FILENAMES").filter(|v| !v.is_empty()) {
        return Ok((given.to_string_lossy().into_owned(), "VK_ICD_FILENAMES".into()));
    }
    let mut dirs: Vec<PathBuf> = ICD_DIRS.iter().map(PathBuf::from).collect();
    for var in ["XDG_CONFIG_DIRS", "XDG_DATA_DIRS"] {
        if let Some(list) = std::env::var_os(var) {
            dirs.extend(std::env::split_paths(&list).map(|d| d.join("vulkan").join("icd.d")));
        }
    }
    let dir_refs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    if let Some(icd) = nvidia_icd(&dir_refs) {
        return Ok((icd.display().to_string(), "NVIDIA's manifest".into()));
    }
    let lib_dirs: Vec<&Path> = NVIDIA_LIB_DIRS.iter().map(Path::new).collect();
    if let Some(lib) = nvidia_library(&lib_dirs) {
        let icd = out.join("nvidia_icd.json");
        let manifest = serde_json::json!({
            "file_format_version": "1.0.0",
            "ICD": {"library_path": lib.display().to_string(), "api_version": "1.3.0"},
        });
        std::fs::write(&icd, manifest.to_string()).map_err(|e| format!("writing {}: {e}", icd.display()))?;
        return Ok((icd.display().to_string(), format!("a manifest written for {}", lib.display())));
    }
    Err(format!(
        "no Vulkan driver for an NVIDIA GPU: no NVIDIA manifest (nvidia_icd.json) under {} and no {NVIDIA_VULKAN_LIB} \
         under {}.\nInstall the driver's Vulkan part (in a container, NVIDIA_DRIVER_CAPABILITIES must include \
         graphics), or set VK_ICD_FILENAMES to the manifest of the driver to check (any Vulkan driver, e.g. \
         lavapipe's lvp_icd.x86_64.json)",
        dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
        NVIDIA_LIB_DIRS.join(", ")
    ))
}

/// An NVIDIA Vulkan driver's manifest (`nvidia_icd.json`) in one of `dirs`, if any.
pub fn nvidia_icd(dirs: &[&Path]) -> Option<PathBuf> {
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        let mut manifests: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        manifests.sort();
        for path in manifests.into_iter().filter(|p| p.extension().is_some_and(|x| x == "json")) {
            let name = path.file_name().unwrap_or_default().to_string_lossy().to_lowercase();
            let text = std::fs::read_to_string(&path).unwrap_or_default().to_lowercase();
            if name.contains("nvidia") || text.contains("libglx_nvidia") || text.contains("libnvidia") {
                return Some(path);
            }
        }
    }
    None
}

fn nvidia_library(dirs: &[&Path]) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(NVIDIA_VULKAN_LIB)).find(|p| p.exists())
}

/// One part of the check and how it ended.
struct Part {
    name: String,
    outcome: std::result::Result<Value, String>,
    seconds: f64,
}

/// What the correctness checks found.
#[derive(Debug, Default, PartialEq)]
struct Verdict {
    /// Kernel families the gate ran, and the adapter it named.
    families: Vec<String>,
    adapter: String,
    /// One line per test binary: passed / failed counts, or why it did not finish.
    lines: Vec<String>,
    /// Tests that failed, by name.
    failed: Vec<String>,
    ok: bool,
}

/// Runs the packed check in `dir`.
fn run_pack(dir: &Path, o: &RunOptions) -> Result {
    let started = Instant::now();
    let deadline = started + o.budget;
    let out = o.out.clone().unwrap_or_else(|| dir.join("results"));
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let (icd, how) = find_driver(&out)?;
    eprintln!("device-check: Vulkan driver {icd} ({how}); budget {} s", o.budget.as_secs());
    // Vulkan only and only this driver: neither weft nor a test can fall back to another.
    let mut env: Vec<(&str, String)> = vec![
        ("VK_ICD_FILENAMES", icd.clone()),
        ("VK_DRIVER_FILES", icd.clone()),
        ("WGPU_BACKEND", "vulkan".into()),
        ("WEFT_REQUIRE_GPU", "1".into()),
    ];
    if !o.quick {
        env.push(("WEFT_FULL", "1".into()));
    }
    let bin = dir.join("bin");
    // Shares of the budget: the gate and the kernel tests two each, each benchmark one (a
    // GEMV-or-GEMM, an attention and an experts timing per GPU family, then a model per shape and family).
    let bench_parts = o.shapes.len() * 2 + 6;
    let shares_left = |done: usize| (4 + bench_parts).saturating_sub(done);

    let mut verdict = Verdict { ok: true, ..Default::default() };
    let gate_log = out.join("gate.log");
    let mut gate = Command::new(bin.join("device_gate"));
    gate.args(["--nocapture", "--test-threads", "3"]);
    let gate_run = run_logged(gate, &env, &gate_log, None, share(deadline, 2, shares_left(0)));
    judge("gate", gate_run, &gate_log, &mut verdict);
    let kernels_log = out.join("kernels.log");
    let mut kernels = Command::new(bin.join("kernels"));
    for name in SOURCE_TESTS {
        kernels.args(["--skip", name]);
    }
    let kernels_run = run_logged(kernels, &env, &kernels_log, None, share(deadline, 2, shares_left(2)));
    judge("kernel tests", kernels_run, &kernels_log, &mut verdict);
    if verdict.families.is_empty() {
        verdict.ok = false;
        verdict.lines.push("the gate opened no kernel family on this driver".into());
    }

    let (mut gemm, mut attention, mut moe) = (Vec::new(), Vec::new(), Vec::new());
    let mut done = 4;
    for family in verdict.families.iter().filter(|f| *f != "cpu") {
        // The per-shape verdicts and the crossover line, or why there are none.
        let verdicts = |l: &str| l.starts_with("crossover: ") || l.contains(": the GEMM wins");
        let timeout = share(deadline, 1, shares_left(done));
        gemm.push((family.clone(), kernel_bench(&bin, "gemm", family, &env, &out, timeout, verdicts)));
        // Each case's time.
        let timeout = share(deadline, 1, shares_left(done + 1));
        let cases = |l: &str| l.starts_with("head ");
        attention.push((family.clone(), kernel_bench(&bin, "attention", family, &env, &out, timeout, cases)));
        // The table's rows: tokens, row by row, grouped, speedup.
        let timeout = share(deadline, 1, shares_left(done + 2));
        let rows = |l: &str| l.trim_end().ends_with('x');
        let timed = kernel_bench(&bin, "moe", family, &env, &out, timeout, rows);
        moe.push((family.clone(), timed.map(|rows| rows.iter().map(|l| l.trim().to_string()).collect())));
        done += 3;
    }
    let mut parts = Vec::new();
    for shape in &o.shapes {
        let model = out.join("models").join(format!("{shape}.q4_1.gguf"));
        let began = Instant::now();
        let made = if model.exists() { Ok(()) } else { make_model(&bin, dir, shape, &model, &out) };
        if let Err(e) = made {
            parts.push(Part { name: format!("make {shape}"), outcome: Err(e), seconds: began.elapsed().as_secs_f64() });
            done += verdict.families.len().max(1);
            continue;
        }
        for family in &verdict.families {
            let began = Instant::now();
            let timeout = share(deadline, 1, shares_left(done).max(1));
            done += 1;
            let name = format!("{shape} {family}");
            let outcome = bench_part(&bin, &model, family, o, &env, &out, timeout);
            parts.push(Part { name, outcome, seconds: began.elapsed().as_secs_f64() });
        }
    }
    let report = report(&verdict, [&gemm, &attention, &moe], &parts, o, &icd, started.elapsed().as_secs_f64());
    println!("{report}");
    let file = out.join("device-check.md");
    std::fs::write(&file, &report).map_err(|e| format!("writing {}: {e}", file.display()))?;
    eprintln!("device-check: wrote {} and each part's log and JSON beside it", file.display());
    if verdict.ok { Ok(()) } else { Err("correctness failed on this device: see the table's first lines".into()) }
}

/// The kernels bench's `mode` in `family`, logged to MODE.FAMILY.log: the lines `keep` picks.
fn kernel_bench(
    bin: &Path,
    mode: &str,
    family: &str,
    env: &[(&str, String)],
    out: &Path,
    timeout: Duration,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<String>> {
    let log = out.join(format!("{mode}.{family}.log"));
    let mut cmd = Command::new(bin.join("bench_kernels"));
    cmd.arg(mode);
    let mut env = env.to_vec();
    env.push(("WEFT_KERNELS", family.to_string()));
    run_logged(cmd, &env, &log, None, timeout)?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    Ok(text.lines().filter(|l| keep(l)).map(str::to_string).collect())
}

/// `shares` of an equal split of the time left among `shares_left` (at least 10 s).
fn share(deadline: Instant, shares: usize, shares_left: usize) -> Duration {
    let rest = deadline.saturating_duration_since(Instant::now());
    (rest * shares as u32 / shares_left.max(1) as u32).max(Duration::from_secs(10))
}

/// Runs `cmd` with `env`, ended after `timeout`: stderr into `log`, stdout into `stdout` when
/// given, else into `log` too.
fn run_logged(
    mut cmd: Command,
    env: &[(&str, String)],
    log: &Path,
    stdout: Option<std::fs::File>,
    timeout: Duration,
) -> Result {
    eprintln!("device-check: running {cmd:?} (log: {}, at most {} s)", log.display(), timeout.as_secs());
    let file = std::fs::File::create(log).map_err(|e| format!("creating {}: {e}", log.display()))?;
    let stdout = match stdout {
        Some(f) => f,
        None => file.try_clone().map_err(|e| e.to_string())?,
    };
    cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str()))).stdout(stdout).stderr(file);
    let mut child = cmd.spawn().map_err(|e| format!("could not start {cmd:?}: {e}"))?;
    let status = crate::peer::wait_within(&mut child, Some(timeout))?;
    if status.success() { Ok(()) } else { Err(format!("exited with {status} (see {})", log.display())) }
}

/// Reads a test binary's log into `verdict`: the families the gate opened, the counts and the
/// failed tests.
fn judge(what: &str, run: Result, log: &Path, verdict: &mut Verdict) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("gate: the ")
            && let Some((family, adapter)) = rest.split_once(" family on ")
            && !verdict.families.iter().any(|f| f == family)
        {
            verdict.families.push(family.to_string());
            verdict.adapter = adapter.to_string();
        }
        if let Some(name) = line.strip_prefix("test ").and_then(|l| l.strip_suffix(" ... FAILED")) {
            verdict.failed.push(format!("{what}: {name}"));
        }
    }
    let counts = text.lines().rev().find_map(|l| l.strip_prefix("test result: ")).map(str::to_string);
    match (run, counts) {
        // A binary that ran nothing checked nothing (a wrong binary, or a filter that matched all).
        (Ok(()), Some(counts)) if counts.contains(" 0 passed") => {
            verdict.ok = false;
            verdict.lines.push(format!("{what}: ran no test ({counts})"));
        }
        (Ok(()), Some(counts)) => verdict.lines.push(format!("{what}: {counts}")),
        (Ok(()), None) => {
            verdict.ok = false;
            verdict.lines.push(format!("{what}: finished without a test result line"));
        }
        (Err(e), counts) => {
            verdict.ok = false;
            let counts = counts.map_or(String::new(), |c| format!(" ({c})"));
            verdict.lines.push(format!("{what}: FAILED, {e}{counts}"));
        }
    }
}

fn make_model(bin: &Path, dir: &Path, shape: &str, model: &Path, out: &Path) -> Result {
    let mut cmd = Command::new(bin.join("make_model"));
    cmd.args(["--shape", shape, "--quant", "q4_1", "--tokenizer-from"]).arg(dir.join("tokenizer.gguf"));
    cmd.arg("--out").arg(model);
    // Writing is disk-bound (seconds for the 8B shape's 4.5 GB); the budget does not limit it.
    run_logged(cmd, &[], &out.join(format!("make.{shape}.log")), None, Duration::from_secs(600))
}

/// One `weft bench --json --bandwidth` of `model` in `family`.
fn bench_part(
    bin: &Path,
    model: &Path,
    family: &str,
    o: &RunOptions,
    env: &[(&str, String)],
    out: &Path,
    timeout: Duration,
) -> std::result::Result<Value, String> {
    let stem = format!("weft.{}.{family}", model.file_stem().unwrap_or_default().to_string_lossy());
    let json_file = out.join(format!("{stem}.json"));
    let list = o.concurrency.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new(bin.join("weft"));
    cmd.args(["bench", "--json", "--bandwidth", "--repeats", "1", "--concurrency", &list]);
    cmd.args(["--prompt-len", &o.prompt_len.to_string(), "--gen-len", &o.gen_len.to_string(), "--model"]).arg(model);
    let mut env = env.to_vec();
    env.push(("WEFT_KERNELS", family.to_string()));
    let log = out.join(format!("{stem}.log"));
    let json_out = std::fs::File::create(&json_file).map_err(|e| format!("creating {}: {e}", json_file.display()))?;
    run_logged(cmd, &env, &log, Some(json_out), timeout)?;
    let text = std::fs::read_to_string(&json_file).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("weft bench printed something other than JSON ({e})"))
}

/// Each GPU family's lines of one kernels-bench mode (GEMV or GEMM: the per-shape verdicts and
/// crossover line; attention: each case's time; experts: row by row against grouped), or why not.
type KernelTimings = [(String, Result<Vec<String>>)];

/// The report: correctness, then where each GPU family's matmul should start tiling, its
/// attention's times and its experts' matmul row by row against grouped, then a row per run,
/// then each model's bandwidth bound, then what did not finish.
fn report(
    verdict: &Verdict,
    [gemm, attention, moe]: [&KernelTimings; 3],
    parts: &[Part],
    o: &RunOptions,
    icd: &str,
    elapsed_s: f64,
) -> String {
    let mut out = format!(
        "Device check on {} (Vulkan driver {icd}), {}; prompts of {} tokens, {} generated, one repeat.\n\n",
        if verdict.adapter.is_empty() { "an unknown adapter" } else { &verdict.adapter },
        utc_now(),
        o.prompt_len,
        o.gen_len
    );
    out.push_str(&format!("Correctness: {}\n", if verdict.ok { "passed" } else { "FAILED" }));
    for line in &verdict.lines {
        out.push_str(&format!("- {line}\n"));
    }
    for name in &verdict.failed {
        out.push_str(&format!("- failed: {name}\n"));
    }
    out.push_str(&format!("- kernel families run: {}\n\n", verdict.families.join(", ")));
    if !gemm.is_empty() {
        out.push_str("GEMV or GEMM (the kernels bench's `gemm`; each family's log gemm.FAMILY.log has the table):\n");
        for (family, lines) in gemm {
            match lines {
                Ok(lines) if !lines.is_empty() => {
                    out.extend(lines.iter().map(|l| format!("- {family}: {l}\n")));
                }
                Ok(_) => out.push_str(&format!("- {family}: printed no crossover (see gemm.{family}.log)\n")),
                Err(e) => out.push_str(&format!("- {family}: not finished, {e}\n")),
            }
        }
        out.push('\n');
    }
    if !attention.is_empty() {
        out.push_str(
            "Attention, one layer over an f16 cache (the kernels bench's `attention`; attention.FAMILY.log):\n",
        );
        for (family, lines) in attention {
            match lines {
                Ok(lines) => out.extend(lines.iter().map(|l| format!("- {family}: {l}\n"))),
                Err(e) => out.push_str(&format!("- {family}: not finished, {e}\n")),
            }
        }
        out.push('\n');
    }
    if !moe.is_empty() {
        out.push_str(
            "Experts row by row or grouped (the kernels bench's `moe`: tokens, per row us, grouped us, speedup; \
             moe.FAMILY.log):\n",
        );
        for (family, lines) in moe {
            match lines {
                Ok(lines) => out.extend(lines.iter().map(|l| format!("- {family}: {l}\n"))),
                Err(e) => out.push_str(&format!("- {family}: not finished, {e}\n")),
            }
        }
        out.push('\n');
    }
    out.push_str(
        "| shape | family | seqs | prefill tok/s | decode tok/s/seq | total tok/s | host ms/step | GPU ms/step | GPU busy | ITL p50 ms | GPU MiB |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let num = |v: &Value, d: usize| v.as_f64().map_or("–".to_string(), |x| format!("{x:.d$}"));
    let mut bounds = Vec::new();
    let mut problems = Vec::new();
    for p in parts {
        let doc = match &p.outcome {
            Ok(doc) => doc,
            Err(e) => {
                problems.push(format!("- {} ({:.0} s): {e}", p.name, p.seconds));
                continue;
            }
        };
        let (shape, family) = p.name.split_once(' ').unwrap_or((&p.name, ""));
        for r in doc["runs"].as_array().into_iter().flatten() {
            // The GPU's share of a decode step: its time over the step's (the inter-token gap).
            let busy = match (r["gpu_ms_per_step_p50"].as_f64(), r["itl_ms_p50"].as_f64()) {
                (Some(gpu), Some(itl)) if itl > 0.0 => format!("{:.0}%", (100.0 * gpu / itl).min(100.0)),
                _ => "–".into(),
            };
            out.push_str(&format!(
                "| {shape} | {family} | {} | {} | {} | {} | {} | {} | {busy} | {} | {} |\n",
                r["concurrency"],
                num(&r["prefill_tok_s"], 1),
                num(&r["decode_tok_s_per_seq"], 1),
                num(&r["aggregate_tok_s"], 1),
                num(&r["host_ms_per_step_p50"], 2),
                num(&r["gpu_ms_per_step_p50"], 2),
                num(&r["itl_ms_p50"], 2),
                num(&r["gpu_mem_mib"], 0)
            ));
        }
        if let Some(line) = bandwidth_bound(shape, family, doc) {
            bounds.push(line);
        }
    }
    if !bounds.is_empty() {
        out.push_str(
            "\nDecode at one sequence against the memory-bandwidth bound (weights read per step ÷ copy bandwidth):\n",
        );
        out.push_str(&bounds.join("\n"));
        out.push('\n');
    }
    out.push_str(&format!("\n{} parts in {elapsed_s:.0} s.\n", parts.len() + 2));
    if !problems.is_empty() {
        out.push_str("\nNot finished:\n");
        out.push_str(&problems.join("\n"));
        out.push('\n');
    }
    out
}

/// "shape family: X tok/s × Y GB = Z GB/s, P% of the copy bandwidth (B GB/s)", from the run at
/// one sequence.
fn bandwidth_bound(shape: &str, family: &str, doc: &Value) -> Option<String> {
    let copy = doc["adapter"]["copy_gb_s"].as_f64()?;
    let bytes = doc["decode_read_bytes"].as_f64()?;
    let one = doc["runs"].as_array()?.iter().find(|r| r["concurrency"] == 1)?;
    let rate = one["decode_tok_s_per_seq"].as_f64()?;
    let moved = rate * bytes / 1e9;
    Some(format!(
        "- {shape} {family}: {rate:.1} tok/s × {:.2} GB = {moved:.1} GB/s, {:.0}% of the copy bandwidth ({copy:.0} GB/s)",
        bytes / 1e9,
        100.0 * moved / copy
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-xtask-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_nvidia_manifest_is_found_and_lavapipe_is_not_it() {
        let dir = temp("icd");
        std::fs::write(dir.join("lvp_icd.x86_64.json"), r#"{"ICD": {"library_path": "/usr/lib/libvulkan_lvp.so"}}"#)
            .unwrap();
        assert_eq!(nvidia_icd(&[dir.as_path()]), None);
        std::fs::write(dir.join("nvidia_icd.json"), r#"{"ICD": {"library_path": "libGLX_nvidia.so.0"}}"#).unwrap();
        assert_eq!(nvidia_icd(&[Path::new("/nonexistent"), dir.as_path()]), Some(dir.join("nvidia_icd.json")));
        assert_eq!(nvidia_library(&[dir.as_path()]), None);
        std::fs::write(dir.join(NVIDIA_VULKAN_LIB), b"").unwrap();
        assert_eq!(nvidia_library(&[Path::new("/nonexistent"), dir.as_path()]), Some(dir.join(NVIDIA_VULKAN_LIB)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn run_options_parse_and_bad_ones_say_why() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(parse_run_options(&[]).unwrap(), RunOptions::default());
        let o = parse_run_options(&args("--shapes llama-3.2-1b --concurrency 1,4 --budget 900 --gen-len 8 --quick"))
            .unwrap();
        assert_eq!(
            (o.shapes, o.concurrency, o.budget.as_secs(), o.gen_len, o.quick),
            (vec!["llama-3.2-1b".into()], vec![1, 4], 900, 8, true)
        );
        let err = parse_run_options(&args("--concurrency 1,0")).unwrap_err();
        assert!(err.contains("--concurrency takes positive whole numbers, not \"0\""), "{err}");
        assert!(parse_run_options(&args("--bogus")).unwrap_err().contains("unknown argument \"--bogus\""));
    }

    #[test]
    fn test_logs_are_judged_by_their_results_and_the_gates_families() {
        let dir = temp("judge");
        let log = dir.join("gate.log");
        std::fs::write(
            &log,
            "gate: the baseline family on NVIDIA H200\ngate: the cpu family not run: no\n\
             gate: the subgroup family on NVIDIA H200\ntest a ... ok\ntest b ... FAILED\n\
             test result: FAILED. 1 passed; 1 failed; 0 ignored\n",
        )
        .unwrap();
        let mut v = Verdict { ok: true, ..Default::default() };
        judge("gate", Err("exited with exit status: 101".into()), &log, &mut v);
        assert_eq!(v.families, vec!["baseline", "subgroup"]);
        assert_eq!(v.adapter, "NVIDIA H200");
        assert_eq!(v.failed, vec!["gate: b"]);
        assert!(!v.ok);
        assert_eq!(v.lines, vec!["gate: FAILED, exited with exit status: 101 (FAILED. 1 passed; 1 failed; 0 ignored)"]);
        std::fs::write(&log, "test a ... ok\ntest result: ok. 1 passed; 0 failed\n").unwrap();
        let mut v = Verdict { ok: true, ..Default::default() };
        judge("kernel tests", Ok(()), &log, &mut v);
        assert!(v.ok);
        assert_eq!(v.lines, vec!["kernel tests: ok. 1 passed; 0 failed"]);
        std::fs::write(&log, "test result: ok. 0 passed; 0 failed; 0 ignored\n").unwrap();
        judge("kernel tests", Ok(()), &log, &mut v);
        assert!(!v.ok);
        assert_eq!(v.lines[1], "kernel tests: ran no test (ok. 0 passed; 0 failed; 0 ignored)");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_report_has_a_row_per_run_the_bandwidth_bound_and_what_did_not_finish() {
        let doc = serde_json::json!({"adapter": {"name": "NVIDIA H200", "copy_gb_s": 4000.0},
            "decode_read_bytes": 4.0e9, "runs": [
            {"concurrency": 1, "prompt_len": 128, "gen_len": 64, "prefill_tok_s": 5000.0, "decode_tok_s_per_seq": 300.0,
             "aggregate_tok_s": 290.0, "host_ms_per_step_p50": 0.4, "gpu_ms_per_step_p50": 3.0, "itl_ms_p50": 3.3,
             "gpu_mem_mib": 900.0}]});
        let parts = [
            Part { name: "llama-3.1-8b subgroup".into(), outcome: Ok(doc), seconds: 20.0 },
            Part { name: "llama-3.1-8b baseline".into(), outcome: Err("ran past its 60 s".into()), seconds: 60.0 },
        ];
        let verdict = Verdict {
            families: vec!["subgroup".into(), "baseline".into()],
            adapter: "NVIDIA H200".into(),
            lines: vec!["gate: ok. 3 passed".into()],
            failed: Vec::new(),
            ok: true,
        };
        let gemm = [
            (
                "subgroup".to_string(),
                Ok(vec![
                    "crossover: GemmMinRows { vendor: 0x10de, family: KernelFamily::Subgroup, min_rows: 8 }".into(),
                ]),
            ),
            ("baseline".to_string(), Err("ran past its 60 s".to_string())),
        ];
        let attention = [(
            "subgroup".to_string(),
            Ok(vec!["head 128, decode, 1 sequence at 2048             41.0 us".to_string()]),
        )];
        let moe = [("subgroup".to_string(), Ok(vec!["16  900.0  300.0  3.00x".to_string()]))];
        let icd = "/etc/vulkan/icd.d/nvidia_icd.json";
        let t = report(&verdict, [&gemm, &attention, &moe], &parts, &RunOptions::default(), icd, 80.0);
        assert!(t.contains("- subgroup: head 128, decode, 1 sequence at 2048             41.0 us\n"), "{t}");
        assert!(t.contains("- subgroup: 16  900.0  300.0  3.00x"), "{t}");
        assert!(
            t.contains(
                "- subgroup: crossover: GemmMinRows { vendor: 0x10de, family: KernelFamily::Subgroup, min_rows: 8 }"
            ),
            "{t}"
        );
        assert!(t.contains("- baseline: not finished, ran past its 60 s"), "{t}");
        assert!(t.starts_with("Device check on NVIDIA H200"), "{t}");
        assert!(
            t.contains("Correctness: passed\n- gate: ok. 3 passed\n- kernel families run: subgroup, baseline"),
            "{t}"
        );
        assert!(
            t.contains("| llama-3.1-8b | subgroup | 1 | 5000.0 | 300.0 | 290.0 | 0.40 | 3.00 | 91% | 3.30 | 900 |"),
            "{t}"
        );
        assert!(
            t.contains(
                "- llama-3.1-8b subgroup: 300.0 tok/s × 4.00 GB = 1200.0 GB/s, 30% of the copy bandwidth (4000 GB/s)"
            ),
            "{t}"
        );
        assert!(t.contains("- llama-3.1-8b baseline (60 s): ran past its 60 s"), "{t}");
    }
}
