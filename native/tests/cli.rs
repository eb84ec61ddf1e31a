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
    for expected in ["adapter:", "features:", "limits:", "memory:", "KV cache", "self-check: matmul Q4_1", "\nok\n"] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
    assert!(stdout.starts_with(&weft::model::inspect::supported()), "what weft runs comes first:\n{stdout}");
    let (ok, stdout, stderr) = weft(&["info", "--baseline"], &[]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("shader-f16=false subgroups=false"),
        "--baseline must drop the optional features:\n{stdout}"
    );
}

/// Each broken model makes `weft generate` exit non-zero with one line naming the file and
/// what is wrong with it.
#[test]
fn broken_models_are_named_in_one_line() {
    use weft::model::gguf::{GgmlType, GgufWriter, MetaValue};
    let dir = std::env::temp_dir().join(format!("weft-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let corrupt = dir.join("corrupt.gguf");
    std::fs::write(&corrupt, b"this is not a model at all").unwrap();
    let mut iq2 = GgufWriter::new();
    iq2.metadata("general.architecture", MetaValue::String("llama".into())).tensor(
        "blk.0.ffn_down.weight",
        &[256, 2],
        GgmlType::IQ2_XXS,
        &[0u8; 132],
    );
    let unsupported = dir.join("iq2.gguf");
    std::fs::write(&unsupported, iq2.to_bytes()).unwrap();
    let truncated = dir.join("truncated.gguf");
    let mut whole = GgufWriter::new();
    whole.metadata("general.architecture", MetaValue::String("llama".into())).tensor(
        "token_embd.weight",
        &[64, 8],
        GgmlType::F32,
        &[0u8; 2048],
    );
    let bytes = whole.to_bytes();
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
    let no_config = dir.join("hf-without-config");
    std::fs::create_dir_all(&no_config).unwrap();

    let cases: [(&std::path::Path, &str); 4] = [
        (&corrupt, "not a GGUF file"),
        (
            &unsupported,
            "tensor blk.0.ffn_down.weight is IQ2_XXS; weft supports F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS, MXFP4, IQ2_XS, IQ3_XXS, IQ3_S, IQ2_S",
        ),
        (&truncated, "past the end of the file"),
        (&no_config, "config.json"),
    ];
    for (path, problem) in cases {
        let (ok, _, stderr) = weft(&["generate", "--model", path.to_str().unwrap(), "--prompt", "hi"], &[]);
        assert!(!ok, "{path:?} must fail");
        let line = stderr.trim_end();
        assert!(!line.contains('\n'), "one line, got:\n{stderr}");
        assert!(line.contains(&path.display().to_string()), "names the file: {line}");
        assert!(line.contains(problem), "says {problem:?}: {line}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_default_model_says_how_to_fetch_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["generate", "--prompt", "hi"])
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cargo xtask fetch-model") && stderr.contains("--model"), "{stderr}");
}

#[test]
fn generate_answers_a_chat_question_with_the_default_model() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !std::path::Path::new(model).exists() {
        assert!(std::env::var("WEFT_REQUIRE_MODEL").as_deref() != Ok("1"), "the default model is missing");
        return eprintln!("skipping: no default model");
    }
    let args = [
        "generate",
        "--model",
        model,
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        // Halves, as llama.cpp holds its cache: the answer stays the same.
        "--kv-cache-dtype",
        "f16",
    ];
    let (ok, stdout, stderr) = weft(&args, &[]);
    if !ok && !gpu_required() && stderr.contains("no GPU adapter found") {
        return eprintln!("skipping: no GPU adapter");
    }
    assert!(ok, "{stderr}");
    assert!(stdout.contains("Paris"), "{stdout}");
    assert!(stderr.contains("tokens/s"), "{stderr}");
    // Not a terminal: model loading is reported as plain log lines, ending with every layer.
    assert!(stderr.contains("30/30 layers on the GPU"), "{stderr}");
}

/// `weft info --model` describes a model from its headers, and with a GPU its KV cache there: a runnable K-quant
/// model with mixed tensor types, and a file it refuses, with every reason.
#[test]
fn info_describes_a_model_and_whether_weft_runs_it() {
    use weft::model::gguf::{GgmlType, GgufWriter, MetaValue};
    use weft::model::tiny;
    let dir = std::env::temp_dir().join(format!("weft-cli-info-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let no_gpu = [("VK_ICD_FILENAMES", "/nonexistent"), ("WGPU_BACKEND", "vulkan")];

    let config = weft::model::config::ModelConfig {
        hidden_size: 256,
        intermediate_size: 320,
        head_dim: 64,
        ..tiny::tiny_config()
    };
    let w = tiny::random_weights(&config, 1, weft::DType::Q4_K);
    let good = dir.join("tiny-q4_k.gguf");
    std::fs::write(&good, tiny::gguf_bytes(&config, &w, weft::DType::Q4_K)).unwrap();
    let (ok, stdout, stderr) = weft(&["info", "--model", good.to_str().unwrap()], &no_gpu);
    assert!(ok, "{stdout}\n{stderr}");
    for expected in [
        "architecture: llama",
        "GGUF v3",
        "Q4_K",
        "Q5_0",
        "F32",
        "2 layers, hidden 256",
        // 2 layers × (K, V) × 2 KV heads × 64 values: 2048 bytes in f32; 2048 positions.
        "KV cache:     2.0 kB a token in f32, 1.0 kB in f16 (--kv-cache-dtype); a full context 4.2 MB / 2.1 MB",
        "weft runs it: yes",
        // Then the KV cache this device would hold, where a GPU opens: none here.
        "on this machine's GPU: none opened",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
    // With a GPU: how many tokens of it fit there.
    let (ok, stdout, stderr) = weft(&["info", "--model", good.to_str().unwrap(), "--kv-cache-dtype", "f32"], &[]);
    assert!(ok, "{stdout}\n{stderr}");
    if !stdout.contains("none opened") {
        assert!(stdout.contains("KV cache: ") && stdout.contains("tokens of f32"), "{stdout}");
    }

    let mut bad = GgufWriter::new();
    bad.metadata("general.architecture", MetaValue::String("mamba".into())).tensor(
        "blk.0.ffn_down.weight",
        &[256, 2],
        GgmlType::IQ2_XXS,
        &[0u8; 132],
    );
    let bad_path = dir.join("bad.gguf");
    std::fs::write(&bad_path, bad.to_bytes()).unwrap();
    let (ok, stdout, stderr) = weft(&["info", "--model", bad_path.to_str().unwrap()], &no_gpu);
    assert!(!ok, "a model weft cannot run exits non-zero");
    for expected in [
        "weft runs it: no",
        "architecture \"mamba\" is not supported",
        "1 tensor is IQ2_XXS, which weft does not decode: blk.0.ffn_down.weight",
        "(not supported)",
        "tokenizer.ggml.model is missing",
        "weft runs:\n  architectures: llama, mistral,",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
    assert!(stderr.contains("weft cannot run this model"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let (ok, _, stderr) = weft(&["info", "--model", dir.join("missing.gguf").to_str().unwrap()], &no_gpu);
    assert!(!ok && stderr.contains("missing.gguf"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `weft info` lists every architecture and tensor type weft runs, from the loaders' own
/// registries (no GPU needed), and for a file it cannot run names everything missing: here a
/// DeepSeek-V2-like file, an unknown architecture with routed experts, whose MXFP4 tensors weft
/// decodes and whose IQ1_S tensors it does not.
#[test]
fn info_lists_what_weft_runs_and_names_what_a_model_lacks() {
    use weft::model::gguf::{GgmlType, GgufWriter, MetaValue};
    let no_gpu = [("VK_ICD_FILENAMES", "/nonexistent"), ("WGPU_BACKEND", "vulkan")];
    let (ok, stdout, _) = weft(&["info"], &no_gpu);
    assert!(!ok, "no GPU opens here");
    let supported = weft::model::inspect::supported();
    assert!(stdout.starts_with(&supported), "{stdout}");
    for arch in weft::model::arch::SUPPORTED {
        assert!(supported.lines().next().unwrap().contains(arch), "{arch} in {supported}");
    }
    // Each type in the list, the last one too, as a whole word.
    let types = format!("{},", supported.lines().nth(1).unwrap());
    for dtype in weft::DType::WEIGHTS {
        assert!(types.contains(&format!(" {dtype},")), "{dtype} in {supported}");
    }
    for expected in ["MXFP4", "IQ2_XS", "IQ3_XXS", "IQ3_S", "IQ2_S", "F16, BF16, Q8_0", "safetensors:   F32"] {
        assert!(supported.contains(expected), "{expected} in {supported}");
    }

    let dir = std::env::temp_dir().join(format!("weft-cli-lacks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut file = GgufWriter::new();
    file.metadata("general.architecture", MetaValue::String("deepseek2".into()))
        .metadata("deepseek2.expert_count", MetaValue::U32(32))
        .tensor("blk.0.ffn_up_exps.weight", &[64, 2], GgmlType::MXFP4, &[0u8; 2 * 34]);
    for layer in 0..6 {
        file.tensor(&format!("blk.{layer}.attn_q.weight"), &[256, 1], GgmlType::IQ1_S, &[0u8; 50]);
    }
    let path = dir.join("deepseek2-like.gguf");
    std::fs::write(&path, file.to_bytes()).unwrap();
    let (ok, stdout, stderr) = weft(&["info", "--model", path.to_str().unwrap()], &no_gpu);
    assert!(!ok && stderr.contains("weft cannot run this model"), "{stderr}");
    for expected in [
        "architecture \"deepseek2\" is not supported; weft runs llama, mistral,",
        "mixture-of-experts is not supported: deepseek2 has 32 experts per layer",
        "6 tensors are IQ1_S, which weft does not decode: blk.0.attn_q.weight, blk.1.attn_q.weight, \
         blk.2.attn_q.weight, blk.3.attn_q.weight and 2 more",
        "weft runs:\n  architectures:",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
    let mxfp4 = stdout.lines().find(|l| l.trim_start().starts_with("MXFP4")).unwrap_or("");
    assert!(!mxfp4.is_empty() && !mxfp4.contains("not supported"), "{stdout}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A KV cache type weft does not hold is refused before anything loads, naming the choices.
#[test]
fn an_unknown_kv_cache_type_is_refused() {
    for command in [&["serve"][..], &["bench"], &["generate", "--prompt", "hi"], &["chat"]] {
        let (ok, _, stderr) = weft(&[command, &["--kv-cache-dtype", "q8"]].concat(), &[]);
        assert!(!ok);
        assert!(stderr.contains("\"q8\" is not a KV cache type; use f32 or f16"), "{command:?}: {stderr}");
    }
}

/// A KV cache too small for the default max_model_len is refused naming flags the command has,
/// and `--max-model-len` makes the same cache enough.
#[test]
fn generate_takes_the_max_model_len_its_kv_error_suggests() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !std::path::Path::new(model).exists() {
        assert!(std::env::var("WEFT_REQUIRE_MODEL").as_deref() != Ok("1"), "the default model is missing");
        return eprintln!("skipping: no default model");
    }
    let base = ["generate", "--model", model, "--prompt", "Hi", "--max-tokens", "2", "--kv-memory", "16MiB"];
    let (ok, _, stderr) = weft(&base, &[]);
    if !ok && !gpu_required() && stderr.contains("no GPU adapter found") {
        return eprintln!("skipping: no GPU adapter");
    }
    assert!(!ok, "16 MiB held a sequence of 4096 tokens: {stderr}");
    assert!(stderr.contains("does not fit the KV cache") && stderr.contains("--max-model-len"), "{stderr}");
    let (ok, _, stderr) = weft(&[&base[..], &["--max-model-len", "512"]].concat(), &[]);
    assert!(ok, "{stderr}");
}

/// `--prompts-file` completes every line in one batch: each reply is the one `--prompt` gives
/// alone (batch invariance, seen from the command line), in the file's order; a file with no
/// prompt, a missing file and both flags at once are refused, naming what to do.
#[test]
fn generate_completes_a_file_of_prompts_as_each_alone() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !std::path::Path::new(model).exists() {
        assert!(std::env::var("WEFT_REQUIRE_MODEL").as_deref() != Ok("1"), "the default model is missing");
        return eprintln!("skipping: no default model");
    }
    let dir = std::env::temp_dir().join(format!("weft-cli-prompts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = ["What is the capital of France?", "Name a prime number.", "List three colors."];
    let file = dir.join("prompts.txt");
    std::fs::write(&file, format!("{}\n\n{}\n{}\n", prompts[0], prompts[1], prompts[2])).unwrap();
    let common = ["generate", "--model", model, "--chat", "--temperature", "0", "--max-tokens", "6"];
    let (ok, stdout, stderr) = weft(&[&common[..], &["--prompts-file", file.to_str().unwrap()]].concat(), &[]);
    if !ok && !gpu_required() && stderr.contains("no GPU adapter found") {
        return eprintln!("skipping: no GPU adapter");
    }
    assert!(ok, "{stderr}");
    assert!(stderr.contains("3 prompts:"), "{stderr}");
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), prompts.len(), "{stdout}");
    for (prompt, line) in prompts.iter().zip(&lines) {
        assert_eq!(line["prompt"], *prompt);
        assert_eq!(line["completion_tokens"], 6, "{line}");
        assert_eq!(line["finish_reason"], "length", "{line}");
        let (ok, alone, stderr) = weft(&[&common[..], &["--prompt", prompt]].concat(), &[]);
        assert!(ok, "{stderr}");
        assert_eq!(line["text"].as_str().unwrap(), alone.strip_suffix('\n').unwrap(), "{prompt:?}");
    }

    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "\n  \n").unwrap();
    let (ok, _, stderr) = weft(&[&common[..], &["--prompts-file", empty.to_str().unwrap()]].concat(), &[]);
    assert!(!ok && stderr.contains("has no prompts: write one prompt a line"), "{stderr}");
    let missing = dir.join("missing.txt");
    let (ok, _, stderr) = weft(&[&common[..], &["--prompts-file", missing.to_str().unwrap()]].concat(), &[]);
    assert!(!ok && stderr.contains("--prompts-file") && stderr.contains("missing.txt"), "{stderr}");
    let (ok, _, stderr) =
        weft(&[&common[..], &["--prompt", "hi", "--prompts-file", file.to_str().unwrap()]].concat(), &[]);
    assert!(!ok && stderr.contains("cannot be used with"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
