//! Structured output: what a request's output must match (a JSON schema, any JSON object, a
//! regex, one of a list of strings, a Lark or GBNF grammar, or a tool call), compiled by
//! llguidance into an allowed-token mask for each sampled row.
//!
//! ```text
//!   Constraint ──ConstraintCompiler::compile (at submit; cached by its text)──> ConstraintState
//!   each step: state.masks(drafted) ──> one bitmask per sampled row (vocab/32 words, 1 = allowed)
//!   after it:  state.advance(kept tokens) ──> Done when the grammar can only end here
//! ```
//!
//! Compiling happens once, when the engine admits a request: a schema, regex or grammar that
//! llguidance refuses, or that outgrows its limits on time and memory, is a
//! `WeftError::InvalidRequest` naming the request field it came from, never a failure halfway
//! through generation. The first mask of each compiled grammar is computed then too (it also
//! proves the grammar can start) and kept with it in the cache.
//!
//! **Invariant:** imports nothing GPU-side and nothing of the engine (a tidy test checks): the
//! engine holds states, the GPU only ever sees their masks as plain words.

mod compiler;
pub mod gbnf;
pub mod tools;

pub use compiler::{Advance, ConstraintCompiler, ConstraintState, MAX_CONSTRAINT_BYTES, mask_words};
pub use tools::{ToolCall, ToolChoice, ToolFormat};

use serde_json::Value;

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// A JSON value valid against this JSON schema.
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    /// A string matching this regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax (vLLM's `grammar`).
    Lark(String),
    /// A grammar in llama.cpp's GBNF (`root ::= ...`).
    Gbnf(String),
    /// One or more calls of the given tools, in the model's own tool-call format (OpenAI's
    /// `tool_choice: "required"` or a named function).
    ToolCalls {
        /// OpenAI's tool objects (`{"type": "function", "function": {"name", "parameters"}}`).
        tools: Vec<Value>,
        /// Only this function may be called (a named `tool_choice`).
        name: Option<String>,
        /// Several calls in one answer (`parallel_tool_calls`).
        parallel: bool,
    },
}

impl Grammar {
    /// The text the compiled grammar is cached by: kind and content, exactly.
    pub fn cache_key(&self) -> String {
        let json = |v: &Value| serde_json::to_string(v).unwrap_or_default();
        match self {
            Grammar::JsonSchema(schema) => format!("json_schema\0{}", json(schema)),
            Grammar::JsonObject => "json_object".into(),
            Grammar::Regex(r) => format!("regex\0{r}"),
            Grammar::Choice(c) => format!("choice\0{}", json(&Value::from(c.clone()))),
            Grammar::Lark(g) => format!("lark\0{g}"),
            Grammar::Gbnf(g) => format!("gbnf\0{g}"),
            Grammar::ToolCalls { tools, name, parallel } => {
                format!("tools\0{}\0{}\0{parallel}", json(&Value::from(tools.clone())), name.as_deref().unwrap_or(""))
            }
        }
    }

    /// The text's size, for the limit on what a request may ask to compile.
    fn text_len(&self) -> usize {
        match self {
            Grammar::JsonObject => 0,
            Grammar::Choice(c) => c.iter().map(String::len).sum(),
            Grammar::Regex(t) | Grammar::Lark(t) | Grammar::Gbnf(t) => t.len(),
            _ => self.cache_key().len(),
        }
    }
}

/// A request's constraint: the grammar and the request field it came from (named when the
/// grammar is refused: "response_format", "guided_regex", "tool_choice", ...).
#[derive(Clone, Debug, PartialEq)]
pub struct Constraint {
    pub grammar: Grammar,
    pub field: String,
}

impl Constraint {
    pub fn new(field: impl Into<String>, grammar: Grammar) -> Self {
        Constraint { grammar, field: field.into() }
    }
}
