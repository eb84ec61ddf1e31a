//! GGUF reader (versions 2 and 3) and writer.

use std::collections::BTreeMap;

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
