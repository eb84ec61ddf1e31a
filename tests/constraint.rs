//! Structured output on the tiny random model: whatever a random model would say, a constrained
//! request's text matches its JSON schema, regex, choice or grammar and ends with `Stop`;
//! unconstrained requests in the same batch are untouched (equal to their solo runs); bad
//! constraints are refused at submission naming their field while the engine goes on; drafted
//! rows get the masks of their positions. The compiler-only tests need no GPU.

use std::sync::Arc;

use serde_json::{Value, json};
use weft::DType;
use weft::constraint::tools::{ToolFormat, parse_calls};
use weft::constraint::{Advance, Constraint, ConstraintCompiler, Grammar};
use weft::engine::request::{FinishReason, GenerationParams, InferenceRequest, InferenceResponse, Prompt};
use weft::engine::{ContinuousBatchEngine, EngineConfig};
use weft::gpu::{GpuOptions, GpuTensorFactory};
use weft::kv::KvCacheConfig;
use weft::model::load::ModelFiles;
use weft::model::tiny;
use weft::sampling::{GpuSampler, SamplingParams};
use weft::tokenizer::{ChatMessage, Tokenizer};

fn files() -> ModelFiles {
    let c = tiny::tiny_config();
    let w = tiny::random_weights(&c, 21, DType::Q8_0);
    ModelFiles::from_gguf_bytes("tiny.gguf", tiny::gguf_bytes(&c, &w, DType::Q8_0)).unwrap()
}

fn engine() -> Option<ContinuousBatchEngine> {
    let f = weft::gpu::open_or_skip(GpuOptions::default()).unwrap().map(GpuTensorFactory::new)?;
    let files = files();
    let exec = files.executor(&f, KvCacheConfig::new(4, 512)).unwrap();
    let e = ContinuousBatchEngine::new_plan_runtime(
        EngineConfig::default(),
        files.tokenizer.clone(),
        Arc::new(GpuSampler),
        Arc::new(exec),
        Arc::new(f),
    )
    .unwrap();
    Some(e)
}

fn request(prompt: &str, sampling: SamplingParams, constraint: Option<Grammar>) -> InferenceRequest {
    let params = GenerationParams {
        sampling,
        max_tokens: Some(400),
        constraint: constraint.map(|g| Constraint::new("response_format", g)),
        ..Default::default()
    };
    InferenceRequest::new(Prompt::Text(prompt.into()), params)
}

fn run(e: &ContinuousBatchEngine, r: InferenceRequest) -> InferenceResponse {
    weft::rt::block_on(e.infer(r)).unwrap()
}

fn samplings() -> Vec<SamplingParams> {
    vec![
        SamplingParams::greedy(),
        SamplingParams { temperature: 1.0, seed: Some(7), ..Default::default() },
        SamplingParams { temperature: 1.0, top_k: 5, top_p: 0.9, seed: Some(8), ..Default::default() },
    ]
}

/// Small schemas a random model must finish within the token limit.
fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 40}}, "required": ["n"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3}}, "required": ["tags"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}}, "required": ["id"], "additionalProperties": false}),
    ]
}

fn check_schema(i: usize, v: &Value) {
    match i {
        0 => assert!(v["ok"].is_boolean(), "{v}"),
        1 => assert!((3..=40).contains(&v["n"].as_i64().unwrap()), "{v}"),
        2 => {
            let tags = v["tags"].as_array().unwrap();
            assert!((1..=3).contains(&tags.len()) && tags.iter().all(|t| t == "a" || t == "b"), "{v}");
        }
        _ => {
            let id = v["id"].as_str().unwrap();
            assert!(id.len() == 5 && id[..2].chars().all(|c| c.is_ascii_uppercase()), "{v}");
        }
    }
}

#[test]
fn json_schemas_hold_whatever_the_sampling() {
    let Some(e) = engine() else { return };
    for (i, schema) in schemas().into_iter().enumerate() {
        for sampling in samplings() {
            let r = run(&e, request("Answer in JSON:", sampling.clone(), Some(Grammar::JsonSchema(schema.clone()))));
            assert_eq!(r.finish_reason, FinishReason::Stop, "schema {i} {sampling:?}: {:?}", r.text);
            let v: Value =
                serde_json::from_str(&r.text).unwrap_or_else(|e| panic!("schema {i} {sampling:?}: {e}: {:?}", r.text));
            check_schema(i, &v);
        }
    }
    // Any object: a random model may not finish one within the limit (a number of 400 digits
    // is an object's value too), but what it writes is an object's beginning.
    let r = run(&e, request("{", SamplingParams::greedy(), Some(Grammar::JsonObject)));
    assert!(r.text.starts_with('{'), "{:?}", r.text);
    if r.finish_reason == FinishReason::Stop {
        assert!(serde_json::from_str::<Value>(&r.text).unwrap().is_object(), "{:?}", r.text);
    }
}

#[test]
fn regex_choice_lark_and_gbnf_hold() {
    let Some(e) = engine() else { return };
    type Check = Box<dyn Fn(&str) -> bool>;
    let cases: Vec<(Grammar, Check)> = vec![
        (Grammar::Regex("[0-9]{3}-[a-z]{2}".into()), Box::new(|t| t.len() == 6 && t.as_bytes()[3] == b'-')),
        (
            Grammar::Choice(vec!["yes".into(), "no".into(), "maybe".into()]),
            Box::new(|t| ["yes", "no", "maybe"].contains(&t)),
        ),
        (
            Grammar::Lark("start: \"x\" DIGIT DIGIT\nDIGIT: /[0-9]/".into()),
            Box::new(|t| t.len() == 3 && t.starts_with('x')),
        ),
        (
            Grammar::Gbnf("root ::= greet \" \" name\ngreet ::= \"hi\" | \"hello\"\nname ::= [a-z]{2,4}".into()),
            Box::new(|t| {
                let (g, n) = t.split_once(' ').unwrap_or(("", ""));
                ["hi", "hello"].contains(&g) && (2..=4).contains(&n.len())
            }),
        ),
    ];
    for (grammar, ok) in &cases {
        for sampling in samplings() {
            let r = run(&e, request("Say:", sampling, Some(grammar.clone())));
            assert!(ok(&r.text), "{grammar:?}: {:?}", r.text);
            assert_eq!(r.finish_reason, FinishReason::Stop, "{grammar:?}: {:?}", r.text);
        }
    }
}

/// 16 requests at once, half constrained (four different schemas) and half not: every one of
/// them equals its solo run, so the masks touch only their own rows.
#[test]
fn constrained_and_free_requests_share_a_batch_without_touching_each_other() {
    let Some(e) = engine() else { return };
    let requests: Vec<InferenceRequest> = (0..16)
        .map(|i| {
            let sampling = if i % 3 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams { temperature: 0.9, seed: Some(i as u64), ..Default::default() }
            };
            let grammar = (i % 2 == 0).then(|| Grammar::JsonSchema(schemas()[i / 2 % 4].clone()));
            let mut r = request(&format!("request {i}:"), sampling, grammar);
            r.params.max_tokens = Some(if i % 2 == 0 { 400 } else { 12 + i });
            r
        })
        .collect();
    let solo: Vec<InferenceResponse> = requests.iter().map(|r| run(&e, r.clone())).collect();
    e.start_loop().unwrap();
    let together: Vec<InferenceResponse> = weft::rt::block_on(futures::future::join_all(requests.iter().map(|r| {
        let e = e.clone();
        let r = r.clone();
        async move { e.infer(r).await.unwrap() }
    })));
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(a.token_ids, b.token_ids, "request {i} changed in the batch");
    }
    e.shutdown();
}

#[test]
fn bad_constraints_are_refused_at_submission_and_the_engine_goes_on() {
    let Some(e) = engine() else { return };
    let bad = [
        Grammar::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "strnig"}}})),
        Grammar::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1})),
        Grammar::JsonSchema(json!("not a schema")),
        Grammar::Regex("[a-z".into()),
        Grammar::Regex("(?<=a)b".into()),
        Grammar::Choice(vec![]),
        Grammar::Lark("start: missing_rule".into()),
        Grammar::Lark("start: (\"a\"".into()),
        Grammar::Gbnf("root ::= [abc".into()),
        Grammar::Gbnf("rooot ::= \"a\"".into()),
        Grammar::Regex("a".repeat(300 * 1024)),
    ];
    for g in bad {
        let r = request("x", SamplingParams::greedy(), Some(g.clone()));
        let Err(err) = e.submit(r) else { panic!("accepted: {g:?}") };
        match &err {
            weft::WeftError::InvalidRequest { field, reason } => {
                assert_eq!(field.as_deref(), Some("response_format"), "{g:?}: {err}");
                assert!(!reason.is_empty());
            }
            other => panic!("{g:?}: {other}"),
        }
    }
    let ok = run(&e, request("x", SamplingParams::greedy(), Some(Grammar::Choice(vec!["fine".into()]))));
    assert_eq!(ok.text, "fine");
}

#[test]
fn a_forced_tool_call_comes_out_in_the_models_format() {
    let Some(e) = engine() else { return };
    let tool = json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"], "additionalProperties": false}}});
    let mut r = request("", SamplingParams::greedy(), None);
    r.prompt = Prompt::Chat(vec![ChatMessage::user("Weather in Paris?")]);
    r.tools = vec![tool.clone()];
    r.params.constraint = Some(Constraint::new(
        "tools",
        Grammar::ToolCalls { tools: vec![tool], name: Some("get_weather".into()), parallel: false },
    ));
    let out = run(&e, r);
    assert_eq!(out.finish_reason, FinishReason::Stop, "{:?}", out.text);
    let (content, calls) = parse_calls(ToolFormat::Hermes, &out.text, &["get_weather"]).unwrap();
    assert_eq!(content, None);
    assert_eq!(calls[0].name, "get_weather");
    let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
    assert!(args["city"] == "Paris" || args["city"] == "Oslo", "{args}");
}

// ----- the compiler alone (no GPU) -----

fn compiler() -> (ConstraintCompiler, Arc<dyn Tokenizer>) {
    let tok = files().tokenizer;
    (ConstraintCompiler::new(tok.clone(), tiny::TINY_VOCAB.len()).unwrap(), tok)
}

fn allowed(words: &[u32], t: u32) -> bool {
    words[t as usize / 32] >> (t % 32) & 1 == 1
}

#[test]
fn masks_follow_the_grammar_and_compilations_are_cached() {
    let (c, tok) = compiler();
    assert_eq!(c.tool_format(), ToolFormat::Hermes, "the tiny template shows tools as Qwen2.5 does");
    let choice = Constraint::new("guided_choice", Grammar::Choice(vec!["ab".into(), "ac".into()]));
    let mut s = c.compile(&choice).unwrap();
    let _again = c.compile(&choice).unwrap();
    assert_eq!(c.cached(), 1);
    let id = |text: &str| tok.encode(text, false).unwrap()[0];
    let (a, b, x) = (id("a"), id("b"), id("x"));
    let m = s.masks(&[]).unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].len(), tiny::TINY_VOCAB.len().div_ceil(32));
    assert!(allowed(&m[0], a) && !allowed(&m[0], b) && !allowed(&m[0], x));
    assert!(!allowed(&m[0], tiny::TINY_EOS), "nothing is complete yet");
    // Drafted rows: after "a" both b and c are allowed; a refused draft repeats the last mask.
    let rows = s.masks(&[a, b]).unwrap();
    assert_eq!(rows.len(), 3);
    assert!(allowed(&rows[1], b) && !allowed(&rows[1], a));
    assert!(allowed(&rows[2], tiny::TINY_EOS) && allowed(&rows[2], tiny::TINY_IM_END), "complete: every EOS");
    let refused = s.masks(&[x, a]).unwrap();
    assert_eq!(refused[1], refused[0]);
    assert_eq!(refused[2], refused[0]);
    // The state itself did not move.
    assert_eq!(s.masks(&[]).unwrap(), m);
    assert_eq!(s.advance(a).unwrap(), Advance::Continue);
    assert_eq!(s.advance(b).unwrap(), Advance::Done);
    let mut s = c.compile(&choice).unwrap();
    assert!(s.advance(x).is_err(), "a refused token is an error");
}

#[test]
fn the_field_is_named_in_every_refusal() {
    let (c, _) = compiler();
    for (field, g) in [
        ("guided_regex", Grammar::Regex("(".into())),
        ("structured_outputs", Grammar::Lark("start: )".into())),
        ("grammar", Grammar::Gbnf("root ::= x".into())),
        ("tools", Grammar::ToolCalls { tools: vec![], name: None, parallel: true }),
    ] {
        let Err(err) = c.compile(&Constraint::new(field, g.clone())) else { panic!("accepted: {g:?}") };
        let err = err.to_string();
        assert!(err.starts_with(&format!("invalid {field}: ")), "{err}");
    }
}
