//! `cargo xtask <command>`: weft's own automation (see `cargo xtask help`).
//!
//! Each command installs what it needs and is missing (the Vulkan software driver when the
//! machine has no GPU driver at all, rustup targets), then runs cargo. No shell scripts.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const HELP: &str = "\
cargo xtask <command>

commands:
  demo            set up what is missing, then run the main job (for now: the GPU self-check)
  test            set up what is missing, then run every test (what CI runs)
  check-targets   cargo check the library for wasm32, Windows and macOS targets
  bench-kernels   print the matmul GFLOP/s and GB/s table for every weight format [FORMAT]
  help            this text
";

type Result<T = ()> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(),
        Some("test") => test(),
        Some("check-targets") => check_targets(),
        Some("bench-kernels") => bench_kernels(&args[1..]),
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
    let mut cmd = cargo();
    cmd.args(["run", "--release", "--quiet", "-p", "weft-native", "--", "info"]);
    run(with_gpu_env(cmd))
}

fn test() -> Result {
    ensure_gpu_driver()?;
    let mut cmd = cargo();
    cmd.args(["test", "--release", "--workspace"]);
    // Tests skip GPU cases when no adapter exists; here a driver was just ensured, so a missing
    // adapter is a failure, not a skip.
    cmd.env("WEFT_REQUIRE_GPU", "1");
    run(with_gpu_env(cmd))?;
    check_wasm()
}

fn bench_kernels(args: &[String]) -> Result {
    ensure_gpu_driver()?;
    let mut cmd = cargo();
    cmd.args(["bench", "--quiet", "-p", "weft", "--bench", "kernels", "--"]).args(args);
    run(with_gpu_env(cmd))
}

fn check_wasm() -> Result {
    rustup_target("wasm32-unknown-unknown")?;
    let mut cmd = cargo();
    cmd.args(["check", "--release", "-p", "weft", "--target", "wasm32-unknown-unknown"]);
    run(cmd)
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
        std::fs::read_dir(dir).is_ok_and(|entries| entries.flatten().any(|e| e.path().extension().is_some_and(|x| x == "json")))
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
