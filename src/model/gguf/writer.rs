//! Writing GGUF version 3 files: in memory (weft's tiny test models, tests of the reader) or
//! streamed tensor by tensor (the big random-weight models of `model::synthetic`).

use std::io::Write;

use super::metadata::as_u64;
use super::*;
use crate::{Result, WeftError};

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
        let declared: Vec<TensorDecl> = self
            .tensors
            .iter()
            .map(|t| TensorDecl { name: t.name.clone(), dims: t.dims.clone(), ggml_type: t.ggml_type })
            .collect();
        let sizes: Vec<u64> = self.tensors.iter().map(|t| t.data.len() as u64).collect();
        let (mut out, offsets) = self.header(&declared, &sizes);
        let data_start = out.len();
        for (t, &offset) in self.tensors.iter().zip(&offsets) {
            out.resize(data_start + offset as usize, 0);
            out.extend_from_slice(&t.data);
        }
        out
    }

    /// Starts writing a file too big to hold in memory: the header (this writer's metadata and
    /// the `tensors` declared, without data) goes to `out` now; then [`GgufStream::tensor_data`]
    /// takes each tensor's bytes, in the declared order, in as many pieces as the caller likes.
    /// Tensors added with [`GgufWriter::tensor`] are not written; the stream writes only
    /// `tensors`.
    pub fn stream<W: Write>(&self, tensors: Vec<TensorDecl>, mut out: W) -> Result<GgufStream<W>> {
        let mut sizes = Vec::with_capacity(tensors.len());
        for t in &tensors {
            let info = TensorInfo { name: t.name.clone(), dims: t.dims.clone(), ggml_type: t.ggml_type, offset: 0 };
            sizes.push(info.checked_size_bytes().map_err(|problem| {
                WeftError::Unsupported(format!("GgufWriter: tensor {} {problem}", shown(&t.name)))
            })?);
        }
        let (header, offsets) = self.header(&tensors, &sizes);
        out.write_all(&header).map_err(io_error)?;
        let written = header.len() as u64;
        Ok(GgufStream { out, tensors, sizes, offsets, data_start: written, written, current: 0, current_bytes: 0 })
    }

    /// The bytes before the data section (padded to where it starts), and each tensor's offset
    /// in the data section.
    fn header(&self, tensors: &[TensorDecl], sizes: &[u64]) -> (Vec<u8>, Vec<u64>) {
        let alignment = self.alignment();
        let mut offsets = Vec::with_capacity(tensors.len());
        let mut data_len = 0u64;
        for &size in sizes {
            let offset = data_len.next_multiple_of(alignment);
            offsets.push(offset);
            data_len = offset + size;
        }

        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&WRITTEN_VERSION.to_le_bytes());
        out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut out, key);
            out.extend_from_slice(&value_type_id(value).to_le_bytes());
            put_value(&mut out, value);
        }
        for (t, &offset) in tensors.iter().zip(&offsets) {
            put_string(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        let data_start = (out.len() as u64).next_multiple_of(alignment);
        out.resize(data_start as usize, 0);
        (out, offsets)
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == ALIGNMENT_KEY)
            .and_then(|(_, v)| as_u64(v))
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT_BYTES)
    }
}

/// A tensor's name, shape (GGUF order, innermost first) and type, declared before its data.
#[derive(Clone, Debug)]
pub struct TensorDecl {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
}

/// A GGUF file being written tensor by tensor (see [`GgufWriter::stream`]).
pub struct GgufStream<W: Write> {
    out: W,
    tensors: Vec<TensorDecl>,
    sizes: Vec<u64>,
    offsets: Vec<u64>,
    data_start: u64,
    written: u64,
    /// The tensor whose data comes next, and how many of its bytes came already.
    current: usize,
    current_bytes: u64,
}

impl<W: Write> GgufStream<W> {
    /// Appends `bytes` to the current tensor's data (padding before its first byte); a tensor is
    /// done when all its bytes came, and the next bytes belong to the next declared tensor.
    pub fn tensor_data(&mut self, bytes: &[u8]) -> Result<()> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let (Some(&size), Some(&offset)) = (self.sizes.get(self.current), self.offsets.get(self.current)) else {
                return Err(WeftError::Unsupported(format!(
                    "GgufStream: {} bytes more than the declared tensors hold",
                    rest.len()
                )));
            };
            if self.current_bytes == 0 {
                let pad = self.data_start + offset - self.written;
                self.out.write_all(&vec![0u8; pad as usize]).map_err(io_error)?;
                self.written += pad;
            }
            let take = rest.len().min((size - self.current_bytes) as usize);
            self.out.write_all(&rest[..take]).map_err(io_error)?;
            self.written += take as u64;
            self.current_bytes += take as u64;
            rest = &rest[take..];
            if self.current_bytes == size {
                self.current += 1;
                self.current_bytes = 0;
            }
        }
        Ok(())
    }

    /// The declared tensor whose data comes next (`None` when all are written).
    pub fn next_tensor(&self) -> Option<&TensorDecl> {
        self.tensors.get(self.current)
    }

    /// Bytes written so far, header included.
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Checks that every declared tensor got all its data, flushes, and returns the writer.
    pub fn finish(mut self) -> Result<W> {
        // A zero-sized tensor at the end needs no data but must not look missing.
        while self.sizes.get(self.current) == Some(&0) {
            self.current += 1;
        }
        if let Some(t) = self.tensors.get(self.current) {
            return Err(WeftError::Unsupported(format!(
                "GgufStream: tensor {} got {} of its {} bytes",
                shown(&t.name),
                self.current_bytes,
                self.sizes[self.current]
            )));
        }
        self.out.flush().map_err(io_error)?;
        Ok(self.out)
    }
}

fn io_error(e: std::io::Error) -> WeftError {
    WeftError::Unsupported(format!("GgufStream: writing failed: {e}"))
}

/// The GGUF metadata value type of `value`.
pub(crate) fn value_type_id(value: &MetaValue) -> u32 {
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

pub(crate) fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Writes the payload of `value` (its type id is written by the caller, or by the array).
pub(crate) fn put_value(out: &mut Vec<u8>, value: &MetaValue) {
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
