//! `weft chat` driven through a pipe: a question, /reset, another message, /exit.

use std::io::Write;
use std::process::{Command, Stdio};

fn gpu_required() -> bool {
    std::env::var("WEFT_REQUIRE_GPU").as_deref() == Ok("1")
}

#[test]
fn chat_answers_over_a_pipe_resets_and_exits() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !std::path::Path::new(model).exists() {
        assert!(
            std::env::var("WEFT_REQUIRE_MODEL").as_deref() != Ok("1"),
            "the default model is missing and WEFT_REQUIRE_MODEL=1"
        );
        return eprintln!("skipping: no default model (run `cargo xtask fetch-model`)");
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["chat", "--model", model, "--temperature", "0", "--max-tokens", "12"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the weft binary runs");
    child.stdin.take().unwrap().write_all(b"What is the capital of France?\n/reset\nHi\n/exit\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && !gpu_required() && stderr.contains("no GPU adapter found") {
        return eprintln!("skipping: no GPU adapter");
    }
    assert!(out.status.success(), "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert!(stdout.contains("Paris"), "{stdout}");
    assert!(!stdout.contains("> "), "no prompt marker when stdin is a pipe: {stdout}");
    assert_eq!(stderr.matches("tokens/s").count(), 4, "speeds of both replies: {stderr}");
    assert!(stderr.contains("reset"), "{stderr}");
}

#[test]
fn chat_help_explains_every_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_weft")).args(["chat", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--model",
        "--system",
        "--max-tokens",
        "--kv-cache-dtype",
        "--temperature",
        "--top-p",
        "--top-k",
        "--seed",
        "/reset",
        "/exit",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}
