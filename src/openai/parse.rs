//! Reading chat and text completion request bodies: every known field is type-checked and an
//! error names the field. What a value may be (ranges, lengths against the context) is checked
//! once, by the engine at submission.

use serde_json::{Map, Value};

use crate::engine::request::{GenerationParams, InferenceRequest, Prompt};
use crate::openai::Endpoint;
use crate::openai::error::{ApiResult, OpenAiError};
use crate::openai::structured::parse_constraint;
use crate::openai::tools::{ToolsRequest, parse_tools, template_tool_calls};
use crate::sampling::SamplingParams;
use crate::tokenizer::ChatMessage;

/// Parse a JSON request body, which must be an object.
pub fn parse_body(text: &[u8]) -> ApiResult<Map<String, Value>> {
    match serde_json::from_slice::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(OpenAiError::invalid_body("the request body must be a JSON object")),
        Err(e) => Err(OpenAiError::invalid_body(format!("the request body is not valid JSON: {e}"))),
    }
}

/// The `model` a request names, if any (an error if it is not a string).
pub fn requested_model(body: &Map<String, Value>) -> ApiResult<Option<&str>> {
    Fields(body).string("model")
}

/// A parsed request: the engine request plus the response options.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenAiRequest {
    pub endpoint: Endpoint,
    pub request: InferenceRequest,
    /// Answer with a stream of chunks.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// Report log-probabilities, with this many alternatives each.
    pub logprobs: Option<usize>,
    /// The model the request names, for the caller to check.
    pub model: Option<String>,
    /// Chat with `tools`: which may be called and how calls are chosen, for reading calls out
    /// of the answer.
    pub tools: Option<ToolsRequest>,
}

/// Read a JSON body (already an object) for an endpoint. Fields are type-checked in a fixed
/// order (model, messages or prompt, then the rest), so the first error is stable; value ranges
/// and lengths are the engine's to check when the request is submitted.
pub fn parse(endpoint: Endpoint, body: &Map<String, Value>) -> ApiResult<OpenAiRequest> {
    let f = Fields(body);
    let model = f.string("model")?.map(str::to_string);
    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Chat(parse_messages(&f)?),
        Endpoint::Completion => {
            let prompt = parse_prompt(&f)?;
            if f.bool("echo")?.unwrap_or(false) {
                return Err(OpenAiError::invalid("echo", "invalid echo: echo is not supported"));
            }
            Prompt::Text(prompt)
        }
    };
    let mut common = parse_common(&f, endpoint == Endpoint::Chat)?;
    let constraint = parse_constraint(body)?;
    let parsed_tools = match endpoint {
        Endpoint::Chat => Some(parse_tools(body)?),
        Endpoint::Completion => match f.get("tools") {
            Some(_) => return Err(OpenAiError::invalid("tools", "invalid tools: tools are for chat completions")),
            None => None,
        },
    };
    let (tools, tools_request, tool_constraint) = match parsed_tools {
        Some(t) => (t.tools, t.request, t.constraint),
        None => (Vec::new(), None, None),
    };
    common.params.constraint = match (constraint, tool_constraint) {
        (Some(c), Some(_)) => {
            return Err(OpenAiError::invalid(
                "tool_choice",
                format!("invalid tool_choice: a required or named tool call cannot be combined with {}", c.field),
            ));
        }
        (c, t) => c.or(t),
    };
    let mut request = InferenceRequest::new(prompt, common.params);
    request.tools = tools;
    Ok(OpenAiRequest {
        endpoint,
        request,
        stream: common.stream,
        include_usage: common.include_usage,
        logprobs: common.logprobs,
        model,
        tools: tools_request,
    })
}

/// Reading request fields: every known field is type-checked and named in the error. `null`
/// counts as absent.
struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn get(&self, k: &str) -> Option<&'a Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }
    fn f32(&self, k: &str) -> ApiResult<Option<f32>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| OpenAiError::invalid(k, format!("invalid {k}: expected a number, got {v}"))),
        }
    }
    fn int(&self, k: &str) -> ApiResult<Option<i64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| OpenAiError::invalid(k, format!("invalid {k}: expected an integer, got {v}"))),
        }
    }
    fn uint(&self, k: &str) -> ApiResult<Option<u64>> {
        match self.int(k)? {
            Some(x) if x < 0 => Err(OpenAiError::invalid(k, format!("invalid {k}: {x} (must not be negative)"))),
            x => Ok(x.map(|x| x as u64)),
        }
    }
    fn bool(&self, k: &str) -> ApiResult<Option<bool>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| OpenAiError::invalid(k, format!("invalid {k}: expected true or false, got {v}"))),
        }
    }
    fn string(&self, k: &str) -> ApiResult<Option<&'a str>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| OpenAiError::invalid(k, format!("invalid {k}: expected a string, got {v}"))),
        }
    }
    /// A string or a list of strings.
    fn strings(&self, k: &str) -> ApiResult<Vec<String>> {
        match self.get(k) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        OpenAiError::invalid(k, format!("invalid {k}: expected a string or a list of strings"))
                    })
                })
                .collect(),
            Some(v) => {
                Err(OpenAiError::invalid(k, format!("invalid {k}: expected a string or a list of strings, got {v}")))
            }
        }
    }
}

/// What both endpoints share, parsed.
struct Common {
    params: GenerationParams,
    stream: bool,
    include_usage: bool,
    /// Report log-probabilities, with this many alternatives each.
    logprobs: Option<usize>,
}

fn parse_common(f: &Fields, chat: bool) -> ApiResult<Common> {
    if let Some(n) = f.int("n")?
        && n != 1
    {
        return Err(OpenAiError::invalid("n", format!("invalid n: {n}; only n=1 is supported")));
    }
    if let Some(b) = f.int("best_of")?
        && b != 1
    {
        return Err(OpenAiError::invalid("best_of", format!("invalid best_of: {b}; only best_of=1 is supported")));
    }
    let _ = f.string("user")?;
    let max_tokens = match f.uint("max_completion_tokens")? {
        Some(x) => Some(x),
        None => f.uint("max_tokens")?,
    };
    let mut sampling = SamplingParams { temperature: 1.0, ..Default::default() };
    if let Some(x) = f.f32("temperature")? {
        sampling.temperature = x;
    }
    if let Some(x) = f.f32("top_p")? {
        sampling.top_p = x;
    }
    if let Some(x) = f.int("top_k")? {
        // vLLM: -1 (or 0) turns it off.
        sampling.top_k = if x <= 0 { 0 } else { x as u32 };
    }
    if let Some(x) = f.f32("min_p")? {
        sampling.min_p = x;
    }
    if let Some(x) = f.f32("repetition_penalty")? {
        sampling.repetition_penalty = x;
    }
    if let Some(x) = f.f32("presence_penalty")? {
        sampling.presence_penalty = x;
    }
    if let Some(x) = f.f32("frequency_penalty")? {
        sampling.frequency_penalty = x;
    }
    if let Some(x) = f.int("seed")? {
        sampling.seed = Some(x as u64);
    }
    let logprobs = if chat {
        let on = f.bool("logprobs")?.unwrap_or(false);
        let top = f.uint("top_logprobs")?;
        if top.is_some() && !on {
            return Err(OpenAiError::invalid(
                "top_logprobs",
                "invalid top_logprobs: set logprobs to true to use top_logprobs",
            ));
        }
        on.then(|| top.unwrap_or(0) as usize)
    } else {
        f.uint("logprobs")?.map(|x| x as usize)
    };
    if let Some(top) = logprobs {
        // The engine reports log-probabilities only when alternatives are asked for.
        sampling.top_logprobs = top.max(1);
    }
    let stop = f.strings("stop")?;
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o)
            .bool("include_usage")
            .map_err(|_| {
                OpenAiError::invalid("stream_options", "invalid stream_options: include_usage must be true or false")
            })?
            .unwrap_or(false),
        Some(v) => {
            return Err(OpenAiError::invalid(
                "stream_options",
                format!("invalid stream_options: expected an object, got {v}"),
            ));
        }
    };
    let max_tokens = max_tokens.map(|x| x as usize);
    let params = GenerationParams { sampling, max_tokens, stop, ignore_eos, ..Default::default() };
    Ok(Common { params, stream, include_usage, logprobs })
}

fn parse_messages(f: &Fields) -> ApiResult<Vec<ChatMessage>> {
    let Some(v) = f.get("messages") else {
        return Err(OpenAiError::invalid("messages", "invalid messages: missing (a list of {role, content} objects)"));
    };
    let Value::Array(list) = v else {
        return Err(OpenAiError::invalid("messages", format!("invalid messages: expected a list, got {v}")));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(OpenAiError::invalid("messages", format!("invalid messages: message {i} is not an object")));
        };
        let Some(Value::String(role)) = m.get("role") else {
            return Err(OpenAiError::invalid("messages", format!("invalid messages: message {i} has no role string")));
        };
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            // The content-parts form: concatenate the text parts.
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => s.push_str(t),
                        _ => {
                            return Err(OpenAiError::invalid(
                                "messages",
                                format!("invalid messages: message {i} has a content part that is not text"),
                            ));
                        }
                    }
                }
                s
            }
            Some(v) => {
                return Err(OpenAiError::invalid(
                    "messages",
                    format!("invalid messages: message {i} content must be a string, got {v}"),
                ));
            }
        };
        let mut message = ChatMessage::new(role.clone(), content);
        if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
            message.tool_calls = template_tool_calls(i, calls)?;
        }
        let text = |k: &str| -> ApiResult<Option<String>> {
            match m.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(v) => Err(OpenAiError::invalid(
                    "messages",
                    format!("invalid messages: message {i} {k} must be a string, got {v}"),
                )),
            }
        };
        message.tool_call_id = text("tool_call_id")?;
        message.name = text("name")?;
        out.push(message);
    }
    Ok(out)
}

fn parse_prompt(f: &Fields) -> ApiResult<String> {
    match f.get("prompt") {
        None => Err(OpenAiError::invalid("prompt", "invalid prompt: missing")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => Ok(a[0].as_str().unwrap_or_default().to_string()),
        Some(Value::Array(_)) => {
            Err(OpenAiError::invalid("prompt", "invalid prompt: only a string or a list of one string is supported"))
        }
        Some(v) => Err(OpenAiError::invalid("prompt", format!("invalid prompt: expected a string, got {v}"))),
    }
}
