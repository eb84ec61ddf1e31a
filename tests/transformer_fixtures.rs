//! Attention models against outside truth, from tiny random-weight transformers models written
//! by tools (each with transformers' logits and greedy tokens):
//!
//! - `tests/fixtures/phi3/` (`tools/make_phi3_fixtures.py`): a `Phi3ForCausalLM` with LongRoPE
//!   (original context 32, context 128) — its Hugging Face directory and the GGUF llama.cpp's
//!   `convert_hf_to_gguf.py` made of it (fused `attn_qkv`, gate and up stacked in `ffn_up`,
//!   `rope_factors_short` / `rope_factors_long`, `rope.scaling.attn_factor`) — and the chat
//!   template transformers rendered.
//! - `tests/fixtures/gemma3/` (`tools/make_gemma3_fixtures.py`): a `Gemma3ForCausalLM` as a
//!   Hugging Face directory (norms stored as w, used as 1 + w; five sliding-window layers of
//!   window 8, then a global one, each kind with its RoPE base; query_pre_attn_scalar 24).
//! - `tests/fixtures/qwen3_yarn/` (`tools/make_yarn_fixtures.py`): a `Qwen3ForCausalLM` with
//!   YaRN (factor 4, original context 32, context 128), both checkpoints, and transformers' own
//!   YaRN frequencies and attention scaling.
//! - `tests/fixtures/phi3_partial/` (`tools/make_yarn_fixtures.py`): Phi-4-mini's shape in
//!   miniature, a `Phi3ForCausalLM` whose RoPE rotates 12 of each head's 16 dimensions
//!   (`partial_rotary_factor` 0.75; the GGUF's `rope.dimension_count` 12), with LongRoPE's 6
//!   short and 6 long factors and tied embeddings, both checkpoints.
//! - `tests/fixtures/granite/` (`tools/make_dense_fixtures.py`): a `GraniteForCausalLM` (IBM
//!   Granite 3.x dense) with its four multipliers far from their defaults (embedding 12,
//!   residual 0.22, attention 0.75, logits divided by 6), both checkpoints.
//! - `tests/fixtures/smollm3/` (`tools/make_dense_fixtures.py`): a `SmolLM3ForCausalLM` of 4
//!   layers whose last is NoPE (`no_rope_layers` [1, 1, 1, 0]; llama.cpp's fixed step of 4),
//!   tied embeddings, both checkpoints.
//! - `tests/fixtures/olmo2/` (`tools/make_dense_fixtures.py`): an `Olmo2ForCausalLM`: norms of
//!   the attention and MLP outputs, none before them, and q_norm / k_norm over the whole q and k
//!   projections, both checkpoints.
//! - `tests/fixtures/qwen3moe/` (`tools/make_moe_fixtures.py`): a `Qwen3MoeForCausalLM`: Qwen3
//!   attention, then in every layer 8 experts of which each token takes the top 2 by the
//!   router's softmax, renormalised (`norm_topk_prob`), both checkpoints (transformers' one
//!   matrix per expert; llama.cpp's stacked `ffn_*_exps`). The router's weights are drawn wide,
//!   so no token's second and third experts nearly tie (the smallest gap in probability is
//!   2.6e-5, far above f32's summation-order noise), and the routing matches transformers'.
//! - `tests/fixtures/granitemoe/` (`tools/make_moe_fixtures.py`): a
//!   `GraniteMoeSharedForCausalLM`: Granite's multipliers, 8 experts a layer of which each token
//!   takes the top 2 (softmax of their logits), plus a shared expert every token runs, both
//!   checkpoints (transformers' fused `input_linear` per layer; llama.cpp's `ffn_*_exps` and
//!   `ffn_*_shexp`); smallest router gap 4.3e-4.
//!
//! - `tests/fixtures/gpt_oss/` (`tools/make_moe_fixtures.py --only gpt_oss`): a
//!   `GptOssForCausalLM`: biased q/k/v/o, a sink logit per head, a sliding window of 8 in layer
//!   0 and full attention in layer 1, YaRN (factor 4, original context 32, untruncated), and 8
//!   biased experts with the clamped SwiGLU of which each token takes its top 2 router logits,
//!   softmaxed; both checkpoints (transformers' fused, interleaved `gate_up_proj`; llama.cpp's
//!   split `ffn_gate_exps` / `ffn_up_exps`), 32 greedy tokens. The smallest gap between a
//!   token's second and third router logit is 1.4e-2; about 7% of the experts' gate/up values
//!   reach the SwiGLU limit. `tests/fixtures/gpt_oss_mxfp4/` is the same model with MXFP4
//!   experts (transformers' `*_blocks` / `*_scales`, which llama.cpp repacks and weft repacks
//!   at load the same way), both checkpoints.
//!
//! transformers picks LongRoPE's factors per forward pass (long once a position passes 32);
//! weft picks them by the context it serves, as llama.cpp does. So Phi-3's two short prompts (at
//! most 29 positions) run on a model opened for a 32-position context (short factors), the
//! 33-token prompt on the full 128 (long factors): each checkpoint is held to transformers
//! under both factor sets, and the attention factor applies to both.
//!
//! - The last prompt position's logits agree within 1e-4: both run f32 over a few layers of
//!   width 64 and differ only in summation order (about 1e-6 on lavapipe, printed), while the
//!   wrong factor set, a missing attention factor, a swapped gate/up half, a norm without its
//!   1 + w, YaRN left out or the whole head rotated instead of its first 12 dimensions moves
//!   logits by 1e-2 or more, as does rotating SmolLM3's NoPE layer; a Granite multiplier left
//!   at its default moves them by 1e-3 or more (the attention scale, behind Granite's residual
//!   and logit scaling, moves them least: about 5e-3); `*_visible` below checks the last four.
//! - 12 greedy tokens (32 for gpt-oss) are equal; a divergence is tolerated only right after a step whose
//!   reference top-1/top-2 margin is below 1e-3 (a near-tie), after which that prompt is no
//!   longer compared.

use std::path::{Path, PathBuf};

use serde_json::Value;
use weft::gpu::{GpuOptions, GpuTensorFactory};
use weft::kv::KvCacheConfig;
use weft::model::config::RopeScaling;
use weft::model::executor::GpuExecutor;
use weft::model::load::ModelFiles;
use weft::step::{SeqStep, StepBatch};
use weft::tokenizer::{ChatMessage, Tokenizer};

const BLOCK: usize = 16;
/// The fixture's original (pre-LongRoPE) context.
const ORIGINAL_CONTEXT: usize = 32;

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(path)
}

/// `family`'s expected.json.
fn expected_of(family: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(&format!("{family}/expected.json"))).unwrap()).unwrap()
}

fn expected() -> Value {
    expected_of("phi3")
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// Sequence `i`'s step: `tokens` at `start_pos`, in its own run of 16 blocks.
fn step(i: usize, tokens: &[u32], start_pos: usize) -> SeqStep {
    let num_blocks = (start_pos + tokens.len()).div_ceil(BLOCK);
    SeqStep {
        id: i as u64,
        tokens: tokens.to_vec(),
        start_pos,
        block_table: (0..num_blocks as u32).map(|b| i as u32 * 16 + b).collect(),
        num_logits: 1,
        ..Default::default()
    }
}

fn logits(exec: &GpuExecutor, seqs: Vec<SeqStep>) -> Vec<Vec<f32>> {
    weft::rt::block_on(exec.logits(&StepBatch { seqs, ..Default::default() })).unwrap()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
}

/// Phi-3's prompts that stay on one side of the original context, run on `path` opened for
/// `context` positions.
fn phi3_fidelity(f: &GpuTensorFactory, path: &str, context: usize) {
    longrope_fidelity(f, "phi3", path, context);
}

/// [`phi3_fidelity`] of `family`'s fixture (a Phi-3 with LongRoPE).
fn longrope_fidelity(f: &GpuTensorFactory, family: &str, path: &str, context: usize) {
    let long = context > ORIGINAL_CONTEXT;
    let prompts: Vec<Value> = expected_of(family)["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| (p["prompt_ids"].as_array().unwrap().len() > ORIGINAL_CONTEXT) == long)
        .cloned()
        .collect();
    let name = format!("{family}/{path} ({} factors)", if long { "long" } else { "short" });
    fidelity(f, &format!("{family}/{path}"), Some(context), &prompts, &name);
}

/// `prompts` run on `path` (opened for `context` positions when given): prefilled together,
/// then 11 decode steps together.
fn fidelity(f: &GpuTensorFactory, path: &str, context: Option<usize>, prompts: &[Value], name: &str) {
    let mut files = ModelFiles::open(&fixture(path)).unwrap();
    if let Some(context) = context {
        files.config.max_position_embeddings = context;
    }
    let exec = files.executor(f, KvCacheConfig::new(BLOCK, 64)).unwrap();
    assert!(!prompts.is_empty());
    let seqs = prompts.iter().enumerate().map(|(i, p)| step(i, &u32s(&p["prompt_ids"]), 0)).collect();
    let mut last = logits(&exec, seqs);
    let mut worst = 0f32;
    for (p, got) in prompts.iter().zip(&last) {
        let want = f32s(&p["last_logits"]);
        assert_eq!(got.len(), want.len());
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        worst = worst.max(diff);
        assert!(diff < 1e-4, "{name}: last-position logits differ by {diff}");
    }
    eprintln!("{name}: largest last-position logit difference {worst:e}");
    let mut tokens: Vec<Vec<u32>> = prompts.iter().map(|p| u32s(&p["prompt_ids"])).collect();
    let mut live = vec![true; prompts.len()];
    for n in 0..u32s(&prompts[0]["greedy_ids"]).len() {
        for (i, p) in prompts.iter().enumerate() {
            let got = argmax(&last[i]);
            let want = u32s(&p["greedy_ids"])[n];
            if live[i] && got != want {
                let margin = f32s(&p["greedy_margins"])[n];
                assert!(margin < 1e-3, "{name}: prompt {i} greedy token {n} is {got}, transformers says {want}");
                eprintln!("{name}: prompt {i} diverges at a near-tie (margin {margin}) at token {n}");
                live[i] = false;
            }
            tokens[i].push(got);
        }
        let seqs = tokens.iter().enumerate().map(|(i, t)| step(i, &t[t.len() - 1..], t.len() - 1)).collect();
        last = logits(&exec, seqs);
    }
}

fn factory() -> Option<GpuTensorFactory> {
    weft::gpu::open_or_skip(GpuOptions::default()).unwrap().map(GpuTensorFactory::new)
}

#[test]
fn gemma3_hf_directory_matches_transformers() {
    let Some(f) = factory() else { return };
    let prompts = expected_of("gemma3")["prompts"].as_array().unwrap().clone();
    fidelity(&f, "gemma3/hf", None, &prompts, "gemma3/hf");
}

#[test]
fn phi3_llama_cpp_gguf_matches_transformers_with_short_and_long_factors() {
    let Some(f) = factory() else { return };
    phi3_fidelity(&f, "model.gguf", ORIGINAL_CONTEXT);
    phi3_fidelity(&f, "model.gguf", 128);
}

#[test]
fn phi3_hf_directory_matches_transformers_with_short_and_long_factors() {
    let Some(f) = factory() else { return };
    phi3_fidelity(&f, "hf", ORIGINAL_CONTEXT);
    phi3_fidelity(&f, "hf", 128);
}

/// The factor set matters at this size: a short prompt on a model opened for the full context
/// (long factors) is far from transformers' short-factor logits, so the fidelity tests above
/// tell the two sets apart.
#[test]
fn phi3_wrong_factor_set_is_visible() {
    let Some(f) = factory() else { return };
    let files = ModelFiles::open(&fixture("phi3/model.gguf")).unwrap();
    let exec = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
    let p = &expected()["prompts"][1];
    let got = logits(&exec, vec![step(0, &u32s(&p["prompt_ids"]), 0)]).remove(0);
    let diff = got.iter().zip(f32s(&p["last_logits"])).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff > 1e-2, "long factors on a short prompt differ by only {diff}");
}

/// Both checkpoints describe the same LongRoPE: the GGUF's factor tensors and attention factor
/// are config.json's factors and transformers' default sqrt(1 + ln 4 / ln 32).
#[test]
fn phi3_checkpoints_read_the_same_longrope() {
    let gguf = ModelFiles::open(&fixture("phi3/model.gguf")).unwrap().config;
    let hf = ModelFiles::open(&fixture("phi3/hf")).unwrap().config;
    let Some(RopeScaling::LongRope { short, long, original_max_position_embeddings, attention_factor }) =
        &gguf.rope_scaling
    else {
        panic!("the GGUF's LongRoPE was not read: {:?}", gguf.rope_scaling)
    };
    assert_eq!(*original_max_position_embeddings, ORIGINAL_CONTEXT);
    assert_eq!(short[..3], [1.0, 1.5, 2.0]);
    assert_eq!(long[..3], [2.0, 5.0, 8.0]);
    let want = (1.0f64 + 4f64.ln() / 32f64.ln()).sqrt() as f32;
    assert!((attention_factor - want).abs() < 1e-6, "{attention_factor} vs {want}");
    let Some(RopeScaling::LongRope { attention_factor: hf_factor, .. }) = &hf.rope_scaling else {
        panic!("config.json's LongRoPE was not read: {:?}", hf.rope_scaling)
    };
    assert!((hf_factor - want).abs() < 1e-6);
    assert_eq!(gguf.inv_freq_for_context(32), hf.inv_freq_for_context(32));
    assert_eq!(gguf.inv_freq_for_context(128), hf.inv_freq_for_context(128));
    assert_ne!(gguf.inv_freq_for_context(32), gguf.inv_freq_for_context(128));
}

/// The chat template the GGUF carries renders as transformers renders Phi-3's.
#[test]
fn phi3_gguf_chat_template_renders_as_transformers_does() {
    let files = ModelFiles::open(&fixture("phi3/model.gguf")).unwrap();
    let chat = &expected()["chat"];
    let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
    let rendered = files.tokenizer.chat_template().unwrap().render(&messages, true).unwrap();
    assert_eq!(rendered, chat["text"].as_str().unwrap());
}

/// The largest difference between `path`'s last-position logits for `family`'s prompt `i` and
/// transformers'.
fn last_logits_diff(exec: &GpuExecutor, family: &str, i: usize) -> f32 {
    let p = &expected_of(family)["prompts"][i];
    let got = logits(exec, vec![step(0, &u32s(&p["prompt_ids"]), 0)]).remove(0);
    got.iter().zip(f32s(&p["last_logits"])).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max)
}

#[test]
fn qwen3_yarn_hf_directory_matches_transformers() {
    let Some(f) = factory() else { return };
    let prompts = expected_of("qwen3_yarn")["prompts"].as_array().unwrap().clone();
    fidelity(&f, "qwen3_yarn/hf", None, &prompts, "qwen3_yarn/hf");
}

#[test]
fn qwen3_yarn_llama_cpp_gguf_matches_transformers() {
    let Some(f) = factory() else { return };
    let prompts = expected_of("qwen3_yarn")["prompts"].as_array().unwrap().clone();
    fidelity(&f, "qwen3_yarn/model.gguf", None, &prompts, "qwen3_yarn/model.gguf");
}

/// Both checkpoints read the same YaRN, whose frequencies and cos/sin scale are transformers'
/// (`rotary_emb.inv_freq`, `attention_scaling`) to f32 rounding: each frequency is a few f32
/// operations (a power, two quotients, a blend), within 4 ulp.
#[test]
fn qwen3_yarn_checkpoints_read_transformers_frequencies() {
    let rope = &expected_of("qwen3_yarn")["rope"];
    let (want_freq, want_scale) = (f32s(&rope["inv_freq"]), rope["attention_scaling"].as_f64().unwrap());
    for path in ["qwen3_yarn/model.gguf", "qwen3_yarn/hf"] {
        let config = ModelFiles::open(&fixture(path)).unwrap().config;
        let Some(RopeScaling::Yarn { factor, original_max_position_embeddings, attention_factor, .. }) =
            config.rope_scaling
        else {
            panic!("{path}: YaRN was not read: {:?}", config.rope_scaling)
        };
        assert_eq!((factor, original_max_position_embeddings), (4.0, ORIGINAL_CONTEXT), "{path}");
        assert!((f64::from(attention_factor) - want_scale).abs() < 1e-6, "{path}: {attention_factor} vs {want_scale}");
        let got = config.inv_freq();
        assert_eq!(got.len(), want_freq.len());
        for (i, (g, w)) in got.iter().zip(&want_freq).enumerate() {
            assert!((g - w).abs() <= 4.0 * f32::EPSILON * w, "{path}: inv_freq[{i}] = {g} vs transformers' {w}");
        }
    }
}

/// YaRN matters at this size: the same model with plain RoPE is far from transformers.
#[test]
fn qwen3_yarn_is_visible() {
    let Some(f) = factory() else { return };
    let mut files = ModelFiles::open(&fixture("qwen3_yarn/model.gguf")).unwrap();
    files.config.rope_scaling = None;
    let exec = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
    let diff = last_logits_diff(&exec, "qwen3_yarn", 2);
    eprintln!("qwen3_yarn without YaRN: last-position logits differ by {diff}");
    assert!(diff > 1e-2, "plain RoPE differs from YaRN by only {diff}");
}

#[test]
fn phi3_partial_rotary_llama_cpp_gguf_matches_transformers_with_short_and_long_factors() {
    let Some(f) = factory() else { return };
    longrope_fidelity(&f, "phi3_partial", "model.gguf", ORIGINAL_CONTEXT);
    longrope_fidelity(&f, "phi3_partial", "model.gguf", 128);
}

#[test]
fn phi3_partial_rotary_hf_directory_matches_transformers_with_short_and_long_factors() {
    let Some(f) = factory() else { return };
    longrope_fidelity(&f, "phi3_partial", "hf", ORIGINAL_CONTEXT);
    longrope_fidelity(&f, "phi3_partial", "hf", 128);
}

/// Both checkpoints say RoPE rotates 12 of 16 dimensions (config.json's
/// `partial_rotary_factor` 0.75, the GGUF's `rope.dimension_count`), with 6 LongRoPE factors.
#[test]
fn phi3_partial_checkpoints_read_the_same_rotary_dims() {
    for path in ["phi3_partial/model.gguf", "phi3_partial/hf"] {
        let config = ModelFiles::open(&fixture(path)).unwrap().config;
        assert_eq!((config.head_dim, config.rotary_dim, config.rope_dim()), (16, Some(12), 12), "{path}");
        let Some(RopeScaling::LongRope { short, long, .. }) = &config.rope_scaling else {
            panic!("{path}: LongRoPE was not read: {:?}", config.rope_scaling)
        };
        assert_eq!((short.len(), long.len()), (6, 6), "{path}");
        assert_eq!(config.inv_freq_for_context(32).len(), 6, "{path}");
    }
}

/// Rotating the whole head instead (what a full-head RoPE with these factors would do) is far
/// from transformers, so the fidelity tests above tell partial rotary apart.
#[test]
fn phi3_partial_rotary_is_visible() {
    let Some(f) = factory() else { return };
    let mut files = ModelFiles::open(&fixture("phi3_partial/model.gguf")).unwrap();
    files.config.max_position_embeddings = ORIGINAL_CONTEXT;
    files.config.rotary_dim = None;
    if let Some(RopeScaling::LongRope { short, long, .. }) = &mut files.config.rope_scaling {
        // Factors for the whole head: the checkpoint's, then 1s for the extra dimensions.
        short.resize(8, 1.0);
        long.resize(8, 1.0);
    }
    let exec = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
    let diff = last_logits_diff(&exec, "phi3_partial", 1);
    eprintln!("phi3_partial rotating whole heads: last-position logits differ by {diff}");
    assert!(diff > 1e-2, "rotating whole heads differs by only {diff}");
}

/// `family`'s prompts, all of them, run on `family/path`.
fn fixture_fidelity(f: &GpuTensorFactory, family: &str, path: &str) {
    let prompts = expected_of(family)["prompts"].as_array().unwrap().clone();
    let name = format!("{family}/{path}");
    fidelity(f, &name, None, &prompts, &name);
}

#[test]
fn granite_llama_cpp_gguf_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "granite", "model.gguf");
}

#[test]
fn granite_hf_directory_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "granite", "hf");
}

/// Both checkpoints read Granite's four multipliers (config.json's `*_multiplier` and
/// `logits_scaling`, the GGUF's `embedding_scale`, `residual_scale`, `attention.scale`,
/// `logit_scale`).
#[test]
fn granite_checkpoints_read_the_same_multipliers() {
    for path in ["granite/model.gguf", "granite/hf"] {
        let config = ModelFiles::open(&fixture(path)).unwrap().config;
        let m = config.multipliers.unwrap_or_else(|| panic!("{path}: no multipliers"));
        assert_eq!((m.embedding, m.residual, m.attention, m.logits_scaling), (12.0, 0.22, 0.75, 6.0), "{path}");
    }
}

/// Each multiplier matters at this size: any one left at its neutral value moves logits ten
/// times the fidelity tolerance or more from transformers'.
#[test]
fn granite_multipliers_are_visible() {
    let Some(f) = factory() else { return };
    type Reset = fn(&mut weft::model::config::Multipliers);
    let neutral: [(&str, Reset); 4] = [
        ("embedding", |m| m.embedding = 1.0),
        ("residual", |m| m.residual = 1.0),
        ("attention", |m| m.attention = 0.25),
        ("logits", |m| m.logits_scaling = 1.0),
    ];
    for (name, reset) in neutral {
        let mut files = ModelFiles::open(&fixture("granite/model.gguf")).unwrap();
        reset(files.config.multipliers.as_mut().unwrap());
        let exec = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
        let diff = last_logits_diff(&exec, "granite", 1);
        eprintln!("granite without its {name} multiplier: last-position logits differ by {diff}");
        assert!(diff > 1e-3, "the {name} multiplier moves logits by only {diff}");
    }
}

#[test]
fn smollm3_llama_cpp_gguf_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "smollm3", "model.gguf");
}

#[test]
fn smollm3_hf_directory_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "smollm3", "hf");
}

/// Both checkpoints make the fourth layer NoPE: config.json's `no_rope_layers`, llama.cpp's
/// fixed step for the GGUF (which has no key for it).
#[test]
fn smollm3_checkpoints_read_the_same_nope_layers() {
    for path in ["smollm3/model.gguf", "smollm3/hf"] {
        let config = ModelFiles::open(&fixture(path)).unwrap().config;
        assert_eq!((config.num_layers, config.no_rope_layers.as_slice()), (4, &[3][..]), "{path}");
    }
}

/// NoPE matters at this size: rotating the fourth layer too moves logits far from
/// transformers'.
#[test]
fn smollm3_nope_layer_is_visible() {
    let Some(f) = factory() else { return };
    let mut files = ModelFiles::open(&fixture("smollm3/model.gguf")).unwrap();
    files.config.no_rope_layers.clear();
    let exec = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
    let diff = last_logits_diff(&exec, "smollm3", 1);
    eprintln!("smollm3 with RoPE in every layer: last-position logits differ by {diff}");
    assert!(diff > 1e-2, "rotating the NoPE layer differs by only {diff}");
}

#[test]
fn olmo2_llama_cpp_gguf_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "olmo2", "model.gguf");
}

#[test]
fn olmo2_hf_directory_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "olmo2", "hf");
}

#[test]
fn qwen3moe_llama_cpp_gguf_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "qwen3moe", "model.gguf");
}

#[test]
fn qwen3moe_hf_directory_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "qwen3moe", "hf");
}

#[test]
fn granitemoe_llama_cpp_gguf_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "granitemoe", "model.gguf");
}

#[test]
fn granitemoe_hf_directory_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "granitemoe", "hf");
}

/// The shared expert counts: left out, Granite MoE's logits move by far more than the
/// tolerance.
#[test]
fn granitemoe_shared_expert_is_visible() {
    let Some(f) = factory() else { return };
    let mut files = ModelFiles::open(&fixture("granitemoe/model.gguf")).unwrap();
    let moe = files.config.moe.as_mut().unwrap();
    assert_eq!(moe.shared_expert_size, 64);
    moe.shared_expert_size = 0;
    let exec = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
    let diff = last_logits_diff(&exec, "granitemoe", 1);
    eprintln!("granitemoe without its shared expert: last-position logits differ by {diff}");
    assert!(diff > 1e-2, "the shared expert moves logits by only {diff}");
}

/// A sigmoid gate on the shared expert is Qwen3.5-MoE's: a Granite MoE directory asked for one
/// is refused, naming what weft reads, not run without it.
#[test]
fn a_gated_shared_expert_outside_qwen35moe_is_refused() {
    let Some(f) = factory() else { return };
    let mut files = ModelFiles::open(&fixture("granitemoe/hf")).unwrap();
    files.config.moe.as_mut().unwrap().shared_expert_gated = true;
    let err = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).err().expect("a gated Granite MoE loads").to_string();
    assert!(err.contains("weft reads gated shared experts of Qwen3.5-MoE only"), "{err}");
}

/// The routing is live: without renormalising the top-2 weights, or with one expert a token
/// instead of two, the logits move by far more than the tolerance.
#[test]
fn qwen3moe_routing_is_visible() {
    let Some(f) = factory() else { return };
    for (what, change) in [
        (
            "unnormalised expert weights",
            (|m: &mut weft::model::config::MoeConfig| {
                m.routing = weft::model::config::Routing::Softmax { normalize: false }
            }) as fn(&mut _),
        ),
        ("one expert a token", |m| m.experts_per_token = 1),
    ] {
        let mut files = ModelFiles::open(&fixture("qwen3moe/model.gguf")).unwrap();
        change(files.config.moe.as_mut().unwrap());
        let exec = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
        let diff = last_logits_diff(&exec, "qwen3moe", 1);
        eprintln!("qwen3moe with {what}: last-position logits differ by {diff}");
        assert!(diff > 1e-2, "{what} differs by only {diff}");
    }
}

/// Batch invariance with experts: each prompt's tokens reach different experts (all 8 are
/// chosen over the fixture's prompts, `tools/make_moe_fixtures.py` prints them), yet a prompt
/// prefilled, then decoded, beside the others gives the bits it gives alone.
#[test]
fn qwen3moe_batch_is_invariant() {
    let Some(f) = factory() else { return };
    moe_batch_is_invariant(&f, "qwen3moe");
}

#[test]
fn gpt_oss_llama_cpp_gguf_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "gpt_oss", "model.gguf");
}

#[test]
fn gpt_oss_hf_directory_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "gpt_oss", "hf");
}

/// gpt-oss with its experts in MXFP4, as OpenAI ships them: transformers read them through its
/// own MXFP4 decoder, llama.cpp's converter repacked them into GGUF MXFP4 `ffn_*_exps`, and
/// weft runs them in that format (the file's experts checked to be MXFP4).
#[test]
fn gpt_oss_mxfp4_experts_match_transformers() {
    let gguf = weft::model::gguf::GgufFile::open(&fixture("gpt_oss_mxfp4/model.gguf")).unwrap();
    for part in ["gate", "up", "down"] {
        let t = gguf.tensor(&format!("blk.1.ffn_{part}_exps.weight")).unwrap();
        assert_eq!(t.ggml_type, weft::model::gguf::GgmlType::MXFP4, "{part}");
    }
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "gpt_oss_mxfp4", "model.gguf");
}

/// The same from the Hugging Face directory itself (transformers' `*_blocks` / `*_scales`,
/// repacked at load as llama.cpp's converter does).
#[test]
fn gpt_oss_mxfp4_hf_directory_matches_transformers() {
    let Some(f) = factory() else { return };
    fixture_fidelity(&f, "gpt_oss_mxfp4", "hf");
}

/// Both checkpoints read the same gpt-oss: sliding window 8 in layer 0 only, biases, YaRN
/// untruncated (the GGUF has no key for it), softmax over the top-2 logits, the clamped SwiGLU.
#[test]
fn gpt_oss_checkpoints_read_the_same_config() {
    use weft::model::config::{ExpertGate, Routing};
    for path in ["gpt_oss/model.gguf", "gpt_oss/hf"] {
        let c = ModelFiles::open(&fixture(path)).unwrap().config;
        assert_eq!((c.sliding_window, c.is_sliding(0), c.is_sliding(1)), (Some(8), true, false), "{path}");
        assert!(c.attention_bias, "{path}");
        let moe = c.moe.unwrap();
        assert_eq!((moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size), (8, 2, 32), "{path}");
        assert_eq!((moe.routing, moe.gate), (Routing::TopKSoftmax, ExpertGate::SwigluOai), "{path}");
        match c.rope_scaling {
            Some(RopeScaling::Yarn { factor, original_max_position_embeddings, truncate, .. }) => {
                assert_eq!((factor, original_max_position_embeddings, truncate), (4.0, 32, false), "{path}")
            }
            other => panic!("{path}: rope scaling {other:?}"),
        }
    }
}

/// What gpt-oss adds is visible at this size: a softmax over all experts (unrenormalised)
/// instead of over the top 2, plain SwiGLU instead of the clamped one, full attention in the
/// sliding layer, or YaRN's ramp rounded (llama.cpp's way) each move logits far past the
/// tolerance. (Sinks are held to the CPU oracle in the kernel tests, with and without.)
#[test]
fn gpt_oss_features_are_visible() {
    use weft::model::config::{ExpertGate, ModelConfig, Routing};
    let Some(f) = factory() else { return };
    type Change = fn(&mut ModelConfig);
    let changes: [(&str, Change, f32); 4] = [
        (
            "a softmax over all experts",
            |c| c.moe.as_mut().unwrap().routing = Routing::Softmax { normalize: false },
            1e-2,
        ),
        ("silu(gate) · up", |c| c.moe.as_mut().unwrap().gate = ExpertGate::Silu, 1e-2),
        ("no sliding window", |c| c.sliding_window = None, 1e-3),
        (
            "YaRN truncated",
            |c| {
                if let Some(RopeScaling::Yarn { truncate, .. }) = &mut c.rope_scaling {
                    *truncate = true;
                }
            },
            1e-3,
        ),
    ];
    for (what, change, at_least) in changes {
        let mut files = ModelFiles::open(&fixture("gpt_oss/model.gguf")).unwrap();
        change(&mut files.config);
        let exec = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
        // The longest prompt (33 tokens): past the window of 8 and the original context of 32.
        let diff = last_logits_diff(&exec, "gpt_oss", 2);
        eprintln!("gpt_oss with {what}: last-position logits differ by {diff}");
        assert!(diff > at_least, "{what} differs by only {diff}");
    }
}

/// gpt-oss's batch invariance, as Qwen3-MoE's: its prompts reach all 8 experts.
#[test]
fn gpt_oss_batch_is_invariant() {
    let Some(f) = factory() else { return };
    moe_batch_is_invariant(&f, "gpt_oss");
}

/// `family`'s prompts prefilled, then decoded three greedy steps, together and each alone:
/// the same bits.
fn moe_batch_is_invariant(f: &GpuTensorFactory, family: &str) {
    let exec = ModelFiles::open(&fixture(&format!("{family}/model.gguf")))
        .unwrap()
        .executor(f, KvCacheConfig::new(BLOCK, 64))
        .unwrap();
    let prompts: Vec<Vec<u32>> =
        expected_of(family)["prompts"].as_array().unwrap().iter().map(|p| u32s(&p["prompt_ids"])).collect();
    // Prefill then three greedy decode steps; returns every step's logits.
    let run = |which: &[usize]| -> Vec<Vec<Vec<f32>>> {
        let mut tokens: Vec<Vec<u32>> = which.iter().map(|&i| prompts[i].clone()).collect();
        let mut seqs: Vec<SeqStep> = which.iter().zip(&tokens).map(|(&i, t)| step(i, t, 0)).collect();
        let mut steps = Vec::new();
        for _ in 0..4 {
            let out = logits(&exec, seqs);
            for (t, l) in tokens.iter_mut().zip(&out) {
                t.push(argmax(l));
            }
            seqs = which.iter().zip(&tokens).map(|(&i, t)| step(i, &t[t.len() - 1..], t.len() - 1)).collect();
            steps.push(out);
        }
        steps
    };
    let together = run(&[0, 1, 2]);
    for i in 0..prompts.len() {
        let alone = run(&[i]);
        for (n, (a, b)) in alone.iter().zip(&together).enumerate() {
            let same = a[0].iter().zip(&b[i]).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "prompt {i} step {n}: logits alone differ from those beside the other prompts");
        }
    }
}

/// Gemma 4's prompts: all four, or the first alone in the GPU families' runs
/// (`WEFT_ONE_PROMPT=1`, outside `WEFT_FULL=1`).
fn gemma4_prompts() -> Vec<Value> {
    let mut prompts = expected_of("gemma4")["prompts"].as_array().unwrap().clone();
    let env = |name: &str| std::env::var(name).as_deref() == Ok("1");
    if env("WEFT_ONE_PROMPT") && !env("WEFT_FULL") {
        prompts.truncate(1);
    }
    prompts
}

#[test]
fn gemma4_llama_cpp_gguf_matches_transformers() {
    let Some(f) = factory() else { return };
    fidelity(&f, "gemma4/model.gguf", None, &gemma4_prompts(), "gemma4/model.gguf");
}

/// llama.cpp's converter writes Gemma 4's layout in its own keys (per-layer KV heads and MLP
/// widths, `*_swa`, `rope_freqs`' 1e30s, `shared_kv_layers`); both checkpoints read the same.
#[test]
fn gemma4_checkpoints_read_the_same_config() {
    let gguf = ModelFiles::open(&fixture("gemma4/model.gguf")).unwrap().config;
    let hf = ModelFiles::open(&fixture("gemma4/hf")).unwrap().config;
    let g = gguf.gemma4.as_ref().unwrap();
    assert_eq!(g.sliding, [true, true, true, false, true, false]);
    assert_eq!((g.global_head_dim, g.global_kv_heads, g.global_rope_angles, g.k_eq_v), (32, 1, 4, true));
    assert_eq!(
        (g.kv_sources.as_slice(), g.intermediate_sizes.as_slice()),
        (&[0, 1, 2, 3, 2, 3][..], &[96, 96, 96, 96, 192, 192][..])
    );
    assert_eq!((g.per_layer_input_size, g.per_layer_vocab_size, g.final_logit_softcapping), (32, 304, Some(5.0)));
    assert_eq!(gguf.gemma4, hf.gemma4);
    let shape = |c: &weft::model::config::ModelConfig| {
        (c.num_heads, c.num_kv_heads, c.head_dim, c.rope_theta, c.rope_local_theta, c.sliding_window, c.rms_norm_eps)
    };
    assert_eq!(shape(&gguf), shape(&hf));
}

#[test]
fn gemma4_hf_directory_matches_transformers() {
    let Some(f) = factory() else { return };
    fidelity(&f, "gemma4/hf", None, &gemma4_prompts(), "gemma4/hf");
}

/// The published checkpoints' full-attention heads of 512 (`gemma4_wide`: 2 query heads and
/// 1 KV head of 512 in layers 1 and 3, the sliding ones of 16; tools/make_gemma4_fixtures.py
/// --wide), both checkpoints, its one prompt of 33 tokens past the window of 8 and 12 greedy
/// tokens: transformers' logits within 1e-4 and its tokens.
#[test]
fn gemma4_wide_heads_match_transformers() {
    let Some(f) = factory() else { return };
    let prompts = expected_of("gemma4_wide")["prompts"].as_array().unwrap().clone();
    for path in ["gemma4_wide/hf", "gemma4_wide/model.gguf"] {
        let g = ModelFiles::open(&fixture(path)).unwrap().config.gemma4.unwrap();
        assert_eq!((g.global_head_dim, g.global_kv_heads, g.global_rope_angles), (512, 1, 64), "{path}");
        fidelity(&f, path, None, &prompts, path);
    }
}

/// The fixture exercises what Gemma 4 adds: each changed alone moves the longest prompt's last
/// logits (33 tokens: past the sliding window of 8) ten times the fidelity tolerance or more.
/// Reading another sliding layer's cache in layer 4 shows that the KV-sharing layers attend
/// over the cache they are given (and that their source's cache holds this step's keys).
#[test]
fn gemma4_features_are_visible() {
    let Some(f) = factory() else { return };
    type Change = fn(&mut weft::model::config::Gemma4Config);
    let changes: [(&str, Change); 4] = [
        ("no per-layer embeddings", |g| g.per_layer_input_size = 0),
        ("layer 4 reading layer 0's cache instead of layer 2's", |g| g.kv_sources[4] = 0),
        ("no final soft-cap", |g| g.final_logit_softcapping = None),
        ("whole heads rotated in the full layers", |g| g.global_rope_angles = g.global_head_dim / 2),
    ];
    for (what, change) in changes {
        let mut files = ModelFiles::open(&fixture("gemma4/hf")).unwrap();
        change(files.config.gemma4.as_mut().unwrap());
        let exec = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
        let diff = last_logits_diff(&exec, "gemma4", 2);
        eprintln!("gemma4 with {what}: last-position logits differ by {diff}");
        assert!(diff > 1e-3, "{what} differs by only {diff}");
    }
}

/// The KV-sharing layers own no cache: the pool holds K and V for 4 of the 6 layers, each of its
/// own shape (2 KV heads of 16 in the sliding layers, 1 of 32 in the full one).
#[test]
fn gemma4_shared_layers_take_no_kv_memory() {
    let config = ModelFiles::open(&fixture("gemma4/hf")).unwrap().config;
    let shapes: Vec<Option<(usize, usize)>> = (0..config.num_layers).map(|i| config.kv_shape(i)).collect();
    assert_eq!(shapes, [Some((2, 16)), Some((2, 16)), Some((2, 16)), Some((1, 32)), None, None]);
    assert_eq!((config.kv_source(4), config.kv_source(5)), (2, 3));
    assert_eq!(config.kv_token_values(), 3 * 32 + 32);
}

/// The 33-token prompt alone in one pass, in chunks of 1, 3 and 8 tokens, and beside the other
/// prompts, then three greedy decode steps: the same bits every way.
#[test]
fn gemma4_batch_and_chunk_invariance() {
    let Some(f) = factory() else { return };
    let exec = ModelFiles::open(&fixture("gemma4/hf")).unwrap().executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
    let prompts: Vec<Vec<u32>> =
        expected_of("gemma4")["prompts"].as_array().unwrap().iter().map(|p| u32s(&p["prompt_ids"])).collect();
    // Prompt 2 prefilled `chunk` tokens a step (beside the other prompts' whole prefills
    // when `others`), then three decode steps; prompt 2's logits after each.
    let run = |chunk: usize, others: bool| -> Vec<Vec<f32>> {
        let mut tokens = prompts[2].clone();
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < tokens.len() {
            let end = pos.saturating_add(chunk).min(tokens.len());
            let mut seqs = vec![step(2, &tokens[pos..end], pos)];
            if others && pos == 0 {
                seqs.extend([0, 1, 3].iter().map(|&i| step(i, &prompts[i], 0)));
            }
            let last = logits(&exec, seqs).swap_remove(0);
            pos = end;
            if pos == tokens.len() && out.len() < 4 {
                tokens.push(argmax(&last));
                out.push(last);
            }
        }
        out
    };
    let alone = run(usize::MAX, false);
    assert_eq!(alone.len(), 4);
    assert!(run(usize::MAX, true) == alone, "prompt 2 beside the others differs from alone");
    for chunk in [1, 3, 8] {
        assert!(run(chunk, false) == alone, "prompt 2 prefilled in chunks of {chunk} differs from one pass");
    }
}

/// What weft cannot run of Gemma 4 is refused by name: its mixture-of-experts layers (26B A4B),
/// full-attention heads past attention's 512 dimensions (the published checkpoints' size), and
/// an MLP activation other than the tanh GELU.
#[test]
fn gemma4_refusals_name_the_feature() {
    use weft::model::config::ModelConfig;
    let text = std::fs::read_to_string(fixture("gemma4/hf/config.json")).unwrap();
    let base: Value = serde_json::from_str(&text).unwrap();
    let refusal = |change: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        change(&mut v);
        ModelConfig::from_hf_json("config.json", &v.to_string()).unwrap_err().to_string()
    };
    let experts = refusal(&|v| {
        v["enable_moe_block"] = true.into();
        v["num_experts"] = 128.into();
    });
    assert!(experts.contains("mixture-of-experts") && experts.contains("128 experts"), "{experts}");
    let wide = refusal(&|v| v["per_layer_config"]["3"]["head_dim"] = 1024.into());
    assert!(wide.contains("heads of 1024 dimensions") && wide.contains("at most 512"), "{wide}");
    let act = refusal(&|v| v["hidden_activation"] = "silu".into());
    assert!(act.contains("hidden_activation \"silu\""), "{act}");
    assert!(ModelConfig::from_hf_json("config.json", &text).is_ok());
}
