//! The field table: every field of OpenAI's chat completions and completions request objects,
//! and every extension weft reads, is honoured (the parsed request carries it), refused with an
//! error naming it, or accepted and ignored on purpose (metadata that changes no token). A
//! field weft does not know is refused.
//!
//! OpenAI's fields as its API reference lists them (the chat object's 35 and the deprecated
//! `functions` / `function_call`; the completions object's 18).

use serde_json::{Map, Value, json};

use super::error::ApiResult;
use super::parse::{IGNORED_FIELDS, known_fields};
use super::*;
use crate::constraint::Grammar;
use crate::engine::request::Prompt;
use crate::tokenizer::ChatMessage;

const OPENAI_CHAT: &[&str] = &[
    "messages",
    "model",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
];

const OPENAI_COMPLETIONS: &[&str] = &[
    "model",
    "prompt",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
];

/// What weft does with a field's value.
enum Is {
    /// The parsed request carries it: `check` holds with the value and not without it.
    Honoured(Value, fn(&OpenAiRequest) -> bool),
    /// Refused with an `invalid_request_error` whose `param` names the field; the values that
    /// ask for nothing weft cannot do are accepted and change nothing.
    Refused(Value, Vec<Value>),
    /// Accepted (type-checked) and ignored, a documented decision: metadata about the caller or
    /// OpenAI's own services (dashboard, storage, tiers, abuse detection, cache routing) that
    /// changes no token a single-model server answers with. The request is the same without it.
    Ignored(Value),
}

/// One row: a field, other fields it needs beside it (e.g. `tools` for `tool_choice`), and
/// what weft does with it.
struct Row {
    field: &'static str,
    with: Value,
    is: Is,
}

fn row(field: &'static str, is: Is) -> Row {
    Row { field, with: json!({}), is }
}

fn row_with(field: &'static str, with: Value, is: Is) -> Row {
    Row { field, with, is }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}})
}

fn grammar(r: &OpenAiRequest) -> Option<&Grammar> {
    r.request.params.constraint.as_ref().map(|c| &c.grammar)
}

/// Rows both endpoints share (OpenAI's common fields, then weft's extensions from vLLM).
fn common_rows() -> Vec<Row> {
    use Is::*;
    vec![
        row("model", Honoured(json!("m"), |r| r.model.as_deref() == Some("m"))),
        row("frequency_penalty", Honoured(json!(0.5), |r| r.request.params.sampling.frequency_penalty == 0.5)),
        row("presence_penalty", Honoured(json!(0.25), |r| r.request.params.sampling.presence_penalty == 0.25)),
        // The engine tests check that the bias reaches the sampled tokens (openai::tests too).
        row(
            "logit_bias",
            Honoured(json!({"50": -100, "7": 2.5}), |r| {
                r.request.params.sampling.logit_bias.pairs() == [(7, 2.5), (50, -100.0)]
            }),
        ),
        row("logit_bias", Refused(json!({"50": 101}), vec![json!({})])),
        row("max_tokens", Honoured(json!(7), |r| r.request.params.max_tokens == Some(7))),
        row("max_completion_tokens", Honoured(json!(7), |r| r.request.params.max_tokens == Some(7))),
        row_with("max_completion_tokens", json!({"max_tokens": 8}), Refused(json!(7), vec![json!(8)])),
        // Each choice its own engine request, seeded seed + i (the engine tests check the tokens).
        row("n", Honoured(json!(3), |r| r.n == 3 && r.choice_requests().len() == 3)),
        row("n", Refused(json!(17), vec![json!(1)])),
        row("seed", Honoured(json!(7), |r| r.request.params.sampling.seed == Some(7))),
        row("stop", Honoured(json!(["x", "y"]), |r| r.request.params.stop == ["x", "y"])),
        row("stream", Honoured(json!(true), |r| r.stream)),
        row_with(
            "stream_options",
            json!({"stream": true}),
            Honoured(json!({"include_usage": true}), |r| r.include_usage),
        ),
        row_with(
            "stream_options",
            json!({"stream": true}),
            Refused(json!({"include_obfuscation": true}), vec![json!({"include_obfuscation": false})]),
        ),
        row("stream_options", Refused(json!({"include_usage": true}), vec![])),
        row("temperature", Honoured(json!(0.5), |r| r.request.params.sampling.temperature == 0.5)),
        row("top_p", Honoured(json!(0.5), |r| r.request.params.sampling.top_p == 0.5)),
        row("prompt_cache_retention", Refused(json!("24h"), vec![json!("in_memory")])),
        row("user", Ignored(json!("someone"))),
        row("metadata", Ignored(json!({"team": "a"}))),
        row("store", Ignored(json!(true))),
        row("service_tier", Ignored(json!("auto"))),
        row("prompt_cache_key", Ignored(json!("k"))),
        row("safety_identifier", Ignored(json!("hash"))),
        // vLLM's extensions.
        row("top_k", Honoured(json!(5), |r| r.request.params.sampling.top_k == 5)),
        row("min_p", Honoured(json!(0.1), |r| r.request.params.sampling.min_p == 0.1)),
        row("repetition_penalty", Honoured(json!(1.2), |r| r.request.params.sampling.repetition_penalty == 1.2)),
        row("ignore_eos", Honoured(json!(true), |r| r.request.params.ignore_eos)),
        row("stop_token_ids", Honoured(json!([7, 8]), |r| r.request.params.stop_token_ids == [7, 8])),
        // vLLM's order (lower runs first) becomes the engine's (higher runs first).
        row("priority", Honoured(json!(-3), |r| r.request.params.priority == 3)),
        // Structured output (vLLM's and llama.cpp's names; their own cases are in structured_tests).
        row("response_format", Honoured(json!({"type": "json_object"}), |r| grammar(r) == Some(&Grammar::JsonObject))),
        row(
            "structured_outputs",
            Honoured(json!({"regex": "a+"}), |r| grammar(r) == Some(&Grammar::Regex("a+".into()))),
        ),
        row("guided_json", Honoured(json!({"type": "object"}), |r| matches!(grammar(r), Some(Grammar::JsonSchema(_))))),
        row("guided_regex", Honoured(json!("a+"), |r| grammar(r) == Some(&Grammar::Regex("a+".into())))),
        row(
            "guided_choice",
            Honoured(json!(["a", "b"]), |r| matches!(grammar(r), Some(Grammar::Choice(c)) if c.len() == 2)),
        ),
        row("guided_grammar", Honoured(json!("start: \"a\""), |r| matches!(grammar(r), Some(Grammar::Lark(_))))),
        row("grammar", Honoured(json!("root ::= \"a\""), |r| matches!(grammar(r), Some(Grammar::Gbnf(_))))),
        row("json_schema", Honoured(json!({"type": "object"}), |r| matches!(grammar(r), Some(Grammar::JsonSchema(_))))),
    ]
}

fn chat_rows() -> Vec<Row> {
    use Is::*;
    let mut rows = common_rows();
    rows.extend([
        row(
            "messages",
            Honoured(json!([{"role": "system", "content": "s"}]), |r| {
                r.request.prompt == Prompt::Chat(vec![ChatMessage::system("s")])
            }),
        ),
        row(
            "logprobs",
            Honoured(json!(true), |r| r.logprobs == Some(0) && r.request.params.sampling.top_logprobs == 1),
        ),
        row_with("top_logprobs", json!({"logprobs": true}), Honoured(json!(3), |r| r.logprobs == Some(3))),
        row("tools", Honoured(json!([tool()]), |r| r.request.tools == [tool()] && r.tools.is_some())),
        // vLLM's extra chat template variables.
        row(
            "chat_template_kwargs",
            Honoured(json!({"enable_thinking": false}), |r| {
                r.request.chat_template_kwargs.get("enable_thinking") == Some(&json!(false))
            }),
        ),
        row("chat_template_kwargs", Refused(json!({"messages": []}), vec![json!({})])),
        row_with(
            "tool_choice",
            json!({"tools": [tool()]}),
            Honoured(json!("required"), |r| matches!(grammar(r), Some(Grammar::ToolCalls { name: None, .. }))),
        ),
        row_with(
            "parallel_tool_calls",
            json!({"tools": [tool()], "tool_choice": "required"}),
            Honoured(json!(false), |r| matches!(grammar(r), Some(Grammar::ToolCalls { parallel: false, .. }))),
        ),
        row("modalities", Refused(json!(["text", "audio"]), vec![json!(["text"])])),
        row("audio", Refused(json!({"voice": "alloy", "format": "wav"}), vec![])),
        row("prediction", Refused(json!({"type": "content", "content": "x"}), vec![])),
        row("reasoning_effort", Refused(json!("low"), vec![])),
        row("verbosity", Refused(json!("low"), vec![])),
        row("web_search_options", Refused(json!({}), vec![])),
        row("functions", Refused(json!([{"name": "f", "parameters": {}}]), vec![])),
        row("function_call", Refused(json!("auto"), vec![])),
    ]);
    rows
}

fn completion_rows() -> Vec<Row> {
    use Is::*;
    let mut rows = common_rows();
    rows.extend([
        row("prompt", Honoured(json!([5, 6]), |r| r.request.prompt == Prompt::Tokens(vec![5, 6]))),
        row("prompt", Honoured(json!("other"), |r| r.request.prompt == Prompt::Text("other".into()))),
        row("prompt", Refused(json!(["a", "b"]), vec![json!(["hi"])])),
        row("logprobs", Honoured(json!(2), |r| r.logprobs == Some(2) && r.request.params.sampling.top_logprobs == 2)),
        row("best_of", Refused(json!(2), vec![json!(1)])),
        row("echo", Refused(json!(true), vec![json!(false)])),
        row("suffix", Refused(json!("end"), vec![json!("")])),
    ]);
    rows
}

fn base(endpoint: Endpoint) -> Map<String, Value> {
    match endpoint {
        Endpoint::Chat => obj(json!({"messages": [{"role": "user", "content": "hi"}]})),
        Endpoint::Completion => obj(json!({"prompt": "hi"})),
    }
}

/// Parse, then the engine's own field checks (as the server and the browser do).
fn full(endpoint: Endpoint, body: &Map<String, Value>) -> ApiResult<OpenAiRequest> {
    let r = parse(endpoint, body)?;
    r.request.validate().map_err(OpenAiError::from_engine)?;
    Ok(r)
}

fn check_rows(endpoint: Endpoint, rows: &[Row]) {
    for Row { field, with, is } in rows {
        let mut without = base(endpoint);
        without.extend(obj(with.clone()));
        let with_value = |v: &Value| {
            let mut b = without.clone();
            b.insert(field.to_string(), v.clone());
            b
        };
        let plain = full(endpoint, &without).unwrap_or_else(|e| panic!("{endpoint:?} {field}: the base fails: {e}"));
        match is {
            Is::Honoured(value, check) => {
                let r = full(endpoint, &with_value(value))
                    .unwrap_or_else(|e| panic!("{endpoint:?} {field}={value}: refused: {e}"));
                assert!(check(&r), "{endpoint:?} {field}={value}: not carried by the parsed request: {r:?}");
                assert!(!check(&plain), "{endpoint:?} {field}: the check holds without the field too");
            }
            Is::Refused(value, accepted) => {
                let e = full(endpoint, &with_value(value)).expect_err(&format!("{endpoint:?} {field}={value}"));
                assert_eq!(e.kind, "invalid_request_error", "{endpoint:?} {field}: {e:?}");
                assert_eq!(e.param.as_deref(), Some(*field), "{endpoint:?} {field}: {e:?}");
                assert!(e.message.contains(field), "{endpoint:?} {field}: the message must name it: {e:?}");
                assert_eq!(e.body()["error"]["param"], json!(field));
                for ok in accepted {
                    let r = full(endpoint, &with_value(ok))
                        .unwrap_or_else(|e| panic!("{endpoint:?} {field}={ok} must be accepted: {e}"));
                    assert_eq!(r, plain, "{endpoint:?} {field}={ok} asks for nothing and changes nothing");
                }
            }
            Is::Ignored(value) => {
                assert!(IGNORED_FIELDS.contains(field), "{field} is ignored but not listed as such");
                let r = full(endpoint, &with_value(value))
                    .unwrap_or_else(|e| panic!("{endpoint:?} {field}={value}: refused: {e}"));
                assert_eq!(r, plain, "{endpoint:?} {field} is ignored: the request is the same without it");
                // Type-checked all the same.
                let e = full(endpoint, &with_value(&json!([[]]))).expect_err(&format!("{field}: a list of lists"));
                assert_eq!(e.param.as_deref(), Some(*field));
            }
        }
    }
}

/// Every OpenAI field has a row, and every row's field is OpenAI's or a listed extension.
fn check_complete(endpoint: Endpoint, openai: &[&str], rows: &[Row]) {
    for field in openai {
        assert!(rows.iter().any(|r| r.field == *field), "{endpoint:?}: OpenAI's {field} has no row");
    }
    for field in known_fields(endpoint) {
        assert!(rows.iter().any(|r| r.field == field), "{endpoint:?}: weft reads {field}, which has no row");
    }
}

#[test]
fn every_chat_field_is_honoured_refused_or_ignored() {
    let rows = chat_rows();
    check_complete(Endpoint::Chat, OPENAI_CHAT, &rows);
    check_rows(Endpoint::Chat, &rows);
}

#[test]
fn every_completions_field_is_honoured_refused_or_ignored() {
    let rows = completion_rows();
    check_complete(Endpoint::Completion, OPENAI_COMPLETIONS, &rows);
    check_rows(Endpoint::Completion, &rows);
}

#[test]
fn unknown_fields_are_refused_by_name() {
    let refused = |endpoint: Endpoint, extra: Value, field: &str, needle: &str| {
        let mut b = base(endpoint);
        b.extend(obj(extra));
        let e = parse(endpoint, &b).unwrap_err();
        assert_eq!((e.kind, e.param.as_deref()), ("invalid_request_error", Some(field)), "{e:?}");
        assert!(e.message.contains(needle), "{e:?} should say {needle:?}");
    };
    refused(Endpoint::Chat, json!({"frobnicate": 1}), "frobnicate", "unknown field frobnicate");
    refused(Endpoint::Chat, json!({"frobnicate": 1}), "frobnicate", "remove it");
    refused(Endpoint::Chat, json!({"echo": false}), "echo", "it is for /v1/completions");
    refused(Endpoint::Completion, json!({"tools": [tool()]}), "tools", "it is for /v1/chat/completions");
    refused(Endpoint::Completion, json!({"top_logprobs": 2}), "top_logprobs", "it is for /v1/chat/completions");
    // The first in name order, whatever order they came in.
    refused(Endpoint::Chat, json!({"zz": 1, "aa": 1}), "aa", "unknown field aa");
    // An unknown field that is null asks for nothing.
    let mut b = base(Endpoint::Chat);
    b.insert("frobnicate".into(), Value::Null);
    assert!(parse(Endpoint::Chat, &b).is_ok());
}
