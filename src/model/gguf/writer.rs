//! Writing GGUF version 3 files (weft's tiny test models, and tests of the reader).

use super::metadata::as_u64;
use super::*;

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
