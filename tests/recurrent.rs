//! Recurrent models against outside truth: `tests/fixtures/mamba2/`,
//! `tests/fixtures/granite_hybrid/`, `tests/fixtures/lfm2/` and `tests/fixtures/qwen35/` hold a
//! tiny random-weight `Mamba2ForCausalLM`, a dense Granite 4.0-H (`GraniteMoeHybridForCausalLM`:
//! Mamba2, attention without RoPE, Mamba2), an `Lfm2ForCausalLM` (short convolution, attention,
//! short convolution, attention) and a `Qwen3_5ForCausalLM` (three Gated DeltaNet layers with 2
//! q/k heads and 4 v heads, then gated attention with partial RoPE) written by
//! `tools/make_recurrent_fixtures.py` — each one's Hugging
//! Face directory, the GGUF llama.cpp's `convert_hf_to_gguf.py` made of it, and transformers'
//! logits and greedy tokens. `tests/fixtures/granite_hybrid_moe/` (`tools/make_moe_fixtures.py`)
//! is Granite 4.0-H with experts (Tiny's and Small's form): the same layers, each MLP 8 routed
//! experts (top 2) beside the shared one; `tests/fixtures/lfm2moe/` an `Lfm2MoeForCausalLM`
//! (LFM2's layers, the first with a dense MLP, the rest 8 experts chosen by sigmoid + a spread
//! expert bias, top 2, renormalised); `tests/fixtures/qwen35moe/` a `Qwen3_5MoeForCausalLM`
//! (Qwen3.5's layers, attention third, each MLP 8 experts softmax top 2 renormalised beside a
//! shared expert scaled by the sigmoid of its own one-row gate; llama.cpp's `qwen35moe`).
//!
//! - The last prompt position's logits (transformers' prefill: its chunked SSD scan) agree
//!   within 1e-4 for both checkpoints of both families, with weft scanning token by token and
//!   with its own chunked scan (chunks of 4 here, so the short prompts hold several); both sum
//!   in other orders, and on lavapipe the largest difference is about 1e-6 (printed), while a
//!   wrong conv window, state, gate or multiplier moves logits by 1e-2 or more.
//! - 12 greedy tokens (LFM2: 32 on 4 prompts; transformers' recurrent decode) are equal; a
//!   divergence is tolerated only right after a step whose reference top-1/top-2 margin is below
//!   1e-3 (a near-tie), after which that prompt is no longer compared. Where the fixture has
//!   each step's top 20 logits (LFM2, Qwen3.5, Qwen3.5-MoE), those agree within 1e-4 too.
//! - A sequence alone equals the same sequence among 15 others, and a prompt prefilled in chunks
//!   of several sizes equals one pass, bit for bit (with the chunked scan: cuts at multiples of
//!   its chunk, as the scheduler makes them; other cuts agree within the fidelity tolerance).

use std::path::{Path, PathBuf};

use serde_json::Value;
use weft::gpu::{GpuOptions, GpuTensorFactory};
use weft::kv::KvCacheConfig;
use weft::model::executor::GpuExecutor;
use weft::model::load::ModelFiles;
use weft::step::{SeqStep, StepBatch};

const BLOCK: usize = 16;

/// The fixtures, by directory name.
const FAMILIES: [&str; 7] =
    ["mamba2", "granite_hybrid", "lfm2", "granite_hybrid_moe", "lfm2moe", "qwen35", "qwen35moe"];

/// The families the engine-level tests walk: all of them, except in the GPU families' runs
/// (`WEFT_ONE_PROMPT=1`, outside `WEFT_FULL`), which skip the three whose recurrent layers are
/// their dense twin's (Granite 4.0-H, LFM2 and Qwen3.5 with experts): their experts' kernels
/// are one for every family, and their fidelity tests still run there.
fn engine_families() -> Vec<&'static str> {
    let env = |key: &str| std::env::var(key).as_deref() == Ok("1");
    let twins = ["granite_hybrid_moe", "lfm2moe", "qwen35moe"];
    FAMILIES.into_iter().filter(|f| !(env("WEFT_ONE_PROMPT") && !env("WEFT_FULL") && twins.contains(f))).collect()
}

fn factory() -> Option<GpuTensorFactory> {
    weft::gpu::open_or_skip(GpuOptions::default()).unwrap().map(GpuTensorFactory::new)
}

/// `path` in the fixture of `family` (one of [`FAMILIES`]).
fn fixture(family: &str, path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(family).join(path)
}

/// How the executors here scan prefills: token by token, and in chunks of 4 positions (the
/// default chunk of 64 is longer than these prompts).
const SCANS: [Option<usize>; 2] = [None, Some(4)];

fn executor(f: &GpuTensorFactory, family: &str, path: &str, scan: Option<usize>) -> GpuExecutor {
    let files = ModelFiles::open(&fixture(family, path)).unwrap();
    files.executor(f, KvCacheConfig::new(BLOCK, 256)).unwrap().with_scan_chunk(scan).unwrap()
}

fn prompts(family: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(fixture(family, "expected.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["prompts"].as_array().unwrap().clone()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// Sequence `slot`'s step: `tokens` at `start_pos`, in its own slot and its own run of blocks
/// (block tables are still handed out for recurrent models; no layer reads them here).
fn step(slot: u32, tokens: &[u32], start_pos: usize, num_logits: usize) -> SeqStep {
    let num_blocks = (start_pos + tokens.len()).div_ceil(BLOCK);
    SeqStep {
        id: u64::from(slot),
        tokens: tokens.to_vec(),
        start_pos,
        block_table: (0..num_blocks as u32).map(|b| slot * 16 + b).collect(),
        num_logits,
        sampling: None,
        state_slot: Some(slot),
        state_restore: None,
        state_save: None,
        lora_slot: None,
        embed: false,
    }
}

fn logits(exec: &GpuExecutor, seqs: Vec<SeqStep>) -> Vec<Vec<f32>> {
    weft::rt::block_on(exec.logits(&StepBatch { seqs, ..Default::default() })).unwrap()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
}

/// Every prompt prefilled in one step, then a decode step of all of them together for each
/// greedy token after the first, scanned each way.
fn fidelity(family: &str, path: &str) {
    for scan in SCANS {
        fidelity_of(family, path, scan);
    }
}

fn fidelity_of(family: &str, path: &str, scan: Option<usize>) {
    let Some(f) = factory() else { return };
    let exec = executor(&f, family, path, scan);
    let prompts = prompts(family);
    let path = format!("{family}/{path} (scan chunks {scan:?})");
    let seqs: Vec<SeqStep> =
        prompts.iter().enumerate().map(|(i, p)| step(i as u32, &u32s(&p["prompt_ids"]), 0, 1)).collect();
    let mut last = logits(&exec, seqs);
    let mut worst = 0f32;
    for (p, got) in prompts.iter().zip(&last) {
        let want = f32s(&p["last_logits"]);
        assert_eq!(got.len(), want.len());
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        worst = worst.max(diff);
        assert!(diff < 1e-4, "{path}: last-position logits differ by {diff}");
    }
    eprintln!("{path}: largest last-position logit difference {worst:e}");
    let mut tokens: Vec<Vec<u32>> = prompts.iter().map(|p| u32s(&p["prompt_ids"])).collect();
    let mut live: Vec<bool> = vec![true; prompts.len()];
    let num_greedy = prompts[0]["greedy_ids"].as_array().unwrap().len();
    for n in 0..num_greedy {
        for (i, p) in prompts.iter().enumerate() {
            if let (true, Some(steps)) = (live[i], p["greedy_top20"].as_array()) {
                for entry in steps[n].as_array().unwrap() {
                    let (id, want) = (entry[0].as_u64().unwrap() as usize, entry[1].as_f64().unwrap() as f32);
                    let diff = (last[i][id] - want).abs();
                    worst = worst.max(diff);
                    assert!(diff < 1e-4, "{path}: prompt {i} step {n}: logit of token {id} differs by {diff}");
                }
            }
            let got = argmax(&last[i]);
            let want = u32s(&p["greedy_ids"])[n];
            if live[i] && got != want {
                let margin = f32s(&p["greedy_margins"])[n];
                assert!(margin < 1e-3, "{path}: prompt {i} greedy token {n} is {got}, transformers says {want}");
                eprintln!("{path}: prompt {i} diverges at a near-tie (margin {margin}) at token {n}");
                live[i] = false;
            }
            tokens[i].push(got);
        }
        if n + 1 == num_greedy {
            break;
        }
        let seqs = tokens.iter().enumerate().map(|(i, t)| step(i as u32, &t[t.len() - 1..], t.len() - 1, 1)).collect();
        last = logits(&exec, seqs);
    }
    eprintln!("{path}: largest logit difference over prefill and decode {worst:e}");
}

#[test]
fn mamba2_hf_directory_matches_transformers() {
    fidelity("mamba2", "hf");
}

#[test]
fn mamba2_llama_cpp_gguf_matches_transformers() {
    fidelity("mamba2", "model.gguf");
}

#[test]
fn granite_hybrid_hf_directory_matches_transformers() {
    fidelity("granite_hybrid", "hf");
}

#[test]
fn granite_hybrid_llama_cpp_gguf_matches_transformers() {
    fidelity("granite_hybrid", "model.gguf");
}

#[test]
fn lfm2moe_hf_directory_matches_transformers() {
    fidelity("lfm2moe", "hf");
}

#[test]
fn lfm2moe_llama_cpp_gguf_matches_transformers() {
    fidelity("lfm2moe", "model.gguf");
}

#[test]
fn granite_hybrid_moe_hf_directory_matches_transformers() {
    fidelity("granite_hybrid_moe", "hf");
}

#[test]
fn granite_hybrid_moe_llama_cpp_gguf_matches_transformers() {
    fidelity("granite_hybrid_moe", "model.gguf");
}

#[test]
fn lfm2_hf_directory_matches_transformers() {
    fidelity("lfm2", "hf");
}

#[test]
fn lfm2_llama_cpp_gguf_matches_transformers() {
    fidelity("lfm2", "model.gguf");
}

#[test]
fn qwen35_hf_directory_matches_transformers() {
    fidelity("qwen35", "hf");
}

#[test]
fn qwen35_llama_cpp_gguf_matches_transformers() {
    fidelity("qwen35", "model.gguf");
}

#[test]
fn qwen35moe_hf_directory_matches_transformers() {
    fidelity("qwen35moe", "hf");
}

#[test]
fn qwen35moe_llama_cpp_gguf_matches_transformers() {
    fidelity("qwen35moe", "model.gguf");
}

/// `weft info --model` finds nothing lacking in either checkpoint of Qwen3.5 or Qwen3.5-MoE
/// (once refused as a mixture-of-experts weft did not run).
#[test]
fn qwen35_checkpoints_inspect_clean() {
    for (family, path, arch) in [
        ("qwen35", "model.gguf", "qwen35"),
        ("qwen35", "hf", "qwen3_5_text"),
        ("qwen35moe", "model.gguf", "qwen35moe"),
        ("qwen35moe", "hf", "qwen3_5_moe_text"),
    ] {
        let report = weft::model::inspect::inspect(&fixture(family, path)).unwrap();
        assert_eq!(report.architecture.as_deref(), Some(arch), "{report}");
        assert!(report.problems.is_empty(), "{report}");
        if family == "qwen35moe" {
            let text = report.to_string();
            assert!(
                text.contains(
                    "8 experts of MLP 32 (2 a token, weights renormalised) + a sigmoid-gated shared expert of MLP 64"
                ),
                "{text}"
            );
        }
    }
}

/// The shared expert's gate counts: without it (the shared expert's output added as it is, as
/// Granite MoE's is), the last-position logits move by far more than the fidelity tolerance,
/// from either checkpoint.
#[test]
fn qwen35moe_shared_expert_gate_is_visible() {
    let Some(f) = factory() else { return };
    for path in ["model.gguf", "hf"] {
        let mut files = ModelFiles::open(&fixture("qwen35moe", path)).unwrap();
        let moe = files.config.moe.as_mut().unwrap();
        assert!(moe.shared_expert_gated, "{path}");
        moe.shared_expert_gated = false;
        let exec = files.executor(&f, KvCacheConfig::new(BLOCK, 256)).unwrap();
        let prompts = prompts("qwen35moe");
        let seqs = prompts.iter().enumerate().map(|(i, p)| step(i as u32, &u32s(&p["prompt_ids"]), 0, 1)).collect();
        let diff = logits(&exec, seqs)
            .iter()
            .zip(&prompts)
            .flat_map(|(got, p)| {
                got.iter().zip(f32s(&p["last_logits"])).map(|(a, b)| (a - b).abs()).collect::<Vec<_>>()
            })
            .fold(0f32, f32::max);
        eprintln!("qwen35moe/{path} without its shared expert's gate: last-position logits differ by {diff}");
        assert!(diff > 1e-2, "{path}: the shared expert's gate moves logits by only {diff}");
    }
}

/// llama.cpp converts a Qwen3.5 with its multi-token-prediction layer after the trunk: counted
/// in block_count, named by nextn_predict_layers, marked not recurrent. The fixture rewritten
/// so (layer 3, an attention layer, copied as that 5th block, which would change every logit
/// if it ran) gives the same logits: weft runs the trunk only.
#[test]
fn qwen35_gguf_with_a_prediction_layer_runs_the_trunk_only() {
    use weft::model::gguf::MetaValue;
    fidelity_of_rewritten_gguf("qwen35", "mtp", |gguf, w| {
        w.metadata("qwen35.block_count", MetaValue::U32(5));
        w.metadata("qwen35.nextn_predict_layers", MetaValue::U32(1));
        let recurrent = [true, true, true, false, false].map(MetaValue::Bool).to_vec();
        w.metadata("qwen35.attention.recurrent_layers", MetaValue::Array(recurrent));
        for t in &gguf.tensors {
            w.tensor(&t.name, &t.dims, t.ggml_type, &gguf.tensor_bytes(t).unwrap());
            if let Some(rest) = t.name.strip_prefix("blk.3.") {
                w.tensor(&format!("blk.4.{rest}"), &t.dims, t.ggml_type, &gguf.tensor_bytes(t).unwrap());
            }
        }
    });
}

/// `family`'s GGUF rewritten by `rewrite`, which gets the fixture and a writer holding its
/// metadata (and no tensors) to change and fill.
fn rewritten_gguf(
    family: &str,
    rewrite: impl FnOnce(&weft::model::gguf::GgufFile, &mut weft::model::gguf::GgufWriter),
) -> Vec<u8> {
    let gguf = weft::model::gguf::GgufFile::open(&fixture(family, "model.gguf")).unwrap();
    let mut w = weft::model::gguf::GgufWriter::new();
    for (key, value) in &gguf.metadata {
        w.metadata(key, value.clone());
    }
    rewrite(&gguf, &mut w);
    w.to_bytes()
}

/// [`fidelity_of`] (scanning token by token) over `family`'s GGUF rewritten by `rewrite`.
fn fidelity_of_rewritten_gguf(
    family: &str,
    what: &str,
    rewrite: impl FnOnce(&weft::model::gguf::GgufFile, &mut weft::model::gguf::GgufWriter),
) {
    let path = std::env::temp_dir().join(format!("weft-{family}-{what}-{}.gguf", std::process::id()));
    std::fs::write(&path, rewritten_gguf(family, rewrite)).unwrap();
    fidelity_of(family, path.to_str().unwrap(), None);
    std::fs::remove_file(&path).unwrap();
}

/// Two GGUF layouts of the same weights: llama.cpp's converter with `--fuse-gate-up-exps`
/// writes each layer's routed gate and up experts as one `ffn_gate_up_exps` (experts, 2 · ff,
/// hidden): each expert's gate rows, then its up rows; and llama.cpp reads the shared expert's
/// gate as a vector (hidden), where this converter wrote a (1, hidden) matrix. The fixture
/// rewritten both ways gives the same logits.
#[test]
fn qwen35moe_gguf_with_fused_gate_up_experts_runs_the_same() {
    fidelity_of_rewritten_gguf("qwen35moe", "fused", |gguf, w| {
        let mut fused = 0;
        for t in &gguf.tensors {
            if t.name.contains(".ffn_up_exps.") {
                continue;
            }
            if t.name.ends_with(".ffn_gate_inp_shexp.weight") {
                w.tensor(&t.name, &t.dims[..1], t.ggml_type, &gguf.tensor_bytes(t).unwrap());
                continue;
            }
            let Some(prefix) = t.name.strip_suffix(".ffn_gate_exps.weight") else {
                w.tensor(&t.name, &t.dims, t.ggml_type, &gguf.tensor_bytes(t).unwrap());
                continue;
            };
            let up = gguf.tensor(&format!("{prefix}.ffn_up_exps.weight")).unwrap();
            let (gate, up) = (gguf.tensor_bytes(t).unwrap(), gguf.tensor_bytes(up).unwrap());
            let experts = t.dims[2] as usize;
            let per_expert = gate.len() / experts;
            let bytes: Vec<u8> = (0..experts)
                .flat_map(|e| [&gate[e * per_expert..][..per_expert], &up[e * per_expert..][..per_expert]])
                .flatten()
                .copied()
                .collect();
            w.tensor(
                &format!("{prefix}.ffn_gate_up_exps.weight"),
                &[t.dims[0], 2 * t.dims[1], t.dims[2]],
                t.ggml_type,
                &bytes,
            );
            fused += 1;
        }
        assert_eq!(fused, 4);
    });
}

/// A shared expert's gate of another width is refused at load, naming the tensor and the
/// shapes weft reads.
#[test]
fn qwen35moe_shared_gate_of_the_wrong_width_is_refused() {
    let Some(f) = factory() else { return };
    let bytes = rewritten_gguf("qwen35moe", |gguf, w| {
        for t in &gguf.tensors {
            let bytes = gguf.tensor_bytes(t).unwrap();
            match t.name.as_str() {
                "blk.0.ffn_gate_inp_shexp.weight" => w.tensor(&t.name, &[32], t.ggml_type, &bytes[..128]),
                _ => w.tensor(&t.name, &t.dims, t.ggml_type, &bytes),
            };
        }
    });
    let files = ModelFiles::from_gguf_bytes("narrow-gate.gguf", bytes).unwrap();
    let err = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).err().expect("a narrow gate loads").to_string();
    assert!(err.contains("blk.0.ffn_gate_inp_shexp.weight has shape [32], expected [64] or [1, 64]"), "{err}");
}

/// The published Qwen3.5 checkpoints are `Qwen3_5ForConditionalGeneration`s (the MoEs
/// `Qwen3_5MoeForConditionalGeneration`s): the text config under `text_config` (the tying
/// outside it) and the text model's tensors under `model.language_model.`, beside a vision
/// tower weft does not run; the MoEs' experts stacked per layer as transformers holds them
/// (`mlp.experts.gate_up_proj` (experts, 2 · ff, hidden), `mlp.experts.down_proj`), not one
/// matrix each as its save_pretrained writes them. Each fixture rewritten in that layout (with
/// a stand-in vision tensor) gives the same logits.
#[test]
fn qwen35_multimodal_checkpoint_layout_runs_its_text_model() {
    multimodal_layout("qwen35", "Qwen3_5ForConditionalGeneration", "qwen3_5");
    multimodal_layout("qwen35moe", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe");
}

fn multimodal_layout(family: &str, class: &str, model_type: &str) {
    let hf = fixture(family, "hf");
    let dir = std::env::temp_dir().join(format!("weft-{family}-vl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut text: Value = serde_json::from_str(&std::fs::read_to_string(hf.join("config.json")).unwrap()).unwrap();
    let tie = text["tie_word_embeddings"].take();
    let config = serde_json::json!({
        "architectures": [class],
        "model_type": model_type,
        "tie_word_embeddings": tie,
        "text_config": text,
        "vision_config": {"model_type": format!("{model_type}_vision"), "depth": 1},
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(hf.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let bytes = std::fs::read(hf.join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let vision = [0u8; 16];
    let stacked = stacked_experts(&tensors);
    let mut renamed: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .tensors()
        .into_iter()
        .filter(|(name, _)| !name.contains(".mlp.experts."))
        .chain(stacked.iter().map(|(name, shape, data)| {
            (name.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data).unwrap())
        }))
        .map(|(name, t)| (name.replacen("model.", "model.language_model.", 1), t))
        .collect();
    assert_eq!(stacked.is_empty(), family == "qwen35", "{family}: {} stacked tensors", stacked.len());
    let stand_in = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], &vision).unwrap();
    renamed.push(("model.visual.patch_embed.proj.bias".into(), stand_in));
    safetensors::serialize_to_file(renamed, None, &dir.join("model.safetensors")).unwrap();
    fidelity_of(family, dir.to_str().unwrap(), None);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each layer's per-expert matrices (`model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight`)
/// stacked as transformers holds them: `...experts.gate_up_proj` (experts, 2 · ff, hidden),
/// each expert's gate rows then its up rows, and `...experts.down_proj` (experts, hidden, ff).
fn stacked_experts(tensors: &safetensors::SafeTensors<'_>) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let mut stacked = Vec::new();
    for layer in 0.. {
        let prefix = format!("model.layers.{layer}.mlp.experts");
        let part = |e: usize, name: &str| tensors.tensor(&format!("{prefix}.{e}.{name}_proj.weight")).ok();
        let Some(first) = part(0, "down") else { break };
        let (hidden, ff) = (first.shape()[0], first.shape()[1]);
        let experts = (0..).take_while(|&e| part(e, "down").is_some()).count();
        let gate_up = (0..experts).flat_map(|e| ["gate", "up"].map(|n| part(e, n).unwrap().data().to_vec())).flatten();
        let down = (0..experts).flat_map(|e| part(e, "down").unwrap().data().to_vec());
        stacked.push((format!("{prefix}.gate_up_proj"), vec![experts, 2 * ff, hidden], gate_up.collect()));
        stacked.push((format!("{prefix}.down_proj"), vec![experts, hidden, ff], down.collect()));
    }
    stacked
}

/// The 33-token prompt alone, in chunks of 1, 3 and 8 tokens, and among 15 other sequences
/// (each prefilling or decoding in its own slot): the same logits bit for bit at the end of
/// the prompt and for 4 decode steps after it.
#[test]
fn batch_and_chunk_invariance() {
    for family in engine_families() {
        for scan in SCANS {
            batch_and_chunk_invariance_of(family, scan);
        }
    }
}

fn batch_and_chunk_invariance_of(family: &str, scan: Option<usize>) {
    let Some(f) = factory() else { return };
    let exec = executor(&f, family, "hf", scan);
    let prompt = u32s(&prompts(family)[2]["prompt_ids"]);
    let run = |chunk: usize, others: bool| -> Vec<Vec<f32>> {
        let mut out = Vec::new();
        let mut tokens = prompt.clone();
        let mut pos = 0usize;
        let mut step_no = 0;
        while out.len() < 5 {
            let end = pos.saturating_add(chunk).min(tokens.len());
            let num_logits = usize::from(end == tokens.len());
            let mut seqs = vec![step(0, &tokens[pos..end], pos, num_logits)];
            if others {
                // 15 neighbours: prefilling their own prompts from scratch each step.
                for slot in 1..16u32 {
                    let len = 1 + (slot as usize * 7 + step_no) % 9;
                    let t: Vec<u32> = (0..len as u32).map(|j| (slot * 31 + j * 7) % 300).collect();
                    seqs.insert((slot as usize) % 2 * seqs.len(), step(slot, &t, 0, 1));
                }
            }
            let rows = logits(&exec, seqs.clone());
            let mine = seqs.iter().position(|s| s.id == 0).unwrap();
            let row_of_mine: usize = seqs[..mine].iter().map(|s| s.num_logits).sum();
            pos = end;
            if num_logits == 1 {
                let l = rows[row_of_mine].clone();
                tokens.push(argmax(&l));
                out.push(l);
            }
            step_no += 1;
        }
        out
    };
    let alone = run(usize::MAX, false);
    let what = format!("{family} (scan chunks {scan:?})");
    for chunk in [1, 3, 8] {
        let chunked = run(chunk, false);
        if scan.is_none_or(|q| chunk % q == 0) {
            assert!(chunked == alone, "{what}: prefill in chunks of {chunk} differs from one pass");
        } else {
            // Cuts inside a scan chunk scan its rows token by token instead: the same sums in
            // another order.
            for (got, want) in chunked.iter().zip(&alone) {
                let diff = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(diff < 1e-4, "{what}: prefill in chunks of {chunk} differs by {diff}");
            }
        }
    }
    assert!(run(usize::MAX, true) == alone, "{what}: among 15 others differs from alone");
    assert!(run(8, true) == alone, "{what}: chunked among 15 others differs from alone");
}

/// Through the engine, for each family: 24 greedy requests, more than there are state slots (16), over a KV
/// pool small enough to preempt and a token budget that chunks prefills, give each request's
/// tokens alone; at the end every state slot and block is free again.
#[test]
fn the_engine_batches_preempts_and_returns_every_slot() {
    for family in engine_families() {
        for scan in SCANS {
            engine_run(family, scan);
        }
    }
}

fn engine_run(family: &str, scan: Option<usize>) {
    use std::sync::Arc;
    use weft::engine::request::{GenerationParams, InferenceRequest, Prompt};
    use weft::engine::{ContinuousBatchEngine, EngineConfig};
    use weft::sampling::{GpuSampler, SamplingParams};

    let Some(f) = factory() else { return };
    let files = ModelFiles::open(&fixture(family, "hf")).unwrap();
    let engine = |num_blocks: usize, config: EngineConfig| {
        let exec = files.executor(&f, KvCacheConfig::new(4, num_blocks)).unwrap();
        let exec = exec.with_scan_chunk(scan).unwrap();
        let tok = files.tokenizer.clone();
        ContinuousBatchEngine::new_plan_runtime(config, tok, Arc::new(GpuSampler), Arc::new(exec), Arc::new(f.clone()))
            .unwrap()
    };
    let requests: Vec<InferenceRequest> = (0..24)
        .map(|i| {
            let prompt: String = (0..(i * 5 % 17 + 1)).map(|j| char::from(b'a' + ((i * 3 + j) % 26) as u8)).collect();
            let params = GenerationParams {
                sampling: SamplingParams::greedy(),
                max_tokens: Some(i % 7 + 3),
                ignore_eos: true,
                ..Default::default()
            };
            InferenceRequest::new(Prompt::Text(prompt), params)
        })
        .collect();
    let alone = engine(256, EngineConfig::default());
    let want: Vec<Vec<u32>> =
        requests.iter().map(|r| weft::rt::block_on(alone.infer(r.clone())).unwrap().token_ids).collect();

    let e = engine(12, EngineConfig { max_num_batched_tokens: 16, ..Default::default() });
    let mut streams: Vec<_> = requests.iter().map(|r| e.submit(r.clone()).unwrap().1).collect();
    while weft::rt::block_on(e.step()).unwrap() {
        let usage = e.state_usage().unwrap();
        assert!(usage.used_slots <= 16);
    }
    for (i, s) in streams.iter_mut().enumerate() {
        let chunks: Vec<_> = weft::rt::block_on(futures::StreamExt::collect::<Vec<_>>(s));
        let got: Vec<u32> = chunks.iter().flat_map(|c| c.as_ref().unwrap().token_ids.clone()).collect();
        assert_eq!(got, want[i], "{family} (scan chunks {scan:?}): request {i}");
    }
    assert!(e.scheduler_stats().preemptions > 0, "the pool was meant to run out");
    assert_eq!(e.state_usage().unwrap().used_slots, 0);
    assert_eq!(e.kv_usage().used_blocks, 0);

    // DESIGN.md principle 2 for a recurrent model: the same workload again (other slots,
    // other states, the same shapes) creates no buffer, texture or bind group.
    let run = |e: &ContinuousBatchEngine| {
        let mut streams: Vec<_> = requests.iter().map(|r| e.submit(r.clone()).unwrap().1).collect();
        while weft::rt::block_on(e.step()).unwrap() {}
        for s in &mut streams {
            weft::rt::block_on(futures::StreamExt::collect::<Vec<_>>(s));
        }
    };
    let warm = f.context().creations();
    run(&e);
    assert_eq!(f.context().creations(), warm, "warm steps of a recurrent model created GPU objects");
}

/// A prefix-state hit equals a cold run: requests sharing a long system prompt restore the
/// state snapshotted at a block boundary inside it (and, in the hybrid, reuse its KV blocks),
/// and generate exactly what an engine without the prefix cache generates.
#[test]
fn a_prefix_state_hit_equals_a_cold_run() {
    for family in engine_families() {
        for scan in SCANS {
            prefix_hit(family, scan);
        }
    }
}

fn prefix_hit(family: &str, scan: Option<usize>) {
    use std::sync::Arc;
    use weft::engine::request::{GenerationParams, InferenceRequest, Prompt};
    use weft::engine::{ContinuousBatchEngine, EngineConfig};
    use weft::sampling::{GpuSampler, SamplingParams};

    let Some(f) = factory() else { return };
    let files = ModelFiles::open(&fixture(family, "hf")).unwrap();
    let engine = |enable_prefix_cache: bool| {
        let exec = files.executor(&f, KvCacheConfig::new(4, 256)).unwrap();
        let exec = exec.with_scan_chunk(scan).unwrap();
        let tok = files.tokenizer.clone();
        let config = EngineConfig { enable_prefix_cache, max_num_batched_tokens: 24, ..Default::default() };
        ContinuousBatchEngine::new_plan_runtime(config, tok, Arc::new(GpuSampler), Arc::new(exec), Arc::new(f.clone()))
            .unwrap()
    };
    let system = "the state of a sequence is carried from one token to the next; a selective scan keeps it. ";
    let requests: Vec<InferenceRequest> = ["what is a state?", "and a scan", "tokens, one by one", "why?"]
        .iter()
        .map(|question| {
            let params = GenerationParams {
                sampling: SamplingParams::greedy(),
                max_tokens: Some(6),
                ignore_eos: true,
                ..Default::default()
            };
            InferenceRequest::new(Prompt::Text(format!("{system}{question}")), params)
        })
        .collect();
    let cold = engine(false);
    let want: Vec<Vec<u32>> =
        requests.iter().map(|r| weft::rt::block_on(cold.infer(r.clone())).unwrap().token_ids).collect();
    let warm = engine(true);
    assert!(warm.config().enable_prefix_cache, "{family}: snapshots keep the prefix cache on");
    for (i, r) in requests.iter().enumerate() {
        let got = weft::rt::block_on(warm.infer(r.clone())).unwrap().token_ids;
        assert_eq!(got, want[i], "{family} (scan chunks {scan:?}): request {i} after a prefix-state hit");
    }
    let stats = warm.prefix_cache_stats();
    assert_eq!(stats.state_hits, 3, "{family}: every request after the first restores a snapshot ({stats:?})");
    assert!(stats.hits >= 3 * 4, "{family}: and reuses at least one interval of blocks");
    assert_eq!(warm.state_usage().unwrap().used_slots, 0);
}

/// The builder sizes the state slots from its state memory: half running, half snapshots, and
/// says so when not even one slot fits.
#[test]
fn the_builder_sizes_state_slots_from_memory() {
    let Some(f) = factory() else { return };
    let path = fixture("mamba2", "hf");
    // 2 layers of (3 · (128 + 2 · 2 · 16) conv + 8 · 16 · 16 state) f32 = 20992 bytes a slot.
    let slot_bytes = 2 * (3 * (128 + 64) + 8 * 16 * 16) * 4;
    let builder = weft::EngineBuilder::from_model(&path).unwrap().state_memory_bytes(5 * slot_bytes);
    let engine = builder.build_on(f.context().clone()).unwrap();
    let usage = engine.state_usage().unwrap();
    assert_eq!((usage.total_slots, usage.slot_size_bytes), (3, slot_bytes));
    let err = weft::EngineBuilder::from_model(&path)
        .unwrap()
        .state_memory_bytes(slot_bytes - 1)
        .build_on(f.context().clone())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("hold no recurrent-state slot"), "{err}");
}

/// The scan chunk the executor uses is the one the scheduler learns (`state_config`): token by
/// token by default on CPU drivers such as lavapipe, else what was asked; fewer than 2 rows a
/// chunk is refused, through the executor and through the builder.
#[test]
fn the_scan_chunk_is_reported_and_checked() {
    use weft::step::ModelExecutor;
    let Some(f) = factory() else { return };
    let files = ModelFiles::open(&fixture("mamba2", "hf")).unwrap();
    let kv = KvCacheConfig::new(BLOCK, 16);
    let exec = files.executor(&f, kv).unwrap();
    let cpu = f.context().kernel_family() == weft::gpu::KernelFamily::Cpu;
    let default = if cpu { 1 } else { weft::model::executor::SCAN_CHUNK_ROWS };
    assert_eq!(exec.state_config().unwrap().scan_chunk_tokens, default);
    let exec = exec.with_scan_chunk(Some(8)).unwrap();
    assert_eq!(exec.state_config().unwrap().scan_chunk_tokens, 8);
    let err = exec.with_scan_chunk(Some(1)).err().unwrap().to_string();
    assert!(err.contains("scan chunks of Some(1) rows; use at least 2, or none"), "{err}");
    let err = weft::EngineBuilder::from_model(fixture("mamba2", "hf"))
        .unwrap()
        .scan_chunk_rows(Some(0))
        .build_on(f.context().clone())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("use at least 2"), "{err}");
}
