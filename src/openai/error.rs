//! OpenAI's error shape, and how engine errors map to it.

use serde_json::{Value, json};

use crate::error::WeftError;

/// An OpenAI-shaped error: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenAiError {
    pub message: String,
    /// OpenAI's `type`: "invalid_request_error", "service_unavailable", "internal_error", ...
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl OpenAiError {
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        OpenAiError { message: message.into(), kind, param: None, code: None }
    }

    /// The caller's fault, in field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        OpenAiError { param: Some(param.to_string()), ..Self::new("invalid_request_error", message) }
    }

    /// The caller's fault, in no one field (the body as a whole).
    pub fn invalid_body(message: impl Into<String>) -> Self {
        Self::new("invalid_request_error", message)
    }

    /// Not now: retrying later may succeed.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new("service_unavailable", message)
    }

    /// Our fault.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new("internal_error", message)
    }

    /// The JSON error object.
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }

    /// An engine error: a refused request is the caller's fault (naming its field), an engine
    /// that is shut down is unavailable, anything else is internal.
    pub fn from_engine(e: WeftError) -> Self {
        match &e {
            WeftError::InvalidRequest { field, .. } => {
                OpenAiError { param: field.clone(), ..Self::invalid_body(e.to_string()) }
            }
            WeftError::Unavailable(m) => Self::unavailable(m.clone()),
            _ => Self::internal(e.to_string()),
        }
    }
}

impl std::fmt::Display for OpenAiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OpenAiError {}

impl From<WeftError> for OpenAiError {
    fn from(e: WeftError) -> Self {
        Self::from_engine(e)
    }
}

pub(crate) type ApiResult<T> = std::result::Result<T, OpenAiError>;
