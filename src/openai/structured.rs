//! Reading structured-output requests: OpenAI's `response_format`, vLLM's
//! `structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`) and its older
//! `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, and llama.cpp's
//! `grammar` (GBNF) and `json_schema`. At most one may be given. Only the shape is checked
//! here; whether the schema, regex or grammar compiles is the engine's to say, at submission,
//! naming the same field.

use serde_json::{Map, Value};

use crate::constraint::{Constraint, Grammar};
use crate::openai::error::{ApiResult, OpenAiError};

/// The fields that carry a constraint, in the order they are read.
pub(crate) const FIELDS: &[&str] = &[
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "grammar",
    "json_schema",
];

/// The request's constraint, if it asks for one.
pub(crate) fn parse_constraint(body: &Map<String, Value>) -> ApiResult<Option<Constraint>> {
    let mut found: Option<Constraint> = None;
    for &field in FIELDS {
        let Some(value) = body.get(field).filter(|v| !v.is_null()) else { continue };
        let Some(grammar) = grammar_of(field, value)? else { continue };
        if let Some(first) = &found {
            return Err(OpenAiError::invalid(
                field,
                format!("invalid {field}: {} already constrains the output; give only one", first.field),
            ));
        }
        found = Some(Constraint::new(field, grammar));
    }
    Ok(found)
}

fn bad(field: &str, why: impl std::fmt::Display) -> OpenAiError {
    OpenAiError::invalid(field, format!("invalid {field}: {why}"))
}

fn string<'a>(field: &str, what: &str, v: &'a Value) -> ApiResult<&'a str> {
    v.as_str().ok_or_else(|| bad(field, format!("{what} must be a string, got {v}")))
}

/// A JSON schema given as an object (or `true`/`false`), or as its JSON text.
fn schema(field: &str, what: &str, v: &Value) -> ApiResult<Value> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(parsed @ (Value::Object(_) | Value::Bool(_))) => Ok(parsed),
            Ok(other) => Err(bad(field, format!("{what} must be a JSON schema object, got {other}"))),
            Err(e) => Err(bad(field, format!("{what} is not valid JSON: {e}"))),
        },
        other => Err(bad(field, format!("{what} must be a JSON schema object, got {other}"))),
    }
}

fn choices(field: &str, what: &str, v: &Value) -> ApiResult<Vec<String>> {
    let Value::Array(items) = v else { return Err(bad(field, format!("{what} must be a list of strings, got {v}"))) };
    items.iter().map(|c| string(field, what, c).map(str::to_string)).collect()
}

/// vLLM's grammars are Lark (as llguidance reads it) unless they are written in GBNF.
fn grammar_text(text: &str) -> Grammar {
    if text.contains("::=") { Grammar::Gbnf(text.to_string()) } else { Grammar::Lark(text.to_string()) }
}

fn grammar_of(field: &str, v: &Value) -> ApiResult<Option<Grammar>> {
    Ok(Some(match field {
        "response_format" => return response_format(v),
        "structured_outputs" => return structured_outputs(v),
        "guided_json" | "json_schema" => Grammar::JsonSchema(schema(field, field, v)?),
        "guided_regex" => Grammar::Regex(string(field, field, v)?.to_string()),
        "guided_choice" => Grammar::Choice(choices(field, field, v)?),
        "guided_grammar" => grammar_text(string(field, field, v)?),
        // llama.cpp's `grammar` is GBNF; vLLM's extras put theirs under structured_outputs.
        _ => Grammar::Gbnf(string(field, field, v)?.to_string()),
    }))
}

fn response_format(v: &Value) -> ApiResult<Option<Grammar>> {
    const F: &str = "response_format";
    let Value::Object(o) = v else { return Err(bad(F, format!("expected an object, got {v}"))) };
    let kind = o.get("type").map(|t| string(F, "type", t)).transpose()?;
    match kind {
        None => Err(bad(F, "type is missing (text, json_object or json_schema)")),
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::JsonObject)),
        Some("json_schema") => {
            let Some(Value::Object(js)) = o.get("json_schema") else {
                return Err(bad(F, "json_schema must be an object with the schema under \"schema\""));
            };
            if let Some(name) = js.get("name") {
                string(F, "json_schema.name", name)?;
            }
            if let Some(strict) = js.get("strict").filter(|s| !s.is_null() && !s.is_boolean()) {
                return Err(bad(F, format!("json_schema.strict must be true or false, got {strict}")));
            }
            match js.get("schema") {
                None | Some(Value::Null) => Err(bad(F, "json_schema.schema is missing")),
                Some(s) => Ok(Some(Grammar::JsonSchema(schema(F, "json_schema.schema", s)?))),
            }
        }
        Some(other) => Err(bad(F, format!("unknown type {other:?} (text, json_object or json_schema)"))),
    }
}

fn structured_outputs(v: &Value) -> ApiResult<Option<Grammar>> {
    const F: &str = "structured_outputs";
    let Value::Object(o) = v else { return Err(bad(F, format!("expected an object, got {v}"))) };
    let mut found: Option<(&str, Grammar)> = None;
    for (key, value) in o.iter().filter(|(_, v)| !v.is_null()) {
        let grammar = match key.as_str() {
            "json" => Grammar::JsonSchema(schema(F, "json", value)?),
            "regex" => Grammar::Regex(string(F, "regex", value)?.to_string()),
            "choice" => Grammar::Choice(choices(F, "choice", value)?),
            "grammar" => grammar_text(string(F, "grammar", value)?),
            "json_object" if value == &Value::Bool(true) => Grammar::JsonObject,
            "json_object" if value == &Value::Bool(false) => continue,
            "json_object" => return Err(bad(F, format!("json_object must be true or false, got {value}"))),
            // Options that change nothing here.
            "disable_fallback" | "disable_any_whitespace" | "disable_additional_properties" | "whitespace_pattern" => {
                continue;
            }
            other => {
                return Err(bad(F, format!("{other} is not supported (json, regex, choice, grammar or json_object)")));
            }
        };
        if let Some((first, _)) = &found {
            return Err(bad(F, format!("both {first} and {key} are given; give one")));
        }
        found = Some((key.as_str(), grammar));
    }
    match found {
        Some((_, g)) => Ok(Some(g)),
        None => Err(bad(F, "none of json, regex, choice, grammar or json_object is given")),
    }
}
