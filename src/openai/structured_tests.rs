//! Structured output and tools in the protocol: each request field becomes the constraint it
//! means (or a 400 naming it), messages carry tool calls and results, and answers that call
//! tools come back as OpenAI's `tool_calls`, whole and streamed.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::*;
use crate::constraint::{Grammar, ToolChoice};
use crate::engine::request::{FinishReason, InferenceResponse, StreamChunk, Usage};
use crate::tokenizer::Tokenizer;

fn chat(extra: Value) -> Map<String, Value> {
    let mut m = json!({"messages": [{"role": "user", "content": "hi"}]}).as_object().cloned().unwrap_or_default();
    m.extend(extra.as_object().cloned().unwrap_or_default());
    m
}

fn tiny_tokenizer() -> Arc<dyn Tokenizer> {
    let meta: crate::model::gguf::Metadata =
        crate::model::tiny::tokenizer_metadata().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    Arc::new(crate::tokenizer::HfTokenizer::from_gguf_metadata(&meta).unwrap())
}

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}})
}

#[test]
fn each_field_becomes_its_constraint() {
    let schema = json!({"type": "object"});
    let cases = [
        (json!({"response_format": {"type": "json_object"}}), "response_format", Grammar::JsonObject),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}}),
            "response_format",
            Grammar::JsonSchema(schema.clone()),
        ),
        (json!({"structured_outputs": {"json": schema}}), "structured_outputs", Grammar::JsonSchema(schema.clone())),
        (json!({"structured_outputs": {"regex": "a+"}}), "structured_outputs", Grammar::Regex("a+".into())),
        (
            json!({"structured_outputs": {"choice": ["a", "b"]}}),
            "structured_outputs",
            Grammar::Choice(vec!["a".into(), "b".into()]),
        ),
        (
            json!({"structured_outputs": {"grammar": "start: \"a\""}}),
            "structured_outputs",
            Grammar::Lark("start: \"a\"".into()),
        ),
        (json!({"structured_outputs": {"json_object": true}}), "structured_outputs", Grammar::JsonObject),
        (json!({"guided_json": "{\"type\": \"object\"}"}), "guided_json", Grammar::JsonSchema(schema.clone())),
        (json!({"guided_regex": "[0-9]"}), "guided_regex", Grammar::Regex("[0-9]".into())),
        (json!({"guided_choice": ["x"]}), "guided_choice", Grammar::Choice(vec!["x".into()])),
        (json!({"guided_grammar": "root ::= \"a\""}), "guided_grammar", Grammar::Gbnf("root ::= \"a\"".into())),
        (json!({"grammar": "root ::= \"a\""}), "grammar", Grammar::Gbnf("root ::= \"a\"".into())),
        (json!({"json_schema": schema}), "json_schema", Grammar::JsonSchema(schema.clone())),
    ];
    for (extra, field, grammar) in cases {
        let r = parse(Endpoint::Chat, &chat(extra.clone())).unwrap();
        let c = r.request.params.constraint.unwrap_or_else(|| panic!("{extra}"));
        assert_eq!((c.field.as_str(), c.grammar), (field, grammar), "{extra}");
    }
    let text = parse(Endpoint::Chat, &chat(json!({"response_format": {"type": "text"}}))).unwrap();
    assert_eq!(text.request.params.constraint, None);
    let completion = json!({"prompt": "x", "guided_regex": "a"}).as_object().cloned().unwrap();
    assert!(parse(Endpoint::Completion, &completion).unwrap().request.params.constraint.is_some());
}

#[test]
fn malformed_fields_are_refused_naming_them() {
    let cases = [
        (json!({"response_format": "json"}), "response_format", "expected an object"),
        (json!({"response_format": {}}), "response_format", "type is missing"),
        (json!({"response_format": {"type": "yaml"}}), "response_format", "unknown type"),
        (json!({"response_format": {"type": "json_schema"}}), "response_format", "json_schema must be an object"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format",
            "schema is missing",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}}),
            "response_format",
            "strict",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}),
            "response_format",
            "schema object",
        ),
        (json!({"structured_outputs": {}}), "structured_outputs", "none of"),
        (json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}), "structured_outputs", "both"),
        (json!({"structured_outputs": {"xml": "a"}}), "structured_outputs", "not supported"),
        (json!({"structured_outputs": {"json_object": 1}}), "structured_outputs", "true or false"),
        (json!({"guided_json": "{oops"}), "guided_json", "not valid JSON"),
        (json!({"guided_json": "[1]"}), "guided_json", "schema object"),
        (json!({"guided_regex": 5}), "guided_regex", "must be a string"),
        (json!({"guided_choice": "a"}), "guided_choice", "list of strings"),
        (json!({"guided_choice": [1]}), "guided_choice", "must be a string"),
        (json!({"grammar": ["x"]}), "grammar", "must be a string"),
        (json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}), "guided_regex", "give only one"),
    ];
    for (extra, field, needle) in cases {
        let e = parse(Endpoint::Chat, &chat(extra.clone())).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(field), "{extra}: {e:?}");
        assert!(e.message.contains(needle), "{extra}: {e:?}");
    }
}

#[test]
fn tools_and_tool_choice() {
    let r = parse(Endpoint::Chat, &chat(json!({"tools": [weather()]}))).unwrap();
    assert_eq!(r.tools.as_ref().map(|t| &t.choice), Some(&ToolChoice::Auto));
    assert_eq!(r.request.tools, vec![weather()]);
    assert_eq!(r.request.params.constraint, None, "auto is not enforced");
    let r = parse(
        Endpoint::Chat,
        &chat(json!({"tools": [weather()], "tool_choice": "required", "parallel_tool_calls": false})),
    )
    .unwrap();
    let c = r.request.params.constraint.unwrap();
    assert_eq!(c.field, "tools");
    assert_eq!(c.grammar, Grammar::ToolCalls { tools: vec![weather()], name: None, parallel: false });
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let r = parse(Endpoint::Chat, &chat(json!({"tools": [weather()], "tool_choice": named}))).unwrap();
    assert_eq!(r.tools.unwrap().choice, ToolChoice::Named("get_weather".into()));
    let r = parse(Endpoint::Chat, &chat(json!({"tools": [weather()], "tool_choice": "none"}))).unwrap();
    assert!(!r.tools.unwrap().reads_calls());
    assert!(parse(Endpoint::Chat, &chat(json!({}))).unwrap().tools.is_none());

    let bad = [
        (json!({"tools": {}}), "tools", "list of tools"),
        (json!({"tools": [{"type": "retrieval"}]}), "tools", "type must be \"function\""),
        (json!({"tools": [{"type": "function"}]}), "tools", "function must be an object"),
        (json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}), "tools", "must be 1 to 64"),
        (json!({"tools": [weather(), weather()]}), "tools", "two tools are named"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 1}}]}),
            "tools",
            "JSON schema object",
        ),
        (json!({"tools": [weather()], "tool_choice": "always"}), "tool_choice", "none, auto, required"),
        (json!({"tools": [weather()], "tool_choice": {"type": "function"}}), "tool_choice", "expected"),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "x"}}}),
            "tool_choice",
            "no tool",
        ),
        (json!({"tool_choice": "required"}), "tool_choice", "no tools"),
        (json!({"tools": [weather()], "parallel_tool_calls": "yes"}), "parallel_tool_calls", "true or false"),
        (
            json!({"tools": [weather()], "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "tool_choice",
            "cannot be combined",
        ),
    ];
    for (extra, field, needle) in bad {
        let e = parse(Endpoint::Chat, &chat(extra.clone())).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(field), "{extra}: {e:?}");
        assert!(e.message.contains(needle), "{extra}: {e:?}");
    }
    let completion = json!({"prompt": "x", "tools": [weather()]}).as_object().cloned().unwrap();
    assert_eq!(parse(Endpoint::Completion, &completion).unwrap_err().param.as_deref(), Some("tools"));
}

#[test]
fn messages_carry_tool_calls_and_results() {
    let messages = json!([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "cold"},
    ]);
    let r = parse(Endpoint::Chat, &chat(json!({"messages": messages}))).unwrap();
    let crate::engine::request::Prompt::Chat(m) = &r.request.prompt else { panic!() };
    assert_eq!(m[1].content, "");
    assert_eq!(m[1].tool_calls[0]["function"]["arguments"], json!({"city": "Oslo"}), "an object for templates");
    assert_eq!(m[1].tool_calls[0]["id"], "call_1");
    assert_eq!(m[2].tool_call_id.as_deref(), Some("call_1"));
    // The tiny model's template writes the call and the result back in its own format.
    let rendered = tiny_tokenizer().chat_template().unwrap().render_with_tools(m, &[weather()], true).unwrap();
    assert!(rendered.contains("<tools>\n{\"type\": \"function\""), "{rendered}");
    assert!(
        rendered
            .contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>")
    );
    assert!(rendered.contains("<tool_response>\ncold\n</tool_response>"), "{rendered}");
    for (bad, needle) in [
        (json!([{"role": "assistant", "tool_calls": {}}]), "must be a list"),
        (json!([{"role": "assistant", "tool_calls": [{"id": "x"}]}]), "function object"),
        (json!([{"role": "tool", "tool_call_id": 3, "content": "x"}]), "tool_call_id must be a string"),
    ] {
        let e = parse(Endpoint::Chat, &chat(json!({"messages": bad}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(e.message.contains(needle), "{e:?}");
    }
}

fn response(text: &str) -> InferenceResponse {
    InferenceResponse {
        text: text.into(),
        token_ids: vec![1],
        logprobs: Vec::new(),
        finish_reason: FinishReason::Eos,
        usage: Usage::default(),
    }
}

const CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";

#[test]
fn answers_with_calls_become_tool_calls() {
    let tok = tiny_tokenizer();
    let shape = |extra: Value, text: &str| {
        let req = parse(Endpoint::Chat, &chat(extra)).unwrap();
        response_json_with(tok.as_ref(), &req, "id", 0, "m", &[response(text)]).unwrap()
    };
    let v = shape(json!({"tools": [weather()]}), CALL);
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"], json!({"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}));
    let named = json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    assert_eq!(shape(named, CALL)["choices"][0]["finish_reason"], "stop");
    let plain = shape(json!({"tools": [weather()]}), "It is cold.");
    assert_eq!(plain["choices"][0]["message"], json!({"role": "assistant", "content": "It is cold."}));
    let none = shape(json!({"tools": [weather()], "tool_choice": "none"}), CALL);
    assert_eq!(none["choices"][0]["message"]["content"], CALL);
    assert_eq!(none["choices"][0]["finish_reason"], "stop");
}

#[test]
fn streamed_calls_arrive_whole_as_deltas() {
    let tok = tiny_tokenizer();
    let req = parse(Endpoint::Chat, &chat(json!({"tools": [weather()], "stream": true}))).unwrap();
    let mut shaper = ChunkShaper::with_tokenizer(tok, &req, "id".into(), 0, "m".into());
    let mut out = shaper.start();
    let text = format!("Checking. {CALL}");
    let pieces: Vec<&str> = vec![&text[..5], &text[5..20], &text[20..]];
    for (i, p) in pieces.iter().enumerate() {
        let last = i == pieces.len() - 1;
        out.extend(shaper.shape(Ok(StreamChunk {
            text: p.to_string(),
            token_ids: vec![1],
            logprobs: Vec::new(),
            finish_reason: last.then_some(FinishReason::Eos),
            usage: last.then(Usage::default),
            embedding: None,
        })));
    }
    let deltas: Vec<&Value> = out.iter().map(|c| &c["choices"][0]["delta"]).collect();
    let content: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
    assert_eq!(content.trim(), "Checking.");
    let calls: Vec<&Value> = deltas.iter().copied().filter(|d| d.get("tool_calls").is_some()).collect();
    assert_eq!(calls.len(), 1);
    let call = &calls[0]["tool_calls"][0];
    assert_eq!(call["index"], 0);
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(out.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    assert!(shaper.finished());
}
