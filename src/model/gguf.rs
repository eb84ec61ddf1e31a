//! GGUF reader (versions 2 and 3) and writer.
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
//!   and every value takes at least one byte of the file); a mapped file is never copied;
//! - array nesting is capped at [`MAX_ARRAY_DEPTH`], which bounds the recursion;
//! - a [`GgufFile`] that opened holds only tensors of a ggml type with a known block layout,
//!   whose element count does not overflow, whose rows are whole blocks, whose offset is a
//!   multiple of the alignment, whose data lies inside the file and overlaps no other tensor's.
//!   So [`GgufFile::tensor_bytes`] is always exactly a tensor's data.

use std::collections::BTreeMap;
use std::fmt;

use crate::quant::DType;
use crate::{Result, WeftError};

/// A typed metadata value (GGUF metadata value types 0..=12).
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

/// Metadata keys to values, as read from the file.
pub type Metadata = BTreeMap<String, MetaValue>;

const MAGIC: [u8; 4] = *b"GGUF";
/// The version [`GgufWriter`] writes.
const WRITTEN_VERSION: u32 = 3;
const DEFAULT_ALIGNMENT_BYTES: u64 = 32;
const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml's `GGML_MAX_DIMS`: no ggml tensor has more dimensions.
const MAX_DIMS: u32 = 4;
/// Deepest array nesting the reader accepts. Arrays of arrays are legal GGUF, but no model uses
/// more than one level; the cap keeps a hostile file from recursing the reader off its stack.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Magic, version and the two counts.
const HEADER_BYTES: u64 = 24;
/// The fewest bytes a metadata entry takes: key length (8), value type (4), a one-byte value.
const MIN_METADATA_ENTRY_BYTES: u64 = 13;
/// The fewest bytes a tensor info takes: name length (8), dimension count (4), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 24;
/// Longest name or key quoted in an error message, in characters.
const MAX_SHOWN_NAME_CHARS: usize = 96;

/// The ggml elements per block of the K-quants and most I-quants.
const QK_K: u64 = 256;

/// Defines [`GgmlType`] from one table row per type: variant = id, (elements, bytes) per block.
macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $block_elems:expr, $block_bytes:expr;)*) => {
        /// A ggml tensor type, by its id in the file (`GGMLQuantizationType` in gguf-py). Known
        /// types carry their block layout, so sizes can be checked for any of them even though
        /// weft computes with only a few (see [`TensorInfo::dtype`]). `Unknown` holds ids that are
        /// not in the table (retired ones included); the reader rejects tensors of those types.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum GgmlType {
            $($variant,)*
            Unknown(u32),
        }

        impl GgmlType {
            pub fn from_u32(id: u32) -> GgmlType {
                match id {
                    $($id => GgmlType::$variant,)*
                    other => GgmlType::Unknown(other),
                }
            }

            /// The type's id in a GGUF file.
            pub fn id(self) -> u32 {
                match self {
                    $(GgmlType::$variant => $id,)*
                    GgmlType::Unknown(id) => id,
                }
            }

            /// ggml's name of the type ("Q6_K"), or "unknown ggml type N".
            pub fn name(&self) -> String {
                match self {
                    $(GgmlType::$variant => stringify!($variant).to_string(),)*
                    GgmlType::Unknown(id) => format!("unknown ggml type {id}"),
                }
            }

            /// (elements, bytes) of one storage block; `None` for an unknown type.
            fn block_layout(self) -> Option<(u64, u64)> {
                match self {
                    $(GgmlType::$variant => Some(($block_elems, $block_bytes)),)*
                    GgmlType::Unknown(_) => None,
                }
            }
        }
    };
}

// Block layouts as in ggml-common.h (and GGML_QUANT_SIZES in gguf-py's constants.py).
ggml_types! {
    F32 = 0, 1, 4;
    F16 = 1, 1, 2;
    Q4_0 = 2, 32, 2 + 16;
    Q4_1 = 3, 32, 2 + 2 + 16;
    Q5_0 = 6, 32, 2 + 4 + 16;
    Q5_1 = 7, 32, 2 + 2 + 4 + 16;
    Q8_0 = 8, 32, 2 + 32;
    Q8_1 = 9, 32, 2 + 2 + 32;
    Q2_K = 10, QK_K, 2 + 2 + QK_K / 16 + QK_K / 4;
    Q3_K = 11, QK_K, 2 + QK_K / 4 + QK_K / 8 + 12;
    Q4_K = 12, QK_K, 2 + 2 + QK_K / 2 + 12;
    Q5_K = 13, QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12;
    Q6_K = 14, QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16;
    Q8_K = 15, QK_K, 4 + QK_K + QK_K / 8;
    IQ2_XXS = 16, QK_K, 2 + QK_K / 4;
    IQ2_XS = 17, QK_K, 2 + QK_K / 4 + QK_K / 32;
    IQ3_XXS = 18, QK_K, 2 + QK_K / 4 + QK_K / 8;
    IQ1_S = 19, QK_K, 2 + QK_K / 8 + QK_K / 16;
    IQ4_NL = 20, 32, 2 + 16;
    IQ3_S = 21, QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4;
    IQ2_S = 22, QK_K, 2 + QK_K / 4 + QK_K / 16;
    IQ4_XS = 23, QK_K, 2 + 2 + QK_K / 2 + QK_K / 64;
    I8 = 24, 1, 1;
    I16 = 25, 1, 2;
    I32 = 26, 1, 4;
    I64 = 27, 1, 8;
    F64 = 28, 1, 8;
    IQ1_M = 29, QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32;
    BF16 = 30, 1, 2;
    TQ1_0 = 34, QK_K, 2 + 4 * 13;
    TQ2_0 = 35, QK_K, 2 + 64;
    MXFP4 = 39, 32, 1 + 16;
}

impl GgmlType {
    /// Elements covered by one storage block (1 for plain number types); `None` if unknown.
    pub fn block_elems(self) -> Option<u64> {
        self.block_layout().map(|(elems, _)| elems)
    }

    /// Bytes of one storage block; `None` if unknown.
    pub fn block_bytes(self) -> Option<u64> {
        self.block_layout().map(|(_, bytes)| bytes)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// How weft holds a tensor's elements: a GPU storage format, or BF16, which widens to F32 at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorDType {
    Native(DType),
    Bf16,
}

/// One tensor's entry in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the innermost, contiguous dimension (a row's length).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset of the data, relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// The product of the dims, saturating at `u64::MAX` (the reader rejects tensors whose
    /// product overflows).
    pub fn num_elems(&self) -> u64 {
        self.checked_num_elems().unwrap_or(u64::MAX)
    }

    /// Bytes of the tensor's data; 0 when undefined (an unknown type, overflowing dims, rows that
    /// are not whole blocks), which the reader never lets through.
    pub fn size_bytes(&self) -> u64 {
        self.checked_size_bytes().unwrap_or(0)
    }

    /// Row-major shape, outermost first: the dims reversed. Dims are saturated to `usize::MAX`
    /// (the reader rejects dims that do not fit in a `usize`).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect()
    }

    /// The format weft computes with for this tensor, or an error naming the tensor's type.
    /// The error's file is "GGUF"; [`GgufFile::check_tensor_types`] names the real file.
    pub fn dtype(&self) -> Result<TensorDType> {
        Ok(match self.ggml_type {
            GgmlType::F32 => TensorDType::Native(DType::F32),
            GgmlType::F16 => TensorDType::Native(DType::F16),
            GgmlType::Q8_0 => TensorDType::Native(DType::Q8_0),
            GgmlType::Q4_0 => TensorDType::Native(DType::Q4_0),
            GgmlType::Q4_1 => TensorDType::Native(DType::Q4_1),
            GgmlType::BF16 => TensorDType::Bf16,
            other => {
                return Err(WeftError::model(
                    "GGUF",
                    format!(
                        "tensor {} is {}; weft supports F32, F16, BF16, Q8_0, Q4_0, Q4_1",
                        shown(&self.name),
                        other.name()
                    ),
                ));
            }
        })
    }

    fn checked_num_elems(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |product, &d| product.checked_mul(d))
    }

    /// The size ggml computes (`ggml_nbytes`): whole blocks per row, times the rows.
    fn checked_size_bytes(&self) -> std::result::Result<u64, String> {
        let (block_elems, block_bytes) =
            self.ggml_type.block_layout().ok_or_else(|| format!("has {}", self.ggml_type.name()))?;
        let overflow = || format!("has dims {:?}, whose product overflows", self.dims);
        self.checked_num_elems().ok_or_else(overflow)?;
        let row_elems = self.dims.first().copied().unwrap_or(1);
        if row_elems % block_elems != 0 {
            return Err(format!(
                "has rows of {row_elems} elements, not a whole number of {} blocks of {block_elems}",
                self.ggml_type.name()
            ));
        }
        // Checked on its own: a zero row length hides any overflow here from the product above.
        let rows =
            self.dims.iter().skip(1).try_fold(1u64, |product, &d| product.checked_mul(d)).ok_or_else(overflow)?;
        (row_elems / block_elems)
            .checked_mul(block_bytes)
            .and_then(|row_bytes| row_bytes.checked_mul(rows))
            .ok_or_else(overflow)
    }
}

/// The file's bytes: mapped from disk natively, owned where there is no file system (the browser).
enum FileBytes {
    Mapped(crate::rt::MappedFile),
    Owned(Vec<u8>),
}

impl FileBytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(map) => map,
            FileBytes::Owned(bytes) => bytes,
        }
    }
}

/// A parsed GGUF file: its metadata and tensor infos, and its bytes for the tensor data.
pub struct GgufFile {
    pub version: u32,
    /// Bytes; the data section and every tensor's offset are multiples of it.
    pub alignment: u64,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    bytes: FileBytes,
    /// Where the data section starts, from the start of the file.
    data_offset: u64,
    name: String,
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`; tensor data is read from the mapping on demand.
    pub fn open(path: &std::path::Path) -> Result<GgufFile> {
        let name = path.display().to_string();
        let map = crate::rt::map_file(path).map_err(|e| WeftError::model(&name, format!("cannot open: {e}")))?;
        Self::parse(name, FileBytes::Mapped(map))
    }

    /// Parses a GGUF file held in memory (the browser has no file to map); `name` is for errors.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<GgufFile> {
        Self::parse(name.to_string(), FileBytes::Owned(bytes))
    }

    fn parse(name: String, bytes: FileBytes) -> Result<GgufFile> {
        let layout = parse_layout(bytes.as_slice()).map_err(|detail| WeftError::model(&name, detail))?;
        Ok(GgufFile {
            version: layout.version,
            alignment: layout.alignment,
            metadata: layout.metadata,
            tensors: layout.tensors,
            bytes,
            data_offset: layout.data_offset,
            name,
        })
    }

    /// The file's name as given to [`GgufFile::open`] or [`GgufFile::from_bytes`].
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The data of `info`, one of this file's `tensors`. An info from elsewhere gets its bytes
    /// only where they lie inside this file, and an empty slice otherwise.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let bytes = self.bytes.as_slice();
        let range = self.data_offset.checked_add(info.offset).and_then(|start| {
            let end = start.checked_add(info.size_bytes())?;
            Some(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
        });
        range.and_then(|r| bytes.get(r)).unwrap_or(&[])
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer type, if the value is not negative.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        as_u64(self.get(key)?)
    }

    /// F32, F64 or any integer type.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        as_f64(self.get(key)?)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            MetaValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// An array whose elements are all strings.
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.array(key)?
            .iter()
            .map(|v| match v {
                MetaValue::String(s) => Some(s.as_str()),
                _ => None,
            })
            .collect()
    }

    /// An array whose elements are all numbers (as [`GgufFile::get_f64`]), narrowed to f32.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        self.array(key)?.iter().map(|v| as_f64(v).map(|x| x as f32)).collect()
    }

    /// An array whose elements are all integers that fit in an i64.
    pub fn get_i64_array(&self, key: &str) -> Option<Vec<i64>> {
        self.array(key)?.iter().map(as_i64).collect()
    }

    /// `general.architecture`, e.g. "llama".
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// Fails on the first tensor whose type weft cannot compute with, naming it and its type.
    pub fn check_tensor_types(&self) -> Result<()> {
        for info in &self.tensors {
            info.dtype().map_err(|e| match e {
                WeftError::Model { detail, .. } => WeftError::model(&self.name, detail),
                other => other,
            })?;
        }
        Ok(())
    }

    fn array(&self, key: &str) -> Option<&[MetaValue]> {
        match self.get(key)? {
            MetaValue::Array(items) => Some(items),
            _ => None,
        }
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .field("file_bytes", &self.bytes.as_slice().len())
            .finish()
    }
}

fn as_u64(value: &MetaValue) -> Option<u64> {
    match *value {
        MetaValue::U8(v) => Some(v.into()),
        MetaValue::U16(v) => Some(v.into()),
        MetaValue::U32(v) => Some(v.into()),
        MetaValue::U64(v) => Some(v),
        MetaValue::I8(v) => u64::try_from(v).ok(),
        MetaValue::I16(v) => u64::try_from(v).ok(),
        MetaValue::I32(v) => u64::try_from(v).ok(),
        MetaValue::I64(v) => u64::try_from(v).ok(),
        _ => None,
    }
}

fn as_i64(value: &MetaValue) -> Option<i64> {
    match *value {
        MetaValue::U8(v) => Some(v.into()),
        MetaValue::U16(v) => Some(v.into()),
        MetaValue::U32(v) => Some(v.into()),
        MetaValue::U64(v) => i64::try_from(v).ok(),
        MetaValue::I8(v) => Some(v.into()),
        MetaValue::I16(v) => Some(v.into()),
        MetaValue::I32(v) => Some(v.into()),
        MetaValue::I64(v) => Some(v),
        _ => None,
    }
}

fn as_f64(value: &MetaValue) -> Option<f64> {
    match *value {
        MetaValue::F32(v) => Some(v.into()),
        MetaValue::F64(v) => Some(v),
        // Every u64, including those above i64::MAX.
        MetaValue::U64(v) => Some(v as f64),
        _ => as_i64(value).map(|v| v as f64),
    }
}

/// A name or key as quoted in an error: escaped to stay on one line, and cut short.
fn shown(name: &str) -> String {
    let escaped: String = name.escape_debug().collect();
    match escaped.char_indices().nth(MAX_SHOWN_NAME_CHARS) {
        Some((cut, _)) => format!("{}...", &escaped[..cut]),
        None => escaped,
    }
}

// ---------------------------------------------------------------------------------------------
// Reading

/// Everything [`GgufFile`] holds except the bytes and the name.
struct Layout {
    version: u32,
    alignment: u64,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    data_offset: u64,
}

/// Why a read failed.
enum ReadError {
    /// The item runs past the end of the file; the caller knows what the item was.
    Truncated,
    /// The item is malformed; the text is the whole message.
    Invalid(String),
}

impl ReadError {
    /// The error's message, where `what` names the item being read when the file was cut short.
    fn describe(self, what: &str) -> String {
        match self {
            ReadError::Truncated => format!("truncated: {what} ends past the end of the file"),
            ReadError::Invalid(message) => message,
        }
    }
}

type ReadResult<T> = std::result::Result<T, ReadError>;

/// A read position in the file's bytes; every read checks the bytes left first.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining_bytes(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, len_bytes: u64) -> ReadResult<&'a [u8]> {
        if len_bytes > self.remaining_bytes() {
            return Err(ReadError::Truncated);
        }
        // Fits in usize: it is at most the bytes left in a slice.
        let end = self.pos + len_bytes as usize;
        let taken = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> ReadResult<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }

    fn u8(&mut self) -> ReadResult<u8> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> ReadResult<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> ReadResult<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A length-prefixed UTF-8 string; the length is checked against the file before copying.
    fn string(&mut self) -> ReadResult<String> {
        let start = self.pos;
        let len_bytes = self.u64()?;
        let raw = self.take(len_bytes)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|e| ReadError::Invalid(format!("the string at byte {start} is not valid UTF-8 ({e})")))
    }
}

/// Reserves room for `count` items, which the caller has checked against the bytes left. The
/// reservation may still fail where memory is smaller than a file's in-memory form (wasm32's
/// 2 GiB), and that is an error, not an abort.
fn reserve<T>(items: &mut Vec<T>, count: u64, what: impl FnOnce() -> String) -> std::result::Result<(), String> {
    usize::try_from(count)
        .ok()
        .and_then(|count| items.try_reserve_exact(count).ok())
        .ok_or_else(|| format!("{}: {count} items do not fit in this machine's memory", what()))
}

/// The fewest file bytes a value of metadata type `type_id` takes; `None` for an unknown type.
fn min_value_bytes(type_id: u32) -> Option<u64> {
    Some(match type_id {
        0 | 1 | 7 => 1,   // u8, i8, bool
        2 | 3 => 2,       // u16, i16
        4..=6 => 4,       // u32, i32, f32
        10..=12 => 8,     // u64, i64, f64
        8 => 8,           // string: its length
        9 => 4 + 8,       // array: element type and count
        _ => return None, // unknown
    })
}

/// Reads one value of metadata type `type_id` for `key`, at array nesting `depth`.
fn read_value(cur: &mut Cursor<'_>, type_id: u32, key: &str, depth: usize) -> ReadResult<MetaValue> {
    Ok(match type_id {
        0 => MetaValue::U8(cur.u8()?),
        1 => MetaValue::I8(i8::from_le_bytes(cur.array()?)),
        2 => MetaValue::U16(u16::from_le_bytes(cur.array()?)),
        3 => MetaValue::I16(i16::from_le_bytes(cur.array()?)),
        4 => MetaValue::U32(cur.u32()?),
        5 => MetaValue::I32(i32::from_le_bytes(cur.array()?)),
        6 => MetaValue::F32(f32::from_le_bytes(cur.array()?)),
        // Writers store 0 or 1; any other byte reads as true rather than failing the file.
        7 => MetaValue::Bool(cur.u8()? != 0),
        8 => MetaValue::String(cur.string().map_err(|e| match e {
            ReadError::Invalid(problem) => ReadError::Invalid(format!("{problem}, in the value of key {}", shown(key))),
            truncated => truncated,
        })?),
        9 => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(ReadError::Invalid(format!(
                    "arrays nested more than {MAX_ARRAY_DEPTH} deep for key {}",
                    shown(key)
                )));
            }
            let elem_type = cur.u32()?;
            let count = cur.u64()?;
            let min_elem_bytes = min_value_bytes(elem_type).ok_or_else(|| {
                ReadError::Invalid(format!(
                    "unknown metadata value type {elem_type} in the array for key {}",
                    shown(key)
                ))
            })?;
            // The count must be possible before the Vec is sized by it.
            if count > cur.remaining_bytes() / min_elem_bytes {
                return Err(ReadError::Invalid(format!(
                    "array of {count} elements of type {elem_type} for key {} cannot fit in the {} \
                     bytes left in the file",
                    shown(key),
                    cur.remaining_bytes()
                )));
            }
            let mut items = Vec::new();
            reserve(&mut items, count, || format!("the array for key {}", shown(key))).map_err(ReadError::Invalid)?;
            for _ in 0..count {
                items.push(read_value(cur, elem_type, key, depth + 1)?);
            }
            MetaValue::Array(items)
        }
        10 => MetaValue::U64(cur.u64()?),
        11 => MetaValue::I64(i64::from_le_bytes(cur.array()?)),
        12 => MetaValue::F64(f64::from_le_bytes(cur.array()?)),
        other => {
            return Err(ReadError::Invalid(format!("unknown metadata value type {other} for key {}", shown(key))));
        }
    })
}

fn parse_layout(bytes: &[u8]) -> std::result::Result<Layout, String> {
    let file_bytes = bytes.len() as u64;
    match bytes.get(..MAGIC.len()) {
        None => return Err(format!("not a GGUF file ({file_bytes} bytes, too short for the magic)")),
        Some(magic) if magic != MAGIC => {
            let hex: String = magic.iter().map(|b| format!("{b:02x}")).collect();
            return Err(format!("not a GGUF file (bad magic 0x{hex})"));
        }
        Some(_) => {}
    }
    let mut cur = Cursor { bytes, pos: MAGIC.len() };
    let header = |e: ReadError| e.describe(&format!("the {HEADER_BYTES}-byte header"));
    let version = cur.u32().map_err(header)?;
    if version != 2 && version != 3 {
        // A big-endian file (v3 allows them) reads as a byte-swapped small version.
        return Err(if matches!(version.swap_bytes(), 2 | 3) {
            "big-endian GGUF files are not supported".to_string()
        } else {
            format!("GGUF version {version} is not supported (2 and 3 are)")
        });
    }
    let tensor_count = cur.u64().map_err(header)?;
    let metadata_count = cur.u64().map_err(header)?;
    if metadata_count > cur.remaining_bytes() / MIN_METADATA_ENTRY_BYTES {
        return Err(format!(
            "the header claims {metadata_count} metadata entries, more than the {} bytes after it \
             can hold",
            cur.remaining_bytes()
        ));
    }

    let mut metadata = Metadata::new();
    for index in 1..=metadata_count {
        let key = cur.string().map_err(|e| e.describe(&format!("metadata entry {index} of {metadata_count}")))?;
        let value_what = || format!("the value of metadata key {}", shown(&key));
        let type_id = cur.u32().map_err(|e| e.describe(&value_what()))?;
        let value = read_value(&mut cur, type_id, &key, 0).map_err(|e| e.describe(&value_what()))?;
        if metadata.contains_key(&key) {
            return Err(format!("duplicate metadata key {}", shown(&key)));
        }
        metadata.insert(key, value);
    }

    let alignment = match metadata.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT_BYTES,
        Some(value) => match as_u64(value) {
            Some(a) if a.is_power_of_two() => a,
            _ => {
                // Quote a scalar; a string or array could be as long as the file.
                let found = match value {
                    MetaValue::String(_) => "a string".to_string(),
                    MetaValue::Array(_) => "an array".to_string(),
                    scalar => format!("{scalar:?}"),
                };
                return Err(format!("{ALIGNMENT_KEY} is {found}, not a power of two"));
            }
        },
    };

    // The count must be possible before the Vec is sized by it.
    if tensor_count > cur.remaining_bytes() / MIN_TENSOR_INFO_BYTES {
        return Err(format!(
            "the header claims {tensor_count} tensors, more than the {} bytes after the metadata \
             can hold",
            cur.remaining_bytes()
        ));
    }
    let mut tensors = Vec::new();
    reserve(&mut tensors, tensor_count, || "the tensor infos".to_string())?;
    for index in 1..=tensor_count {
        let info =
            read_tensor_info(&mut cur).map_err(|e| e.describe(&format!("tensor info {index} of {tensor_count}")))?;
        tensors.push(info);
    }

    let data_offset = (cur.pos as u64)
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| format!("an alignment of {alignment} bytes puts the data section past any file's end"))?;
    check_tensor_data(&tensors, data_offset, alignment, file_bytes)?;
    Ok(Layout { version, alignment, metadata, tensors, data_offset })
}

/// One tensor info, checked on its own: its type, dims and size are sound.
fn read_tensor_info(cur: &mut Cursor<'_>) -> ReadResult<TensorInfo> {
    let name = cur.string()?;
    let invalid = |name: &str, problem: String| ReadError::Invalid(format!("tensor {} {problem}", shown(name)));
    let dim_count = cur.u32()?;
    if dim_count > MAX_DIMS {
        return Err(invalid(&name, format!("has {dim_count} dimensions (ggml allows at most {MAX_DIMS})")));
    }
    let mut dims = Vec::with_capacity(dim_count as usize);
    for _ in 0..dim_count {
        dims.push(cur.u64()?);
    }
    let ggml_type = GgmlType::from_u32(cur.u32()?);
    let offset = cur.u64()?;
    if let Some(&d) = dims.iter().find(|&&d| usize::try_from(d).is_err()) {
        return Err(invalid(&name, format!("has a dimension of {d}, too large for this machine")));
    }
    let info = TensorInfo { name, dims, ggml_type, offset };
    info.checked_size_bytes().map_err(|problem| invalid(&info.name, problem))?;
    Ok(info)
}

/// Checks that every tensor's data is aligned, inside the file, and disjoint from the others',
/// and that no two tensors share a name.
fn check_tensor_data(
    tensors: &[TensorInfo],
    data_offset: u64,
    alignment: u64,
    file_bytes: u64,
) -> std::result::Result<(), String> {
    for info in tensors {
        if info.offset % alignment != 0 {
            return Err(format!(
                "tensor {} has offset {}, not a multiple of the alignment {alignment}",
                shown(&info.name),
                info.offset
            ));
        }
        let size_bytes = info.size_bytes();
        let end = data_offset
            .checked_add(info.offset)
            .and_then(|start| start.checked_add(size_bytes))
            .filter(|&end| end <= file_bytes);
        if end.is_none() {
            return Err(format!(
                "tensor {}: {size_bytes} bytes at data offset {} end past the end of the file \
                 ({file_bytes} bytes, data section at {data_offset})",
                shown(&info.name),
                info.offset
            ));
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| (t.offset, t.size_bytes()));
    for pair in by_offset.windows(2) {
        // Cannot overflow: both ends were checked to lie inside the file above.
        if pair[0].offset + pair[0].size_bytes() > pair[1].offset {
            return Err(format!("the data of tensors {} and {} overlap", shown(&pair[0].name), shown(&pair[1].name)));
        }
    }
    let mut by_name: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    by_name.sort_unstable();
    match by_name.windows(2).find(|pair| pair[0] == pair[1]) {
        Some(pair) => Err(format!("duplicate tensor name {}", shown(pair[0]))),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// Writing

/// Builds a GGUF v3 file in memory: for tests and tiny random models.
///
/// Metadata is written as given (a repeated key replaces the earlier value), so tests can also
/// build files the reader must reject. Tensor data is padded to `general.alignment` when that is
/// set to a power of two, and to 32 bytes otherwise.
#[derive(Clone, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<WriterTensor>,
}

#[derive(Clone)]
struct WriterTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    data: Vec<u8>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`.
    ///
    /// # Panics
    /// If an array in `value` mixes element types, which GGUF cannot store.
    pub fn metadata(&mut self, key: &str, value: MetaValue) -> &mut Self {
        assert!(arrays_are_uniform(&value), "GgufWriter: the array for key {key} mixes element types");
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, old)) => *old = value,
            None => self.metadata.push((key.to_string(), value)),
        }
        self
    }

    /// Adds a tensor; `dims` in GGUF order (innermost first), `data` in the type's block layout.
    ///
    /// # Panics
    /// If the type's layout is known and `data` is not exactly the tensor's size. Data of an
    /// unknown type is written as given.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ggml_type: GgmlType, data: &[u8]) -> &mut Self {
        if ggml_type.block_layout().is_some() {
            let info = TensorInfo { name: name.to_string(), dims: dims.to_vec(), ggml_type, offset: 0 };
            match info.checked_size_bytes() {
                Ok(size) => assert!(
                    size == data.len() as u64,
                    "GgufWriter: tensor {name} {ggml_type} {dims:?} takes {size} bytes, not {}",
                    data.len()
                ),
                Err(problem) => panic!("GgufWriter: tensor {name} {problem}"),
            }
        }
        self.tensors.push(WriterTensor { name: name.to_string(), dims: dims.to_vec(), ggml_type, data: data.to_vec() });
        self
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = self
            .metadata
            .iter()
            .find(|(k, _)| k == ALIGNMENT_KEY)
            .and_then(|(_, v)| as_u64(v))
            .filter(|a| a.is_power_of_two())
            .and_then(|a| usize::try_from(a).ok())
            .unwrap_or(DEFAULT_ALIGNMENT_BYTES as usize);

        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut data_len = 0usize;
        for t in &self.tensors {
            let offset = data_len.next_multiple_of(alignment);
            offsets.push(offset);
            data_len = offset + t.data.len();
        }

        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&WRITTEN_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut out, key);
            out.extend_from_slice(&value_type_id(value).to_le_bytes());
            put_value(&mut out, value);
        }
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            put_string(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
        }
        let data_start = out.len().next_multiple_of(alignment);
        out.resize(data_start, 0);
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            out.resize(data_start + offset, 0);
            out.extend_from_slice(&t.data);
        }
        out
    }
}

/// The GGUF metadata value type of `value`.
fn value_type_id(value: &MetaValue) -> u32 {
    match value {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn arrays_are_uniform(value: &MetaValue) -> bool {
    match value {
        MetaValue::Array(items) => {
            let first_type = items.first().map(value_type_id);
            items.iter().all(|v| Some(value_type_id(v)) == first_type && arrays_are_uniform(v))
        }
        _ => true,
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Writes the payload of `value` (its type id is written by the caller, or by the array).
fn put_value(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(u8::from(*v)),
        MetaValue::String(s) => put_string(out, s),
        MetaValue::Array(items) => {
            // An empty array still needs an element type; any reads back as an empty array.
            let elem_type = items.first().map_or(0, value_type_id);
            out.extend_from_slice(&elem_type.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize;

    use crate::sampling::SamplerRng as Rng;

    /// `len` reproducible random bytes.
    fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
        (0..len).map(|_| rng.next_u64() as u8).collect()
    }

    fn parse(bytes: Vec<u8>) -> Result<GgufFile> {
        GgufFile::from_bytes("test.gguf", bytes)
    }

    /// The one-line detail of a parse that must fail.
    fn parse_err(bytes: Vec<u8>) -> String {
        match parse(bytes) {
            Ok(file) => panic!("expected an error, parsed {file:?}"),
            Err(WeftError::Model { file, detail }) => {
                assert_eq!(file, "test.gguf");
                assert!(!detail.contains('\n'), "multi-line message: {detail}");
                detail
            }
            Err(other) => panic!("expected a Model error, got {other:?}"),
        }
    }

    fn header(version: u32, tensor_count: u64, metadata_count: u64) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&tensor_count.to_le_bytes());
        out.extend_from_slice(&metadata_count.to_le_bytes());
        out
    }

    fn put_entry(out: &mut Vec<u8>, key: &str, value: &MetaValue) {
        put_string(out, key);
        out.extend_from_slice(&value_type_id(value).to_le_bytes());
        put_value(out, value);
    }

    fn put_tensor_info(out: &mut Vec<u8>, name: &str, dims: &[u64], type_id: u32, offset: u64) {
        put_string(out, name);
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&type_id.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
    }

    /// A hand-made v3 file, for layouts the writer will not produce: the given metadata and tensor
    /// infos, padding to 32 bytes, then `data_bytes` zero bytes of data.
    fn raw_file(metadata: &[(&str, MetaValue)], infos: &[(&str, &[u64], u32, u64)], data_bytes: usize) -> Vec<u8> {
        let mut out = header(3, infos.len() as u64, metadata.len() as u64);
        for (key, value) in metadata {
            put_entry(&mut out, key, value);
        }
        for &(name, dims, type_id, offset) in infos {
            put_tensor_info(&mut out, name, dims, type_id, offset);
        }
        out.resize(out.len().next_multiple_of(32) + data_bytes, 0);
        out
    }

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// A small valid file whose last tensor ends exactly at the end of the file.
    fn small_file() -> Vec<u8> {
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 7.0).collect();
        GgufWriter::new()
            .metadata("general.architecture", MetaValue::String("llama".into()))
            .metadata("llama.block_count", MetaValue::U32(2))
            .metadata("llama.rope.freq_base", MetaValue::F32(10000.0))
            .metadata("tokenizer.ggml.tokens", MetaValue::Array(vec![MetaValue::String("a".into()); 3]))
            .metadata("nested", MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::I16(-2)])]))
            .tensor("a", &[4, 2], GgmlType::F32, &f32_bytes(&values[..8]))
            .tensor("b", &[32], GgmlType::Q8_0, &quantize(DType::Q8_0, &values[..32]).unwrap())
            .tensor("c", &[32, 2], GgmlType::Q4_1, &quantize(DType::Q4_1, &values).unwrap())
            .to_bytes()
    }

    /// Whatever parsed must keep the reader's promise: every tensor's bytes are its whole data.
    fn check_parsed(bytes: Vec<u8>) {
        if let Ok(file) = parse(bytes) {
            for info in &file.tensors {
                assert_eq!(file.tensor_bytes(info).len() as u64, info.size_bytes(), "{}", info.name);
            }
        }
    }

    #[test]
    fn a_file_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<GgufFile>();
    }

    #[test]
    fn ggml_types_have_ids_names_and_block_layouts() {
        for id in 0..64 {
            assert_eq!(GgmlType::from_u32(id).id(), id);
        }
        assert_eq!(GgmlType::from_u32(0), GgmlType::F32);
        assert_eq!(GgmlType::from_u32(8), GgmlType::Q8_0);
        assert_eq!(GgmlType::from_u32(14), GgmlType::Q6_K);
        assert_eq!(GgmlType::from_u32(30), GgmlType::BF16);
        assert_eq!(GgmlType::from_u32(4), GgmlType::Unknown(4), "Q4_2 was retired");
        assert_eq!(GgmlType::Q6_K.name(), "Q6_K");
        assert_eq!(GgmlType::IQ2_XXS.name(), "IQ2_XXS");
        assert_eq!(GgmlType::Unknown(99).name(), "unknown ggml type 99");
        assert_eq!(GgmlType::Q6_K.block_elems(), Some(256));
        assert_eq!(GgmlType::Q6_K.block_bytes(), Some(210));
        assert_eq!(GgmlType::Q4_K.block_bytes(), Some(144));
        assert_eq!(GgmlType::Q8_0.block_bytes(), Some(34));
        assert_eq!(GgmlType::Unknown(99).block_bytes(), None);
        // The types weft computes with agree with quant.rs.
        for dtype in DType::WEIGHTS {
            let ggml = GgmlType::from_u32(match dtype {
                DType::F32 => 0,
                DType::F16 => 1,
                DType::Q4_0 => 2,
                DType::Q4_1 => 3,
                DType::Q8_0 => 8,
                DType::U32 => unreachable!("not a weight"),
            });
            assert_eq!(ggml.name(), dtype.name());
            assert_eq!(ggml.block_elems(), Some(dtype.block_elems() as u64));
            assert_eq!(ggml.block_bytes(), Some(dtype.block_bytes() as u64));
        }
    }

    #[test]
    fn tensor_info_shape_size_and_dtype() {
        let info = TensorInfo { name: "w".into(), dims: vec![576, 1536], ggml_type: GgmlType::Q4_1, offset: 0 };
        assert_eq!(info.shape(), vec![1536, 576]);
        assert_eq!(info.num_elems(), 576 * 1536);
        assert_eq!(info.size_bytes(), 576 / 32 * 20 * 1536);
        assert_eq!(info.dtype().unwrap(), TensorDType::Native(DType::Q4_1));
        let bf16 = TensorInfo { ggml_type: GgmlType::BF16, ..info.clone() };
        assert_eq!(bf16.dtype().unwrap(), TensorDType::Bf16);
        assert_eq!(bf16.size_bytes(), 576 * 1536 * 2);
        let q6k = TensorInfo { name: "blk.0.ffn_down.weight".into(), ggml_type: GgmlType::Q6_K, ..info.clone() };
        match q6k.dtype() {
            Err(WeftError::Model { detail, .. }) => assert_eq!(
                detail,
                "tensor blk.0.ffn_down.weight is Q6_K; weft supports F32, F16, BF16, Q8_0, Q4_0, Q4_1"
            ),
            other => panic!("{other:?}"),
        }
        let scalar = TensorInfo { dims: vec![], ggml_type: GgmlType::F32, ..info.clone() };
        assert_eq!((scalar.num_elems(), scalar.size_bytes(), scalar.shape()), (1, 4, vec![]));
        let overflowing = TensorInfo { dims: vec![u64::MAX, 2], ..info.clone() };
        assert_eq!((overflowing.num_elems(), overflowing.size_bytes()), (u64::MAX, 0));
        let unknown = TensorInfo { ggml_type: GgmlType::Unknown(77), ..info };
        assert_eq!(unknown.size_bytes(), 0);
    }

    #[test]
    fn every_metadata_type_round_trips() {
        let values = [
            ("u8", MetaValue::U8(200)),
            ("i8", MetaValue::I8(-100)),
            ("u16", MetaValue::U16(60000)),
            ("i16", MetaValue::I16(-30000)),
            ("u32", MetaValue::U32(4_000_000_000)),
            ("i32", MetaValue::I32(-2_000_000_000)),
            ("u64", MetaValue::U64(u64::MAX)),
            ("i64", MetaValue::I64(i64::MIN)),
            ("f32", MetaValue::F32(-1.5e-5)),
            ("f64", MetaValue::F64(std::f64::consts::PI)),
            ("true", MetaValue::Bool(true)),
            ("false", MetaValue::Bool(false)),
            ("string", MetaValue::String("héllo, wörld ✓".into())),
            ("empty string", MetaValue::String(String::new())),
            ("empty array", MetaValue::Array(vec![])),
            ("strings", MetaValue::Array(vec![MetaValue::String("x".into()), MetaValue::String("".into())])),
            ("f32s", MetaValue::Array(vec![MetaValue::F32(0.5), MetaValue::F32(-2.0)])),
            ("i32s", MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(-3)])),
            ("u64s", MetaValue::Array(vec![MetaValue::U64(7)])),
            ("bools", MetaValue::Array(vec![MetaValue::Bool(true), MetaValue::Bool(false)])),
            (
                "nested",
                MetaValue::Array(vec![
                    MetaValue::Array(vec![MetaValue::U8(1), MetaValue::U8(2)]),
                    MetaValue::Array(vec![MetaValue::String("in".into())]),
                    MetaValue::Array(vec![]),
                ]),
            ),
        ];
        let mut writer = GgufWriter::new();
        for (key, value) in &values {
            writer.metadata(key, value.clone());
        }
        writer.metadata("general.architecture", MetaValue::String("llama".into()));
        let file = parse(writer.to_bytes()).unwrap();
        assert_eq!(file.version, 3);
        assert_eq!(file.alignment, 32);
        assert!(file.tensors.is_empty());
        assert_eq!(file.metadata.len(), values.len() + 1);
        for (key, value) in &values {
            assert_eq!(file.get(key), Some(value), "{key}");
        }

        assert_eq!(file.architecture(), Some("llama"));
        assert_eq!(file.get_str("string"), Some("héllo, wörld ✓"));
        assert_eq!(file.get_str("u8"), None);
        assert_eq!(file.get_u64("u8"), Some(200));
        assert_eq!(file.get_u64("u64"), Some(u64::MAX));
        assert_eq!(file.get_u64("i8"), None, "negative");
        assert_eq!(file.get_u64("f32"), None);
        assert_eq!(file.get_u64("missing"), None);
        assert_eq!(file.get_f64("f64"), Some(std::f64::consts::PI));
        assert_eq!(file.get_f64("f32"), Some(-1.5e-5f32 as f64));
        assert_eq!(file.get_f64("i32"), Some(-2e9));
        assert_eq!(file.get_f64("string"), None);
        assert_eq!(file.get_bool("true"), Some(true));
        assert_eq!(file.get_bool("u8"), None);
        assert_eq!(file.get_str_array("strings"), Some(vec!["x", ""]));
        assert_eq!(file.get_str_array("f32s"), None);
        assert_eq!(file.get_str_array("empty array"), Some(vec![]));
        assert_eq!(file.get_f32_array("f32s"), Some(vec![0.5, -2.0]));
        assert_eq!(file.get_f32_array("i32s"), Some(vec![1.0, -3.0]));
        assert_eq!(file.get_f32_array("strings"), None);
        assert_eq!(file.get_i64_array("i32s"), Some(vec![1, -3]));
        assert_eq!(file.get_i64_array("u64s"), Some(vec![7]));
        assert_eq!(file.get_i64_array("f32s"), None);
        assert_eq!(file.get_i64_array("u8"), None, "not an array");
    }

    #[test]
    fn writer_replaces_a_repeated_key() {
        let bytes =
            GgufWriter::new().metadata("k", MetaValue::U8(1)).metadata("k", MetaValue::String("two".into())).to_bytes();
        let file = parse(bytes).unwrap();
        assert_eq!(file.metadata.len(), 1);
        assert_eq!(file.get_str("k"), Some("two"));
    }

    #[test]
    #[should_panic(expected = "mixes element types")]
    fn writer_refuses_mixed_arrays() {
        GgufWriter::new().metadata("k", MetaValue::Array(vec![MetaValue::U8(1), MetaValue::I8(1)]));
    }

    #[test]
    #[should_panic(expected = "takes 34 bytes, not 33")]
    fn writer_refuses_data_of_the_wrong_size() {
        GgufWriter::new().tensor("t", &[32], GgmlType::Q8_0, &[0; 33]);
    }

    #[test]
    fn tensors_of_several_types_round_trip() {
        let values: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0).collect();
        let f16: Vec<u8> = values[..96].iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
        let bf16: Vec<u8> = values[..10].iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
        let q6k: Vec<u8> = (0..420).map(|i| (i * 7) as u8).collect();
        let tensors: Vec<(&str, Vec<u64>, GgmlType, Vec<u8>)> = vec![
            ("f32", vec![3], GgmlType::F32, f32_bytes(&values[..3])),
            ("f16", vec![32, 3], GgmlType::F16, f16),
            ("q8_0", vec![64, 2], GgmlType::Q8_0, quantize(DType::Q8_0, &values[..128]).unwrap()),
            ("q4_0", vec![32, 2, 2], GgmlType::Q4_0, quantize(DType::Q4_0, &values[..128]).unwrap()),
            ("q4_1", vec![256], GgmlType::Q4_1, quantize(DType::Q4_1, &values).unwrap()),
            ("bf16", vec![5, 2], GgmlType::BF16, bf16),
            ("blk.0.ffn_down.weight", vec![256, 2], GgmlType::Q6_K, q6k),
        ];
        for alignment in [None, Some(1u32), Some(8), Some(64), Some(4096)] {
            let mut writer = GgufWriter::new();
            if let Some(a) = alignment {
                writer.metadata("general.alignment", MetaValue::U32(a));
            }
            for (name, dims, ggml_type, data) in &tensors {
                writer.tensor(name, dims, *ggml_type, data);
            }
            let file = parse(writer.to_bytes()).unwrap();
            let alignment = alignment.map_or(32, u64::from);
            assert_eq!(file.alignment, alignment);
            assert_eq!(file.data_offset % alignment, 0);
            assert_eq!(file.tensors.len(), tensors.len());
            for (info, (name, dims, ggml_type, data)) in file.tensors.iter().zip(&tensors) {
                assert_eq!((&info.name, &info.dims, info.ggml_type), (&name.to_string(), dims, *ggml_type));
                assert_eq!(info.offset % alignment, 0);
                assert_eq!(file.tensor(name), Some(info));
                assert_eq!(file.tensor_bytes(info), data.as_slice(), "{name}");
            }
            assert_eq!(file.tensor("q4_0").unwrap().shape(), vec![2, 2, 32]);
            assert_eq!(file.tensor("bf16").unwrap().dtype().unwrap(), TensorDType::Bf16);
            assert_eq!(file.tensor("missing"), None);
            match file.check_tensor_types() {
                Err(WeftError::Model { file, detail }) => {
                    assert_eq!(file, "test.gguf");
                    assert_eq!(
                        detail,
                        "tensor blk.0.ffn_down.weight is Q6_K; weft supports F32, F16, BF16, Q8_0, Q4_0, Q4_1"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn supported_types_pass_the_type_check() {
        let bytes = GgufWriter::new()
            .tensor("a", &[2], GgmlType::F32, &[0; 8])
            .tensor("b", &[2], GgmlType::BF16, &[0; 4])
            .to_bytes();
        parse(bytes).unwrap().check_tensor_types().unwrap();
    }

    #[test]
    fn version_2_files_are_read() {
        let mut bytes = small_file();
        bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
        let file = parse(bytes).unwrap();
        assert_eq!(file.version, 2);
        assert_eq!(file.tensors.len(), 3);
    }

    #[test]
    fn bad_magic_and_short_files_are_rejected() {
        assert_eq!(parse_err(vec![]), "not a GGUF file (0 bytes, too short for the magic)");
        assert_eq!(parse_err(b"GGU".to_vec()), "not a GGUF file (3 bytes, too short for the magic)");
        assert_eq!(parse_err(b"\x7fELF and more".to_vec()), "not a GGUF file (bad magic 0x7f454c46)");
        let detail = parse_err(b"GGUF\x03\x00".to_vec());
        assert_eq!(detail, "truncated: the 24-byte header ends past the end of the file");
        let detail = parse_err(header(3, 0, 0)[..20].to_vec());
        assert!(detail.starts_with("truncated: the 24-byte header"), "{detail}");
    }

    #[test]
    fn unsupported_versions_are_rejected() {
        assert_eq!(parse_err(header(1, 0, 0)), "GGUF version 1 is not supported (2 and 3 are)");
        assert_eq!(parse_err(header(4, 0, 0)), "GGUF version 4 is not supported (2 and 3 are)");
        assert_eq!(parse_err(header(3u32.swap_bytes(), 0, 0)), "big-endian GGUF files are not supported");
    }

    #[test]
    fn empty_file_with_only_a_header_is_valid() {
        let file = parse(header(3, 0, 0)).unwrap();
        assert!(file.metadata.is_empty() && file.tensors.is_empty());
        file.check_tensor_types().unwrap();
    }

    #[test]
    fn absurd_counts_and_lengths_are_rejected_before_allocating() {
        let detail = parse_err(header(3, 0, u64::MAX));
        assert!(detail.contains("claims 18446744073709551615 metadata entries"), "{detail}");
        let detail = parse_err(header(3, u64::MAX, 0));
        assert!(detail.contains("claims 18446744073709551615 tensors"), "{detail}");
        // A metadata count that passes the header check but not the entries that follow.
        let mut bytes = header(3, 0, 2);
        put_entry(&mut bytes, "a", &MetaValue::U64(1));
        bytes.resize(bytes.len() + 13, 0xFF);
        assert!(parse_err(bytes).starts_with("truncated: metadata entry 2 of 2"));

        // A key of u64::MAX bytes.
        let mut bytes = header(3, 0, 1);
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&[0; 16]);
        assert_eq!(parse_err(bytes), "truncated: metadata entry 1 of 1 ends past the end of the file");

        // A string value of u64::MAX bytes.
        let mut bytes = header(3, 0, 1);
        put_string(&mut bytes, "s");
        bytes.extend_from_slice(&8u32.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(parse_err(bytes), "truncated: the value of metadata key s ends past the end of the file");

        // Arrays whose counts cannot fit in what is left.
        for (elem_type, count) in [(0u32, 17u64), (0, u64::MAX), (10, 3), (8, 3), (9, 2)] {
            let mut bytes = header(3, 0, 1);
            put_string(&mut bytes, "arr");
            bytes.extend_from_slice(&9u32.to_le_bytes());
            bytes.extend_from_slice(&elem_type.to_le_bytes());
            bytes.extend_from_slice(&count.to_le_bytes());
            bytes.extend_from_slice(&[0; 16]);
            let detail = parse_err(bytes);
            assert!(
                detail.starts_with(&format!("array of {count} elements of type {elem_type} for key arr cannot fit")),
                "{detail}"
            );
        }

        // A tensor name of u64::MAX bytes.
        let mut bytes = header(3, 2, 0);
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&[0; 48]);
        assert_eq!(parse_err(bytes), "truncated: tensor info 1 of 2 ends past the end of the file");
    }

    #[test]
    fn unknown_metadata_types_are_rejected() {
        let mut bytes = header(3, 0, 1);
        put_string(&mut bytes, "foo");
        bytes.extend_from_slice(&13u32.to_le_bytes());
        bytes.extend_from_slice(&[0; 8]);
        assert_eq!(parse_err(bytes), "unknown metadata value type 13 for key foo");

        let mut bytes = header(3, 0, 1);
        put_string(&mut bytes, "foo");
        bytes.extend_from_slice(&9u32.to_le_bytes());
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&[0; 8]);
        assert_eq!(parse_err(bytes), "unknown metadata value type 4294967295 in the array for key foo");
    }

    #[test]
    fn array_nesting_is_capped() {
        fn nested(depth: usize) -> MetaValue {
            (0..depth).fold(MetaValue::U8(7), |inner, _| MetaValue::Array(vec![inner]))
        }
        let at_cap = GgufWriter::new().metadata("deep", nested(MAX_ARRAY_DEPTH)).to_bytes();
        assert_eq!(parse(at_cap).unwrap().get("deep"), Some(&nested(MAX_ARRAY_DEPTH)));
        let past_cap = GgufWriter::new().metadata("deep", nested(MAX_ARRAY_DEPTH + 1)).to_bytes();
        assert_eq!(parse_err(past_cap), "arrays nested more than 8 deep for key deep");

        // Deep enough to overflow the stack if the reader recursed without a cap.
        let depth = 1_000_000;
        let mut bytes = header(3, 0, 1);
        put_string(&mut bytes, "deep");
        bytes.extend_from_slice(&9u32.to_le_bytes());
        for _ in 0..depth {
            bytes.extend_from_slice(&9u32.to_le_bytes());
            bytes.extend_from_slice(&1u64.to_le_bytes());
        }
        assert_eq!(parse_err(bytes), "arrays nested more than 8 deep for key deep");
    }

    #[test]
    fn bad_alignments_are_rejected() {
        for value in [MetaValue::U32(0), MetaValue::U32(3), MetaValue::U32(48), MetaValue::I32(-32)] {
            let bytes = GgufWriter::new().metadata("general.alignment", value.clone()).to_bytes();
            assert_eq!(parse_err(bytes), format!("general.alignment is {value:?}, not a power of two"));
        }
        let bytes = GgufWriter::new().metadata("general.alignment", MetaValue::String("32".into())).to_bytes();
        assert_eq!(parse_err(bytes), "general.alignment is a string, not a power of two");
        // A power of two too large for any data section.
        let bytes = raw_file(&[("general.alignment", MetaValue::U64(1 << 63))], &[], 0);
        let file = parse(bytes).unwrap();
        assert_eq!(file.alignment, 1 << 63);
        let bytes = raw_file(&[("general.alignment", MetaValue::U64(1 << 63))], &[("t", &[1], 0, 0)], 4);
        assert!(parse_err(bytes).contains("end past the end of the file"));
    }

    #[test]
    fn duplicates_are_rejected() {
        let bytes = raw_file(&[("k", MetaValue::U8(1)), ("k", MetaValue::U8(2))], &[], 0);
        assert_eq!(parse_err(bytes), "duplicate metadata key k");
        let bytes = raw_file(&[], &[("t", &[1], 0, 0), ("t", &[1], 0, 32)], 64);
        assert_eq!(parse_err(bytes), "duplicate tensor name t");
    }

    #[test]
    fn invalid_utf8_is_rejected() {
        let mut bytes = header(3, 0, 1);
        bytes.extend_from_slice(&2u64.to_le_bytes());
        bytes.extend_from_slice(&[0xC3, 0x28]);
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.push(0);
        let detail = parse_err(bytes);
        assert!(detail.starts_with("the string at byte 24 is not valid UTF-8"), "{detail}");
        let mut bytes = header(3, 0, 1);
        put_string(&mut bytes, "k");
        bytes.extend_from_slice(&8u32.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.push(0xFF);
        let detail = parse_err(bytes);
        assert!(detail.starts_with("the string at byte 37 is not valid UTF-8"), "{detail}");
        assert!(detail.ends_with(", in the value of key k"), "{detail}");
    }

    #[test]
    fn bad_tensor_infos_are_rejected() {
        let cases: [(&[u64], u32, u64, usize, &str); 8] = [
            (
                &[4],
                0,
                0,
                15,
                "tensor t: 16 bytes at data offset 0 end past the end of the file (79 bytes, data section at 64)",
            ),
            (&[4], 0, 1 << 40, 16, "end past the end of the file"),
            (&[4], 0, u64::MAX - 31, 16, "end past the end of the file"),
            (&[4], 0, 8, 64, "tensor t has offset 8, not a multiple of the alignment 32"),
            (
                &[1 << 32, 1 << 32, 1 << 32],
                0,
                0,
                16,
                "tensor t has dims [4294967296, 4294967296, 4294967296], whose product overflows",
            ),
            (&[1, 1, 1, 1, 1], 0, 0, 16, "tensor t has 5 dimensions (ggml allows at most 4)"),
            (&[16], 2, 0, 64, "tensor t has rows of 16 elements, not a whole number of Q4_0 blocks of 32"),
            (&[4], 99, 0, 64, "tensor t has unknown ggml type 99"),
        ];
        for (dims, type_id, offset, data_bytes, expected) in cases {
            let detail = parse_err(raw_file(&[], &[("t", dims, type_id, offset)], data_bytes));
            assert!(detail.contains(expected), "{detail} does not contain {expected}");
        }
        // The product of the dims fits, the byte size does not.
        let detail = parse_err(raw_file(&[], &[("t", &[1 << 62, 2], 0, 0)], 16));
        assert!(detail.contains("whose product overflows"), "{detail}");
        // Rows of zero elements make the product 0, but the row count still overflows.
        let detail = parse_err(raw_file(&[], &[("t", &[0, 1 << 40, 1 << 40], 0, 0)], 16));
        assert!(detail.contains("whose product overflows"), "{detail}");
        // Empty tensors are fine.
        let file = parse(raw_file(&[], &[("t", &[0, 1 << 40], 0, 0)], 0)).unwrap();
        assert_eq!(file.tensor_bytes(&file.tensors[0]), &[] as &[u8]);
    }

    #[test]
    fn overlapping_tensors_are_rejected() {
        let detail = parse_err(raw_file(&[], &[("a", &[16], 0, 0), ("b", &[8], 0, 32)], 96));
        assert_eq!(detail, "the data of tensors a and b overlap");
        let detail = parse_err(raw_file(&[], &[("b", &[8], 0, 0), ("a", &[8], 0, 0)], 96));
        assert!(detail.ends_with("overlap"), "{detail}");
        // Touching is not overlapping, and the order in the file need not be the order of the data.
        let file = parse(raw_file(&[], &[("b", &[8], 0, 32), ("a", &[8], 0, 0)], 64)).unwrap();
        assert_eq!(file.tensor_bytes(file.tensor("b").unwrap()).len(), 32);
    }

    #[test]
    fn truncated_tensor_infos_name_their_index() {
        let bytes = raw_file(&[], &[("a", &[8], 0, 0), ("b", &[8], 0, 32), ("c", &[8], 0, 64)], 0);
        // Cut inside the third info (the padding is up to 31 bytes, the info 41 bytes).
        let mut cut = header(3, 3, 0);
        put_tensor_info(&mut cut, "a", &[8], 0, 0);
        put_tensor_info(&mut cut, "b", &[8], 0, 32);
        let cut_len = cut.len() + 10;
        assert_eq!(parse_err(bytes[..cut_len].to_vec()), "truncated: tensor info 3 of 3 ends past the end of the file");
    }

    #[test]
    fn long_or_multiline_names_are_quoted_on_one_line() {
        let name = format!("line\nbreak{}", "x".repeat(500));
        let detail = parse_err(raw_file(&[], &[(name.as_str(), &[4], 99, 0)], 16));
        assert!(detail.starts_with("tensor line\\nbreakxxx"), "{detail}");
        assert!(detail.len() < 200, "{detail}");
    }

    #[test]
    fn fuzz_random_bytes_never_panic() {
        let mut rng = Rng::new(0x5EED);
        let valid = small_file();
        for i in 0..3000 {
            let len = rng.below(400);
            let mut bytes = random_bytes(&mut rng, len);
            match i % 4 {
                // Past the magic and version, into the counts and the metadata.
                0 => {
                    let mut prefixed = header(3, rng.below(5) as u64, rng.below(5) as u64);
                    prefixed.append(&mut bytes);
                    bytes = prefixed;
                }
                // A valid beginning followed by garbage.
                1 => {
                    let mut prefixed = valid[..rng.below(valid.len())].to_vec();
                    prefixed.append(&mut bytes);
                    bytes = prefixed;
                }
                // A valid file with a few bytes overwritten.
                2 => {
                    bytes = valid.clone();
                    for _ in 0..1 + rng.below(4) {
                        let at = rng.below(bytes.len());
                        bytes[at] = rng.next_u64() as u8;
                    }
                }
                _ => {}
            }
            check_parsed(bytes);
        }
    }

    #[test]
    fn fuzz_every_truncation_fails() {
        let valid = small_file();
        check_parsed(valid.clone());
        for len in 0..valid.len() {
            assert!(parse(valid[..len].to_vec()).is_err(), "a truncation to {len} bytes parsed");
        }
    }

    #[test]
    fn fuzz_single_byte_corruptions_never_panic() {
        let valid = small_file();
        for at in 0..valid.len() {
            let original = valid[at];
            for corrupt in [original ^ 0xFF, original ^ 0x80, original.wrapping_add(1), 0, 0xFF] {
                let mut bytes = valid.clone();
                bytes[at] = corrupt;
                check_parsed(bytes);
            }
        }
    }

    #[test]
    fn open_maps_the_same_file_from_bytes_reads() {
        let dir = std::env::temp_dir().join(format!("weft-gguf-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("small.gguf");
        std::fs::write(&path, small_file()).unwrap();
        let mapped = GgufFile::open(&path).unwrap();
        let owned = parse(small_file()).unwrap();
        assert_eq!(mapped.name(), path.display().to_string());
        assert_eq!((&mapped.metadata, &mapped.tensors), (&owned.metadata, &owned.tensors));
        for info in &mapped.tensors {
            assert_eq!(mapped.tensor_bytes(info), owned.tensor_bytes(info));
        }

        let empty = dir.join("empty.gguf");
        std::fs::write(&empty, b"").unwrap();
        let err = GgufFile::open(&empty).unwrap_err().to_string();
        assert_eq!(err, format!("{}: not a GGUF file (0 bytes, too short for the magic)", empty.display()));
        let missing = dir.join("missing.gguf");
        let err = GgufFile::open(&missing).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}: cannot open", missing.display())), "{err}");
        assert!(GgufFile::open(&dir).is_err(), "a directory");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_the_real_model_file() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        if !path.exists() {
            eprintln!("skipping reads_the_real_model_file: {} is absent", path.display());
            return;
        }
        let file = GgufFile::open(&path).unwrap();
        assert_eq!(file.version, 3);
        assert_eq!(file.architecture(), Some("llama"));
        assert_eq!(file.tensors.len(), 272);
        assert_eq!(file.get_str("tokenizer.ggml.pre"), Some("smollm"));
        assert_eq!(file.get_str("tokenizer.ggml.model"), Some("gpt2"));
        assert_eq!(file.get_u64("llama.block_count"), Some(30));
        assert_eq!(file.get_u64("llama.embedding_length"), Some(576));
        assert_eq!(file.get_f64("llama.rope.freq_base"), Some(100000.0));
        assert_eq!(file.get_str_array("tokenizer.ggml.tokens").map(|t| t.len()), Some(49152));
        assert_eq!(file.get_i64_array("tokenizer.ggml.token_type").map(|t| t.len()), Some(49152));
        assert_eq!(file.get_bool("tokenizer.ggml.add_bos_token"), Some(false));
        file.check_tensor_types().unwrap();

        let embd = file.tensor("token_embd.weight").unwrap();
        assert_eq!(embd.ggml_type, GgmlType::Q8_0);
        assert_eq!(embd.shape(), vec![49152, 576]);
        assert_eq!(embd.dtype().unwrap(), TensorDType::Native(DType::Q8_0));
        assert_eq!(file.tensor_bytes(embd).len() as u64, 49152 * 576 / 32 * 34);
        let down = file.tensor("blk.0.ffn_down.weight").unwrap();
        assert_eq!((down.ggml_type, down.shape()), (GgmlType::Q4_1, vec![576, 1536]));

        let file_bytes = std::fs::metadata(&path).unwrap().len();
        let last = file.tensors.iter().max_by_key(|t| t.offset).unwrap();
        let last_end = file.data_offset + last.offset + last.size_bytes();
        assert!(last_end <= file_bytes, "{} ends at {last_end}, past {file_bytes}", last.name);
        assert_eq!(file.tensor_bytes(last).len() as u64, last.size_bytes());
    }
}
