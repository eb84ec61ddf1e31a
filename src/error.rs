//! The one error type of the library: every public fallible path returns [`WeftError`].

use thiserror::Error;

pub type Result<T, E = WeftError> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum WeftError {
    /// wgpu found no adapter at all: natively the usual cause is a machine without a GPU
    /// driver, in a browser WebGPU being off or the GPU blocklisted. `hint` says which, and what
    /// to do.
    #[error("no GPU adapter found{hint}")]
    NoAdapter { hint: String },

    /// `WGPU_ADAPTER_NAME` was set but matched none of the adapters present.
    #[error("WGPU_ADAPTER_NAME={wanted:?} matches no adapter; the adapters present are: {available}")]
    AdapterNotFound { wanted: String, available: String },

    #[error("could not open the GPU device {adapter:?}: {reason}")]
    Device { adapter: String, reason: String },

    /// A validation or out-of-memory error reported by wgpu while recording or submitting work.
    #[error("GPU error in {context}: {reason}")]
    Gpu { context: String, reason: String },

    /// The GPU device was lost (a driver reset or crash, the GPU removed, a step past the
    /// operating system's watchdog): nothing more can run on it.
    #[error(
        "the GPU device {adapter:?} was lost ({reason}); restart weft (in a browser, reload the page) to open it \
         again. A driver resets a GPU whose work runs too long (Windows after 2 s): if that is what happened, lower \
         --max-num-batched-tokens or EngineConfig::max_step_seconds"
    )]
    DeviceLost { adapter: String, reason: String },

    /// Reading a buffer back from the GPU failed (device lost, mapping refused).
    #[error("reading GPU buffer back failed: {0}")]
    Readback(String),

    /// Operands of a kernel or tensor operation do not fit together.
    #[error("{op}: {detail}")]
    Shape { op: &'static str, detail: String },

    /// A model file or directory that cannot be read: names the file and what is wrong with it.
    #[error("{file}: {detail}")]
    Model { file: String, detail: String },

    /// A request refused at submission, naming the request field at fault (`None`: the
    /// request as a whole). Nothing was queued.
    #[error("invalid {}: {reason}", field.as_deref().unwrap_or("request"))]
    InvalidRequest { field: Option<String>, reason: String },

    /// Not now: the engine is shut down (or draining); retrying elsewhere or later may work.
    #[error("{0}")]
    Unavailable(String),

    /// The request is well formed but the device or build cannot serve it.
    #[error("{0}")]
    Unsupported(String),
}

impl WeftError {
    pub fn model(file: impl Into<String>, detail: impl Into<String>) -> Self {
        WeftError::Model { file: file.into(), detail: detail.into() }
    }

    /// A request refused at submission because of `field`.
    pub fn invalid(field: &str, reason: impl Into<String>) -> Self {
        WeftError::InvalidRequest { field: Some(field.to_string()), reason: reason.into() }
    }

    /// A request refused at submission, as a whole.
    pub fn invalid_request(reason: impl Into<String>) -> Self {
        WeftError::InvalidRequest { field: None, reason: reason.into() }
    }

    pub(crate) fn shape(op: &'static str, detail: impl Into<String>) -> Self {
        WeftError::Shape { op, detail: detail.into() }
    }
}
