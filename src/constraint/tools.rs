//! Tool calls in the model's own format: which format a model uses (recognised from its chat
//! template), the grammar that forces a call (`tool_choice: "required"` or a named function),
//! reading calls back out of generated text, whole or as it streams, and the prompt for models
//! whose template cannot show tools.
//!
//! | format       | models                        | a call                                                        |
//! |--------------|-------------------------------|---------------------------------------------------------------|
//! | `Hermes`     | Qwen2.5, Hermes, weft's tiny  | `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`   |
//! | `Llama3Json` | Llama 3.1-3.3                 | `{"name": .., "parameters": {..}}` (after `<|python_tag|>`)    |
//! | `Mistral`    | Mistral, Mixtral              | `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]`            |
//! | `Json`       | any other (the fallback)      | `{"name": .., "arguments": {..}}`, several as a JSON array     |

use serde_json::{Map, Value, json};

use super::compiler::with_json_options;
use crate::tokenizer::ChatMessage;

/// How a model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3Json,
    Mistral,
    Json,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_MARK: &str = "[TOOL_CALLS]";
const LLAMA_TAG: &str = "<|python_tag|>";

impl ToolFormat {
    /// The format a chat template (its Jinja source) shows tool calls in; `Json` when it shows
    /// none of the known ones.
    pub fn detect(template: Option<&str>) -> Self {
        let t = template.unwrap_or("");
        if t.contains(HERMES_OPEN) {
            ToolFormat::Hermes
        } else if t.contains(MISTRAL_MARK) {
            ToolFormat::Mistral
        } else if t.contains(LLAMA_TAG) || (t.contains("ipython") && t.contains("parameters")) {
            ToolFormat::Llama3Json
        } else {
            ToolFormat::Json
        }
    }

    /// The key holding a call's arguments.
    fn arguments_key(self) -> &'static str {
        if self == ToolFormat::Llama3Json { "parameters" } else { "arguments" }
    }
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model answers in text; its output is not read for calls.
    None,
    /// The model decides; calls in its output are returned as calls.
    #[default]
    Auto,
    /// At least one call, enforced with a grammar.
    Required,
    /// A call of this function, enforced with a grammar.
    Named(String),
}

/// One call read from the output: the function and its arguments as JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// The `function` object of an OpenAI tool.
fn function(tool: &Value) -> Option<&Map<String, Value>> {
    tool.get("function")?.as_object()
}

/// A tool's function name.
pub fn tool_name(tool: &Value) -> Option<&str> {
    function(tool)?.get("name")?.as_str()
}

/// The JSON schema of one call of `tool` in `format`.
fn call_schema(format: ToolFormat, tool: &Value) -> Value {
    let f = function(tool);
    let name = f.and_then(|f| f.get("name")).cloned().unwrap_or(Value::Null);
    let parameters = f.and_then(|f| f.get("parameters")).cloned().unwrap_or_else(|| json!({"type": "object"}));
    let key = format.arguments_key();
    json!({
        "type": "object",
        "properties": {"name": {"const": name}, key: parameters},
        "required": ["name", key],
        "additionalProperties": false,
    })
}

/// The Lark grammar that forces a call (several when `parallel`) of `tools` (only `name` when
/// given) in `format`; `special` finds a control token's id by its text.
pub fn grammar(
    format: ToolFormat,
    tools: &[Value],
    name: Option<&str>,
    parallel: bool,
    special: &dyn Fn(&str) -> Option<u32>,
) -> Result<String, String> {
    let chosen: Vec<&Value> = tools.iter().filter(|t| name.is_none_or(|n| tool_name(t) == Some(n))).collect();
    if chosen.is_empty() {
        return Err(match name {
            Some(n) => format!("no tool is named {n:?}"),
            None => "there are no tools to call".into(),
        });
    }
    let mut schemas: Vec<Value> = chosen.iter().map(|t| call_schema(format, t)).collect();
    let one = if schemas.len() == 1 { schemas.remove(0) } else { json!({"anyOf": schemas}) };
    let json = |schema: Value| serde_json::to_string(&with_json_options(schema)).unwrap_or_default();
    let list = |schema: &Value| {
        let mut list = json!({"type": "array", "items": schema, "minItems": 1});
        if !parallel {
            list["maxItems"] = json!(1);
        }
        list
    };
    let repeat = if parallel { " (\"\\n\" call)*" } else { "" };
    Ok(match format {
        ToolFormat::Hermes => format!(
            "start: call{repeat}\ncall: \"{HERMES_OPEN}\\n\" args \"\\n{HERMES_CLOSE}\"\nargs: %json {}\n",
            json(one)
        ),
        ToolFormat::Llama3Json => {
            let repeat = if parallel { " (\"; \" args)*" } else { "" };
            format!("start: args{repeat}\nargs: %json {}\n", json(one))
        }
        ToolFormat::Mistral => {
            let mark = match special(MISTRAL_MARK) {
                Some(id) => format!("<[{id}]>"),
                None => format!("{MISTRAL_MARK:?}"),
            };
            format!("start: {mark} args\nargs: %json {}\n", json(list(&one)))
        }
        ToolFormat::Json if parallel => format!("start: args\nargs: %json {}\n", json(list(&one))),
        ToolFormat::Json => format!("start: args\nargs: %json {}\n", json(one)),
    })
}

/// Consecutive JSON values in `text`, separated by whitespace, `,` or `;`; `None` unless all
/// of it is such values.
fn json_values(text: &str) -> Option<Vec<Value>> {
    let mut out = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = stream.next()?.ok()?;
        rest = rest[stream.byte_offset()..].trim_start_matches(|c: char| c.is_whitespace() || c == ';' || c == ',');
        out.push(value);
    }
    Some(out)
}

/// A call object (`{"name", "arguments" | "parameters"}`) naming one of `names`.
fn call_of(value: &Value, names: &[&str]) -> Option<ToolCall> {
    let name = value.get("name")?.as_str()?;
    if !names.contains(&name) {
        return None;
    }
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None => "{}".to_string(),
        // Some models write the arguments as a JSON string, as OpenAI does.
        Some(Value::String(s)) => s.clone(),
        Some(v) => serde_json::to_string(v).ok()?,
    };
    Some(ToolCall { name: name.to_string(), arguments })
}

/// Calls in a run of JSON text (objects, or arrays of objects): all of it, or `None`.
fn json_calls(text: &str, names: &[&str]) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for value in json_values(text)? {
        match value {
            Value::Array(items) => {
                for item in &items {
                    calls.push(call_of(item, names)?);
                }
            }
            other => calls.push(call_of(&other, names)?),
        }
    }
    (!calls.is_empty()).then_some(calls)
}

/// The calls in a whole output, and the text around them (`None` when there is none); `None`
/// when the output holds no call of a tool in `names` (it is then plain content).
pub fn parse_calls(format: ToolFormat, text: &str, names: &[&str]) -> Option<(Option<String>, Vec<ToolCall>)> {
    match format {
        ToolFormat::Hermes => {
            let mut stream = ToolStream::new(format, names);
            let mut events = stream.push(text);
            events.extend(stream.finish());
            let mut content = String::new();
            let mut calls = Vec::new();
            for e in events {
                match e {
                    ToolEvent::Content(c) => content.push_str(&c),
                    ToolEvent::Call(c) => calls.push(c),
                }
            }
            let content = content.trim();
            (!calls.is_empty()).then(|| ((!content.is_empty()).then(|| content.to_string()), calls))
        }
        _ => {
            let body = text.trim_start();
            let body = body.strip_prefix(MISTRAL_MARK).or_else(|| body.strip_prefix(LLAMA_TAG)).unwrap_or(body);
            json_calls(body, names).map(|calls| (None, calls))
        }
    }
}

/// What a stretch of streamed output turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolEvent {
    Content(String),
    Call(ToolCall),
}

/// Reads calls out of streamed text. Hermes calls are recognised as each one closes, with the
/// text around them streaming on; in the other formats a call is the whole output, so an output
/// that starts like one is held back until it ends, and any other streams at once.
pub struct ToolStream {
    format: ToolFormat,
    names: Vec<String>,
    /// Text received and not yet handed on.
    held: String,
    /// Inside a Hermes `<tool_call>`.
    in_call: bool,
    /// Non-Hermes: `Some(true)` once the output looks like a call, `Some(false)` once it does not.
    whole: Option<bool>,
}

impl ToolStream {
    pub fn new(format: ToolFormat, names: &[&str]) -> Self {
        ToolStream {
            format,
            names: names.iter().map(|n| n.to_string()).collect(),
            held: String::new(),
            in_call: false,
            whole: None,
        }
    }

    fn names(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    /// Take the next piece of text.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.held.push_str(text);
        let mut out = Vec::new();
        if self.format != ToolFormat::Hermes {
            if self.whole.is_none() {
                let start = self.held.trim_start();
                if !start.is_empty() {
                    let looks = ["{", "[", MISTRAL_MARK, LLAMA_TAG]
                        .iter()
                        .any(|m| start.starts_with(m) || (m.len() > 1 && m.starts_with(start)));
                    let sure = ["{", "["].iter().any(|m| start.starts_with(m))
                        || start.starts_with(MISTRAL_MARK)
                        || start.starts_with(LLAMA_TAG);
                    if !looks {
                        self.whole = Some(false);
                    } else if sure {
                        self.whole = Some(true);
                    }
                }
            }
            if self.whole == Some(false) {
                out.push(ToolEvent::Content(std::mem::take(&mut self.held)));
            }
            return out;
        }
        loop {
            if self.in_call {
                let Some(end) = self.held.find(HERMES_CLOSE) else { break };
                let body = self.held[..end].to_string();
                self.held.drain(..end + HERMES_CLOSE.len());
                self.in_call = false;
                out.push(self.hermes_call(&body, true));
            } else if let Some(start) = self.held.find(HERMES_OPEN) {
                if start > 0 {
                    out.push(ToolEvent::Content(self.held[..start].to_string()));
                }
                self.held.drain(..start + HERMES_OPEN.len());
                self.in_call = true;
            } else {
                // Hold back what may be the start of a `<tool_call>` split across pieces.
                let keep = (1..HERMES_OPEN.len()).rev().find(|&n| self.held.ends_with(&HERMES_OPEN[..n])).unwrap_or(0);
                let send = self.held.len() - keep;
                if send > 0 {
                    out.push(ToolEvent::Content(self.held[..send].to_string()));
                    self.held.drain(..send);
                }
                break;
            }
        }
        out
    }

    /// A Hermes call body, or the text as it came when it is not a call.
    fn hermes_call(&self, body: &str, closed: bool) -> ToolEvent {
        match json_calls(body, &self.names()) {
            Some(mut calls) if calls.len() == 1 => ToolEvent::Call(calls.remove(0)),
            _ => ToolEvent::Content(format!("{HERMES_OPEN}{body}{}", if closed { HERMES_CLOSE } else { "" })),
        }
    }

    /// The output ended: what is still held back.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let held = std::mem::take(&mut self.held);
        if self.format == ToolFormat::Hermes {
            if self.in_call {
                self.in_call = false;
                // A call cut short by the end of the output (its closing tag never came).
                return vec![self.hermes_call(&held, false)];
            }
            return if held.is_empty() { Vec::new() } else { vec![ToolEvent::Content(held)] };
        }
        match parse_calls(self.format, &held, &self.names()) {
            Some((_, calls)) => calls.into_iter().map(ToolEvent::Call).collect(),
            None if held.is_empty() => Vec::new(),
            None => vec![ToolEvent::Content(held)],
        }
    }
}

/// Whether a chat template shows the `tools` it is given.
pub fn template_shows_tools(template: &str) -> bool {
    template.contains("tools")
}

/// The conversation as a template that knows nothing of tools can show it: the tools listed in
/// a system message with the `Json` format's instructions, calls written into the assistant's
/// text, results as plain messages. Templates that show tools get the messages unchanged.
pub fn messages_for_template(template: &str, messages: &[ChatMessage], tools: &[Value]) -> Vec<ChatMessage> {
    if tools.is_empty() || template_shows_tools(template) {
        return messages.to_vec();
    }
    let listing: Vec<String> =
        tools.iter().filter_map(|t| function(t)).map(|f| Value::Object(f.clone()).to_string()).collect();
    let instructions = format!(
        "You can call these functions:\n{}\nTo call one, answer with only a JSON object: \
         {{\"name\": <function name>, \"arguments\": <an object of its parameters>}}.",
        listing.join("\n")
    );
    let mut out = Vec::with_capacity(messages.len() + 1);
    match messages.first() {
        Some(first) if first.role == "system" => {
            out.push(ChatMessage::system(format!("{}\n\n{instructions}", first.content)));
        }
        _ => out.push(ChatMessage::system(instructions)),
    }
    let skip = usize::from(messages.first().is_some_and(|m| m.role == "system"));
    for m in &messages[skip..] {
        let mut m = m.clone();
        if !m.tool_calls.is_empty() && !template.contains("tool_calls") {
            let calls: Vec<Value> = m
                .tool_calls
                .iter()
                .filter_map(|c| c.get("function"))
                .map(|f| json!({"name": f.get("name"), "arguments": f.get("arguments")}))
                .collect();
            let text = if calls.len() == 1 { calls[0].to_string() } else { Value::from(calls).to_string() };
            m.content = if m.content.is_empty() { text } else { format!("{}\n{text}", m.content) };
            m.tool_calls.clear();
        }
        out.push(m);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Value {
        json!({"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    #[test]
    fn formats_are_recognised_from_the_template() {
        assert_eq!(ToolFormat::detect(Some("{{ '<tool_call>' }}")), ToolFormat::Hermes);
        assert_eq!(ToolFormat::detect(Some("[TOOL_CALLS] {{ x }}")), ToolFormat::Mistral);
        assert_eq!(ToolFormat::detect(Some("<|python_tag|>")), ToolFormat::Llama3Json);
        assert_eq!(ToolFormat::detect(Some("<|im_start|>")), ToolFormat::Json);
        assert_eq!(ToolFormat::detect(None), ToolFormat::Json);
    }

    #[test]
    fn whole_outputs_are_read_in_each_format() {
        let names = ["get_weather", "other"];
        let hermes = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"other\", \"arguments\": \"{}\"}\n</tool_call>";
        let (content, calls) = parse_calls(ToolFormat::Hermes, hermes, &names).unwrap();
        assert_eq!(content.as_deref(), Some("Let me look."));
        assert_eq!(calls[0], ToolCall { name: "get_weather".into(), arguments: "{\"city\":\"Paris\"}".into() });
        assert_eq!(calls[1].arguments, "{}");
        let mistral = "[TOOL_CALLS][{\"name\": \"other\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}]";
        assert_eq!(parse_calls(ToolFormat::Mistral, mistral, &names).unwrap().1.len(), 2);
        let llama = "<|python_tag|>{\"name\": \"other\", \"parameters\": {\"a\": 1}}; {\"name\": \"other\", \"parameters\": {}}";
        let calls = parse_calls(ToolFormat::Llama3Json, llama, &names).unwrap().1;
        assert_eq!(calls[0].arguments, "{\"a\":1}");
        assert_eq!(calls.len(), 2);
        assert!(parse_calls(ToolFormat::Json, "{\"name\": \"nope\", \"arguments\": {}}", &names).is_none());
        assert!(parse_calls(ToolFormat::Json, "The weather is fine.", &names).is_none());
        assert!(parse_calls(ToolFormat::Hermes, "<tool_call>\nnot json\n</tool_call>", &names).is_none());
    }

    #[test]
    fn streamed_hermes_calls_come_out_as_they_close() {
        let mut s = ToolStream::new(ToolFormat::Hermes, &["f"]);
        let text = "Sure <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> done";
        let mut events = Vec::new();
        for piece in text.as_bytes().chunks(3) {
            events.extend(s.push(std::str::from_utf8(piece).unwrap()));
        }
        events.extend(s.finish());
        let content: String = events
            .iter()
            .filter_map(|e| match e {
                ToolEvent::Content(c) => Some(c.as_str()),
                ToolEvent::Call(_) => None,
            })
            .collect();
        assert_eq!(content, "Sure  done");
        let calls: Vec<&ToolEvent> = events.iter().filter(|e| matches!(e, ToolEvent::Call(_))).collect();
        assert_eq!(calls, [&ToolEvent::Call(ToolCall { name: "f".into(), arguments: "{}".into() })]);
        // A call cut short is handed on as text.
        let mut s = ToolStream::new(ToolFormat::Hermes, &["f"]);
        assert!(s.push("<tool_call>\n{\"name\": \"f\"").is_empty());
        assert_eq!(s.finish(), [ToolEvent::Content("<tool_call>\n{\"name\": \"f\"".into())]);
    }

    #[test]
    fn streamed_json_outputs_are_held_only_when_they_look_like_calls() {
        let mut s = ToolStream::new(ToolFormat::Json, &["f"]);
        assert!(s.push("  ").is_empty());
        assert!(s.push("{\"name\": \"f\",").is_empty());
        assert!(s.push(" \"arguments\": {\"a\": 2}}").is_empty());
        assert_eq!(s.finish(), [ToolEvent::Call(ToolCall { name: "f".into(), arguments: "{\"a\":2}".into() })]);
        let mut s = ToolStream::new(ToolFormat::Json, &["f"]);
        assert_eq!(s.push("Hello"), [ToolEvent::Content("Hello".into())]);
        assert_eq!(s.push(" {"), [ToolEvent::Content(" {".into())]);
        assert!(s.finish().is_empty());
    }

    #[test]
    fn grammars_follow_the_format() {
        let tools = [tool("get_weather"), tool("other")];
        let none = |_: &str| None;
        let g = grammar(ToolFormat::Hermes, &tools, None, true, &none).unwrap();
        assert!(g.starts_with("start: call (\"\\n\" call)*\ncall: \"<tool_call>\\n\" args \"\\n</tool_call>\""), "{g}");
        assert!(g.contains("anyOf"));
        let g = grammar(ToolFormat::Hermes, &tools, Some("other"), false, &none).unwrap();
        assert!(g.starts_with("start: call\n") && !g.contains("anyOf") && g.contains("\"const\":\"other\""), "{g}");
        let g = grammar(ToolFormat::Mistral, &tools, None, false, &|t| (t == "[TOOL_CALLS]").then_some(5)).unwrap();
        assert!(g.starts_with("start: <[5]> args") && g.contains("\"maxItems\":1"), "{g}");
        let g = grammar(ToolFormat::Llama3Json, &tools, None, false, &none).unwrap();
        assert!(g.contains("\"parameters\""), "{g}");
        assert!(grammar(ToolFormat::Json, &tools, Some("missing"), false, &none).unwrap_err().contains("missing"));
        assert!(grammar(ToolFormat::Json, &[], None, false, &none).is_err());
    }

    #[test]
    fn templates_without_tools_get_them_in_a_system_message() {
        let mut call = ChatMessage::assistant("");
        call.tool_calls = vec![json!({"type": "function", "function": {"name": "f", "arguments": {"a": 1}}})];
        let messages = [ChatMessage::user("hi"), call, ChatMessage::new("tool", "42")];
        let out = messages_for_template("{{ messages }}", &messages, &[tool("f")]);
        assert_eq!(out[0].role, "system");
        assert!(out[0].content.contains("\"name\":\"f\"") && out[0].content.contains("JSON object"));
        assert!(out[2].tool_calls.is_empty() && out[2].content.contains("\"name\":\"f\""));
        assert_eq!(messages_for_template("{{ tools }}", &messages, &[tool("f")]), messages.to_vec());
    }
}
