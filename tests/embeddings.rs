//! Embeddings against outside truth: `tests/fixtures/qwen3_embedding/`
//! (`tools/make_embedding_fixtures.py`) is a tiny random-weight Qwen3 set up as
//! Qwen3-Embedding is — last-token pooling, then L2 normalisation — converted to GGUF by
//! llama.cpp (with `qwen3.pooling_type` 3), with sentence-transformers' embeddings of four
//! inputs; `tests/fixtures/bert_embedding/` is a tiny random-weight BERT encoder set up as
//! bge is (CLS pooling; also mean-pooled, as all-MiniLM is), with its own WordPiece vocabulary.
//!
//! weft's embeddings have cosine ≥ 0.999 with sentence-transformers' (they agree to about 1e-6:
//! both run f32 over two layers of width 64 and differ only in summation order, while a wrong
//! pooled token, a missing final norm or, for BERT, a causal mask gives cosines far lower);
//! they are the same bits whether an embedding runs alone, with the others or beside a
//! generation (batch invariance), from text or from token ids; the requests free their KV
//! blocks; `dimensions` truncates before normalising; a generation-only model, impossible
//! sizes, an encoder's prompt past one step and a generation request to an encoder are
//! refused, naming the field.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use weft::engine::request::{EmbeddingParams, GenerationParams, InferenceRequest, Prompt};
use weft::engine::{ContinuousBatchEngine, EngineConfig};
use weft::gpu::{GpuOptions, GpuTensorFactory};
use weft::kv::KvCacheConfig;
use weft::model::config::Pooling;
use weft::model::load::ModelFiles;
use weft::sampling::{GpuSampler, SamplingParams};
use weft::tokenizer::Tokenizer;
use weft::{DType, WeftError};

fn factory() -> Option<GpuTensorFactory> {
    weft::gpu::open_or_skip(GpuOptions::default()).unwrap().map(GpuTensorFactory::new)
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_embedding").join(name)
}

fn bert_fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bert_embedding").join(name)
}

fn expected() -> Vec<(String, Vec<u32>, Vec<f32>)> {
    expected_of(&fixture("expected.json"), "embedding")
}

/// Each input's text, token ids and embedding under `key`.
fn expected_of(path: &Path, key: &str) -> Vec<(String, Vec<u32>, Vec<f32>)> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let floats = |a: &Value| a.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect::<Vec<_>>();
    v["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let ids = i["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            (i["text"].as_str().unwrap().to_string(), ids, floats(&i[key]))
        })
        .collect()
}

/// The BERT fixture's GGUF vocabulary (WordPiece, llama.cpp's spelling) tokenizes as
/// sentence-transformers' `BertTokenizerFast`: [CLS] … [SEP], lower-cased, accents stripped.
#[test]
fn bert_vocabulary_tokenizes_as_sentence_transformers() {
    let file = weft::model::gguf::GgufFile::open(&bert_fixture("model.gguf")).unwrap();
    let tok = weft::tokenizer::HfTokenizer::from_gguf_metadata_of(&file.metadata, file.name()).unwrap();
    for (text, ids, _) in expected_of(&bert_fixture("expected.json"), "embedding") {
        assert_eq!(tok.encode(&text, true).unwrap(), ids, "{text:?}");
    }
}

/// The fixture's engine, `max_num_batched_tokens` a step (small budgets chunk the prompts).
fn engine(f: &GpuTensorFactory, files: &ModelFiles, max_num_batched_tokens: usize) -> ContinuousBatchEngine {
    let exec = files.executor(f, KvCacheConfig::new(4, 64)).unwrap();
    let config = EngineConfig { max_num_batched_tokens, max_num_seqs: 8, ..Default::default() };
    ContinuousBatchEngine::new_plan_runtime(
        config,
        files.tokenizer.clone(),
        Arc::new(GpuSampler),
        Arc::new(exec),
        Arc::new(f.clone()),
    )
    .unwrap()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(&p, &q)| f64::from(p) * f64::from(q)).sum::<f64>();
    dot(a, b) / (dot(a, a) * dot(b, b)).sqrt()
}

fn embed(e: &ContinuousBatchEngine, prompt: Prompt, dimensions: Option<usize>) -> weft::Result<Vec<f32>> {
    weft::rt::block_on(e.embed(prompt, EmbeddingParams { dimensions }, None)).map(|(v, _)| v)
}

#[test]
fn embeddings_match_sentence_transformers() {
    let Some(f) = factory() else { return };
    let files = ModelFiles::open(&fixture("model.gguf")).unwrap();
    let e = engine(&f, &files, 64);
    for (text, ids, want) in expected() {
        assert_eq!(files.tokenizer.encode(&text, true).unwrap(), ids, "{text:?} tokenizes as sentence-transformers");
        let got = embed(&e, Prompt::Text(text.clone()), None).unwrap();
        assert_eq!(got.len(), want.len());
        let cos = cosine(&got, &want);
        println!("{text:?}: cosine {cos:.9}");
        assert!(cos >= 0.999, "{text:?}: cosine {cos} with sentence-transformers");
        assert_eq!(embed(&e, Prompt::Tokens(ids), None).unwrap(), got, "token ids embed as the text does");
        let norm: f64 = got.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        assert!((norm - 1.0).abs() < 1e-5, "normalised: {norm}");
    }
    assert_eq!(e.kv_usage().used_blocks, 0, "embeddings keep no KV blocks but the prefix cache's");
}

/// Each embedding alone, then all together with a generation in the same steps, then with
/// prompts cut into 5-token chunks: the same bits every time.
#[test]
fn embeddings_are_batch_invariant() {
    let Some(f) = factory() else { return };
    let files = ModelFiles::open(&fixture("model.gguf")).unwrap();
    let inputs = expected();
    let alone: Vec<Vec<f32>> = inputs
        .iter()
        .map(|(_, ids, _)| embed(&engine(&f, &files, 64), Prompt::Tokens(ids.clone()), None).unwrap())
        .collect();
    for budget in [64, 5] {
        let e = engine(&f, &files, budget);
        let params = GenerationParams {
            sampling: SamplingParams::greedy(),
            max_tokens: Some(6),
            ignore_eos: true,
            ..Default::default()
        };
        let generation = e.infer_stream(InferenceRequest::new(Prompt::Tokens(vec![5, 17, 42]), params)).unwrap();
        let together = weft::rt::block_on(futures::future::join_all(
            inputs.iter().map(|(_, ids, _)| e.embed(Prompt::Tokens(ids.clone()), EmbeddingParams::default(), None)),
        ));
        let generated = weft::rt::block_on(weft::engine::collect_response(&mut Box::pin(generation))).unwrap();
        assert_eq!(generated.token_ids.len(), 6, "the generation beside them ran");
        for ((got, _), want) in together.into_iter().map(Result::unwrap).zip(&alone) {
            assert_eq!(&got, want, "budget {budget}: batched with others, the same bits");
        }
    }
}

#[test]
fn dimensions_truncate_then_normalise_and_bad_requests_are_refused() {
    let Some(f) = factory() else { return };
    let files = ModelFiles::open(&fixture("model.gguf")).unwrap();
    let e = engine(&f, &files, 64);
    let ids = expected()[0].1.clone();
    let full = embed(&e, Prompt::Tokens(ids.clone()), None).unwrap();
    let short = embed(&e, Prompt::Tokens(ids.clone()), Some(16)).unwrap();
    assert_eq!(short.len(), 16);
    assert!(cosine(&short, &full[..16]) > 0.999999);
    for bad in [0, 65] {
        let err = embed(&e, Prompt::Tokens(ids.clone()), Some(bad)).unwrap_err();
        assert!(matches!(err, WeftError::InvalidRequest { .. }) && err.to_string().contains("dimensions"), "{err}");
    }

    // A generation-only model: refused, saying how to turn embeddings on.
    let c = weft::model::tiny::tiny_config();
    let w = weft::model::tiny::random_weights(&c, 21, DType::F32);
    let tiny = ModelFiles::from_gguf_bytes("tiny.gguf", weft::model::tiny::gguf_bytes(&c, &w, DType::F32)).unwrap();
    let err = embed(&engine(&f, &tiny, 64), Prompt::Tokens(vec![1, 2]), None).unwrap_err();
    assert!(err.to_string().contains("--pooling last"), "{err}");
}

/// After warm-up and a batch of generations, the same prompts as embeddings create no buffer:
/// their hidden states ride in the samples' readback, whose staging buffer warm-up sized for
/// them (a warm step creates nothing).
#[test]
fn warm_embeddings_create_no_buffers() {
    let Some(f) = factory() else { return };
    let files = ModelFiles::open(&fixture("model.gguf")).unwrap();
    let exec = files.executor(&f, KvCacheConfig::new(4, 64)).unwrap();
    exec.warm_up(64, 8).unwrap();
    let config = EngineConfig { max_num_batched_tokens: 64, max_num_seqs: 8, ..Default::default() };
    let e = ContinuousBatchEngine::new_plan_runtime(
        config,
        files.tokenizer.clone(),
        Arc::new(GpuSampler),
        Arc::new(exec),
        Arc::new(f.clone()),
    )
    .unwrap();
    let inputs = expected();
    let params = GenerationParams { sampling: SamplingParams::greedy(), max_tokens: Some(1), ..Default::default() };
    let generations =
        inputs.iter().map(|(_, ids, _)| e.infer(InferenceRequest::new(Prompt::Tokens(ids.clone()), params.clone())));
    for r in weft::rt::block_on(futures::future::join_all(generations)) {
        r.unwrap();
    }
    let warm = f.context().creations();
    let embeddings =
        inputs.iter().map(|(_, ids, _)| e.embed(Prompt::Tokens(ids.clone()), EmbeddingParams::default(), None));
    for r in weft::rt::block_on(futures::future::join_all(embeddings)) {
        r.unwrap();
    }
    assert_eq!(f.context().creations().buffers, warm.buffers, "embedding steps created buffers");
}

/// The BERT fixture's engine (`tests/fixtures/bert_embedding/`, bge's stack), pooling as its
/// GGUF says (CLS) or as `pooling` overrides.
fn bert_engine(
    f: &GpuTensorFactory,
    pooling: Option<Pooling>,
    max_num_batched_tokens: usize,
) -> (ContinuousBatchEngine, ModelFiles) {
    let mut files = ModelFiles::open(&bert_fixture("model.gguf")).unwrap();
    if let Some(p) = pooling {
        files.config.pooling = Some(p);
    }
    (engine(f, &files, max_num_batched_tokens), files)
}

/// A BERT encoder (bidirectional attention, post-norm layers, learned absolute positions, the
/// erf GELU) against sentence-transformers, CLS-pooled as bge is and mean-pooled as all-MiniLM
/// is, both L2-normalised. Tolerance: cosine ≥ 0.999, as above; both run f32 and differ in
/// summation order and in the GPU's erf (within 1.5e-7), so they agree to about 1e-6, while a
/// causal mask, a missing LayerNorm or the tanh GELU moves the cosine by far more.
#[test]
fn bert_embeddings_match_sentence_transformers() {
    let Some(f) = factory() else { return };
    for (pooling, key) in [(None, "embedding"), (Some(Pooling::Mean), "embedding_mean")] {
        let (e, files) = bert_engine(&f, pooling, 64);
        assert_eq!(files.config.architecture, "bert");
        for (text, ids, want) in expected_of(&bert_fixture("expected.json"), key) {
            let got = embed(&e, Prompt::Text(text.clone()), None).unwrap();
            let cos = cosine(&got, &want);
            let max_diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            println!("{key} {text:?}: cosine {cos:.9}, max |diff| {max_diff:.2e}");
            assert!(cos >= 0.999, "{key} {text:?}: cosine {cos} with sentence-transformers");
            assert_eq!(embed(&e, Prompt::Tokens(ids), None).unwrap(), got, "token ids embed as the text does");
        }
        assert_eq!(e.kv_usage().used_blocks + e.kv_usage().cached_blocks, 0, "an encoder caches no blocks");
    }
}

/// Each BERT embedding alone, then all four in one step (52 tokens of a 64-token budget): the
/// same bits.
#[test]
fn bert_embeddings_are_batch_invariant() {
    let Some(f) = factory() else { return };
    let inputs = expected_of(&bert_fixture("expected.json"), "embedding");
    for pooling in [Pooling::Cls, Pooling::Mean] {
        let alone: Vec<Vec<f32>> = inputs
            .iter()
            .map(|(_, ids, _)| embed(&bert_engine(&f, Some(pooling), 64).0, Prompt::Tokens(ids.clone()), None).unwrap())
            .collect();
        let (e, _) = bert_engine(&f, Some(pooling), 64);
        let params = GenerationParams { embedding: Some(EmbeddingParams::default()), ..Default::default() };
        let mut receivers: Vec<_> = inputs
            .iter()
            .map(|(_, ids, _)| e.submit(InferenceRequest::new(Prompt::Tokens(ids.clone()), params.clone())).unwrap().1)
            .collect();
        assert!(weft::rt::block_on(e.step()).unwrap());
        assert_eq!(e.metrics().steps, 1);
        for (receiver, want) in receivers.iter_mut().zip(&alone) {
            let chunk = receiver.try_recv().unwrap().unwrap();
            assert_eq!(chunk.embedding.as_ref(), Some(want), "{pooling:?}: in one step with the others, the same bits");
        }
    }
}

/// An encoder's prompt runs whole in one step: one longer than max_num_batched_tokens is
/// refused at submission, naming the limit, and holds no KV block; a generation request is
/// refused, pointing to /v1/embeddings; CLS or mean pooling of a causal model is refused.
#[test]
fn bert_refuses_what_it_cannot_run() {
    let Some(f) = factory() else { return };
    let (e, _) = bert_engine(&f, None, 16);
    let long = expected_of(&bert_fixture("expected.json"), "embedding")[3].1.clone();
    assert_eq!(long.len(), 21);
    let err = embed(&e, Prompt::Tokens(long), None).unwrap_err();
    assert!(matches!(err, WeftError::InvalidRequest { .. }), "{err}");
    assert!(err.to_string().contains("21 tokens") && err.to_string().contains("max_num_batched_tokens = 16"), "{err}");
    assert_eq!(e.kv_usage().used_blocks, 0, "the refused prompt holds no block");
    let params = GenerationParams { max_tokens: Some(2), ..Default::default() };
    let err = weft::rt::block_on(e.infer(InferenceRequest::new(Prompt::Text("hello".into()), params))).unwrap_err();
    assert!(matches!(err, WeftError::InvalidRequest { .. }) && err.to_string().contains("/v1/embeddings"), "{err}");
    assert!(embed(&e, Prompt::Text("hello world".into()), None).is_ok(), "the engine still embeds");

    let c = weft::model::tiny::tiny_config();
    let w = weft::model::tiny::random_weights(&c, 21, DType::F32);
    let mut tiny = ModelFiles::from_gguf_bytes("tiny.gguf", weft::model::tiny::gguf_bytes(&c, &w, DType::F32)).unwrap();
    tiny.config.pooling = Some(Pooling::Mean);
    let err = tiny.executor(&f, KvCacheConfig::new(4, 64)).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("--pooling last"), "{err}");
}

/// Once warm, BERT embeddings of every pooling span create no buffer: the pooled rows ride in
/// the samples' readback (sized by warm-up), and the pooling spans live in the workspace.
#[test]
fn warm_bert_embeddings_create_no_buffers() {
    let Some(f) = factory() else { return };
    let files = ModelFiles::open(&bert_fixture("model.gguf")).unwrap();
    let exec = files.executor(&f, KvCacheConfig::new(4, 64)).unwrap();
    exec.warm_up(64, 8).unwrap();
    let config = EngineConfig { max_num_batched_tokens: 64, max_num_seqs: 8, ..Default::default() };
    let e = ContinuousBatchEngine::new_plan_runtime(
        config,
        files.tokenizer.clone(),
        Arc::new(GpuSampler),
        Arc::new(exec),
        Arc::new(f.clone()),
    )
    .unwrap();
    let inputs = expected_of(&bert_fixture("expected.json"), "embedding");
    // A first request, as the decoder's test above runs generations first: the first step
    // after warm-up still makes one buffer (measured here; the decoder's test steps past it).
    embed(&e, Prompt::Tokens(inputs[1].1.clone()), None).unwrap();
    let warm = f.context().creations();
    let embeddings =
        inputs.iter().map(|(_, ids, _)| e.embed(Prompt::Tokens(ids.clone()), EmbeddingParams::default(), None));
    for r in weft::rt::block_on(futures::future::join_all(embeddings)) {
        r.unwrap();
    }
    embed(&e, Prompt::Tokens(inputs[0].1.clone()), None).unwrap();
    assert_eq!(f.context().creations().buffers, warm.buffers, "embedding steps created buffers");
}
