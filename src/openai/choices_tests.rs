//! Reasoning models and `n` choices through the protocol: Qwen3's real chat template with
//! `chat_template_kwargs`, the reasoning parser chosen from the model, `reasoning_content` in
//! whole and streamed answers, tool calls read from the answer only, `n` choices shaped into
//! one response; and on a tiny Qwen3 engine on the GPU, `n` seeded choices against single
//! requests, a reasoning-only answer, and a constraint that starts after the end marker.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::{Map, Value, json};

use super::*;
use crate::engine::ContinuousBatchEngine;
use crate::engine::request::{FinishReason, InferenceResponse, StreamChunk, Usage};
use crate::model::tiny::{QWEN3_END_THINK, QWEN3_THINK};
use crate::tokenizer::{ChatMessage, Tokenizer};

fn body(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn tokenizer(meta: Vec<(&'static str, crate::model::gguf::MetaValue)>) -> Arc<dyn Tokenizer> {
    let meta: crate::model::gguf::Metadata = meta.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    Arc::new(crate::tokenizer::HfTokenizer::from_gguf_metadata(&meta).unwrap())
}

fn qwen3() -> Arc<dyn Tokenizer> {
    tokenizer(crate::model::tiny::qwen3_tokenizer_metadata())
}

fn chatml() -> Arc<dyn Tokenizer> {
    tokenizer(crate::model::tiny::tokenizer_metadata())
}

fn user(extra: Value) -> Map<String, Value> {
    let mut m = body(json!({"messages": [{"role": "user", "content": "What is 2+2?"}]}));
    m.extend(body(extra));
    m
}

/// A parsed chat request with the model's reasoning parser applied.
fn request(tok: &dyn Tokenizer, extra: Value) -> OpenAiRequest {
    let mut r = parse(Endpoint::Chat, &user(extra)).unwrap();
    r.apply_reasoning(tok, ReasoningParser::detect(tok).as_ref()).unwrap();
    r
}

fn response(text: &str, completion_tokens: usize) -> InferenceResponse {
    InferenceResponse {
        text: text.into(),
        token_ids: vec![],
        logprobs: vec![],
        finish_reason: FinishReason::Eos,
        usage: Usage { prompt_tokens: 10, completion_tokens, cached_prompt_tokens: 0 },
    }
}

fn chunk(text: &str, finish: Option<FinishReason>, completion_tokens: usize) -> StreamChunk {
    StreamChunk {
        text: text.into(),
        token_ids: vec![],
        logprobs: vec![],
        finish_reason: finish,
        usage: finish.map(|_| Usage { prompt_tokens: 10, completion_tokens, cached_prompt_tokens: 4 }),
        embedding: None,
    }
}

/// The concatenated `field` of choice `index`'s deltas.
fn deltas(chunks: &[Value], index: usize, field: &str) -> Option<String> {
    let mut out: Option<String> = None;
    for c in chunks {
        for choice in c["choices"].as_array().unwrap() {
            if choice["index"] == index
                && let Some(t) = choice["delta"][field].as_str()
            {
                out.get_or_insert_default().push_str(t);
            }
        }
    }
    out
}

#[test]
fn enable_thinking_false_changes_the_prompt_as_qwen3s_template_says() {
    let tok = qwen3();
    let t = tok.as_ref();
    let messages = [ChatMessage::user("What is 2+2?")];
    let template = t.chat_template().unwrap();
    let on = template.render(&messages, true).unwrap();
    assert_eq!(on, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
    let off = body(json!({"enable_thinking": false}));
    let rendered = template.render_with_kwargs(&messages, &[], true, &off).unwrap();
    assert_eq!(rendered, format!("{on}<think>\n\n</think>\n\n"));
    // `true` renders as thinking on (the template tests `is false`).
    assert_eq!(template.render_with_kwargs(&messages, &[], true, &body(json!({"enable_thinking": true}))).unwrap(), on);

    // /tokenize renders the conversation with the kwargs, as a chat completion does.
    let v = tokenize(t, 64, &user(json!({"chat_template_kwargs": {"enable_thinking": false}}))).unwrap();
    let ids = t.encode(&rendered, false).unwrap();
    assert_eq!(v["tokens"], json!(ids));
    assert_eq!(ids[ids.len() - 6..], [QWEN3_THINK, 10, 10, QWEN3_END_THINK, 10, 10], "the markers are single tokens");
    let v = tokenize(t, 64, &user(json!({}))).unwrap();
    assert_eq!(v["tokens"], json!(t.encode(&on, false).unwrap()));

    // The engine renders the chat prompt with the request's kwargs.
    let r = parse(Endpoint::Chat, &user(json!({"chat_template_kwargs": {"enable_thinking": false}}))).unwrap();
    let text = crate::engine::render_chat(t, &messages, &[], &r.request.chat_template_kwargs, true).unwrap();
    assert_eq!(text, rendered);
    // A variable the render sets itself is refused, here and at the engine's door.
    let reserved = body(json!({"add_generation_prompt": false}));
    let e = template.render_with_kwargs(&messages, &[], true, &reserved).unwrap_err();
    assert!(e.to_string().contains("chat_template_kwargs") && e.to_string().contains("add_generation_prompt"), "{e}");
    let e = parse(Endpoint::Chat, &user(json!({"chat_template_kwargs": {"messages": 1}}))).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("chat_template_kwargs"));
    assert!(e.message.contains("messages is set by the request itself"), "{e:?}");
}

#[test]
fn the_parser_is_chosen_from_the_model() {
    let (q, c) = (qwen3(), chatml());
    let p = ReasoningParser::detect(q.as_ref()).expect("Qwen3's template and vocabulary think");
    assert_eq!((p.family.name, p.end_id), ("qwen3", QWEN3_END_THINK));
    assert_eq!(ReasoningParser::detect(c.as_ref()), None, "ChatML without <think> does not think");
    // Named: `none` turns it off, another family with the same markers is taken, a family
    // whose markers the vocabulary lacks is refused, saying what to do.
    assert_eq!(ReasoningParser::resolve(Some("none"), q.as_ref()), Ok(None));
    assert_eq!(ReasoningParser::resolve(None, q.as_ref()), Ok(Some(p)));
    assert_eq!(ReasoningParser::resolve(Some("deepseek_r1"), q.as_ref()).unwrap().unwrap().family.name, "deepseek_r1");
    let e = ReasoningParser::resolve(Some("qwen3"), c.as_ref()).unwrap_err();
    assert!(e.contains("<think>") && e.contains("choose another parser or none"), "{e}");
    let e = ReasoningParser::resolve(Some("granite"), q.as_ref()).unwrap_err();
    assert!(e.contains("unknown reasoning parser \"granite\""), "{e}");
    // A template that mentions <think> over a vocabulary without the tokens: no parser.
    let mut meta = crate::model::tiny::tokenizer_metadata();
    for (k, v) in &mut meta {
        if *k == "tokenizer.chat_template" {
            *v = crate::model::gguf::MetaValue::String(crate::model::tiny::QWEN3_CHAT_TEMPLATE.into());
        }
    }
    assert_eq!(ReasoningParser::detect(tokenizer(meta).as_ref()), None);
}

#[test]
fn apply_reasoning_reads_the_prompt() {
    let tok = qwen3();
    let t = tok.as_ref();
    let json_object = json!({"response_format": {"type": "json_object"}});
    // Thinking on: the output opens inside the reasoning, and a constraint waits for </think>.
    let r = request(t, json_object.clone());
    assert_eq!(r.reasoning.map(|x| (x.family.name, x.open)), Some(("qwen3", true)));
    assert_eq!(r.request.params.constraint_after, Some(QWEN3_END_THINK));
    // Thinking off: the prompt closed it; the answer and its constraint start at once.
    let mut off = body(json_object);
    off.insert("chat_template_kwargs".into(), json!({"enable_thinking": false}));
    let r = request(t, Value::Object(off));
    assert_eq!(r.reasoning.map(|x| x.open), Some(false));
    assert_eq!(r.request.params.constraint_after, None);
    // No parser (or a text completion): nothing changes.
    let r = request(chatml().as_ref(), json!({}));
    assert_eq!((r.reasoning, r.request.params.constraint_after), (None, None));
    let mut r = parse(Endpoint::Completion, &body(json!({"prompt": "x"}))).unwrap();
    r.apply_reasoning(t, ReasoningParser::detect(t).as_ref()).unwrap();
    assert_eq!(r.reasoning, None);
    // A refused render is the request's error.
    let mut r = parse(Endpoint::Chat, &user(json!({}))).unwrap();
    r.request.chat_template_kwargs = body(json!({"tools": 1}));
    let e = r.apply_reasoning(t, ReasoningParser::detect(t).as_ref()).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("chat_template_kwargs"));
}

#[test]
fn whole_answers_carry_reasoning_content() {
    let tok = qwen3();
    let t = tok.as_ref();
    let r = request(t, json!({}));
    let v = response_json_with(t, &r, "id", 0, "m", &[response("<think>\nadd\n</think>\n\n4", 9)]).unwrap();
    let m = &v["choices"][0]["message"];
    assert_eq!((m["reasoning_content"].as_str(), m["content"].as_str()), (Some("\nadd\n"), Some("\n\n4")));
    // Cut off while thinking: no answer.
    let v = response_json_with(t, &r, "id", 0, "m", &[response("<think>hmm", 2)]).unwrap();
    let m = &v["choices"][0]["message"];
    assert_eq!((m["reasoning_content"].as_str(), &m["content"]), (Some("hmm"), &Value::Null));
    // Thinking off: all answer, reasoning_content null.
    let r = request(t, json!({"chat_template_kwargs": {"enable_thinking": false}}));
    let v = response_json_with(t, &r, "id", 0, "m", &[response("<think>x</think>4", 2)]).unwrap();
    let m = &v["choices"][0]["message"];
    assert_eq!((&m["reasoning_content"], m["content"].as_str()), (&Value::Null, Some("<think>x</think>4")));
    // No parser: no reasoning_content at all.
    let c = chatml();
    let r = request(c.as_ref(), json!({}));
    let v = response_json_with(c.as_ref(), &r, "id", 0, "m", &[response("<think>x</think>4", 2)]).unwrap();
    assert!(v["choices"][0]["message"].get("reasoning_content").is_none());
    assert_eq!(v["choices"][0]["message"]["content"], "<think>x</think>4");
}

#[test]
fn tool_calls_are_read_from_the_answer_only() {
    let tok = qwen3();
    let t = tok.as_ref();
    let tools = json!([{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]);
    let r = request(t, json!({"tools": tools}));
    let call = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2}}\n</tool_call>";
    // A call written while thinking is reasoning, not a call.
    let text = format!("<think>maybe {call}</think>No call.");
    let v = response_json_with(t, &r, "id", 0, "m", &[response(&text, 9)]).unwrap();
    let choice = &v["choices"][0];
    assert!(choice["message"].get("tool_calls").is_none(), "{choice}");
    assert_eq!(choice["message"]["content"], "No call.");
    assert_eq!(choice["message"]["reasoning_content"], format!("maybe {call}"));
    // One in the answer is a call.
    let text = format!("<think>I will call add.</think>\n\n{call}");
    let v = response_json_with(t, &r, "id", 0, "m", &[response(&text, 9)]).unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["tool_calls"][0]["function"]["name"], "add", "{choice}");
    assert_eq!(choice["message"]["reasoning_content"], "I will call add.");
    assert_eq!(choice["finish_reason"], "tool_calls");

    // Streamed, cut anywhere: the same separation.
    let text = format!("<think>I will {call}</think>\n\n{call}");
    for cut in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
        let mut s = ChunkShaper::with_tokenizer(tok.clone(), &r, "id".into(), 0, "m".into());
        let mut out = s.shape(Ok(chunk(&text[..cut], None, 0)));
        out.extend(s.shape(Ok(chunk(&text[cut..], Some(FinishReason::Eos), 9))));
        assert_eq!(deltas(&out, 0, "reasoning_content").as_deref(), Some(&*format!("I will {call}")), "cut {cut}");
        let calls: Vec<&Value> = out.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
        assert_eq!(calls.len(), 1, "cut {cut}: {out:?}");
        assert_eq!(out.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    }
}

#[test]
fn streamed_reasoning_never_leaks_a_partial_marker() {
    let tok = qwen3();
    let r = request(tok.as_ref(), json!({"stream": true}));
    let text = "<think>\nstep one </ two\n</think>\n\nThe answer is 4.";
    // Every cut into three chunks: reasoning and content deltas concatenate to the whole
    // answer's, and no delta holds part of a marker.
    let cuts: Vec<usize> = (0..=text.len()).collect();
    for &a in &cuts {
        for &b in cuts.iter().filter(|&&b| b >= a) {
            let mut s = ChunkShaper::with_tokenizer(tok.clone(), &r, "id".into(), 0, "m".into());
            let mut out = s.start();
            out.extend(s.shape(Ok(chunk(&text[..a], None, 0))));
            out.extend(s.shape(Ok(chunk(&text[a..b], None, 0))));
            out.extend(s.shape(Ok(chunk(&text[b..], Some(FinishReason::Eos), 12))));
            assert!(s.finished());
            assert_eq!(deltas(&out, 0, "reasoning_content").as_deref(), Some("\nstep one </ two\n"), "{a} {b}");
            assert_eq!(deltas(&out, 0, "content").as_deref(), Some("\n\nThe answer is 4."), "{a} {b}");
            for c in &out {
                let d = &c["choices"][0]["delta"];
                for k in ["reasoning_content", "content"] {
                    let t = d[k].as_str().unwrap_or_default();
                    assert!(!t.contains("<think") && !t.contains("</think") && !t.contains("think>"), "{a} {b}: {c}");
                    assert!(!t.ends_with('<') && !t.ends_with("</"), "{a} {b}: {c}");
                }
            }
        }
    }
}

#[test]
fn n_choices_in_one_response() {
    let tok = chatml();
    let t = tok.as_ref();
    let r = parse(Endpoint::Chat, &user(json!({"n": 3}))).unwrap();
    let v = response_json_with(t, &r, "id", 0, "m", &[response("a", 2), response("b", 3), response("c", 4)]).unwrap();
    let texts: Vec<(&Value, &Value)> =
        v["choices"].as_array().unwrap().iter().map(|c| (&c["index"], &c["message"]["content"])).collect();
    assert_eq!(texts, [(&json!(0), &json!("a")), (&json!(1), &json!("b")), (&json!(2), &json!("c"))]);
    // The prompt counted once, every completion.
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 9, "total_tokens": 19, "prompt_tokens_details": {"cached_tokens": 0}})
    );
    let r = parse(Endpoint::Completion, &body(json!({"prompt": "x", "n": 2}))).unwrap();
    let v = response_json_with(t, &r, "id", 0, "m", &[response("a", 1), response("b", 1)]).unwrap();
    assert_eq!((&v["choices"][1]["index"], &v["choices"][1]["text"]), (&json!(1), &json!("b")));
    // One failed choice fails the response.
    let mut failed = response("b", 1);
    failed.finish_reason = FinishReason::Error;
    assert_eq!(
        response_json_with(t, &r, "id", 0, "m", &[response("a", 1), failed]).unwrap_err().kind,
        "internal_error"
    );

    // Streamed: a role chunk per choice, chunks tagged with their choice, and the usage once
    // every choice has finished.
    let r = parse(Endpoint::Chat, &user(json!({"n": 2, "stream": true, "stream_options": {"include_usage": true}})))
        .unwrap();
    let mut s = ChunkShaper::with_tokenizer(tok.clone(), &r, "id".into(), 0, "m".into());
    let mut out = s.start();
    assert_eq!(out.len(), 2);
    out.extend(s.shape_choice(1, Ok(chunk("x", None, 0))));
    out.extend(s.shape_choice(0, Ok(chunk("y", None, 0))));
    out.extend(s.shape_choice(1, Ok(chunk("z", Some(FinishReason::Length), 2))));
    assert!(!s.finished(), "choice 0 is still going");
    assert!(out.iter().all(|c| c.get("usage").is_none()));
    out.extend(s.shape_choice(0, Ok(chunk("w", Some(FinishReason::Eos), 3))));
    assert!(s.finished());
    assert!(s.shape_choice(0, Ok(chunk("late", None, 0))).is_empty(), "nothing after a choice finished");
    assert_eq!(
        (deltas(&out, 0, "content").as_deref(), deltas(&out, 1, "content").as_deref()),
        (Some("yw"), Some("xz"))
    );
    let finishes: Vec<(&Value, &Value)> = out
        .iter()
        .filter_map(|c| c["choices"].get(0).filter(|c| !c["finish_reason"].is_null()))
        .map(|c| (&c["index"], &c["finish_reason"]))
        .collect();
    assert_eq!(finishes, [(&json!(1), &json!("length")), (&json!(0), &json!("stop"))]);
    let usage = &out.last().unwrap()["usage"];
    assert_eq!((&usage["prompt_tokens"], &usage["completion_tokens"]), (&json!(10), &json!(5)));
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 4);
    // An error in one choice ends the response.
    let mut s = ChunkShaper::with_tokenizer(tok, &r, "id".into(), 0, "m".into());
    let out = s.shape_choice(1, Err(crate::WeftError::Unavailable("gone".into())));
    assert!(out.last().unwrap().get("error").is_some() && s.finished());
}

/// The tiny Qwen3 engine on the GPU (lavapipe in CI), or `None` to skip.
fn qwen3_engine(prefix_cache: bool) -> Option<ContinuousBatchEngine> {
    let bytes = crate::model::tiny::qwen3_gguf(6, crate::DType::Q8_0);
    let config =
        crate::engine::EngineConfig { max_model_len: 96, enable_prefix_cache: prefix_cache, ..Default::default() };
    super::tests::engine_on("tiny-qwen3.gguf", bytes, config)
}

fn run(engine: &ContinuousBatchEngine, r: &OpenAiRequest) -> Vec<InferenceResponse> {
    let futures = r.choice_requests().into_iter().map(|c| engine.infer(c));
    crate::rt::block_on(futures::future::try_join_all(futures)).unwrap()
}

fn run_streamed(engine: &ContinuousBatchEngine, r: &OpenAiRequest) -> Vec<Value> {
    let streams: Vec<_> = r
        .choice_requests()
        .into_iter()
        .enumerate()
        .map(|(i, c)| engine.infer_stream(c).unwrap().map(move |item| (i, item)).boxed())
        .collect();
    let mut merged = futures::stream::select_all(streams);
    let mut shaper = ChunkShaper::new(engine.clone(), r, "id".into(), 0, "m".into());
    let mut out = shaper.start();
    while !shaper.finished() {
        let Some((i, item)) = crate::rt::block_on(merged.next()) else { break };
        out.extend(shaper.shape_choice(i, item));
    }
    assert!(shaper.finished());
    out
}

/// `n: 3` with a seed gives three choices whose tokens are those of three single requests
/// seeded seed, seed + 1, seed + 2; whole and streamed, with the prefix cache on and off.
#[test]
fn n_seeded_choices_equal_single_requests() {
    for prefix_cache in [true, false] {
        let Some(engine) = qwen3_engine(prefix_cache) else { return };
        let tok = engine.tokenizer().clone();
        let base = json!({"max_tokens": 6, "ignore_eos": true, "temperature": 1.0, "seed": 40,
                          "chat_template_kwargs": {"enable_thinking": false}});
        let mut three = user(base.clone());
        three.insert("n".into(), json!(3));
        let r = request(tok.as_ref(), Value::Object(three.clone()));
        let together = run(&engine, &r);
        let singles: Vec<InferenceResponse> = (0..3)
            .map(|i| {
                let mut one = user(base.clone());
                one.insert("seed".into(), json!(40 + i));
                run(&engine, &request(tok.as_ref(), Value::Object(one))).remove(0)
            })
            .collect();
        for (i, (a, b)) in together.iter().zip(&singles).enumerate() {
            assert_eq!(a.token_ids, b.token_ids, "choice {i} against the single request seeded {}", 40 + i);
        }
        let ids: Vec<&Vec<u32>> = singles.iter().map(|s| &s.token_ids).collect();
        assert!(ids[0] != ids[1] || ids[1] != ids[2], "the seeds must matter: {ids:?}");
        let v = response_json(&engine, &r, "id", 0, "m", &together[0]).unwrap();
        assert_eq!(v["choices"].as_array().unwrap().len(), 1, "response_json shapes one response");
        let v = response_json_with(tok.as_ref(), &r, "id", 0, "m", &together).unwrap();
        for (i, s) in singles.iter().enumerate() {
            assert_eq!(v["choices"][i]["index"], i);
            assert_eq!(v["choices"][i]["message"]["content"], s.text.as_str());
        }
        assert_eq!(v["usage"]["prompt_tokens"], singles[0].usage.prompt_tokens);
        assert_eq!(v["usage"]["completion_tokens"], 18);
        // Streamed: each choice's deltas are its single request's text.
        three.insert("stream".into(), json!(true));
        three.insert("stream_options".into(), json!({"include_usage": true}));
        let r = request(tok.as_ref(), Value::Object(three));
        let out = run_streamed(&engine, &r);
        for (i, s) in singles.iter().enumerate() {
            assert_eq!(deltas(&out, i, "content").unwrap_or_default(), s.text, "streamed choice {i}");
        }
        assert_eq!(out.last().unwrap()["usage"]["completion_tokens"], 18);
    }
}

/// A prompt that leaves Qwen3 thinking: the random model never writes `</think>`, so the
/// whole answer is reasoning, whole and streamed; with thinking off the same tokens are all
/// content.
#[test]
fn a_thinking_answer_is_all_reasoning() {
    let Some(engine) = qwen3_engine(true) else { return };
    let tok = engine.tokenizer().clone();
    let base = json!({"max_tokens": 8, "ignore_eos": true, "temperature": 0});
    let r = request(tok.as_ref(), base.clone());
    assert_eq!(r.reasoning.map(|x| x.open), Some(true));
    let whole = run(&engine, &r).remove(0);
    assert!(!whole.token_ids.contains(&QWEN3_END_THINK), "this seed's greedy answer must not end its reasoning");
    assert!(!whole.text.is_empty(), "{whole:?}");
    let v = response_json(&engine, &r, "id", 0, "m", &whole).unwrap();
    let m = &v["choices"][0]["message"];
    let expected = whole.text.trim_start().strip_prefix("<think>").unwrap_or(&whole.text);
    assert_eq!((m["reasoning_content"].as_str(), &m["content"]), (Some(expected), &Value::Null), "{v}");
    let mut streamed = user(base.clone());
    streamed.insert("stream".into(), json!(true));
    let out = run_streamed(&engine, &request(tok.as_ref(), Value::Object(streamed)));
    assert_eq!(deltas(&out, 0, "reasoning_content").as_deref(), Some(expected));
    assert_eq!(deltas(&out, 0, "content").unwrap_or_default(), "");

    let mut off = user(base);
    off.insert("chat_template_kwargs".into(), json!({"enable_thinking": false}));
    let r = request(tok.as_ref(), Value::Object(off));
    let answer = run(&engine, &r).remove(0);
    let v = response_json(&engine, &r, "id", 0, "m", &answer).unwrap();
    let m = &v["choices"][0]["message"];
    assert_eq!((&m["reasoning_content"], m["content"].as_str()), (&Value::Null, Some(answer.text.as_str())));
}

/// The engine's half of reasoning with structured output: the constraint starts after the
/// `constraint_after` token. Here that token is one the free greedy answer writes, so the
/// answer runs free up to it and then matches the grammar.
#[test]
fn a_constraint_starts_after_the_end_of_reasoning() {
    use crate::constraint::{Constraint, Grammar};
    let Some(engine) = qwen3_engine(false) else { return };
    let tok = engine.tokenizer().clone();
    let r = request(tok.as_ref(), json!({"max_tokens": 12, "ignore_eos": true, "temperature": 0}));
    let free = run(&engine, &r).remove(0);
    // The third token stands in for </think> (the random model never writes the real one).
    let end = free.token_ids[2];
    let first = free.token_ids.iter().position(|&t| t == end).unwrap();
    let mut constrained = r.request.clone();
    constrained.params.constraint = Some(Constraint::new("response_format", Grammar::Regex("xyz".into())));
    constrained.params.constraint_after = Some(end);
    let out = crate::rt::block_on(engine.infer(constrained.clone())).unwrap();
    assert_eq!(out.token_ids[..=first], free.token_ids[..=first], "free up to the marker");
    let answer = tok.decode(&out.token_ids[first + 1..], true).unwrap();
    assert_eq!((answer.as_str(), out.finish_reason), ("xyz", FinishReason::Stop));
    // Without constraint_after the constraint holds from the first token.
    constrained.params.constraint_after = None;
    let out = crate::rt::block_on(engine.infer(constrained.clone())).unwrap();
    assert_eq!(out.text, "xyz");
    // An end token outside the vocabulary is refused at the door, naming it.
    constrained.params.constraint_after = Some(100_000);
    let e = OpenAiError::from_engine(engine.submit(constrained).unwrap_err());
    assert_eq!(e.param.as_deref(), Some("constraint_after"));
}
