//! `weft bench` in-process (JSON) and against a `weft serve` it starts (table).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/SmolLM2-135M-Instruct.Q4_1.gguf");

fn model_present() -> bool {
    if std::path::Path::new(MODEL).exists() {
        return true;
    }
    assert!(
        std::env::var("WEFT_REQUIRE_MODEL").as_deref() != Ok("1"),
        "the default model is missing and WEFT_REQUIRE_MODEL=1"
    );
    eprintln!("skipping: no default model (run `cargo xtask fetch-model`)");
    false
}

fn no_gpu(stderr: &str) -> bool {
    if std::env::var("WEFT_REQUIRE_GPU").as_deref() != Ok("1") && stderr.contains("no GPU adapter found") {
        eprintln!("skipping: no GPU adapter");
        return true;
    }
    false
}

fn weft(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .env_remove("WEFT_API_KEY")
        .output()
        .expect("the weft binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn positive(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    let n = x.as_f64().unwrap_or_else(|| panic!("{path:?} is not a number in {v}"));
    assert!(n > 0.0, "{path:?} = {n} is not positive in {v}");
    n
}

/// The schema: `{adapter, model, repeats, runs: [...]}`, one run per (prompt length,
/// concurrency), every rate and latency measured, in-process figures present.
#[test]
fn in_process_json_has_every_run() {
    if !model_present() {
        return;
    }
    let args = ["--concurrency", "1,2", "--prompt-len", "8", "--gen-len", "4", "--repeats", "1", "--json"];
    let (ok, stdout, stderr) = weft(&[&["bench", "--model", MODEL][..], &args].concat());
    if !ok && no_gpu(&stderr) {
        return;
    }
    assert!(ok, "{stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    assert!(doc["adapter"]["name"].as_str().is_some_and(|n| !n.is_empty()), "{doc}");
    assert!(doc["adapter"]["features"].is_array() && doc["adapter"]["backend"].is_string(), "{doc}");
    assert_eq!(doc["model"], "SmolLM2-135M-Instruct.Q4_1.gguf", "{doc}");
    assert_eq!(doc["repeats"], 1, "{doc}");
    let runs = doc["runs"].as_array().unwrap_or_else(|| panic!("no runs: {doc}"));
    assert_eq!(runs.len(), 2, "{doc}");
    for (run, c) in runs.iter().zip([1u64, 2]) {
        assert_eq!(
            (run["concurrency"].as_u64(), run["prompt_len"].as_u64(), run["gen_len"].as_u64()),
            (Some(c), Some(8), Some(4))
        );
        for key in ["prefill_tok_s", "decode_tok_s_per_seq", "aggregate_tok_s", "host_ms_per_step_p50"] {
            positive(run, &[key]);
        }
        for key in ["gpu_mem_mib", "host_rss_mib"] {
            positive(run, &[key]);
        }
        // Timestamp queries are optional in WebGPU: without them the GPU time is null.
        assert!(run["gpu_ms_per_step_p50"].is_null() || positive(run, &["gpu_ms_per_step_p50"]) > 0.0);
        for key in ["ttft_ms", "itl_ms"] {
            let p50 = positive(run, &[&format!("{key}_p50")]);
            let p99 = positive(run, &[&format!("{key}_p99")]);
            assert!(p50 <= p99, "{run}");
        }
        assert!(run.get("speculation").is_none(), "no speculation asked for: {run}");
    }
}

/// A running `weft serve`, killed on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    if s.write_all(format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").as_bytes())
        .is_err()
    {
        return false;
    }
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.1 200")
}

#[test]
fn table_against_a_server() {
    if !model_present() {
        return;
    }
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut server = Server(
        Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["serve", "--port", &port.to_string(), "--model", MODEL, "--api-key", "bench-key"])
            .env_remove("WEFT_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("weft serve starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    while !healthy(port) {
        if let Some(status) = server.0.try_wait().unwrap() {
            let mut stderr = String::new();
            let _ = server.0.stderr.take().unwrap().read_to_string(&mut stderr);
            if no_gpu(&stderr) {
                return;
            }
            panic!("weft serve exited early ({status}): {stderr}");
        }
        assert!(Instant::now() < deadline, "weft serve did not get healthy in time");
        std::thread::sleep(Duration::from_millis(200));
    }
    let url = format!("http://127.0.0.1:{port}");
    let (ok, stdout, stderr) = weft(&[
        "bench",
        "--url",
        &url,
        "--api-key",
        "bench-key",
        "--concurrency",
        "2",
        "--prompt-len",
        "6",
        "--gen-len",
        "3",
    ]);
    assert!(ok, "{stderr}");
    let mut lines = stdout.lines();
    let header = lines.next().unwrap_or_default();
    for column in ["conc", "prefill tok/s", "decode tok/s", "total tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99"]
    {
        assert!(header.contains(column), "{column} missing from:\n{stdout}");
    }
    let row: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(row.len(), 14, "{stdout}");
    assert_eq!(row[..3], ["2", "6", "3"], "concurrency, prompt and output lengths: {stdout}");
    for cell in &row[3..10] {
        assert!(cell.parse::<f64>().unwrap() > 0.0, "{cell} in:\n{stdout}");
    }
    // A server reports no step times or memory.
    assert_eq!(row[10..], ["-", "-", "-", "-"], "{stdout}");
    // Aligned: every row is as wide as the header.
    assert_eq!(stdout.lines().nth(1).unwrap().len(), header.len(), "{stdout}");

    // A wrong key is reported, not hidden.
    let (ok, _, stderr) = weft(&[
        "bench",
        "--url",
        &url,
        "--api-key",
        "wrong",
        "--concurrency",
        "1",
        "--prompt-len",
        "4",
        "--gen-len",
        "1",
    ]);
    assert!(!ok);
    assert!(stderr.contains("401"), "{stderr}");
}

#[test]
fn bench_help_explains_every_flag() {
    let (ok, help, _) = weft(&["bench", "--help"]);
    assert!(ok);
    for flag in [
        "--model",
        "--url",
        "--api-key",
        "--concurrency",
        "--prompt-len",
        "--gen-len",
        "--kv-memory",
        "--kv-cache-dtype",
        "--json",
        "TTFT",
        "inter-token",
        "--task",
        "--shared-prefix",
        "--request-rate",
        "--draft-model",
        "--spec-ngram",
        "--spec-tokens",
        "--temperature",
        "--top-k",
        "--top-p",
        "--host-only",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

/// Sampled requests (llama.cpp's default filters) on the tiny model: the JSON names the
/// sampling and every run generates its tokens; a temperature no sampler takes is refused
/// before anything loads, naming the flag's field.
#[test]
fn sampling_flags_reach_every_request() {
    let tiny = tiny_model("sampling");
    let tiny = tiny.to_str().unwrap();
    let base =
        ["bench", "--model", tiny, "--kv-memory", "16MiB", "--prompt-len", "8", "--gen-len", "4", "--repeats", "1"];
    let sampled = ["--concurrency", "1,2", "--temperature", "0.8", "--top-k", "40", "--top-p", "0.95", "--json"];
    let (ok, stdout, stderr) = weft(&[&base[..], &sampled].concat());
    if !ok && no_gpu(&stderr) {
        return;
    }
    assert!(ok, "{stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    assert_eq!(doc["sampling"], serde_json::json!({"temperature": 0.8f32, "top_k": 40, "top_p": 0.95f32}), "{doc}");
    for run in doc["runs"].as_array().unwrap() {
        positive(run, &["decode_tok_s_per_seq"]);
        positive(run, &["aggregate_tok_s"]);
    }
    let (ok, _, stderr) = weft(&[&base[..], &["--temperature", "3"]].concat());
    assert!(!ok);
    assert!(stderr.contains("temperature") && stderr.contains("between 0 and 2"), "{stderr}");
}

/// `--shared-prefix`: the requests of each run begin with the same tokens, with the prefix
/// cache on, here sent at `--request-rate` 40 a second; a prefix that leaves a prompt nothing
/// of its own, one asked of chat prompts, or a rate that is not positive is refused before
/// anything loads, saying what to change.
#[test]
fn shared_prefix_and_request_rate_runs_and_their_bad_uses_are_refused() {
    let tiny = tiny_model("prefix");
    let tiny = tiny.to_str().unwrap();
    let base = ["bench", "--model", tiny, "--kv-memory", "16MiB", "--gen-len", "4", "--repeats", "1"];
    let run = ["--shared-prefix", "8", "--prompt-len", "12", "--concurrency", "1,4", "--request-rate", "40", "--json"];
    let (ok, stdout, stderr) = weft(&[&base[..], &run].concat());
    if !ok && no_gpu(&stderr) {
        return;
    }
    assert!(ok, "{stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    for run in doc["runs"].as_array().unwrap() {
        positive(run, &["aggregate_tok_s"]);
    }
    let (ok, _, stderr) = weft(&[&base[..], &["--shared-prefix", "12", "--prompt-len", "12"]].concat());
    assert!(!ok);
    assert!(stderr.contains("--shared-prefix 12") && stderr.contains("longer prompt"), "{stderr}");
    let (ok, _, stderr) = weft(&[&base[..], &["--shared-prefix", "4", "--task", "chat"]].concat());
    assert!(!ok);
    assert!(stderr.contains("--task random"), "{stderr}");
    let (ok, _, stderr) = weft(&[&base[..], &["--request-rate", "0"]].concat());
    assert!(!ok);
    assert!(stderr.contains("--request-rate must be a positive number"), "{stderr}");
}

/// The tiny random model, written to a temporary file (fast on lavapipe).
fn tiny_model(name: &str) -> std::path::PathBuf {
    let c = weft::model::tiny::tiny_config();
    let w = weft::model::tiny::random_weights(&c, 21, weft::DType::Q8_0);
    let path = std::env::temp_dir().join(format!("weft-bench-{}-{name}.gguf", std::process::id()));
    std::fs::write(&path, weft::model::tiny::gguf_bytes(&c, &w, weft::DType::Q8_0)).unwrap();
    path
}

/// Speculative decoding in `weft bench --json`: prompt lookup and a draft model (here the
/// model itself, so greedy drafts are always kept) report their counts per run; a draft with
/// another vocabulary is refused with the reason.
#[test]
fn speculation_counts_are_reported_per_run() {
    let tiny = tiny_model("spec");
    let tiny = tiny.to_str().unwrap();
    let base = [
        "bench",
        "--model",
        tiny,
        "--kv-memory",
        "16MiB",
        "--concurrency",
        "1,2",
        "--prompt-len",
        "24",
        "--gen-len",
        "8",
        "--repeats",
        "1",
        "--task",
        "copy",
        "--json",
    ];
    for spec in [&["--spec-ngram", "--spec-tokens", "3"][..], &["--draft-model", tiny]] {
        let (ok, stdout, stderr) = weft(&[&base[..], spec].concat());
        if !ok && no_gpu(&stderr) {
            return;
        }
        assert!(ok, "{stderr}");
        let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
        assert_eq!(doc["task"], "copy", "{doc}");
        assert!(doc["speculation"]["num_speculative_tokens"].as_u64().is_some(), "{doc}");
        for level in doc["runs"].as_array().unwrap() {
            let s = &level["speculation"];
            let drafted = s["drafted_tokens"].as_u64().unwrap_or_else(|| panic!("{level}"));
            let rate = s["acceptance_rate"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&rate) && s["mean_accepted_len"].as_f64().is_some(), "{level}");
            if spec[0] == "--draft-model" {
                assert!(drafted > 0 && rate == 1.0, "the model as its own draft keeps every greedy draft: {level}");
            }
        }
    }
    let (ok, stdout, stderr) = weft(&base);
    assert!(ok, "{stderr}");
    assert!(serde_json::from_str::<Value>(&stdout).unwrap()["runs"][0].get("speculation").is_none(), "{stdout}");
    if model_present() {
        let (ok, _, stderr) = weft(&[&base[..], &["--draft-model", MODEL]].concat());
        assert!(!ok);
        assert!(stderr.contains("the draft model's tokenizer has 49152 tokens but the target's has 260"), "{stderr}");
    }
    let _ = std::fs::remove_file(tiny);
}

/// `--host-only` runs the real engine on a fake GPU (no adapter needed): each level's widest
/// decode steps have their phases (how many sequences they held said: at a fake GPU's speed a
/// level's requests need not all decode in one step), one submission each, and the table
/// names them.
#[test]
fn host_only_reports_each_decode_steps_phases() {
    let tiny = tiny_model("host-only");
    let args = ["--concurrency", "1,4", "--prompt-len", "8", "--gen-len", "6", "--repeats", "1", "--host-only"];
    let (ok, stdout, stderr) = weft(&[&["bench", "--model", tiny.to_str().unwrap()][..], &args, &["--json"]].concat());
    assert!(ok, "{stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["adapter"]["backend"], "noop", "{doc}");
    assert_eq!(doc["adapter"]["kernels"], "subgroup", "{doc}");
    for run in doc["runs"].as_array().unwrap() {
        let seqs = positive(run, &["decode_step", "seqs"]);
        assert!(seqs <= positive(run, &["concurrency"]), "{run}");
        positive(run, &["decode_step", "steps_per_s"]);
        positive(run, &["decode_step", "output_ms"]);
        assert_eq!(run["decode_step"]["submissions_per_step"], 1.0, "{run}");
    }
    let (ok, table, stderr) = weft(&[&["bench", "--model", tiny.to_str().unwrap()][..], &args].concat());
    assert!(ok, "{stderr}");
    assert!(table.contains("host per decode step") && table.contains("submits/step"), "{table}");
}
