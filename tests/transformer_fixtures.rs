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
//! - `tests/fixtures/gemma4moe/` (`tools/make_gemma4_fixtures.py --only gemma4moe`): Gemma 4's
//!   mixture-of-experts layers (as the 26B A4B): in each of 6 layers the dense GeGLU MLP beside
//!   8 GeGLU experts of 32, top 2, routed from the residual stream under the router's own norm
//!   and scale, weights renormalised then scaled per expert (0.56 to 1.53), each branch with its
//!   own norms; both checkpoints (transformers' stacked `experts.gate_up_proj`; llama.cpp's
//!   fused `ffn_gate_up_exps` and `ffn_down_exps.scale`), 32 greedy tokens. All 8 experts are
//!   reached; the smallest gap between a token's second and third router probability is 9.5e-5.
//!   The four prompts together are 64 tokens: the experts run grouped by expert.
//! - `tests/fixtures/gemma3n/` (`tools/make_gemma3n_fixtures.py`): a `Gemma3nForCausalLM`:
//!   AltUp over 4 streams, Laurel of rank 32, activation sparsity 0.95 in the first two layers,
//!   per-layer embeddings, KV sharing in the last two layers, MLP widths differing by layer,
//!   both checkpoints, 4 prompts and 32 greedy tokens. Its logits are held to the same 1e-4: the
//!   same f32 arithmetic in another order, a few more norms deep (AltUp's streams are f32 sums of
//!   4 terms; printed differences are about 1e-6).
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

/// A Gemma fixture's prompts (`gemma4`, `gemma3n`): all four, or the first alone in the GPU
/// families' runs (`WEFT_ONE_PROMPT=1`, outside `WEFT_FULL=1`).
fn gemma_prompts(name: &str) -> Vec<Value> {
    let mut prompts = expected_of(name)["prompts"].as_array().unwrap().clone();
    let env = |name: &str| std::env::var(name).as_deref() == Ok("1");
    if env("WEFT_ONE_PROMPT") && !env("WEFT_FULL") {
        prompts.truncate(1);
    }
    prompts
}

#[test]
fn gemma4_llama_cpp_gguf_matches_transformers() {
    let Some(f) = factory() else { return };
    fidelity(&f, "gemma4/model.gguf", None, &gemma_prompts("gemma4"), "gemma4/model.gguf");
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
    fidelity(&f, "gemma4/hf", None, &gemma_prompts("gemma4"), "gemma4/hf");
}

/// The published checkpoints' full-attention heads of 512 (`gemma4_wide`: 2 query heads and
/// 1 KV head of 512 in layers 1 and 3, the sliding ones of 16; tools/make_gemma4_fixtures.py
/// --only gemma4_wide), both checkpoints, its one prompt of 33 tokens past the window of 8 and 12 greedy
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
    batch_and_chunk_invariance(&f, "gemma4");
}

/// [`gemma4_batch_and_chunk_invariance`] for the fixture `name` (its `hf/`, four prompts).
fn batch_and_chunk_invariance(f: &GpuTensorFactory, name: &str) {
    let hf = format!("{name}/hf");
    let exec = ModelFiles::open(&fixture(&hf)).unwrap().executor(f, KvCacheConfig::new(BLOCK, 64)).unwrap();
    let prompts: Vec<Vec<u32>> =
        expected_of(name)["prompts"].as_array().unwrap().iter().map(|p| u32s(&p["prompt_ids"])).collect();
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

/// What weft cannot run of Gemma 4 is refused by name: experts without their number
/// (`enable_moe_block` alone), full-attention heads past attention's 512 dimensions (the
/// published checkpoints' size), and an MLP activation other than the tanh GELU.
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
    let experts = refusal(&|v| v["enable_moe_block"] = true.into());
    assert!(experts.contains("missing or malformed metadata num_experts"), "{experts}");
    let wide = refusal(&|v| v["per_layer_config"]["3"]["head_dim"] = 1024.into());
    assert!(wide.contains("heads of 1024 dimensions") && wide.contains("at most 512"), "{wide}");
    let act = refusal(&|v| v["hidden_activation"] = "silu".into());
    assert!(act.contains("hidden_activation \"silu\""), "{act}");
    assert!(ModelConfig::from_hf_json("config.json", &text).is_ok());
}

#[test]
fn gemma4moe_llama_cpp_gguf_matches_transformers() {
    let Some(f) = factory() else { return };
    fidelity(&f, "gemma4moe/model.gguf", None, &gemma_prompts("gemma4moe"), "gemma4moe/model.gguf");
}

#[test]
fn gemma4moe_hf_directory_matches_transformers() {
    let Some(f) = factory() else { return };
    fidelity(&f, "gemma4moe/hf", None, &gemma_prompts("gemma4moe"), "gemma4moe/hf");
}

/// llama.cpp's converter writes Gemma 4's experts under the generic `expert_*` keys; both
/// checkpoints read the same experts, and the layers' shape as the dense Gemma 4's reads.
#[test]
fn gemma4moe_checkpoints_read_the_same_config() {
    use weft::model::config::{ExpertGate, Routing};
    let gguf = ModelFiles::open(&fixture("gemma4moe/model.gguf")).unwrap().config;
    let hf = ModelFiles::open(&fixture("gemma4moe/hf")).unwrap().config;
    let m = gguf.moe.expect("the GGUF's experts");
    assert_eq!((m.num_experts, m.experts_per_token, m.expert_intermediate_size), (8, 2, 32));
    assert_eq!(
        (m.routing, m.gate, m.shared_expert_size),
        (Routing::Softmax { normalize: true }, ExpertGate::GeluTanh, 0)
    );
    assert_eq!(gguf.moe, hf.moe);
    assert_eq!(gguf.gemma4, hf.gemma4);
    assert_eq!((gguf.intermediate_size, hf.intermediate_size), (96, 96));
}

/// The routing is live: one or three experts a token instead of two move the longest prompt's
/// last logits ten times the tolerance or more. (Leaving the top-2 weights unnormalised moves
/// them by only about 1e-3: a factor common to a token's experts cancels in post_ffw_norm_2
/// but for its epsilon; the per-expert scales, which change the experts' ratio, are held to
/// transformers by the fidelity tests.)
#[test]
fn gemma4moe_routing_is_visible() {
    let Some(f) = factory() else { return };
    type Change = fn(&mut weft::model::config::MoeConfig);
    let changes: [(&str, Change); 2] =
        [("one expert a token", |m| m.experts_per_token = 1), ("three experts a token", |m| m.experts_per_token = 3)];
    for (what, change) in changes {
        let mut files = ModelFiles::open(&fixture("gemma4moe/hf")).unwrap();
        change(files.config.moe.as_mut().unwrap());
        let exec = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
        let diff = last_logits_diff(&exec, "gemma4moe", 2);
        eprintln!("gemma4moe with {what}: last-position logits differ by {diff}");
        assert!(diff > 1e-3, "{what} differs by only {diff}");
    }
}

/// Batch invariance with experts, as the dense Gemma 4's: the fixture's prompts reach all 8
/// experts; the 33-token prompt alone (row by row) and beside the other three (64 tokens: the
/// experts grouped by expert), prefilled whole and in chunks, gives the same bits.
#[test]
fn gemma4moe_batch_and_chunk_invariance() {
    let Some(f) = factory() else { return };
    let lengths: usize =
        expected_of("gemma4moe")["prompts"].as_array().unwrap().iter().map(|p| u32s(&p["prompt_ids"]).len()).sum();
    assert!(lengths >= weft::model::layers::GROUPED_MIN_TOKENS, "the batch of all prompts runs the experts row by row");
    batch_and_chunk_invariance(&f, "gemma4moe");
}

/// `weft info --model` finds nothing lacking in either checkpoint of the Gemma 4 with experts
/// (once refused as a mixture-of-experts weft did not run), and says what runs.
#[test]
fn gemma4moe_checkpoints_inspect_clean() {
    for (path, arch) in [("gemma4moe/model.gguf", "gemma4"), ("gemma4moe/hf", "gemma4_text")] {
        let report = weft::model::inspect::inspect(&fixture(path)).unwrap();
        assert_eq!(report.architecture.as_deref(), Some(arch), "{report}");
        assert!(report.problems.is_empty(), "{report}");
        let text = report.to_string();
        let experts = "8 experts of MLP 32 (2 a token, weights renormalised, GeGLU) + a dense MLP 96";
        assert!(text.contains(experts), "{text}");
    }
}

/// The Gemma 4 with experts' GGUF rewritten by `rewrite` (each tensor given with its bytes; it
/// writes what it keeps), in a temporary file.
fn rewritten_gemma4moe(
    what: &str,
    rewrite: impl Fn(&str, &[u64], &[u8], &mut weft::model::gguf::GgufWriter),
) -> PathBuf {
    let gguf = weft::model::gguf::GgufFile::open(&fixture("gemma4moe/model.gguf")).unwrap();
    let mut w = weft::model::gguf::GgufWriter::new();
    for (key, value) in &gguf.metadata {
        w.metadata(key, value.clone());
    }
    for t in &gguf.tensors {
        assert_eq!(t.ggml_type, weft::model::gguf::GgmlType::F32, "{}", t.name);
        rewrite(&t.name, &t.dims, &gguf.tensor_bytes(t).unwrap(), &mut w);
    }
    let path = std::env::temp_dir().join(format!("weft-gemma4moe-{what}-{}.gguf", std::process::id()));
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

/// llama.cpp reads a Gemma 4 layer's gate and up experts fused (`ffn_gate_up_exps`, what this
/// converter writes) or split (`ffn_gate_exps`, `ffn_up_exps`); the fixture rewritten split
/// holds to transformers the same.
#[test]
fn gemma4moe_gguf_with_split_gate_up_experts_matches_transformers() {
    let Some(f) = factory() else { return };
    let path = rewritten_gemma4moe("split", |name, dims, bytes, w| {
        let f32 = weft::model::gguf::GgmlType::F32;
        let Some(prefix) = name.strip_suffix(".ffn_gate_up_exps.weight") else {
            w.tensor(name, dims, f32, bytes);
            return;
        };
        // (experts, 2 · ff, hidden): each expert's gate rows, then its up rows.
        let (experts, half) = (dims[2] as usize, bytes.len() / dims[2] as usize / 2);
        let part = |which: usize| -> Vec<u8> {
            (0..experts).flat_map(|e| bytes[(2 * e + which) * half..][..half].iter().copied()).collect()
        };
        let split = [dims[0], dims[1] / 2, dims[2]];
        w.tensor(&format!("{prefix}.ffn_gate_exps.weight"), &split, f32, &part(0));
        w.tensor(&format!("{prefix}.ffn_up_exps.weight"), &split, f32, &part(1));
    });
    let prompts = gemma_prompts("gemma4moe");
    fidelity(&f, path.to_str().unwrap(), None, &prompts, "gemma4moe split");
    std::fs::remove_file(&path).unwrap();
}

/// What Gemma 4 adds to its routing and experts shows: each changed alone in the GGUF moves the
/// longest prompt's last logits ten times the fidelity tolerance or more. The per-expert scales
/// left out (llama.cpp then scales by 1), the router's input scale set to 1, and the experts'
/// and the MLP's post-norms swapped.
#[test]
fn gemma4moe_router_scales_and_norms_are_visible() {
    let Some(f) = factory() else { return };
    type Rewrite = fn(&str, &[u64], &[u8], &mut weft::model::gguf::GgufWriter);
    let changes: [(&str, Rewrite); 3] = [
        ("no-expert-scales", |name, dims, bytes, w| {
            if !name.ends_with(".ffn_down_exps.scale") {
                w.tensor(name, dims, weft::model::gguf::GgmlType::F32, bytes);
            }
        }),
        ("router-scale-1", |name, dims, bytes, w| {
            let ones: Vec<u8> = std::iter::repeat_n(1f32.to_le_bytes(), bytes.len() / 4).flatten().collect();
            let bytes = if name.ends_with(".ffn_gate_inp.scale") { &ones[..] } else { bytes };
            w.tensor(name, dims, weft::model::gguf::GgmlType::F32, bytes);
        }),
        ("post-norms-swapped", |name, dims, bytes, w| {
            let name = match name.rsplit_once(".post_ffw_norm_") {
                Some((layer, "1.weight")) => format!("{layer}.post_ffw_norm_2.weight"),
                Some((layer, "2.weight")) => format!("{layer}.post_ffw_norm_1.weight"),
                _ => name.to_string(),
            };
            w.tensor(&name, dims, weft::model::gguf::GgmlType::F32, bytes);
        }),
    ];
    for (what, rewrite) in changes {
        let path = rewritten_gemma4moe(what, rewrite);
        let exec = ModelFiles::open(&path).unwrap().executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
        let diff = last_logits_diff(&exec, "gemma4moe", 2);
        std::fs::remove_file(&path).unwrap();
        eprintln!("gemma4moe with {what}: last-position logits differ by {diff}");
        assert!(diff > 1e-3, "{what} differs by only {diff}");
    }
}

#[test]
fn gemma3n_hf_directory_matches_transformers() {
    let Some(f) = factory() else { return };
    fidelity(&f, "gemma3n/hf", None, &gemma_prompts("gemma3n"), "gemma3n/hf");
}

#[test]
fn gemma3n_llama_cpp_gguf_matches_transformers() {
    let Some(f) = factory() else { return };
    fidelity(&f, "gemma3n/model.gguf", None, &gemma_prompts("gemma3n"), "gemma3n/model.gguf");
}

/// Both checkpoints read the same model. The sparsity's cutoff is the outside truth for weft's
/// normal quantile: the GGUF carries torch's `icdf(0.95)` (f32) as llama.cpp's converter wrote
/// it, the Hugging Face config only 0.95, which weft turns into the same f32.
#[test]
fn gemma3n_checkpoints_read_the_same_config() {
    let gguf = ModelFiles::open(&fixture("gemma3n/model.gguf")).unwrap().config;
    let hf = ModelFiles::open(&fixture("gemma3n/hf")).unwrap().config;
    let g = gguf.gemma4.as_ref().unwrap();
    let x = g.gemma3n.as_ref().unwrap();
    assert_eq!(g.sliding, [true, true, true, false, true, false]);
    assert_eq!(
        (g.kv_sources.as_slice(), g.intermediate_sizes.as_slice()),
        (&[0, 1, 2, 3, 2, 3][..], &[96, 64, 96, 96, 64, 96][..])
    );
    assert_eq!((g.per_layer_input_size, g.per_layer_vocab_size, g.final_logit_softcapping), (32, 304, Some(5.0)));
    assert_eq!((x.altup_num_inputs, x.altup_active_idx, x.altup_correct_scale, x.laurel_rank), (4, 0, true, 32));
    let cut = Some(1.644_853_6f32);
    assert_eq!(x.sparsity_std_multipliers, [cut, cut, None, None, None, None]);
    assert_eq!(gguf.gemma4, hf.gemma4);
    let shape = |c: &weft::model::config::ModelConfig| {
        (c.num_heads, c.num_kv_heads, c.head_dim, c.rope_theta, c.rope_local_theta, c.sliding_window, c.rms_norm_eps)
    };
    assert_eq!(shape(&gguf), shape(&hf));
    assert_eq!((gguf.architecture.as_str(), hf.architecture.as_str()), ("gemma3n", "gemma3n_text"));
}

/// A multimodal Gemma 3n's `config.json` (model_type "gemma3n") is read through its
/// `text_config`, the towers' configs ignored; its weights are looked up under
/// `model.language_model.` (`Gemma3nForConditionalGeneration`'s names).
#[test]
fn gemma3n_multimodal_config_reads_its_text_config() {
    use weft::model::config::ModelConfig;
    let text: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("gemma3n/hf/config.json")).unwrap()).unwrap();
    let outer = serde_json::json!({
        "model_type": "gemma3n",
        "architectures": ["Gemma3nForConditionalGeneration"],
        "text_config": text,
        "vision_config": {"model_type": "gemma3n_vision"},
        "audio_config": {"model_type": "gemma3n_audio"},
    });
    let wrapped = ModelConfig::from_hf_json("config.json", &outer.to_string()).unwrap();
    let plain = ModelConfig::from_hf_json("config.json", &text.to_string()).unwrap();
    assert_eq!(wrapped.architecture, "gemma3n");
    assert_eq!(wrapped.gemma4, plain.gemma4);
    let bare = serde_json::json!({"model_type": "gemma3n"});
    let err = ModelConfig::from_hf_json("config.json", &bare.to_string()).unwrap_err().to_string();
    assert!(err.contains("text_config"), "{err}");
}

/// The fixture exercises what Gemma 3n adds: each changed alone moves the longest prompt's
/// last logits (33 tokens: past the window of 8) ten times the fidelity tolerance or more.
#[test]
fn gemma3n_features_are_visible() {
    let Some(f) = factory() else { return };
    type Change = fn(&mut weft::model::config::Gemma4Config);
    let changes: [(&str, Change); 4] = [
        ("no activation sparsity", |g| g.gemma3n.as_mut().unwrap().sparsity_std_multipliers.fill(None)),
        ("no correct_output_scale", |g| g.gemma3n.as_mut().unwrap().altup_correct_scale = false),
        ("layer 4 reading layer 0's cache instead of layer 2's", |g| g.kv_sources[4] = 0),
        ("no final soft-cap", |g| g.final_logit_softcapping = None),
    ];
    for (what, change) in changes {
        let mut files = ModelFiles::open(&fixture("gemma3n/hf")).unwrap();
        change(files.config.gemma4.as_mut().unwrap());
        let exec = files.executor(&f, KvCacheConfig::new(BLOCK, 64)).unwrap();
        let diff = last_logits_diff(&exec, "gemma3n", 2);
        eprintln!("gemma3n with {what}: last-position logits differ by {diff}");
        assert!(diff > 1e-3, "{what} differs by only {diff}");
    }
}

/// A Gemma 4 GGUF with experts but without a layer's router input scale is refused at load,
/// naming the tensor, rather than run with some other scale.
#[test]
fn gemma4moe_gguf_without_its_router_scale_is_refused() {
    let Some(f) = factory() else { return };
    let path = rewritten_gemma4moe("no-router-scale", |name, dims, bytes, w| {
        if name != "blk.2.ffn_gate_inp.scale" {
            w.tensor(name, dims, weft::model::gguf::GgmlType::F32, bytes);
        }
    });
    let err = ModelFiles::open(&path).unwrap().executor(&f, KvCacheConfig::new(BLOCK, 64)).err();
    std::fs::remove_file(&path).unwrap();
    let err = err.expect("a Gemma 4 without a router scale loads").to_string();
    assert!(err.contains("blk.2.ffn_gate_inp.scale"), "{err}");
}

/// The 33-token prompt alone, in chunks and beside the others: the same bits every way (the
/// AltUp streams and the sparsity's row statistics are per token).
#[test]
fn gemma3n_batch_and_chunk_invariance() {
    let Some(f) = factory() else { return };
    batch_and_chunk_invariance(&f, "gemma3n");
}

/// What weft cannot run of a Gemma 3n config is refused by name.
#[test]
fn gemma3n_refusals_name_the_feature() {
    use weft::model::config::ModelConfig;
    let text = std::fs::read_to_string(fixture("gemma3n/hf/config.json")).unwrap();
    let base: Value = serde_json::from_str(&text).unwrap();
    let refusal = |change: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        change(&mut v);
        ModelConfig::from_hf_json("config.json", &v.to_string()).unwrap_err().to_string()
    };
    let act = refusal(&|v| v["hidden_activation"] = "silu".into());
    assert!(act.contains("hidden_activation \"silu\""), "{act}");
    let streams = refusal(&|v| v["altup_num_inputs"] = 9.into());
    assert!(streams.contains("altup_num_inputs is 9") && streams.contains("2 to 8"), "{streams}");
    let active = refusal(&|v| v["altup_active_idx"] = 4.into());
    assert!(active.contains("altup_active_idx 4 of 4"), "{active}");
    let rope = refusal(&|v| v["rope_parameters"]["full_attention"]["rope_type"] = "yarn".into());
    assert!(rope.contains("rope_type \"yarn\""), "{rope}");
    let sparsity = refusal(&|v| v["activation_sparsity_pattern"] = serde_json::json!([0.95]));
    assert!(sparsity.contains("do not cover the model's 6 layers"), "{sparsity}");
    assert!(ModelConfig::from_hf_json("config.json", &text).is_ok());
}

/// A multimodal Gemma 3n directory (`Gemma3nForConditionalGeneration`: model_type "gemma3n",
/// the text model's weights under `model.language_model.`) runs its text model: the fixture's
/// directory rewritten so (same tensor bytes, renamed; the config wrapped as `text_config`)
/// matches transformers as the plain one does.
#[test]
fn gemma3n_multimodal_directory_runs_its_text_model() {
    let Some(f) = factory() else { return };
    let src = fixture("gemma3n/hf");
    let dir = std::env::temp_dir().join(format!("weft-gemma3n-multimodal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let text: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let config =
        serde_json::json!({"model_type": "gemma3n", "text_config": text, "vision_config": {}, "audio_config": {}});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    // safetensors: an 8-byte little-endian header length, the JSON header, then the data, which
    // the header's offsets index from its end, so renaming keys leaves the data as it is.
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let renamed: serde_json::Map<String, Value> = header
        .into_iter()
        .map(|(k, v)| match k.strip_prefix("model.") {
            Some(rest) => (format!("model.language_model.{rest}"), v),
            None => (k, v),
        })
        .collect();
    let mut header = serde_json::to_vec(&renamed).unwrap();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(&bytes[8 + header_len..]);
    std::fs::write(dir.join("model.safetensors"), out).unwrap();
    let prompts = &gemma_prompts("gemma3n")[..1];
    fidelity(&f, dir.to_str().unwrap(), None, prompts, "gemma3n multimodal directory");
    assert_eq!(ModelFiles::open(&dir).unwrap().config.architecture, "gemma3n");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A Gemma 3n GGUF's metadata is read as llama.cpp's converter writes it, and what is missing
/// or beyond weft is refused naming the key: a small file of metadata and the three tensors the
/// config reads its sizes from (the token tables' rows, Laurel's rank).
#[test]
fn gemma3n_gguf_config_names_what_is_wrong() {
    use weft::model::config::ModelConfig;
    use weft::model::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
    type Meta = Vec<(&'static str, MetaValue)>;
    let gguf = |change: &dyn Fn(&mut Meta)| {
        let mut meta = vec![
            ("general.architecture", MetaValue::String("gemma3n".into())),
            ("gemma3n.block_count", MetaValue::U32(2)),
            ("gemma3n.context_length", MetaValue::U32(128)),
            ("gemma3n.embedding_length", MetaValue::U32(64)),
            ("gemma3n.feed_forward_length", MetaValue::Array(vec![MetaValue::I32(96), MetaValue::I32(64)])),
            ("gemma3n.attention.head_count", MetaValue::U32(4)),
            ("gemma3n.attention.head_count_kv", MetaValue::U32(2)),
            ("gemma3n.attention.key_length", MetaValue::U32(16)),
            ("gemma3n.attention.sliding_window", MetaValue::U32(8)),
            (
                "gemma3n.attention.sliding_window_pattern",
                MetaValue::Array(vec![MetaValue::Bool(true), MetaValue::Bool(false)]),
            ),
            ("gemma3n.altup.num_inputs", MetaValue::U32(4)),
            ("gemma3n.embedding_length_per_layer_input", MetaValue::U32(32)),
            (
                "gemma3n.activation_sparsity_scale",
                MetaValue::Array(vec![MetaValue::F32(1.5), MetaValue::F32(f32::NEG_INFINITY)]),
            ),
        ];
        change(&mut meta);
        let mut w = GgufWriter::new();
        for (key, value) in meta {
            w.metadata(key, value);
        }
        w.tensor("token_embd.weight", &[64, 8], GgmlType::F32, &[0; 64 * 8 * 4])
            .tensor("per_layer_token_embd.weight", &[64, 8], GgmlType::F32, &[0; 64 * 8 * 4])
            .tensor("blk.0.laurel_l.weight", &[64, 16], GgmlType::F32, &[0; 64 * 16 * 4]);
        ModelConfig::from_gguf(&GgufFile::from_bytes("gemma3n.gguf", w.to_bytes()).unwrap())
    };
    let c = gguf(&|_| {}).unwrap();
    let x = c.gemma4.as_ref().unwrap().gemma3n.as_ref().unwrap();
    assert_eq!((x.altup_num_inputs, x.laurel_rank, x.altup_correct_scale), (4, 16, false));
    assert_eq!(x.sparsity_std_multipliers, [Some(1.5), None]);
    assert_eq!(c.gemma4.as_ref().unwrap().intermediate_sizes, [96, 64]);
    let err = |change: &dyn Fn(&mut Meta)| gguf(change).unwrap_err().to_string();
    let missing = err(&|m| m.retain(|(k, _)| *k != "gemma3n.altup.num_inputs"));
    assert!(missing.contains("gemma3n.altup.num_inputs"), "{missing}");
    let many = err(&|m| m.push(("gemma3n.altup.num_inputs", MetaValue::U32(9))));
    assert!(many.contains("altup_num_inputs is 9"), "{many}");
    let pattern = err(&|m| {
        m.retain(|(k, _)| *k != "gemma3n.attention.sliding_window_pattern");
        m.push(("gemma3n.attention.sliding_window_pattern", MetaValue::Array(vec![MetaValue::Bool(true)])));
    });
    assert!(pattern.contains("sliding_window_pattern has 1 entries; the model has 2 layers"), "{pattern}");
}

/// The engine builds and serves Gemma 3n within what `plan_kv` sets aside before anything is
/// uploaded (the workspace estimate counts AltUp's streams and Laurel's buffers), and greedy
/// decoding through the engine gives what the executor's steps give.
#[test]
fn gemma3n_engine_serves_within_its_plan() {
    use weft::engine::request::{GenerationParams, InferenceRequest, Prompt};
    use weft::sampling::SamplingParams;
    let Some(f) = factory() else { return };
    let path = fixture("gemma3n/hf");
    let builder = || weft::EngineBuilder::from_model(&path).unwrap();
    let planned = builder().plan_kv(f.context()).unwrap();
    let before = f.context().creations().bytes;
    let engine = builder().build_on(f.context().clone()).unwrap();
    let made = f.context().creations().bytes - before;
    let kv = weft::step::ModelExecutor::kv_config(engine.executor().as_ref());
    let token_values = ModelFiles::open(&path).unwrap().config.kv_token_values();
    let pool = (kv.num_blocks * weft::kv::KvCacheConfig::block_bytes(kv.block_size, token_values, kv.dtype)) as u64;
    assert!(made <= planned.weights_bytes + pool + planned.other_bytes, "{made} bytes made for {planned:?}");
    let p = &expected_of("gemma3n")["prompts"][0];
    let params = GenerationParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(8),
        ignore_eos: true,
        ..Default::default()
    };
    let request = InferenceRequest::new(Prompt::Tokens(u32s(&p["prompt_ids"])), params);
    let out = weft::rt::block_on(engine.infer(request)).unwrap();
    assert_eq!(out.token_ids, u32s(&p["greedy_ids"])[..8]);
}
