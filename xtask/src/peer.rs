//! The peer of `cargo xtask bench --peer`: llama.cpp through llama-cpp-python, built twice into
//! venvs outside the repository (under `~/.cache/weft-peer`, or `$WEFT_PEER_DIR`): once with its
//! Vulkan backend, which runs on the same adapter as weft, and once CPU-only, what a user without
//! a GPU runs. `tools/peer_bench.py` runs the workload in either.
//!
//! The Vulkan build needs glslc, the Vulkan loader's development files and SPIR-V headers
//! (Debian: `glslc libvulkan-dev spirv-headers`, installed through apt when running as root), and
//! Vulkan headers newer than Debian 12's 1.3.239: on such a machine the headers of the next
//! Debian release's `libvulkan-dev` are fetched by package name with `apt-get download` (through
//! a private copy of the machine's own apt sources with the release name changed; the system's
//! apt configuration is untouched), unpacked next to the venvs and passed as
//! `-DVulkan_INCLUDE_DIR`. pip builds from source with `--no-cache-dir`, or it would reuse a
//! cached CPU-only wheel.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{Result, root, run};

/// The llama-cpp-python release measured against (it pins its own llama.cpp).
pub const LLAMA_CPP_PYTHON_VERSION: &str = "0.3.36";

/// Debian's release whose libvulkan-dev headers are new enough, and the one that is not.
const HEADERS_RELEASE: &str = "trixie";
const OLD_RELEASE: &str = "bookworm";
/// ggml's Vulkan backend does not build against headers older than this `VK_HEADER_VERSION`.
const MIN_HEADER_VERSION: u32 = 240;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PeerKind {
    Vulkan,
    Cpu,
}

impl PeerKind {
    fn dir_name(self) -> &'static str {
        match self {
            PeerKind::Vulkan => "vulkan",
            PeerKind::Cpu => "cpu",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            PeerKind::Vulkan => "llama.cpp Vulkan",
            PeerKind::Cpu => "llama.cpp CPU",
        }
    }
}

/// Where the venvs and the unpacked headers live.
pub fn peer_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WEFT_PEER_DIR") {
        return PathBuf::from(dir);
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".cache").join("weft-peer"),
        None => crate::target_dir().join("weft-peer"),
    }
}

fn python_of(venv: &Path) -> PathBuf {
    if cfg!(windows) { venv.join("Scripts").join("python.exe") } else { venv.join("bin").join("python") }
}

/// The venv's python when its llama-cpp-python is the pinned release built for `kind`: judged
/// by whether ggml's Vulkan backend library was built, not by `llama_supports_gpu_offload`,
/// which also needs a visible device (ggml hides CPU-type ones such as lavapipe unless
/// `GGML_VK_VISIBLE_DEVICES` names them).
pub fn ready(kind: PeerKind) -> Option<PathBuf> {
    let python = python_of(&peer_dir().join(kind.dir_name()));
    let want_vulkan = if kind == PeerKind::Vulkan { "True" } else { "False" };
    let check = format!(
        "import os, sys, llama_cpp as L\n\
         lib = os.path.join(os.path.dirname(L.__file__), 'lib')\n\
         vulkan = any(n.startswith('libggml-vulkan') for n in os.listdir(lib))\n\
         sys.exit(0 if L.__version__ == '{LLAMA_CPP_PYTHON_VERSION}' and vulkan == {want_vulkan} else 1)"
    );
    let ok = Command::new(&python).args(["-c", &check]).output().is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

/// The venv's python, building llama-cpp-python into it first when needed (tens of minutes on
/// two cores).
pub fn ensure(kind: PeerKind) -> Result<PathBuf> {
    if let Some(python) = ready(kind) {
        return Ok(python);
    }
    let venv = peer_dir().join(kind.dir_name());
    eprintln!(
        "xtask: building llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} ({}) into {}; this compiles llama.cpp \
         (on 2 cores, about an hour for Vulkan, whose shaders are many)",
        kind.label(),
        venv.display()
    );
    // ggml builds for the machine's own CPU; where that has AMX but the kernel withholds its
    // tile state (a VM), ggml's AMX matmul dies with SIGSEGV on the first batch. AMX speeds
    // only int8 prefill on the newest Xeons: built without it.
    let mut cmake_args = if cfg!(target_arch = "x86_64") {
        let no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16";
        format!("-DCMAKE_C_FLAGS='{no_amx}' -DCMAKE_CXX_FLAGS='{no_amx}'")
    } else {
        String::new()
    };
    if kind == PeerKind::Vulkan {
        install_vulkan_build_tools()?;
        cmake_args += " -DGGML_VULKAN=on";
        if let Some(include) = vulkan_headers()? {
            cmake_args += &format!(" -DVulkan_INCLUDE_DIR={}", include.display());
        }
    }
    let python = python_of(&venv);
    if !python.exists() {
        let mut make = Command::new("python3");
        make.args(["-m", "venv"]).arg(&venv);
        run(make).map_err(|e| format!("{e}\n(on Debian `python3 -m venv` needs the python3-venv package)"))?;
    }
    // --no-cache-dir: otherwise pip reuses a wheel built earlier with other CMAKE_ARGS (the CPU
    // one for the Vulkan venv); --force-reinstall: a venv with the wrong build gets rebuilt.
    let mut pip = Command::new(&python);
    pip.args(["-m", "pip", "install", "--no-cache-dir", "--force-reinstall"]);
    pip.arg(format!("llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"));
    // Both builds use every core; CMAKE_ARGS alone decides the backend.
    pip.env("CMAKE_ARGS", cmake_args).env("CMAKE_BUILD_PARALLEL_LEVEL", cores().to_string());
    run(pip)?;
    ready(kind).ok_or_else(|| {
        format!("llama-cpp-python in {} was built but does not look like the {} build", venv.display(), kind.label())
    })
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// glslc, the loader's development files, SPIR-V headers (Debian package names).
fn install_vulkan_build_tools() -> Result {
    if Path::new("/usr/bin/glslc").exists() || Command::new("glslc").arg("--version").output().is_ok() {
        return Ok(());
    }
    let is_root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !(is_root && Path::new("/usr/bin/apt-get").exists()) {
        return Err("llama.cpp's Vulkan build needs glslc and the Vulkan headers: \
                    sudo apt-get install -y glslc libvulkan-dev spirv-headers"
            .into());
    }
    let mut install = Command::new("apt-get");
    install
        .args(["install", "-y", "-qq", "glslc", "libvulkan-dev", "spirv-headers"])
        .env("DEBIAN_FRONTEND", "noninteractive");
    run(install)
}

/// The `VK_HEADER_VERSION` of the Vulkan headers at `include`.
fn header_version(include: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(include.join("vulkan").join("vulkan_core.h")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("#define VK_HEADER_VERSION ")).and_then(|v| v.trim().parse().ok())
}

/// An include directory with new enough Vulkan headers: `None` when the system's are (nothing
/// to pass), else Debian `trixie`'s unpacked under the peer directory (fetched once).
fn vulkan_headers() -> Result<Option<PathBuf>> {
    if header_version(Path::new("/usr/include")).is_some_and(|v| v >= MIN_HEADER_VERSION) {
        return Ok(None);
    }
    let unpacked = peer_dir().join("vulkan-headers");
    let include = unpacked.join("usr").join("include");
    if header_version(&include).is_some_and(|v| v >= MIN_HEADER_VERSION) {
        return Ok(Some(include));
    }
    let apt = peer_dir().join("apt");
    let _ = std::fs::remove_dir_all(&apt);
    let parts = apt.join("sources.list.d");
    for dir in [parts.clone(), apt.join("lists").join("partial"), apt.join("cache").join("archives").join("partial")] {
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let sources = renamed_sources(Path::new("/etc/apt"), OLD_RELEASE, HEADERS_RELEASE)?;
    for (name, text) in &sources {
        std::fs::write(parts.join(name), text).map_err(|e| e.to_string())?;
    }
    let empty = apt.join("sources.list");
    std::fs::write(&empty, "").map_err(|e| e.to_string())?;
    let apt_get = |args: &[&str]| {
        let mut cmd = Command::new("apt-get");
        cmd.current_dir(&apt)
            .arg("-o")
            .arg(format!("Dir::Etc::SourceList={}", empty.display()))
            .arg("-o")
            .arg(format!("Dir::Etc::SourceParts={}", parts.display()))
            .arg("-o")
            .arg(format!("Dir::State::Lists={}", apt.join("lists").display()))
            .arg("-o")
            .arg(format!("Dir::Cache={}", apt.join("cache").display()))
            .args(["-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root", "-qq"])
            .args(args);
        cmd
    };
    eprintln!(
        "xtask: fetching the Vulkan headers of Debian {HEADERS_RELEASE}'s libvulkan-dev (a private apt directory)"
    );
    run(apt_get(&["update"]))?;
    run(apt_get(&["download", "libvulkan-dev"]))?;
    let deb = std::fs::read_dir(&apt)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libvulkan-dev_")))
        .ok_or("apt-get download libvulkan-dev left no .deb")?;
    let mut unpack = Command::new("dpkg-deb");
    unpack.arg("-x").arg(&deb).arg(&unpacked);
    run(unpack)?;
    match header_version(&include) {
        Some(v) if v >= MIN_HEADER_VERSION => Ok(Some(include)),
        other => Err(format!("the headers unpacked at {} have VK_HEADER_VERSION {other:?}", include.display())),
    }
}

/// The machine's apt sources (`sources.list`, `sources.list.d/*.list` and `*.sources`) that name
/// release `from`, with every `from` changed to `to`: (file name, text) pairs. Entries of other
/// releases are left out.
pub fn renamed_sources(etc_apt: &Path, from: &str, to: &str) -> Result<Vec<(String, String)>> {
    let mut files = vec![etc_apt.join("sources.list")];
    if let Ok(entries) = std::fs::read_dir(etc_apt.join("sources.list.d")) {
        let mut more: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        more.sort();
        files.extend(more);
    }
    let mut out = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        let renamed = match ext {
            "list" => text
                .lines()
                .filter(|l| !l.trim_start().starts_with('#') && l.contains(from))
                .map(|l| l.replace(from, to) + "\n")
                .collect::<String>(),
            "sources" => text
                .split("\n\n")
                .filter(|stanza| stanza.lines().any(|l| l.starts_with("Suites:") && l.contains(from)))
                .map(|stanza| stanza.replace(from, to) + "\n\n")
                .collect(),
            _ => continue,
        };
        if !renamed.trim().is_empty() {
            out.push((format!("{i:02}-{to}.{ext}"), renamed));
        }
    }
    if out.is_empty() {
        return Err(format!(
            "no apt source under {} names Debian {from}, so the {to} headers cannot be fetched; \
             install Vulkan headers newer than 1.3.239 (VK_HEADER_VERSION >= {MIN_HEADER_VERSION}) yourself",
            etc_apt.display()
        ));
    }
    Ok(out)
}

/// Runs `tools/peer_bench.py` in the `kind` venv on `model`; its JSON. `env` is added to the
/// environment (the device check hides lavapipe that way); `timeout` ends it.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    kind: PeerKind,
    python: &Path,
    model: &Path,
    prompt_len: usize,
    gen_len: usize,
    seqs: usize,
    repeats: usize,
    env: &[(&str, &str)],
    timeout: Option<Duration>,
) -> Result<Value> {
    let mut cmd = Command::new(python);
    cmd.arg(root().join("tools").join("peer_bench.py")).arg("--model").arg(model);
    cmd.args(["--prompt-len", &prompt_len.to_string(), "--gen-len", &gen_len.to_string()]);
    cmd.args(["--seqs", &seqs.to_string(), "--repeats", &repeats.to_string(), "--label", kind.label()]);
    match kind {
        // Without it ggml leaves a CPU-type Vulkan device (lavapipe) out and runs on the CPU.
        PeerKind::Vulkan => cmd.args(["--expect", "vulkan"]).env("GGML_VK_VISIBLE_DEVICES", "0"),
        PeerKind::Cpu => cmd.args(["--expect", "cpu", "--n-gpu-layers", "0"]),
    };
    // lavapipe's vector width is left at what llama.cpp's users get (its default, 256 bits, unless
    // LP_NATIVE_VECTOR_WIDTH is set): llama.cpp's Vulkan build ran slower here at the 512 bits
    // weft asks for (bench/README.md).
    cmd.envs(env.iter().copied()).env("NODEVICE_SELECT", "1");
    let stdout = output_within(cmd, timeout)?;
    serde_json::from_str(&stdout).map_err(|e| format!("tools/peer_bench.py printed something else ({e}):\n{stdout}"))
}

/// Runs `cmd` (stderr shown) and returns its stdout, ending it after `timeout` if one is given.
pub fn output_within(mut cmd: Command, timeout: Option<Duration>) -> Result<String> {
    eprintln!("xtask: running {cmd:?}");
    // stdout goes to a file, not a pipe: nothing has to drain it while the clock is watched.
    let out_file = std::env::temp_dir().join(format!("weft-xtask-{}-{}.out", std::process::id(), unique()));
    let file = std::fs::File::create(&out_file).map_err(|e| format!("creating {}: {e}", out_file.display()))?;
    let mut child = cmd.stdout(file).spawn().map_err(|e| format!("could not start {cmd:?}: {e}"))?;
    let status = match wait_within(&mut child, timeout) {
        Ok(status) => status,
        Err(e) => {
            let _ = std::fs::remove_file(&out_file);
            return Err(format!("{cmd:?} {e}"));
        }
    };
    let stdout = std::fs::read_to_string(&out_file);
    let _ = std::fs::remove_file(&out_file);
    if !status.success() {
        return Err(format!("{cmd:?} failed ({status})"));
    }
    stdout.map_err(|e| format!("{cmd:?} printed something other than UTF-8: {e}"))
}

/// Waits for `child`, ending it once it has run past `timeout`: its exit status, or an error
/// saying that it ran past.
pub fn wait_within(child: &mut std::process::Child, timeout: Option<Duration>) -> Result<std::process::ExitStatus> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(status);
        }
        if let Some(limit) = timeout.filter(|&t| started.elapsed() > t) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("ran past its {} s and was ended", limit.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A number no other call in this process gets.
fn unique() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_renamed_in_both_formats() {
        let dir = std::env::temp_dir().join(format!("weft-xtask-apt-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sources.list.d")).unwrap();
        std::fs::write(
            dir.join("sources.list"),
            "# deb http://x bookworm main\ndeb http://x bookworm main\ndeb http://y noble main\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("sources.list.d").join("debian.sources"),
            "Types: deb\nURIs: http://x\nSuites: bookworm bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://z\nSuites: stable\n",
        )
        .unwrap();
        let got = renamed_sources(&dir, "bookworm", "trixie").unwrap();
        assert_eq!(got[0], ("00-trixie.list".to_string(), "deb http://x trixie main\n".to_string()));
        assert_eq!(got[1].0, "01-trixie.sources");
        assert!(got[1].1.contains("Suites: trixie trixie-updates") && !got[1].1.contains("stable"), "{}", got[1].1);
        std::fs::remove_dir_all(&dir).unwrap();
        let err = renamed_sources(Path::new("/nonexistent"), "bookworm", "trixie").unwrap_err();
        assert!(err.contains("no apt source"), "{err}");
    }
}
