//! Typed access to a GGUF file's metadata: integers of any width, floats, strings and arrays,
//! each `None` when the key is absent or holds another type.

use super::{GgufFile, MetaValue};

impl GgufFile {
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

    /// An array whose elements are all booleans.
    pub fn get_bool_array(&self, key: &str) -> Option<Vec<bool>> {
        self.array(key)?
            .iter()
            .map(|v| match v {
                MetaValue::Bool(b) => Some(*b),
                _ => None,
            })
            .collect()
    }

    /// `general.architecture`, e.g. "llama".
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    fn array(&self, key: &str) -> Option<&[MetaValue]> {
        match self.get(key)? {
            MetaValue::Array(items) => Some(items),
            _ => None,
        }
    }
}

pub(crate) fn as_u64(value: &MetaValue) -> Option<u64> {
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

pub(crate) fn as_i64(value: &MetaValue) -> Option<i64> {
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

pub(crate) fn as_f64(value: &MetaValue) -> Option<f64> {
    match *value {
        MetaValue::F32(v) => Some(v.into()),
        MetaValue::F64(v) => Some(v),
        // Every u64, including those above i64::MAX.
        MetaValue::U64(v) => Some(v as f64),
        _ => as_i64(value).map(|v| v as f64),
    }
}
