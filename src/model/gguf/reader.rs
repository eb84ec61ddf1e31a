//! Reading a GGUF file: the header, metadata and tensor infos, every count and length checked
//! against the bytes left before anything is allocated, then the tensor data's placement. See
//! the module docs of `model::gguf` for the invariants.

use std::borrow::Cow;
use std::fmt;

use super::metadata::as_u64;
use super::*;
use crate::{Result, WeftError};

/// Random access to a file's bytes, for [`GgufFile::from_reader`]: where there is no file to map
/// and the whole file must not be held in memory (the browser reads a stored or downloaded model
/// in slices through one).
pub trait ReadAt: crate::rt::MaybeSend + crate::rt::MaybeSync {
    /// The file's length in bytes.
    fn len_bytes(&self) -> u64;
    /// Fill `buf` with the file's bytes from `offset` on; the caller keeps the range inside the
    /// file. The error says why the read failed, for the message that names the file.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::result::Result<(), String>;
}

/// The file's bytes: mapped from disk natively, owned (tests, tools), or read in slices on demand.
enum FileBytes {
    Mapped(crate::rt::MappedFile),
    Owned(Vec<u8>),
    Read(Box<dyn ReadAt>),
}

impl FileBytes {
    /// The whole file, where it is in memory (mapped or owned): tensors are then borrowed.
    fn in_memory(&self) -> Option<&[u8]> {
        match self {
            FileBytes::Mapped(map) => Some(map),
            FileBytes::Owned(bytes) => Some(bytes),
            FileBytes::Read(_) => None,
        }
    }

    fn len_bytes(&self) -> u64 {
        match self {
            FileBytes::Read(reader) => reader.len_bytes(),
            memory => memory.in_memory().map_or(0, |b| b.len() as u64),
        }
    }

    /// `buf.len()` bytes from `offset`, which the caller has checked lie inside the file.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::result::Result<(), String> {
        match self {
            FileBytes::Read(reader) => reader.read_at(offset, buf),
            memory => {
                let bytes = memory.in_memory().unwrap_or(&[]);
                // Inside the file, so inside a slice: fits in usize.
                let start = offset as usize;
                buf.copy_from_slice(&bytes[start..start + buf.len()]);
                Ok(())
            }
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
    pub(crate) data_offset: u64,
    name: String,
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`; tensor data is read from the mapping on demand.
    pub fn open(path: &std::path::Path) -> Result<GgufFile> {
        let name = path.display().to_string();
        let map = crate::rt::map_file(path).map_err(|e| WeftError::model(&name, format!("cannot open: {e}")))?;
        Self::parse(name, FileBytes::Mapped(map))
    }

    /// Parses a GGUF file held in memory; `name` is for errors.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<GgufFile> {
        Self::parse(name.to_string(), FileBytes::Owned(bytes))
    }

    /// Parses a GGUF file read through `reader`: the header, metadata and tensor infos now (in
    /// windows of [`WINDOW_BYTES`]), each tensor's data when [`tensor_bytes`](Self::tensor_bytes)
    /// asks for it. So the file is never whole in memory (the browser's way: its WebAssembly
    /// memory holds one tensor at a time while a model loads). `name` is for errors.
    pub fn from_reader(name: &str, reader: Box<dyn ReadAt>) -> Result<GgufFile> {
        Self::parse(name.to_string(), FileBytes::Read(reader))
    }

    fn parse(name: String, bytes: FileBytes) -> Result<GgufFile> {
        let layout = parse_layout(&bytes).map_err(|detail| WeftError::model(&name, detail))?;
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

    /// The file's name as given to [`GgufFile::open`], [`GgufFile::from_bytes`] or
    /// [`GgufFile::from_reader`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the data section starts, from the start of the file: tensor `t`'s data lies at
    /// `data_offset() + t.offset`.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Take the mapped file's pages out of resident memory (see
    /// [`MappedFile::release_pages`](crate::rt::MappedFile::release_pages)); bytes held in memory
    /// stay, and a reader's tensors were never kept.
    pub fn release_pages(&self) {
        if let FileBytes::Mapped(map) = &self.bytes {
            map.release_pages();
        }
    }

    /// The data of `info`, one of this file's `tensors`: borrowed from a file in memory, read
    /// into a buffer of its own through a reader. An info whose data lies outside this file, or
    /// a read that fails, is an error naming the tensor.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<Cow<'_, [u8]>> {
        let outside = || WeftError::model(&self.name, format!("tensor {} lies outside the file", shown(&info.name)));
        let start = self.data_offset.checked_add(info.offset).ok_or_else(outside)?;
        let end =
            start.checked_add(info.size_bytes()).filter(|&end| end <= self.bytes.len_bytes()).ok_or_else(outside)?;
        if let Some(bytes) = self.bytes.in_memory() {
            // Inside the file, so inside a slice.
            return Ok(Cow::Borrowed(&bytes[start as usize..end as usize]));
        }
        let len_bytes = end - start;
        let mut data = Vec::new();
        reserve(&mut data, len_bytes, || format!("tensor {}", shown(&info.name)))
            .map_err(|detail| WeftError::model(&self.name, detail))?;
        data.resize(len_bytes as usize, 0);
        self.bytes.read_at(start, &mut data).map_err(|e| {
            WeftError::model(
                &self.name,
                format!("cannot read tensor {} (bytes {start}..{end}): {e}", shown(&info.name)),
            )
        })?;
        Ok(Cow::Owned(data))
    }

    /// The data of `info`, one of this file's `tensors`, as a source read a slice at a time
    /// when uploaded (never whole in memory through a reader; a mapped file's pages dropped as
    /// each slice is uploaded). An info whose data lies outside this file is an error naming the
    /// tensor; so is a read that fails later.
    pub fn tensor_source<'a>(&'a self, info: &'a TensorInfo) -> Result<TensorSource<'a>> {
        let outside = || WeftError::model(&self.name, format!("tensor {} lies outside the file", shown(&info.name)));
        let start = self.data_offset.checked_add(info.offset).ok_or_else(outside)?;
        let end =
            start.checked_add(info.size_bytes()).filter(|&end| end <= self.bytes.len_bytes()).ok_or_else(outside)?;
        Ok(TensorSource { file: self, name: &info.name, start, len_bytes: end - start })
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
            .field("file_bytes", &self.bytes.len_bytes())
            .finish()
    }
}

/// One tensor's data in its file, read a slice at a time ([`GgufFile::tensor_source`]).
pub struct TensorSource<'a> {
    file: &'a GgufFile,
    name: &'a str,
    /// Where the data starts, from the start of the file (inside it, with `len_bytes`).
    start: u64,
    len_bytes: u64,
}

impl crate::tensor::ByteSource for TensorSource<'_> {
    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    fn in_memory(&self) -> Option<&[u8]> {
        // Inside the file, so inside a slice.
        let whole = self.file.bytes.in_memory()?;
        Some(&whole[self.start as usize..(self.start + self.len_bytes) as usize])
    }

    fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let from = self.start + offset;
        let to = from + out.len() as u64;
        if offset + out.len() as u64 > self.len_bytes {
            return Err(WeftError::model(
                &self.file.name,
                format!("bytes {from}..{to} lie past the end of tensor {}", shown(self.name)),
            ));
        }
        self.file.bytes.read_at(from, out).map_err(|e| {
            WeftError::model(
                &self.file.name,
                format!(
                    "cannot read tensor {} (bytes {from}..{to} of its {}..{}): {e}",
                    shown(self.name),
                    self.start,
                    self.start + self.len_bytes
                ),
            )
        })
    }

    fn release(&self, range: std::ops::Range<u64>) {
        if let FileBytes::Mapped(map) = &self.file.bytes {
            // Inside the file, so inside the mapping.
            map.release_range((self.start + range.start) as usize, (range.end - range.start) as usize);
        }
    }
}

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

/// Bytes a reader's cursor reads at once: the header, metadata and tensor infos (a
/// vocabulary's strings, often megabytes) go through a window of this size, not the whole file.
pub const WINDOW_BYTES: usize = 1 << 20;

/// A read position in the file; every read checks the bytes left first. A file in memory is read
/// in place; a reader's through a window of [`WINDOW_BYTES`].
struct Cursor<'a> {
    file: &'a FileBytes,
    len_bytes: u64,
    pos: u64,
    /// A reader's bytes from `window_start` on.
    window: Vec<u8>,
    window_start: u64,
}

impl<'a> Cursor<'a> {
    fn new(file: &'a FileBytes, pos: u64) -> Cursor<'a> {
        Cursor { file, len_bytes: file.len_bytes(), pos, window: Vec::new(), window_start: 0 }
    }

    fn remaining_bytes(&self) -> u64 {
        self.len_bytes - self.pos
    }

    /// Fill `out` from the position on, and move past it.
    fn read(&mut self, out: &mut [u8]) -> ReadResult<()> {
        if out.len() as u64 > self.remaining_bytes() {
            return Err(ReadError::Truncated);
        }
        if let Some(bytes) = self.file.in_memory() {
            // Fits in usize: it is inside a slice.
            let start = self.pos as usize;
            out.copy_from_slice(&bytes[start..start + out.len()]);
            self.pos += out.len() as u64;
            return Ok(());
        }
        let mut done = 0;
        while done < out.len() {
            let window_end = self.window_start + self.window.len() as u64;
            if self.pos < self.window_start || self.pos >= window_end {
                // Fits in usize: at most WINDOW_BYTES.
                let len = self.remaining_bytes().min(WINDOW_BYTES as u64) as usize;
                self.window.resize(len, 0);
                self.window_start = self.pos;
                self.file
                    .read_at(self.pos, &mut self.window)
                    .map_err(|e| ReadError::Invalid(format!("cannot read {len} bytes at byte {}: {e}", self.pos)))?;
            }
            let at = (self.pos - self.window_start) as usize;
            let n = (out.len() - done).min(self.window.len() - at);
            out[done..done + n].copy_from_slice(&self.window[at..at + n]);
            done += n;
            self.pos += n as u64;
        }
        Ok(())
    }

    fn array<const N: usize>(&mut self) -> ReadResult<[u8; N]> {
        let mut out = [0u8; N];
        self.read(&mut out)?;
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
        if len_bytes > self.remaining_bytes() {
            return Err(ReadError::Truncated);
        }
        // Fits in usize: at most the bytes left in the file, which is in memory or was sized
        // by `ReadAt::len_bytes`; and reserved fallibly.
        let mut raw = Vec::new();
        reserve(&mut raw, len_bytes, || format!("the string at byte {start}")).map_err(ReadError::Invalid)?;
        raw.resize(len_bytes as usize, 0);
        self.read(&mut raw)?;
        String::from_utf8(raw).map_err(|e| {
            ReadError::Invalid(format!("the string at byte {start} is not valid UTF-8 ({})", e.utf8_error()))
        })
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

fn parse_layout(file: &FileBytes) -> std::result::Result<Layout, String> {
    let file_bytes = file.len_bytes();
    let mut cur = Cursor::new(file, 0);
    let magic: [u8; 4] = match cur.array() {
        Err(ReadError::Truncated) => {
            return Err(format!("not a GGUF file ({file_bytes} bytes, too short for the magic)"));
        }
        Err(ReadError::Invalid(why)) => return Err(why),
        Ok(magic) => magic,
    };
    if magic != MAGIC {
        let hex: String = magic.iter().map(|b| format!("{b:02x}")).collect();
        return Err(format!("not a GGUF file (bad magic 0x{hex})"));
    }
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

    let data_offset = cur
        .pos
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
