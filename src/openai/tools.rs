//! OpenAI's tool calling: reading `tools`, `tool_choice` and `parallel_tool_calls` (a
//! `"required"` or named choice becomes a grammar the engine enforces), the assistant's
//! `tool_calls` and the `role: "tool"` results in `messages`, and the `tool_calls` objects of
//! responses and streamed deltas. Which format the model writes calls in, and reading them from
//! its text, is `crate::constraint::tools`.

use serde_json::{Map, Value, json};

use crate::constraint::{Constraint, Grammar, ToolCall, ToolChoice, ToolFormat};
use crate::openai::error::{ApiResult, OpenAiError};
use crate::tokenizer::Tokenizer;

/// A chat request's tools, for reading calls out of the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolsRequest {
    /// The function names that may be called.
    pub names: Vec<String>,
    pub choice: ToolChoice,
}

impl ToolsRequest {
    /// Whether the answer is read for calls (not with `tool_choice: "none"`).
    pub fn reads_calls(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The finish reason of an answer that made calls: OpenAI says "tool_calls", except when
    /// the request named the function.
    pub fn finish_reason(&self) -> &'static str {
        if matches!(self.choice, ToolChoice::Named(_)) { "stop" } else { "tool_calls" }
    }

    pub fn names(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }
}

/// What `tools` and friends asked for: the tool objects (for the chat template), what the
/// response shaping needs, and the constraint that enforces a required or named call.
pub(crate) struct ParsedTools {
    pub tools: Vec<Value>,
    pub request: Option<ToolsRequest>,
    pub constraint: Option<Constraint>,
}

fn bad(field: &str, why: impl std::fmt::Display) -> OpenAiError {
    OpenAiError::invalid(field, format!("invalid {field}: {why}"))
}

/// Read `tools`, `tool_choice` and `parallel_tool_calls`.
pub(crate) fn parse_tools(body: &Map<String, Value>) -> ApiResult<ParsedTools> {
    let get = |k: &str| body.get(k).filter(|v| !v.is_null());
    let tools = match get("tools") {
        None => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(v) => return Err(bad("tools", format!("expected a list of tools, got {v}"))),
    };
    let mut names = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad("tools", format!("tool {i}: type must be \"function\"")));
        }
        let Some(function) = tool.get("function").and_then(Value::as_object) else {
            return Err(bad("tools", format!("tool {i}: function must be an object")));
        };
        let name = function.get("name").and_then(Value::as_str).unwrap_or("");
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(bad("tools", format!("tool {i}: name {name:?} must be 1 to 64 of a-z, A-Z, 0-9, _ and -")));
        }
        if names.contains(&name.to_string()) {
            return Err(bad("tools", format!("two tools are named {name:?}")));
        }
        if let Some(p) = function.get("parameters").filter(|p| !p.is_object() && !p.is_null()) {
            return Err(bad("tools", format!("tool {name}: parameters must be a JSON schema object, got {p}")));
        }
        names.push(name.to_string());
    }
    let choice = match get("tool_choice") {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => return Err(bad("tool_choice", format!("{other:?} (none, auto, required or a function)"))),
        },
        Some(Value::Object(o)) => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            match name {
                Some(n) if o.get("type").and_then(Value::as_str) == Some("function") => ToolChoice::Named(n.into()),
                _ => {
                    return Err(bad("tool_choice", "expected {\"type\": \"function\", \"function\": {\"name\": ...}}"));
                }
            }
        }
        Some(v) => return Err(bad("tool_choice", format!("expected a string or an object, got {v}"))),
    };
    let parallel = match get("parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(bad("parallel_tool_calls", format!("expected true or false, got {v}"))),
    };
    if tools.is_empty() && !matches!(choice, ToolChoice::None) {
        return Err(bad("tool_choice", "there are no tools to choose from"));
    }
    if let ToolChoice::Named(n) = &choice
        && !names.contains(n)
    {
        return Err(bad("tool_choice", format!("no tool is named {n:?}")));
    }
    let constraint = match &choice {
        ToolChoice::Required => Some(None),
        ToolChoice::Named(n) => Some(Some(n.clone())),
        _ => None,
    }
    .map(|name| Constraint::new("tools", Grammar::ToolCalls { tools: tools.clone(), name, parallel }));
    let request = (!tools.is_empty()).then_some(ToolsRequest { names, choice });
    Ok(ParsedTools { tools, request, constraint })
}

/// An assistant message's `tool_calls` as templates take them: `arguments` as an object
/// (Hugging Face's convention) where OpenAI sends a JSON string.
pub(crate) fn template_tool_calls(i: usize, calls: &Value) -> ApiResult<Vec<Value>> {
    let Value::Array(calls) = calls else {
        return Err(bad("messages", format!("message {i}: tool_calls must be a list")));
    };
    calls
        .iter()
        .map(|c| {
            let function = c
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| bad("messages", format!("message {i}: each tool call needs a function object")))?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("messages", format!("message {i}: a tool call's function has no name")))?;
            let arguments = match function.get("arguments") {
                Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
                Some(v) => v.clone(),
                None => json!({}),
            };
            let mut call = json!({"type": "function", "function": {"name": name, "arguments": arguments}});
            if let Some(id) = c.get("id") {
                call["id"] = id.clone();
            }
            Ok(call)
        })
        .collect()
}

/// The model's tool-call format, from its chat template.
pub(crate) fn format_of(tok: &dyn Tokenizer) -> ToolFormat {
    ToolFormat::detect(tok.chat_template().map(|t| t.source()))
}

/// A fresh call id ("call_" and 24 hex digits), unique within the process.
pub fn call_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = web_time::SystemTime::now().duration_since(web_time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("call_{:016x}{:08x}", t as u64, n as u32)
}

/// A response message's `tool_calls` entry.
pub(crate) fn call_json(call: &ToolCall) -> Value {
    json!({"id": call_id(), "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
}

/// A streamed delta's `tool_calls` entry: the whole call at once, at `index`.
pub(crate) fn call_delta_json(index: usize, call: &ToolCall) -> Value {
    let mut v = call_json(call);
    v["index"] = json!(index);
    v
}
