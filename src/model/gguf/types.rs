//! The ggml type table (every type's block layout, so sizes can be checked even for types weft
//! does not compute with), metadata values, and tensor infos.

use std::collections::BTreeMap;
use std::fmt;

use super::{QK_K, shown};
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
            pub(crate) fn block_layout(self) -> Option<(u64, u64)> {
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

/// The ggml types of the tensors weft reads from GGUF files, by name: every weight format
/// ([`crate::quant::FORMATS`]), each kept in its own format on the GPU.
pub fn decoded_types() -> Vec<&'static str> {
    crate::quant::FORMATS.iter().map(|f| f.name).collect()
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
    pub fn dtype(&self) -> Result<DType> {
        DType::from_ggml_type(self.ggml_type.id()).ok_or_else(|| {
            WeftError::model(
                "GGUF",
                format!(
                    "tensor {} is {}; weft supports {}",
                    shown(&self.name),
                    self.ggml_type.name(),
                    decoded_types().join(", ")
                ),
            )
        })
    }

    fn checked_num_elems(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |product, &d| product.checked_mul(d))
    }

    /// The size ggml computes (`ggml_nbytes`): whole blocks per row, times the rows.
    pub(crate) fn checked_size_bytes(&self) -> std::result::Result<u64, String> {
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
