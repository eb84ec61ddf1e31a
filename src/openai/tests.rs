//! The protocol against its documented shapes: parsing errors name the field, responses and
//! chunks look like OpenAI's, and a tiny engine answers end to end.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::error::ApiResult;
use super::*;
use crate::engine::ContinuousBatchEngine;
use crate::engine::request::{FinishReason, InferenceResponse, Prompt, StreamChunk, TokenLogprob, Usage};
use crate::error::WeftError;
use crate::openai::shape::piece;
use crate::tokenizer::ChatMessage;
use crate::tokenizer::Tokenizer;

fn body(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn chat(extra: Value) -> Map<String, Value> {
    let mut m = body(json!({"messages": [{"role": "user", "content": "hi"}]}));
    m.extend(body(extra));
    m
}

fn completion(extra: Value) -> Map<String, Value> {
    let mut m = body(json!({"prompt": "hi"}));
    m.extend(body(extra));
    m
}

/// Parse, then the field checks of the engine's door, mapped as the server and the browser map
/// them.
fn full(endpoint: Endpoint, m: &Map<String, Value>) -> ApiResult<OpenAiRequest> {
    let r = parse(endpoint, m)?;
    r.request.validate().map_err(OpenAiError::from_engine)?;
    Ok(r)
}

fn tiny_tokenizer() -> Arc<dyn Tokenizer> {
    let meta: crate::model::gguf::Metadata =
        crate::model::tiny::tokenizer_metadata().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    Arc::new(crate::tokenizer::HfTokenizer::from_gguf_metadata(&meta).unwrap())
}

#[track_caller]
fn assert_invalid(r: ApiResult<impl std::fmt::Debug>, param: Option<&str>, needle: &str) {
    let e = r.unwrap_err();
    assert_eq!(e.kind, "invalid_request_error", "{e:?}");
    assert_eq!(e.param.as_deref(), param, "{e:?}");
    assert!(e.message.contains(needle), "{e:?} should mention {needle:?}");
    let b = e.body();
    assert_eq!(b["error"]["message"], e.message);
    assert_eq!(b["error"]["type"], "invalid_request_error");
    assert!(b["error"].get("code").is_some());
}

#[test]
fn bodies_must_be_json_objects() {
    assert_invalid(parse_body(b"{\"messages\": ["), None, "not valid JSON");
    assert_invalid(parse_body(b"[1, 2]"), None, "must be a JSON object");
    assert_eq!(parse_body(b"{\"a\": 1}").unwrap()["a"], 1);
}

#[test]
fn wrong_types_name_the_field() {
    let cases = [
        ("temperature", json!("hot"), "expected a number"),
        ("top_p", json!([]), "expected a number"),
        ("max_tokens", json!(1.5), "expected an integer"),
        ("max_tokens", json!(-5), "must not be negative"),
        ("max_completion_tokens", json!("8"), "expected an integer"),
        ("seed", json!("x"), "expected an integer"),
        ("stream", json!("yes"), "expected true or false"),
        ("stop", json!(7), "a string or a list of strings"),
        ("stop", json!(["a", 1]), "a string or a list of strings"),
        ("user", json!(3), "expected a string"),
        ("model", json!(3), "expected a string"),
        ("stream_options", json!(true), "expected an object"),
        ("logprobs", json!(1), "expected true or false"),
    ];
    for (field, value, needle) in cases {
        assert_invalid(full(Endpoint::Chat, &chat(json!({ field: value }))), Some(field), needle);
    }
    assert_invalid(
        full(Endpoint::Chat, &chat(json!({"stream": true, "stream_options": {"include_usage": 1}}))),
        Some("stream_options"),
        "include_usage",
    );
    assert_invalid(
        full(Endpoint::Completion, &completion(json!({"stop_token_ids": [1, -2]}))),
        Some("stop_token_ids"),
        "-2 is not a token id",
    );
    assert_invalid(
        full(Endpoint::Completion, &completion(json!({"stop_token_ids": 7}))),
        Some("stop_token_ids"),
        "expected a list of token ids",
    );
    assert_invalid(
        full(Endpoint::Completion, &completion(json!({"priority": 1_i64 << 40}))),
        Some("priority"),
        "32-bit integer",
    );
    assert_invalid(full(Endpoint::Chat, &chat(json!({"metadata": {"a": 1}}))), Some("metadata"), "object of strings");
    assert_invalid(full(Endpoint::Chat, &chat(json!({"store": "yes"}))), Some("store"), "expected true or false");
    assert_invalid(
        full(Endpoint::Completion, &completion(json!({"logprobs": true}))),
        Some("logprobs"),
        "expected an integer",
    );
    assert_invalid(requested_model(&chat(json!({"model": false}))), Some("model"), "expected a string");
    // null is absent.
    assert!(full(Endpoint::Chat, &chat(json!({"temperature": null, "stop": null}))).is_ok());
}

#[test]
fn bad_logit_biases_name_the_field_and_what_is_wrong() {
    let too_many: Map<String, Value> = (0..301).map(|t| (t.to_string(), json!(1))).collect();
    let cases = [
        (json!([1]), "expected an object of token ids to biases"),
        (json!("x"), "expected an object of token ids to biases"),
        (json!({"abc": 1}), "key \"abc\" is not a token id"),
        (json!({"1.5": 1}), "key \"1.5\" is not a token id"),
        (json!({"-3": 1}), "key \"-3\" is not a token id"),
        (json!({"4294967296": 1}), "is not a token id"),
        (json!({"5": "high"}), "the bias of token 5 must be a number, got \"high\""),
        (json!({"5": null}), "the bias of token 5 must be a number"),
        (json!({"5": [1]}), "the bias of token 5 must be a number"),
        (json!({"5": 100.5}), "100.5 for token 5 (a bias must be between -100 and 100)"),
        (json!({"5": -101}), "-101 for token 5"),
        (json!({"5": 1e300}), "inf for token 5"),
        (json!({"5": 1, "05": 2}), "token 5 is biased twice"),
        (Value::Object(too_many), "301 tokens (at most 300 may be biased)"),
    ];
    for (value, needle) in cases {
        for endpoint in [Endpoint::Chat, Endpoint::Completion] {
            let b = match endpoint {
                Endpoint::Chat => chat(json!({ "logit_bias": value })),
                Endpoint::Completion => completion(json!({ "logit_bias": value })),
            };
            assert_invalid(full(endpoint, &b), Some("logit_bias"), needle);
        }
    }
    // The bounds themselves are fine, and null asks for nothing.
    let edge: Map<String, Value> =
        (0..300).map(|t| (t.to_string(), json!(if t % 2 == 0 { 100 } else { -100 }))).collect();
    let r = full(Endpoint::Chat, &chat(json!({ "logit_bias": edge }))).unwrap();
    assert_eq!(r.request.params.sampling.logit_bias.pairs().len(), 300);
    assert!(
        full(Endpoint::Chat, &chat(json!({"logit_bias": null}))).unwrap().request.params.sampling.logit_bias.is_empty()
    );
}

#[test]
fn choices() {
    for n in [0, 17, -1] {
        assert_invalid(full(Endpoint::Chat, &chat(json!({"n": n}))), Some("n"), "1 to 16 choices per request");
    }
    assert_invalid(full(Endpoint::Completion, &completion(json!({"n": 99}))), Some("n"), "invalid n: 99");
    assert_invalid(full(Endpoint::Chat, &chat(json!({"n": "2"}))), Some("n"), "expected an integer");
    // Choice i is seeded seed + i; without a seed each draws its own.
    let r = full(Endpoint::Chat, &chat(json!({"n": 3, "seed": 7}))).unwrap();
    let seeds: Vec<Option<u64>> = r.choice_requests().iter().map(|c| c.params.sampling.seed).collect();
    assert_eq!(seeds, [Some(7), Some(8), Some(9)]);
    let r = full(Endpoint::Completion, &completion(json!({"n": 2, "seed": -1}))).unwrap();
    let seeds: Vec<Option<u64>> = r.choice_requests().iter().map(|c| c.params.sampling.seed).collect();
    assert_eq!(seeds, [Some(u64::MAX), Some(0)], "seeds wrap");
    let r = full(Endpoint::Chat, &chat(json!({"n": 2}))).unwrap();
    assert!(r.choice_requests().iter().all(|c| c.params.sampling.seed.is_none() && c.prompt == r.request.prompt));
    assert_invalid(full(Endpoint::Completion, &completion(json!({"best_of": 3}))), Some("best_of"), "only best_of=1");
    assert!(full(Endpoint::Completion, &completion(json!({"best_of": 1}))).is_ok());
    assert!(full(Endpoint::Chat, &chat(json!({"n": 1}))).is_ok());
}

#[test]
fn logprob_options() {
    assert_invalid(
        full(Endpoint::Chat, &chat(json!({"top_logprobs": 2}))),
        Some("top_logprobs"),
        "set logprobs to true",
    );
    assert_invalid(
        full(Endpoint::Chat, &chat(json!({"logprobs": true, "top_logprobs": 21}))),
        Some("top_logprobs"),
        "between 0 and 20",
    );
    assert_invalid(
        full(Endpoint::Completion, &completion(json!({"logprobs": 21}))),
        Some("top_logprobs"),
        "between 0 and 20",
    );
    let r = full(Endpoint::Chat, &chat(json!({"logprobs": true}))).unwrap();
    assert_eq!(r.logprobs, Some(0));
    assert_eq!(r.request.params.sampling.top_logprobs, 1, "the engine needs at least one alternative");
    let r = full(Endpoint::Chat, &chat(json!({"logprobs": true, "top_logprobs": 5}))).unwrap();
    assert_eq!((r.logprobs, r.request.params.sampling.top_logprobs), (Some(5), 5));
    assert_eq!(full(Endpoint::Chat, &chat(json!({"logprobs": false}))).unwrap().logprobs, None);
    assert_eq!(full(Endpoint::Completion, &completion(json!({"logprobs": 3}))).unwrap().logprobs, Some(3));
}

#[test]
fn bad_messages() {
    let cases = [
        (json!({}), "missing"),
        (json!({"messages": "hi"}), "expected a list"),
        (json!({"messages": [1]}), "message 0 is not an object"),
        (json!({"messages": [{"content": "hi"}]}), "message 0 has no role string"),
        (json!({"messages": [{"role": "user", "content": 5}]}), "content must be a string"),
        (json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), "not text"),
        // Found by the engine's validation.
        (json!({"messages": []}), "there are no messages"),
        (json!({"messages": [{"role": "wizard", "content": "hi"}]}), "unknown role"),
    ];
    for (b, needle) in cases {
        assert_invalid(full(Endpoint::Chat, &body(b)), Some("messages"), needle);
    }
    let parts = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, {"role": "assistant"}]});
    let r = full(Endpoint::Chat, &body(parts)).unwrap();
    assert_eq!(r.request.prompt, Prompt::Chat(vec![ChatMessage::user("ab"), ChatMessage::new("assistant", "")]));
}

#[test]
fn bad_prompts() {
    assert_invalid(full(Endpoint::Completion, &body(json!({}))), Some("prompt"), "missing");
    assert_invalid(full(Endpoint::Completion, &body(json!({"prompt": 5}))), Some("prompt"), "expected a string");
    let cases = [
        (json!(["a", "b"]), "a batch of 2 prompts"),
        (json!([[1, 2], [3]]), "a batch of 2 prompts"),
        (json!([]), "the list is empty"),
        (json!([[]]), "expected a string, a list of token ids"),
        (json!([1, "a"]), "expected a string, a list of token ids"),
        (json!([1, -1]), "-1 is not a token id"),
        (json!([1.5]), "1.5 is not a token id"),
        (json!([1_u64 << 33]), "is not a token id"),
        (json!({"text": "a"}), "expected a string, a list of token ids"),
    ];
    for (prompt, needle) in cases {
        assert_invalid(full(Endpoint::Completion, &body(json!({ "prompt": prompt }))), Some("prompt"), needle);
    }
    for prompt in [json!([5, 6, 7]), json!([[5, 6, 7]])] {
        let r = full(Endpoint::Completion, &body(json!({ "prompt": prompt }))).unwrap();
        assert_eq!(r.request.prompt, Prompt::Tokens(vec![5, 6, 7]));
    }
    assert_invalid(full(Endpoint::Completion, &body(json!({"prompt": ""}))), Some("prompt"), "empty");
    assert_invalid(full(Endpoint::Completion, &completion(json!({"echo": true}))), Some("echo"), "not supported");
    let r = full(Endpoint::Completion, &body(json!({"prompt": ["once"]}))).unwrap();
    assert_eq!(r.request.prompt, Prompt::Text("once".into()));
}

#[test]
fn the_first_error_is_stable() {
    // The model's type, then the messages, then the rest.
    let m = body(json!({"model": 1, "messages": "x", "n": 2}));
    assert_eq!(parse(Endpoint::Chat, &m).unwrap_err().param.as_deref(), Some("model"));
    let m = body(json!({"messages": "x", "n": 2}));
    assert_eq!(parse(Endpoint::Chat, &m).unwrap_err().param.as_deref(), Some("messages"));
}

#[test]
fn fields_and_defaults() {
    let r = full(
        Endpoint::Chat,
        &chat(json!({
            "model": "m", "temperature": 0, "top_p": 0.5, "top_k": -1, "min_p": 0.1, "seed": 7,
            "stop": "x", "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
            "max_completion_tokens": 9, "max_tokens": 9,
        })),
    )
    .unwrap();
    assert_eq!(r.endpoint, Endpoint::Chat);
    assert_eq!(r.model.as_deref(), Some("m"));
    assert!(r.stream && r.include_usage);
    let p = &r.request.params;
    assert_eq!(p.max_tokens, Some(9));
    assert_eq!(
        (p.sampling.temperature, p.sampling.top_p, p.sampling.top_k, p.sampling.min_p, p.sampling.seed),
        (0.0, 0.5, 0, 0.1, Some(7))
    );
    assert_eq!(p.stop, vec!["x".to_string()]);
    assert!(p.ignore_eos);

    let r = full(Endpoint::Completion, &completion(json!({}))).unwrap();
    assert_eq!(r.request.params.sampling.temperature, 1.0, "OpenAI's default temperature");
    assert!(!r.stream && !r.include_usage && r.model.is_none() && r.logprobs.is_none());
    // No max_tokens: the engine gives the rest of the context, capped.
    assert_eq!(r.request.params.max_tokens, None);
    // max_tokens 0 is refused by validation, naming the field.
    assert_invalid(full(Endpoint::Completion, &completion(json!({"max_tokens": 0}))), Some("max_tokens"), "at least 1");
    assert_invalid(
        full(Endpoint::Completion, &completion(json!({"temperature": -1}))),
        Some("temperature"),
        "temperature",
    );
}

#[test]
fn engine_errors_keep_their_kind() {
    let e = OpenAiError::from_engine(WeftError::invalid("top_p", "2 (must be in (0, 1])"));
    assert_eq!((e.kind, e.param.as_deref()), ("invalid_request_error", Some("top_p")));
    assert_eq!(e.message, "invalid top_p: 2 (must be in (0, 1])");
    let e = OpenAiError::from_engine(WeftError::invalid_request("nothing to do"));
    assert_eq!(
        (e.kind, e.param.as_deref(), e.message.as_str()),
        ("invalid_request_error", None, "invalid request: nothing to do")
    );
    let e = OpenAiError::from_engine(WeftError::Unavailable("the engine was shut down".into()));
    assert_eq!(e.kind, "service_unavailable");
    let e = OpenAiError::from_engine(WeftError::Readback("lost".into()));
    assert_eq!(e.kind, "internal_error");
    assert_eq!(e.to_string(), e.message);
    assert_eq!(
        e.body(),
        json!({"error": {"message": e.message, "type": "internal_error", "param": null, "code": null}})
    );
}

#[test]
fn ids_are_unique_and_prefixed() {
    let a = request_id(Endpoint::Chat);
    let b = request_id(Endpoint::Chat);
    assert!(a.starts_with("chatcmpl-") && a != b, "{a} {b}");
    assert!(request_id(Endpoint::Completion).starts_with("cmpl-"));
    assert!(unix_now() > 1_600_000_000);
}

fn lp(token: u32) -> TokenLogprob {
    TokenLogprob { token, logprob: -0.5, top: vec![(token, -0.5), (token + 1, -1.5), (token + 2, -2.5)] }
}

fn response(finish_reason: FinishReason) -> InferenceResponse {
    let usage = Usage { prompt_tokens: 3, completion_tokens: 2, cached_prompt_tokens: 1 };
    InferenceResponse {
        text: "ab".into(),
        token_ids: vec![66, 67],
        logprobs: vec![lp(66), lp(67)],
        finish_reason,
        usage,
    }
}

#[test]
fn whole_responses() {
    let tok = tiny_tokenizer();
    let req = full(Endpoint::Chat, &chat(json!({"logprobs": true, "top_logprobs": 2}))).unwrap();
    let v = response_json_with(tok.as_ref(), &req, "chatcmpl-1", 5, "tiny", &[response(FinishReason::Eos)]).unwrap();
    assert_eq!(
        (v["id"].as_str(), v["object"].as_str(), v["created"].as_u64(), v["model"].as_str()),
        (Some("chatcmpl-1"), Some("chat.completion"), Some(5), Some("tiny"))
    );
    let c = &v["choices"][0];
    assert_eq!(c["message"], json!({"role": "assistant", "content": "ab"}));
    assert_eq!(c["finish_reason"], "stop");
    let first = &c["logprobs"]["content"][0];
    assert_eq!(first["token"].as_str().unwrap(), piece(tok.as_ref(), 66));
    assert_eq!(first["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}})
    );

    let req = full(Endpoint::Completion, &completion(json!({"logprobs": 1}))).unwrap();
    let v = response_json_with(tok.as_ref(), &req, "cmpl-1", 5, "tiny", &[response(FinishReason::Length)]).unwrap();
    assert_eq!(v["object"], "text_completion");
    let c = &v["choices"][0];
    assert_eq!((c["text"].as_str(), c["finish_reason"].as_str()), (Some("ab"), Some("length")));
    let l = &c["logprobs"];
    let len0 = piece(tok.as_ref(), 66).len();
    assert_eq!(l["text_offset"], json!([0, len0]));
    assert_eq!(l["top_logprobs"][0].as_object().unwrap().len(), 1);
    let req = full(Endpoint::Completion, &completion(json!({}))).unwrap();
    assert!(
        response_json_with(tok.as_ref(), &req, "cmpl-1", 5, "tiny", &[response(FinishReason::Stop)]).unwrap()["choices"]
            [0]["logprobs"]
            .is_null()
    );

    let e = response_json_with(tok.as_ref(), &req, "cmpl-1", 5, "tiny", &[response(FinishReason::Error)]).unwrap_err();
    assert_eq!(e.kind, "internal_error");
}

fn chunk(text: &str, finish_reason: Option<FinishReason>) -> StreamChunk {
    let usage = finish_reason.map(|_| Usage { prompt_tokens: 3, completion_tokens: 2, cached_prompt_tokens: 0 });
    StreamChunk {
        text: text.into(),
        token_ids: vec![66],
        logprobs: vec![lp(66)],
        finish_reason,
        usage,
        embedding: None,
    }
}

#[test]
fn streamed_chat_chunks() {
    let req = full(Endpoint::Chat, &chat(json!({"stream": true, "stream_options": {"include_usage": true}}))).unwrap();
    let mut s = ChunkShaper::with_tokenizer(tiny_tokenizer(), &req, "chatcmpl-1".into(), 5, "tiny".into());
    let out = s.shape(Ok(chunk("a", None)));
    assert_eq!(out.len(), 2, "the role first: {out:?}");
    assert_eq!(out[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    assert_eq!(out[0]["object"], "chat.completion.chunk");
    assert_eq!(
        out[1]["choices"][0],
        json!({"index": 0, "delta": {"content": "a"}, "logprobs": null, "finish_reason": null})
    );
    assert!(!s.finished());
    // An empty chunk without log-probabilities sends nothing.
    assert!(s.shape(Ok(chunk("", None))).is_empty());
    let out = s.shape(Ok(chunk("b", Some(FinishReason::Stop))));
    assert_eq!(out.len(), 3, "{out:?}");
    assert_eq!(out[1]["choices"][0], json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"}));
    assert!(out[1].get("usage").is_none());
    assert_eq!(out[2]["choices"], json!([]));
    assert_eq!(out[2]["usage"]["total_tokens"], 5);
    assert!(s.finished());
    assert!(s.shape(Ok(chunk("c", None))).is_empty(), "nothing after the finish");
}

#[test]
fn streamed_completion_chunks() {
    let tok = tiny_tokenizer();
    let req = full(Endpoint::Completion, &completion(json!({"stream": true, "logprobs": 2}))).unwrap();
    let mut s = ChunkShaper::with_tokenizer(tok.clone(), &req, "cmpl-1".into(), 5, "tiny".into());
    assert!(s.start().is_empty(), "completions have no role chunk");
    let out = s.shape(Ok(chunk("", None)));
    assert_eq!(out.len(), 1, "log-probabilities alone make a chunk");
    assert_eq!(out[0]["object"], "text_completion");
    assert_eq!(out[0]["choices"][0]["logprobs"]["text_offset"], json!([0]));
    let out = s.shape(Ok(chunk("b", Some(FinishReason::Eos))));
    assert_eq!(
        out[0]["choices"][0]["logprobs"]["text_offset"],
        json!([piece(tok.as_ref(), 66).len()]),
        "offsets run on across chunks"
    );
    assert_eq!(out[1]["choices"][0], json!({"index": 0, "text": "", "logprobs": null, "finish_reason": "stop"}));
    assert_eq!(out.len(), 2, "no usage chunk unless asked");
    assert!(s.finished());
}

#[test]
fn streamed_errors() {
    let req = full(Endpoint::Chat, &chat(json!({"stream": true}))).unwrap();
    let mut s = ChunkShaper::with_tokenizer(tiny_tokenizer(), &req, "chatcmpl-1".into(), 5, "tiny".into());
    assert_eq!(s.start().len(), 1);
    assert!(s.start().is_empty(), "the role is sent once");
    let out = s.shape(Err(WeftError::Unavailable("the engine was shut down".into())));
    assert_eq!(out, vec![OpenAiError::unavailable("the engine was shut down").body()]);
    assert!(s.finished());

    let mut s = ChunkShaper::with_tokenizer(tiny_tokenizer(), &req, "chatcmpl-1".into(), 5, "tiny".into());
    let out = s.shape(Ok(chunk("", Some(FinishReason::Error))));
    assert_eq!(out.last().unwrap()["error"]["type"], "internal_error");
    assert!(s.finished());
}

/// An engine on the GPU (lavapipe in CI) over the GGUF `bytes`, with 64 KV blocks of 4 tokens,
/// or `None` to skip where there is no adapter.
pub(super) fn engine_on(
    name: &str,
    bytes: Vec<u8>,
    config: crate::engine::EngineConfig,
) -> Option<ContinuousBatchEngine> {
    use crate::gpu::{GpuOptions, GpuTensorFactory};
    let ctx = crate::gpu::open_or_skip(GpuOptions::default()).unwrap()?;
    let f = GpuTensorFactory::new(ctx);
    let files = crate::model::load::ModelFiles::from_gguf_bytes(name, bytes).unwrap();
    let exec = files.executor(&f, crate::kv::KvCacheConfig::new(4, 64)).unwrap();
    let engine = ContinuousBatchEngine::new_plan_runtime(
        config,
        files.tokenizer.clone(),
        Arc::new(crate::sampling::GpuSampler),
        Arc::new(exec),
        Arc::new(f),
    )
    .unwrap();
    Some(engine)
}

/// Against a tiny engine on the GPU: the default max_tokens, and a request end to end.
#[test]
fn against_a_tiny_engine() {
    use crate::engine::EngineConfig;
    use futures::StreamExt;

    let c = crate::model::tiny::tiny_config();
    let w = crate::model::tiny::random_weights(&c, 21, crate::DType::Q8_0);
    let bytes = crate::model::tiny::gguf_bytes(&c, &w, crate::DType::Q8_0);
    let config = EngineConfig { max_model_len: 64, ..EngineConfig::default() };
    let Some(engine) = engine_on("tiny.gguf", bytes, config) else { return };

    // Without max_tokens, the rest of the context: here 64 minus the prompt.
    let r = parse(Endpoint::Completion, &completion(json!({"prompt": "abc", "ignore_eos": true, "temperature": 0})))
        .unwrap();
    let n = engine.tokenizer().encode("abc", true).unwrap().len();
    let whole = crate::rt::block_on(engine.infer(r.request.clone())).unwrap();
    assert_eq!(whole.usage.completion_tokens, engine.config().max_model_len - n);

    // stop_token_ids reach the engine: the first of them generated ends the answer, "stop".
    let greedy = json!({"prompt": "abc", "ignore_eos": true, "temperature": 0, "max_tokens": 4});
    let r = parse(Endpoint::Completion, &body(greedy.clone())).unwrap();
    let four = crate::rt::block_on(engine.infer(r.request)).unwrap();
    assert_eq!(four.finish_reason, FinishReason::Length);
    let stop_at = four.token_ids[2];
    let first = four.token_ids.iter().position(|&t| t == stop_at).unwrap();
    let mut b = body(greedy.clone());
    b.insert("stop_token_ids".into(), json!([stop_at]));
    let stopped = crate::rt::block_on(engine.infer(parse(Endpoint::Completion, &b).unwrap().request)).unwrap();
    assert_eq!((stopped.finish_reason, stopped.usage.completion_tokens), (FinishReason::Stop, first + 1));
    // One outside the vocabulary is refused, naming the field.
    b.insert("stop_token_ids".into(), json!([1, 5000]));
    let refused =
        OpenAiError::from_engine(engine.submit(parse(Endpoint::Completion, &b).unwrap().request).unwrap_err());
    assert_eq!(refused.param.as_deref(), Some("stop_token_ids"));
    // logit_bias reaches the sampled tokens: +100 forces a token the model would not pick, and
    // -100 bans the token it would; one outside the vocabulary is refused, naming the field.
    let forced = (0..260).find(|t| !four.token_ids.contains(t)).unwrap();
    let mut biased = body(greedy.clone());
    biased.insert("logit_bias".into(), json!({ forced.to_string(): 100 }));
    let out = crate::rt::block_on(engine.infer(parse(Endpoint::Completion, &biased).unwrap().request)).unwrap();
    assert_eq!(out.token_ids, [forced; 4]);
    biased.insert("logit_bias".into(), json!({ four.token_ids[0].to_string(): -100 }));
    let out = crate::rt::block_on(engine.infer(parse(Endpoint::Completion, &biased).unwrap().request)).unwrap();
    assert_ne!(out.token_ids[0], four.token_ids[0]);
    biased.insert("logit_bias".into(), json!({"5": 1, "260": -100}));
    let refused =
        OpenAiError::from_engine(engine.submit(parse(Endpoint::Completion, &biased).unwrap().request).unwrap_err());
    assert_eq!(refused.param.as_deref(), Some("logit_bias"));
    assert!(refused.message.contains("token id 260 is outside the vocabulary (ids 0 to 259)"), "{refused:?}");
    // A prompt of token ids is the prompt those ids spell.
    let mut b = body(greedy);
    b.insert("prompt".into(), json!([engine.tokenizer().encode("abc", true).unwrap()]));
    let by_ids = crate::rt::block_on(engine.infer(parse(Endpoint::Completion, &b).unwrap().request)).unwrap();
    assert_eq!(by_ids.token_ids, four.token_ids);
    // Lengths are the engine's to check, with OpenAI's error shape.
    let r = parse(Endpoint::Completion, &completion(json!({"max_tokens": 1000}))).unwrap();
    let refused = OpenAiError::from_engine(engine.submit(r.request).expect_err("max_tokens 1000 must be refused"));
    assert_eq!((refused.kind, refused.param.as_deref()), ("invalid_request_error", Some("max_tokens")));

    let b = chat(
        json!({"max_tokens": 3, "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 2, "stream": true}),
    );
    let r = parse(Endpoint::Chat, &b).unwrap();
    let whole = crate::rt::block_on(engine.infer(r.request.clone())).unwrap();
    let v = response_json(&engine, &r, "chatcmpl-1", 5, "tiny", &whole).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["logprobs"]["content"].as_array().unwrap().len(), 3);
    assert_eq!(v["usage"]["completion_tokens"], 3);

    let mut shaper = ChunkShaper::new(engine.clone(), &r, "chatcmpl-2".into(), 5, "tiny".into());
    let mut stream = Box::pin(engine.infer_stream(r.request.clone()).unwrap());
    let mut chunks = shaper.start();
    while !shaper.finished() {
        let Some(item) = crate::rt::block_on(stream.next()) else { break };
        chunks.extend(shaper.shape(item));
    }
    assert!(shaper.finished());
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, whole.text, "streamed and whole agree");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
}

fn tiny_hf_tokenizer(template: bool) -> crate::tokenizer::HfTokenizer {
    let meta: crate::model::gguf::Metadata = crate::model::tiny::tokenizer_metadata()
        .into_iter()
        .filter(|(k, _)| template || *k != "tokenizer.chat_template")
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    crate::tokenizer::HfTokenizer::from_gguf_metadata(&meta).unwrap()
}

#[test]
fn tokenize_a_prompt_or_a_conversation() {
    let tok = tiny_tokenizer();
    let t = tok.as_ref();
    let v = tokenize(t, 64, &body(json!({"model": "m", "prompt": "hi there", "return_token_strs": true}))).unwrap();
    let ids = t.encode("hi there", true).unwrap();
    assert_eq!(v["tokens"], json!(ids));
    assert_eq!((v["count"].as_u64(), v["max_model_len"].as_u64()), (Some(8), Some(64)));
    // As the vocabulary spells them: GPT-2's byte alphabet writes a space as "Ġ".
    assert_eq!(v["token_strs"], json!(["h", "i", "Ġ", "t", "h", "e", "r", "e"]));
    let v = tokenize(t, 64, &body(json!({"prompt": "hi"}))).unwrap();
    assert!(v["token_strs"].is_null(), "token strings only when asked");

    // A conversation: the tokens a chat completion's prompt is, generation prompt and all.
    let messages = json!([{"role": "user", "content": "hi"}]);
    let v = tokenize(t, 64, &body(json!({"messages": messages}))).unwrap();
    let text = crate::engine::render_chat(t, &[ChatMessage::user("hi")], &[], &Default::default(), true).unwrap();
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text:?}");
    assert_eq!(v["tokens"], json!(t.encode(&text, false).unwrap()));
    assert_eq!(detokenize(t, &body(json!({"tokens": v["tokens"]}))).unwrap(), json!({ "prompt": text }));
    let v = tokenize(t, 64, &body(json!({"messages": messages, "add_generation_prompt": false}))).unwrap();
    let text = crate::engine::render_chat(t, &[ChatMessage::user("hi")], &[], &Default::default(), false).unwrap();
    assert!(!text.ends_with("<|im_start|>assistant\n"), "{text:?}");
    assert_eq!(v["tokens"], json!(t.encode(&text, false).unwrap()));
    // The template shows the tools.
    let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
    let v = tokenize(t, 64, &body(json!({"messages": messages, "tools": tools}))).unwrap();
    let prompt = detokenize(t, &body(json!({"tokens": v["tokens"]}))).unwrap();
    assert!(prompt["prompt"].as_str().unwrap().contains("get_weather"), "{prompt}");
    // Special tokens are kept, and an empty list is an empty text.
    assert_eq!(detokenize(t, &body(json!({"model": "m", "tokens": [258, 104]}))).unwrap()["prompt"], "<|im_start|>h");
    assert_eq!(detokenize(t, &body(json!({"tokens": []}))).unwrap()["prompt"], "");
}

#[test]
fn tokenize_errors_name_the_field() {
    let tok = tiny_tokenizer();
    let t = tok.as_ref();
    let chat = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({"prompt": "a", "messages": chat}), Some("messages"), "not both"),
        (json!({"model": "m"}), None, "needs a prompt"),
        (json!({"prompt": 5}), Some("prompt"), "expected a string"),
        (json!({"prompt": "a", "add_generation_prompt": true}), Some("add_generation_prompt"), "unknown field"),
        (json!({"prompt": "a", "add_special_tokens": "yes"}), Some("add_special_tokens"), "expected true or false"),
        (json!({"prompt": "a", "return_token_strs": 1}), Some("return_token_strs"), "expected true or false"),
        (json!({"messages": chat, "continue_final_message": true}), Some("continue_final_message"), "remove"),
        (json!({"messages": chat, "chat_template_kwargs": []}), Some("chat_template_kwargs"), "expected an object"),
        (
            json!({"messages": chat, "chat_template_kwargs": {"tools": []}}),
            Some("chat_template_kwargs"),
            "tools is set",
        ),
        (json!({"prompt": "a", "chat_template_kwargs": {}}), Some("chat_template_kwargs"), "unknown field"),
        (json!({"messages": "hi"}), Some("messages"), "expected a list"),
        (json!({"messages": [{"role": "user", "content": "hi"}], "tools": 3}), Some("tools"), "list of tools"),
    ];
    for (b, param, needle) in cases {
        assert_invalid(tokenize(t, 64, &body(b)), param, needle);
    }
    let bare = tiny_hf_tokenizer(false);
    assert_invalid(tokenize(&bare, 64, &body(json!({"messages": chat}))), Some("messages"), "no chat template");
    let mut refusing = tiny_hf_tokenizer(false);
    refusing.set_chat_template("{{ raise_exception('only one message, please') }}").unwrap();
    assert_invalid(tokenize(&refusing, 64, &body(json!({"messages": chat}))), Some("messages"), "only one message");

    let cases = [
        (json!({}), Some("tokens"), "missing"),
        (json!({"tokens": "1 2"}), Some("tokens"), "expected a list of token ids"),
        (json!({"tokens": [1, -1]}), Some("tokens"), "-1 is not a token id"),
        (json!({"tokens": [1.5]}), Some("tokens"), "1.5 is not a token id"),
        (json!({"tokens": [1, 260]}), Some("tokens"), "token id 260 is outside the vocabulary (ids 0 to 259)"),
        (json!({"tokens": [1], "prompt": "a"}), Some("prompt"), "unknown field"),
    ];
    for (b, param, needle) in cases {
        assert_invalid(detokenize(t, &body(b)), param, needle);
    }
}

#[test]
fn a_chat_template_replaces_the_models() {
    let mut tok = tiny_hf_tokenizer(true);
    let own = tok.chat_template().unwrap().source().to_string();
    let e = tok.set_chat_template("{% for %}").unwrap_err().to_string();
    assert!(e.contains("does not parse"), "{e}");
    assert_eq!(tok.chat_template().unwrap().source(), own, "a template that fails leaves the old one");
    let source = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}\
                  {% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token }}";
    tok.set_chat_template(source).unwrap();
    let v = tokenize(&tok, 64, &body(json!({"messages": [{"role": "user", "content": "hi"}]}))).unwrap();
    let text = detokenize(&tok, &body(json!({"tokens": v["tokens"]}))).unwrap();
    assert_eq!(text["prompt"], "[user]hi[assistant]<|endoftext|>");
    // A model without a template gets one.
    let mut bare = tiny_hf_tokenizer(false);
    bare.set_chat_template(source).unwrap();
    assert_eq!(bare.chat_template().unwrap().source(), source);
}
