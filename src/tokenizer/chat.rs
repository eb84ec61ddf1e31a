//! [`ChatTemplate`]: a model's own Jinja chat template rendered with minijinja, the way Hugging
//! Face transformers renders it (`apply_chat_template(.., tokenize=False)`).
//!
//! What transformers sets up and templates rely on:
//! - `trim_blocks` and `lstrip_blocks` on, no autoescaping, `{% break %}` / `{% continue %}`;
//! - the variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and `tools` /
//!   `documents` defined as `none`, plus whatever a request's `chat_template_kwargs` adds
//!   (`enable_thinking: false` turns Qwen3's thinking off);
//! - `raise_exception(msg)` (the template refuses the conversation: an error carrying `msg`)
//!   and `strftime_now(format)` (the current date; UTC here, local time in transformers);
//! - a `tojson` filter that writes what Python's `json.dumps(x, ensure_ascii=False)` writes
//!   (keyword arguments `indent`, `separators`, `sort_keys`, `ensure_ascii`);
//! - Python string, dict and list methods (`strip`, `startswith`, `items`, `get`, ...) from
//!   minijinja-contrib's pycompat.

use std::fmt::{self, Write as _};
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::{Result, WeftError};

const TEMPLATE_NAME: &str = "chat_template";

/// The variables every render sets; `chat_template_kwargs` may add others, not replace these.
pub const RESERVED_VARIABLES: &[&str] =
    &["messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "documents"];

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant", ... (whatever the template knows).
    pub role: String,
    pub content: String,
    /// An assistant's tool calls, as templates expect them: `{"type": "function", "id",
    /// "function": {"name", "arguments"}}` with `arguments` an object (Hugging Face's
    /// convention), not OpenAI's JSON string. Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
    /// A tool result's call id (role "tool").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool's name, on a tool result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// A message as the template sees it: a mapping with the keys `role` and `content`, in that
/// order (as the Python dict transformers passes), then `tool_calls`, `tool_call_id` and `name`
/// where the message has them (undefined otherwise, as templates test with `is defined`).
#[derive(Debug)]
struct MessageValue(ChatMessage);

impl MessageValue {
    fn keys(&self) -> Vec<&'static str> {
        let m = &self.0;
        let mut keys = vec!["role", "content"];
        keys.extend((!m.tool_calls.is_empty()).then_some("tool_calls"));
        keys.extend(m.tool_call_id.as_ref().map(|_| "tool_call_id"));
        keys.extend(m.name.as_ref().map(|_| "name"));
        keys
    }
}

impl Object for MessageValue {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let m = &self.0;
        match key.as_str()? {
            "role" => Some(Value::from(m.role.clone())),
            "content" => Some(Value::from(m.content.clone())),
            "tool_calls" if !m.tool_calls.is_empty() => Some(Value::from(minijinja::value::Serde(&m.tool_calls))),
            "tool_call_id" => m.tool_call_id.clone().map(Value::from),
            "name" => m.name.clone().map(Value::from),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.keys().into_iter().map(Value::from).collect())
    }
}

/// A compiled chat template. Cheap to clone.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    /// The Jinja source, as given.
    source: Arc<str>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token` / `eos_token` are the texts the template sees under those
    /// names. A template that does not parse is an error here, not at render time.
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| template_error("configuring the template engine failed", &e))?,
        );
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| template_error("the chat template does not parse", &e))?;
        Ok(ChatTemplate {
            env: Arc::new(env),
            source: source.into(),
            bos_token: bos_token.map(str::to_owned),
            eos_token: eos_token.map(str::to_owned),
        })
    }

    /// Renders a conversation; `add_generation_prompt` appends the header of the assistant's
    /// turn (where the template has one).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// [`render`](Self::render) with tool definitions (OpenAI's `{"type": "function",
    /// "function": {...}}` objects) as the template's `tools` variable; none is `none`, as in
    /// transformers.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with_kwargs(messages, tools, add_generation_prompt, &serde_json::Map::new())
    }

    /// [`render_with_tools`](Self::render_with_tools) with extra template variables (a
    /// request's `chat_template_kwargs`, e.g. Qwen3's `enable_thinking`), as transformers'
    /// `apply_chat_template(**kwargs)` passes them. The variables the template is always given
    /// ([`RESERVED_VARIABLES`]) cannot be replaced: such a key is an error naming it.
    pub fn render_with_kwargs(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        if let Some(k) = kwargs.keys().find(|k| RESERVED_VARIABLES.contains(&k.as_str())) {
            return Err(WeftError::invalid(
                "chat_template_kwargs",
                format!("{k} is set by the request itself, not by chat_template_kwargs; remove it"),
            ));
        }
        let messages: Vec<Value> = messages.iter().map(|m| Value::from_object(MessageValue(m.clone()))).collect();
        let tools = if tools.is_empty() { Value::from(()) } else { Value::from(minijinja::value::Serde(tools)) };
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().map(Value::from).unwrap_or(Value::UNDEFINED),
            eos_token => self.eos_token.clone().map(Value::from).unwrap_or(Value::UNDEFINED),
            tools => tools,
            documents => (),
            ..Value::from(minijinja::value::Serde(kwargs))
        };
        let template =
            self.env.get_template(TEMPLATE_NAME).map_err(|e| template_error("the chat template is missing", &e))?;
        template.render(ctx).map_err(|e| {
            if let Some(message) = raised_message(&e) {
                WeftError::model("chat template", format!("the template refused the conversation: {message}"))
            } else {
                template_error("rendering the chat template failed", &e)
            }
        })
    }

    /// The template's Jinja source (what a tool-call format is recognised by).
    pub fn source(&self) -> &str {
        &self.source
    }
}

fn template_error(what: &str, e: &Error) -> WeftError {
    let mut detail = format!("{what}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        let _ = write!(detail, "; {inner}");
        source = inner.source();
    }
    WeftError::model("chat template", detail)
}

const RAISED_PREFIX: &str = "raise_exception: ";

fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISED_PREFIX}{message}")))
}

/// The message of a `raise_exception` call, wherever it sits in the error chain.
fn raised_message(e: &Error) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(mj) = err.downcast_ref::<Error>() {
            if let Some(msg) = mj.detail().and_then(|d| d.strip_prefix(RAISED_PREFIX)) {
                return Some(msg.to_owned());
            }
        }
        current = err.source();
    }
    None
}

// ----- strftime_now -----

fn strftime_now(format: String) -> std::result::Result<Value, Error> {
    let secs =
        web_time::SystemTime::now().duration_since(web_time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime(&format, secs).map(Value::from)
}

/// Days since 1970-01-01 to (year, month 1..=12, day 1..=31) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Python's `strftime` for a UTC time (the C locale's names).
fn strftime(format: &str, unix_secs: i64) -> std::result::Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday; 0 = Monday
    let day_of_year = days - days_before_year(year) + 1;
    let month_name = MONTHS[month as usize - 1];
    let day_name = DAYS[weekday];
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match spec {
            'Y' => write!(out, "{year}"),
            'y' => write!(out, "{:02}", year.rem_euclid(100)),
            'm' => write!(out, "{month:02}"),
            'd' => write!(out, "{day:02}"),
            'e' => write!(out, "{day:2}"),
            'H' => write!(out, "{hour:02}"),
            'I' => write!(out, "{hour12:02}"),
            'M' => write!(out, "{minute:02}"),
            'S' => write!(out, "{second:02}"),
            'p' => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            'B' => write!(out, "{month_name}"),
            'b' | 'h' => write!(out, "{}", &month_name[..3]),
            'A' => write!(out, "{day_name}"),
            'a' => write!(out, "{}", &day_name[..3]),
            'j' => write!(out, "{day_of_year:03}"),
            'w' => write!(out, "{}", (weekday + 1) % 7),
            'u' => write!(out, "{}", weekday + 1),
            'F' => write!(out, "{year}-{month:02}-{day:02}"),
            'T' => write!(out, "{hour:02}:{minute:02}:{second:02}"),
            'D' => write!(out, "{month:02}/{day:02}/{:02}", year.rem_euclid(100)),
            'Z' => write!(out, "UTC"),
            'z' => write!(out, "+0000"),
            '%' => write!(out, "%"),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: the directive %{other} is not supported"),
                ));
            }
        };
    }
    Ok(out)
}

fn days_before_year(year: i64) -> i64 {
    // Days from 1970-01-01 to January 1st of `year`.
    let y = year - 1;
    let leap_days = |y: i64| y.div_euclid(4) - y.div_euclid(100) + y.div_euclid(400);
    365 * (year - 1970) + leap_days(y) - leap_days(1969)
}

// ----- tojson -----

/// transformers' `tojson`: `json.dumps(value, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (None, Some(s)) => Some(s.to_owned()),
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be a number or a string")),
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.as_str().unwrap_or(",").to_owned(), b.as_str().unwrap_or(":").to_owned())
                }
                _ => {
                    return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings"));
                }
            }
        }
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let writer = JsonWriter {
        indent,
        item_sep,
        key_sep,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    writer.write(&mut out, value, 0)?;
    Ok(Value::from(out))
}

struct JsonWriter {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl JsonWriter {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn write(&self, out: &mut String, value: &Value, depth: usize) -> std::result::Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if let Some(i) = value.as_i64().filter(|_| value.is_integer()) {
                    let _ = write!(out, "{i}");
                } else if value.is_integer() {
                    let _ = write!(out, "{value}");
                } else {
                    let f = f64::try_from(value.clone())?;
                    out.push_str(&python_float(f));
                }
            }
            ValueKind::String => self.write_str(out, value.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, key) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    match key.as_str() {
                        Some(s) => self.write_str(out, s),
                        None => self.write_str(out, &key.to_string()),
                    }
                    out.push_str(&self.key_sep);
                    self.write(out, &value.get_item(key)?, depth + 1)?;
                }
                self.newline(out, depth);
                out.push('}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.write(out, item, depth + 1)?;
                }
                self.newline(out, depth);
                out.push(']');
            }
            _ => self.write_str(out, &value.to_string()),
        }
        Ok(())
    }

    fn write_str(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr(float)` (what `json.dumps` writes): the shortest digits that round-trip,
/// positional for exponents -4..16, scientific (`1e-05`, `1.5e+16`) outside.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp < 0 {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        } else if exp + 1 >= n {
            format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
        } else {
            let (int, frac) = digits.split_at((exp + 1) as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let mant = if rest.is_empty() { first.to_owned() } else { format!("{first}.{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (123.456, "123.456"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (-2.25, "-2.25"),
            (1e15, "1000000000000000.0"),
        ] {
            assert_eq!(python_float(f), want, "{f}");
        }
    }

    #[test]
    fn strftime_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t).unwrap(), "2024-02-29 13:05:09");
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "29 Feb 2024");
        assert_eq!(strftime("%A %B %j %I%p", t).unwrap(), "Thursday February 060 01PM");
        assert_eq!(strftime("%F", 0).unwrap(), "1970-01-01");
        assert_eq!(strftime("%a %j", 0).unwrap(), "Thu 001");
    }
}
