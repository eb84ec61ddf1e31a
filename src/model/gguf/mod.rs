//! GGUF: the reader (versions 2 and 3; `reader`), typed metadata getters (`metadata`), the
//! ggml type table and tensor infos (`types`), and the writer weft's tiny test models use
//! (`writer`).
//!
//! A GGUF file is, all little-endian: the magic `GGUF`, a `u32` version, `u64` tensor and
//! metadata counts; the metadata as (string key, `u32` value type, value) entries; one info per
//! tensor (string name, `u32` dimension count, `u64` dims with the innermost first, `u32` ggml
//! type, `u64` offset into the data section); padding up to `general.alignment` (default 32);
//! then the data section. A string is a `u64` byte length and UTF-8 bytes; an array is a `u32`
//! element type, a `u64` count and the elements.
//!
//! Invariants of the reader, whatever the input:
//! - it returns an error and never panics; each error is one [`WeftError::Model`] line naming the
//!   file and the problem;
//! - it never allocates more than the file's length justifies: every count and length is checked
//!   against the bytes still unread *before* anything is allocated for it, so what it holds is at
//!   most a small constant factor of the file's length (an in-memory [`MetaValue`] is 32 bytes,
//!   and every value takes at least one byte of the file); a mapped file is never copied, and a
//!   file read through a [`ReadAt`] (the browser's) is read in windows of [`WINDOW_BYTES`] while
//!   parsing and one tensor at a time after;
//! - array nesting is capped at [`MAX_ARRAY_DEPTH`], which bounds the recursion;
//! - a [`GgufFile`] that opened holds only tensors of a ggml type with a known block layout,
//!   whose element count does not overflow, whose rows are whole blocks, whose offset is a
//!   multiple of the alignment, whose data lies inside the file and overlaps no other tensor's.
//!   So [`GgufFile::tensor_bytes`] of one of its tensors is always exactly that tensor's data.

mod metadata;
mod reader;
#[cfg(test)]
mod tests;
mod types;
mod writer;

pub use reader::{GgufFile, ReadAt, TensorSource, WINDOW_BYTES};
pub use types::{GgmlType, MetaValue, Metadata, TensorInfo, decoded_types};
pub use writer::{GgufStream, GgufWriter, TensorDecl};

pub(crate) const MAGIC: [u8; 4] = *b"GGUF";
/// The version [`GgufWriter`] writes.
pub(crate) const WRITTEN_VERSION: u32 = 3;
pub(crate) const DEFAULT_ALIGNMENT_BYTES: u64 = 32;
pub(crate) const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml's `GGML_MAX_DIMS`: no ggml tensor has more dimensions.
pub(crate) const MAX_DIMS: u32 = 4;
/// Deepest array nesting the reader accepts. Arrays of arrays are legal GGUF, but no model uses
/// more than one level; the cap keeps a hostile file from recursing the reader off its stack.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Magic, version and the two counts.
pub(crate) const HEADER_BYTES: u64 = 24;
/// The fewest bytes a metadata entry takes: key length (8), value type (4), a one-byte value.
pub(crate) const MIN_METADATA_ENTRY_BYTES: u64 = 13;
/// The fewest bytes a tensor info takes: name length (8), dimension count (4), type (4), offset (8).
pub(crate) const MIN_TENSOR_INFO_BYTES: u64 = 24;
/// Longest name or key quoted in an error message, in characters.
pub(crate) const MAX_SHOWN_NAME_CHARS: usize = 96;

/// The ggml elements per block of the K-quants and most I-quants.
pub(crate) const QK_K: u64 = 256;

/// A name or key as quoted in an error: escaped to stay on one line, and cut short.
pub(crate) fn shown(name: &str) -> String {
    let escaped: String = name.escape_debug().collect();
    match escaped.char_indices().nth(MAX_SHOWN_NAME_CHARS) {
        Some((cut, _)) => format!("{}...", &escaped[..cut]),
        None => escaped,
    }
}
