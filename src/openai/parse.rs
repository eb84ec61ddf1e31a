//! Reading chat and text completion request bodies: every known field is type-checked and an
//! error names the field. What a value may be (ranges, lengths against the context) is checked
//! once, by the engine at submission.
//!
//! Nothing is dropped silently: a field is honoured, refused with an error naming it (one weft
//! cannot honour, or a value it cannot honour, such as `n` above 16 or `echo`), or one of the
//! few metadata fields that change nothing about the answer ([`IGNORED_FIELDS`]). A field weft
//! does not know is refused too.

use serde_json::{Map, Value};

use crate::engine::request::{GenerationParams, InferenceRequest, Prompt};
use crate::openai::Endpoint;
use crate::openai::error::{ApiResult, OpenAiError};
use crate::openai::reasoning::Reasoning;
use crate::openai::structured::{FIELDS as STRUCTURED_FIELDS, parse_constraint};
use crate::openai::tools::{ToolsRequest, parse_tools, template_tool_calls};
use crate::sampling::{LogitBias, SamplingParams};
use crate::tokenizer::{ChatMessage, RESERVED_VARIABLES};

/// Fields both endpoints read (OpenAI's, then vLLM's extensions: `top_k`, `min_p`,
/// `repetition_penalty`, `ignore_eos`, `stop_token_ids`, `priority`); the structured-output
/// fields come on top.
const COMMON_FIELDS: &[&str] = &[
    "model",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "prompt_cache_retention",
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "stop_token_ids",
    "priority",
];

/// Fields only chat completions read (`chat_template_kwargs` is vLLM's).
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "chat_template_kwargs",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "verbosity",
    "web_search_options",
    "functions",
    "function_call",
];

/// Fields only text completions read.
const COMPLETION_FIELDS: &[&str] = &["prompt", "logprobs", "echo", "best_of", "suffix"];

/// Accepted and type-checked, then ignored on purpose: metadata about the caller or about
/// OpenAI's own services (its dashboard, storage, service tiers, abuse detection, cache routing)
/// that changes nothing about the tokens a single-model server answers with.
pub(crate) const IGNORED_FIELDS: &[&str] =
    &["user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"];

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
    /// How many choices (`n`, 1 to [`MAX_N`]): each is its own engine request
    /// ([`OpenAiRequest::choice_requests`]).
    pub n: usize,
    /// A thinking model's reasoning, separated from the answer: set by
    /// [`OpenAiRequest::apply_reasoning`]; `None` after `parse`.
    pub reasoning: Option<Reasoning>,
}

/// The most choices one request may ask for (`n`).
pub const MAX_N: usize = 16;

impl OpenAiRequest {
    /// The engine requests of the `n` choices: choice `i` is this request with seed `seed + i`
    /// (wrapping) when a seed is given, so a choice's tokens are those of a single request
    /// with that seed; without a seed each draws its own. They share the prompt, so with the
    /// prefix cache on the later choices reuse the first one's KV blocks.
    pub fn choice_requests(&self) -> Vec<InferenceRequest> {
        (0..self.n.max(1) as u64)
            .map(|i| {
                let mut r = self.request.clone();
                r.params.sampling.seed = r.params.sampling.seed.map(|s| s.wrapping_add(i));
                r
            })
            .collect()
    }
}

/// Read a JSON body (already an object) for an endpoint. Fields are type-checked in a fixed
/// order (model, messages or prompt, then the rest), so the first error is stable; value ranges
/// and lengths are the engine's to check when the request is submitted.
pub fn parse(endpoint: Endpoint, body: &Map<String, Value>) -> ApiResult<OpenAiRequest> {
    let f = Fields(body);
    let model = f.string("model")?.map(str::to_string);
    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Chat(parse_messages(&f)?),
        Endpoint::Completion => parse_prompt(&f)?,
    };
    refuse_unknown(endpoint, body)?;
    refuse_unsupported(endpoint, &f)?;
    let mut common = parse_common(&f, endpoint == Endpoint::Chat)?;
    let constraint = parse_constraint(body)?;
    let parsed_tools = match endpoint {
        Endpoint::Chat => Some(parse_tools(body)?),
        Endpoint::Completion => None,
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
    if endpoint == Endpoint::Chat {
        request.chat_template_kwargs = parse_template_kwargs(body)?;
    }
    Ok(OpenAiRequest {
        endpoint,
        request,
        stream: common.stream,
        include_usage: common.include_usage,
        logprobs: common.logprobs,
        model,
        tools: tools_request,
        n: common.n,
        reasoning: None,
    })
}

/// Every field `endpoint` reads: honoured, refused unless it asks for nothing, or ignored.
pub(crate) fn known_fields(endpoint: Endpoint) -> Vec<&'static str> {
    let own = match endpoint {
        Endpoint::Chat => CHAT_FIELDS,
        Endpoint::Completion => COMPLETION_FIELDS,
    };
    [COMMON_FIELDS, own, IGNORED_FIELDS, STRUCTURED_FIELDS].concat()
}

/// A field this endpoint does not know is refused, naming it (the first in name order; `null`
/// asks for nothing).
fn refuse_unknown(endpoint: Endpoint, body: &Map<String, Value>) -> ApiResult<()> {
    let known = known_fields(endpoint);
    let mut unknown: Vec<&String> =
        body.iter().filter(|(k, v)| !v.is_null() && !known.contains(&k.as_str())).map(|(k, _)| k).collect();
    unknown.sort();
    let Some(k) = unknown.first() else { return Ok(()) };
    let other = match endpoint {
        Endpoint::Chat if COMPLETION_FIELDS.contains(&k.as_str()) => " (it is for /v1/completions)",
        Endpoint::Completion if CHAT_FIELDS.contains(&k.as_str()) => " (it is for /v1/chat/completions)",
        _ => "",
    };
    Err(OpenAiError::invalid(
        k,
        format!("unknown field {k}{other}: weft does not support it; remove it from the request"),
    ))
}

/// Fields weft knows but cannot honour: refused unless absent, `null` or their do-nothing value.
fn refuse_unsupported(endpoint: Endpoint, f: &Fields) -> ApiResult<()> {
    let refuse = |k: &str, why: &str| Err(OpenAiError::invalid(k, format!("invalid {k}: {why}")));
    if endpoint == Endpoint::Completion {
        if let Some(b) = f.int("best_of")?
            && b != 1
        {
            return refuse("best_of", &format!("{b}; only best_of=1 is supported"));
        }
        if f.bool("echo")?.unwrap_or(false) {
            return refuse("echo", "echoing the prompt is not supported; remove echo (or send false)");
        }
        if f.string("suffix")?.is_some_and(|s| !s.is_empty()) {
            return refuse("suffix", "weft does not insert text before a suffix; remove suffix");
        }
    }
    match f.string("prompt_cache_retention")? {
        None | Some("in_memory") => {}
        Some(other) => {
            return refuse(
                "prompt_cache_retention",
                &format!("{other:?}: weft's prefix cache is in memory only (send \"in_memory\" or nothing)"),
            );
        }
    }
    if endpoint == Endpoint::Chat {
        match f.get("modalities") {
            None => {}
            Some(Value::Array(a)) if a.iter().all(|m| m == "text") => {}
            Some(v) => return refuse("modalities", &format!("{v}: weft answers with text only (send [\"text\"])")),
        }
        let unsupported: [(&str, &str); 7] = [
            ("audio", "weft answers with text only; remove audio"),
            ("prediction", "predicted outputs are not supported; remove prediction"),
            ("reasoning_effort", "weft cannot set a model's reasoning effort; remove reasoning_effort"),
            ("verbosity", "weft cannot set a model's verbosity; remove verbosity"),
            ("web_search_options", "weft does not search the web; remove web_search_options"),
            ("functions", "the deprecated functions are not supported; send tools instead"),
            ("function_call", "the deprecated function_call is not supported; send tool_choice instead"),
        ];
        for (k, why) in unsupported {
            if f.get(k).is_some() {
                return refuse(k, why);
            }
        }
    }
    // The ignored metadata is type-checked all the same.
    for k in ["user", "service_tier", "prompt_cache_key", "safety_identifier"] {
        f.string(k)?;
    }
    f.bool("store")?;
    match f.get("metadata") {
        None => {}
        Some(Value::Object(m)) if m.values().all(Value::is_string) => {}
        Some(v) => return refuse("metadata", &format!("expected an object of strings, got {v}")),
    }
    Ok(())
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
    /// A list of token ids.
    fn token_ids(&self, k: &str) -> ApiResult<Vec<u32>> {
        match self.get(k) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => token_ids(k, a),
            Some(v) => Err(OpenAiError::invalid(k, format!("invalid {k}: expected a list of token ids, got {v}"))),
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
    n: usize,
}

fn parse_common(f: &Fields, chat: bool) -> ApiResult<Common> {
    let max_tokens = match (f.uint("max_completion_tokens")?, f.uint("max_tokens")?) {
        (Some(a), Some(b)) if a != b => {
            return Err(OpenAiError::invalid(
                "max_completion_tokens",
                format!(
                    "invalid max_completion_tokens: {a}, but max_tokens is {b}; send one of them \
                     (max_completion_tokens is the newer name of max_tokens)"
                ),
            ));
        }
        (a, b) => a.or(b),
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
    sampling.logit_bias = parse_logit_bias(f)?;
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
    let include_usage = parse_stream_options(f, stream)?;
    let stop_token_ids = f.token_ids("stop_token_ids")?;
    // vLLM's priority: lower is handled earlier; the engine's runs higher first.
    let priority = match f.int("priority")? {
        None => 0,
        Some(p) => match i32::try_from(p) {
            Ok(p) if p > i32::MIN => -p,
            _ => {
                return Err(OpenAiError::invalid(
                    "priority",
                    format!("invalid priority: {p} (must be a 32-bit integer, lower runs first)"),
                ));
            }
        },
    };
    let n = match f.int("n")? {
        None => 1,
        Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
        Some(n) => {
            return Err(OpenAiError::invalid(
                "n",
                format!(
                    "invalid n: {n}; weft answers 1 to {MAX_N} choices per request (send several requests for more)"
                ),
            ));
        }
    };
    let max_tokens = max_tokens.map(|x| x as usize);
    let params =
        GenerationParams { sampling, max_tokens, stop, stop_token_ids, ignore_eos, priority, ..Default::default() };
    Ok(Common { params, stream, include_usage, logprobs, n })
}

/// `logit_bias`: an object from token ids (strings, as JSON keys are) to numbers. How many, how
/// large and whether the ids are in the vocabulary are the engine's to check.
fn parse_logit_bias(f: &Fields) -> ApiResult<LogitBias> {
    const K: &str = "logit_bias";
    let bad = |why: String| OpenAiError::invalid(K, format!("invalid {K}: {why}"));
    let m = match f.get(K) {
        None => return Ok(LogitBias::default()),
        Some(Value::Object(m)) => m,
        Some(v) => {
            return Err(bad(format!("expected an object of token ids to biases (e.g. {{\"50256\": -100}}), got {v}")));
        }
    };
    let pairs = m.iter().map(|(k, v)| {
        let token =
            k.parse::<u32>().map_err(|_| bad(format!("key {k:?} is not a token id (a whole number, 0 or more)")))?;
        let bias = v.as_f64().ok_or_else(|| bad(format!("the bias of token {k} must be a number, got {v}")))?;
        Ok((token, bias as f32))
    });
    Ok(LogitBias::new(pairs.collect::<ApiResult<Vec<_>>>()?))
}

/// vLLM's `chat_template_kwargs`: an object of extra variables for the chat template (e.g.
/// `{"enable_thinking": false}`); the variables a render always sets cannot be replaced.
pub(crate) fn parse_template_kwargs(body: &Map<String, Value>) -> ApiResult<Map<String, Value>> {
    const K: &str = "chat_template_kwargs";
    match Fields(body).get(K) {
        None => Ok(Map::new()),
        Some(Value::Object(m)) => match m.keys().find(|k| RESERVED_VARIABLES.contains(&k.as_str())) {
            Some(k) => Err(OpenAiError::invalid(
                K,
                format!(
                    "invalid {K}: {k} is set by the request itself, not by {K}; remove it (the template's own \
                     variables are {})",
                    RESERVED_VARIABLES.join(", ")
                ),
            )),
            None => Ok(m.clone()),
        },
        Some(v) => Err(OpenAiError::invalid(
            K,
            format!(
                "invalid {K}: expected an object of template variables (e.g. {{\"enable_thinking\": false}}), got {v}"
            ),
        )),
    }
}

/// `messages` of a body (for `/tokenize`), read as a chat completion reads them.
pub(crate) fn parse_messages_of(body: &Map<String, Value>) -> ApiResult<Vec<ChatMessage>> {
    parse_messages(&Fields(body))
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

/// `stream_options`: `include_usage` (a last chunk with the usage), and OpenAI's
/// `include_obfuscation`, which weft cannot do (it never pads chunks).
fn parse_stream_options(f: &Fields, stream: bool) -> ApiResult<bool> {
    const K: &str = "stream_options";
    let o = match f.get(K) {
        None => return Ok(false),
        Some(Value::Object(o)) => o,
        Some(v) => return Err(OpenAiError::invalid(K, format!("invalid {K}: expected an object, got {v}"))),
    };
    if !stream {
        return Err(OpenAiError::invalid(K, format!("invalid {K}: it applies only with stream: true")));
    }
    let flag = |k: &str| {
        Fields(o).bool(k).map_err(|_| OpenAiError::invalid(K, format!("invalid {K}: {k} must be true or false")))
    };
    if let Some(k) = o.keys().find(|k| !matches!(k.as_str(), "include_usage" | "include_obfuscation")) {
        return Err(OpenAiError::invalid(
            K,
            format!("invalid {K}: unknown option {k} (include_usage, include_obfuscation); remove it"),
        ));
    }
    if flag("include_obfuscation")? == Some(true) {
        return Err(OpenAiError::invalid(
            K,
            format!("invalid {K}: weft does not pad streamed chunks; send include_obfuscation: false or nothing"),
        ));
    }
    Ok(flag("include_usage")?.unwrap_or(false))
}

/// A completions prompt: a string, a list of token ids, or a list of one of either (a batch of
/// several prompts is refused: one request per prompt).
fn parse_prompt(f: &Fields) -> ApiResult<Prompt> {
    let bad = |why: String| Err(OpenAiError::invalid("prompt", format!("invalid prompt: {why}")));
    let one = |v: &Value| -> Option<ApiResult<Prompt>> {
        match v {
            Value::String(s) => Some(Ok(Prompt::Text(s.clone()))),
            Value::Array(ids) if !ids.is_empty() && ids.iter().all(Value::is_number) => {
                Some(token_ids("prompt", ids).map(Prompt::Tokens))
            }
            _ => None,
        }
    };
    let what = "a string, a list of token ids, or a list of one of either";
    match f.get("prompt") {
        None => bad(format!("missing ({what})")),
        Some(Value::Array(a)) if a.is_empty() => bad("the list is empty".into()),
        Some(v) if one(v).is_some() => one(v).unwrap_or_else(|| bad(what.into())),
        Some(Value::Array(a)) if a.len() == 1 => match one(&a[0]) {
            Some(p) => p,
            None => bad(format!("expected {what}, got {v}", v = a[0])),
        },
        Some(Value::Array(a)) if a.iter().all(|p| one(p).is_some()) => {
            bad(format!("a batch of {} prompts; weft takes one prompt per request: send {} requests", a.len(), a.len()))
        }
        Some(v) => bad(format!("expected {what}, got {v}")),
    }
}

/// A list of token ids (each a whole number from 0 to 2^32 - 1); whether they are in the
/// vocabulary is the engine's to check.
fn token_ids(k: &str, list: &[Value]) -> ApiResult<Vec<u32>> {
    list.iter()
        .map(|v| {
            v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| {
                OpenAiError::invalid(k, format!("invalid {k}: {v} is not a token id (a whole number, 0 or more)"))
            })
        })
        .collect()
}
