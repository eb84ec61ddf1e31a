//! The `weft` binary's GPU self-check and its error paths, run as a user would run them.

use std::process::Command;

fn weft(args: &[&str], envs: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .expect("the weft binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn gpu_required() -> bool {
    std::env::var("WEFT_REQUIRE_GPU").as_deref() == Ok("1")
}

#[test]
fn without_an_adapter_info_says_what_to_install() {
    let (ok, _, stderr) = weft(&["info"], &[("VK_ICD_FILENAMES", "/nonexistent"), ("WGPU_BACKEND", "vulkan")]);
    assert!(!ok, "must exit non-zero");
    assert!(stderr.contains("no GPU adapter found"), "{stderr}");
    assert!(stderr.contains("apt-get install mesa-vulkan-drivers"), "{stderr}");
    assert!(stderr.contains("VK_ICD_FILENAMES=/nonexistent"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn an_unmatched_adapter_name_lists_the_adapters() {
    let (ok, _, stderr) = weft(&["info"], &[("WGPU_ADAPTER_NAME", "no-such-gpu-xyz")]);
    assert!(!ok);
    assert!(stderr.contains("WGPU_ADAPTER_NAME=\"no-such-gpu-xyz\" matches no adapter"), "{stderr}");
    if gpu_required() {
        assert!(!stderr.contains("are: none"), "a GPU is required here, so some adapter is listed: {stderr}");
    }
}

#[test]
fn info_runs_the_self_check() {
    let (ok, stdout, stderr) = weft(&["info"], &[]);
    if !ok && !gpu_required() && stderr.contains("no GPU adapter found") {
        eprintln!("skipping: no GPU adapter");
        return;
    }
    assert!(ok, "{stderr}");
    for expected in ["adapter:", "features:", "limits:", "self-check: matmul Q4_1", "\nok\n"] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
    let (ok, stdout, stderr) = weft(&["info", "--baseline"], &[]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("shader-f16=false subgroups=false"), "--baseline must drop the optional features:\n{stdout}");
}
