//! Element types of tensors and the weight formats weft computes with: one file per format
//! (its block layout, CPU codec and GGUF type id), mirroring `shaders/formats/`, all listed in
//! [`FORMATS`], the one table the GGUF reader, the tiny-model writer and the shader pipelines
//! read.
//!
//! Quantized weights stay in their file's block layout on the GPU; the shader decoder of a
//! format (`shaders/formats/<name>.wgsl`) decodes exactly what its CPU codec here decodes. The
//! encoders follow ggml's reference quantizers so that test weights look like real ones.
//!
//! Adding a format: a file here with its [`Format`], a line in [`FORMATS`] and a variant of
//! [`DType`], and its decoder in `shaders/formats/`.

mod f16;
mod f32;
mod q4_0;
mod q4_1;
mod q8_0;

use crate::error::{Result, WeftError};

/// Elements per quantization block of the 32-element block formats (Q8_0, Q4_0, Q4_1).
pub const QK: usize = 32;

/// How the elements of a tensor are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    Q8_0,
    Q4_0,
    Q4_1,
    /// 32-bit unsigned integers: token ids, positions, block tables. Never a weight.
    U32,
}

/// One weight format: layout, GGUF id and CPU codec.
pub struct Format {
    pub dtype: DType,
    /// ggml's name ("Q4_1"); also the shader decoder's file, lowercased.
    pub name: &'static str,
    /// The GGUF (ggml) type id.
    pub ggml_type: u32,
    /// Elements of one storage block (1 for plain floats).
    pub block_elems: usize,
    /// Bytes of one storage block.
    pub block_bytes: usize,
    /// Decode whole blocks, appending their values.
    pub decode: fn(&[u8], &mut Vec<f32>),
    /// Encode whole blocks of values, appending their bytes (ggml's reference rounding).
    pub encode: fn(&[f32], &mut Vec<u8>),
}

/// Every weight format, in the order tests and shader variants enumerate them.
pub const FORMATS: [&Format; 5] = [&f32::FORMAT, &f16::FORMAT, &q8_0::FORMAT, &q4_0::FORMAT, &q4_1::FORMAT];

impl DType {
    /// Every format a weight matrix or embedding table may have on the GPU.
    pub const WEIGHTS: [DType; 5] =
        [FORMATS[0].dtype, FORMATS[1].dtype, FORMATS[2].dtype, FORMATS[3].dtype, FORMATS[4].dtype];

    /// The weight format's entry in [`FORMATS`]; `None` for `U32`.
    pub fn format(self) -> Option<&'static Format> {
        FORMATS.into_iter().find(|f| f.dtype == self)
    }

    /// The weight format with GGUF type id `id`, if weft computes with it.
    pub fn from_ggml_type(id: u32) -> Option<DType> {
        FORMATS.into_iter().find(|f| f.ggml_type == id).map(|f| f.dtype)
    }

    pub fn name(self) -> &'static str {
        self.format().map_or("U32", |f| f.name)
    }

    /// Elements covered by one storage unit (a block, or one element for plain types).
    pub fn block_elems(self) -> usize {
        self.format().map_or(1, |f| f.block_elems)
    }

    /// Bytes of one storage unit.
    pub fn block_bytes(self) -> usize {
        self.format().map_or(4, |f| f.block_bytes)
    }

    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes taken by `num_elems` consecutive elements; block formats need whole blocks.
    pub fn size_bytes(self, num_elems: usize) -> Result<usize> {
        if !num_elems.is_multiple_of(self.block_elems()) {
            return Err(WeftError::shape(
                "tensor layout",
                format!(
                    "{} stores blocks of {} elements, but a row has {num_elems} elements",
                    self.name(),
                    self.block_elems()
                ),
            ));
        }
        Ok(num_elems / self.block_elems() * self.block_bytes())
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn weight_format(dtype: DType, what: &str) -> Result<&'static Format> {
    dtype.format().ok_or_else(|| WeftError::Unsupported(format!("U32 tensors hold indices; {what}")))
}

/// Decode `bytes` (a whole number of storage units of `dtype`) into f32 values.
pub fn dequantize(dtype: DType, bytes: &[u8]) -> Result<Vec<f32>> {
    let format = weight_format(dtype, "there are no values to dequantize")?;
    if !bytes.len().is_multiple_of(format.block_bytes) {
        return Err(WeftError::shape(
            "dequantize",
            format!("{} bytes is not a whole number of {dtype} units of {} bytes", bytes.len(), format.block_bytes),
        ));
    }
    let mut out = Vec::with_capacity(bytes.len() / format.block_bytes * format.block_elems);
    (format.decode)(bytes, &mut out);
    Ok(out)
}

/// Encode f32 values as `dtype` (ggml's reference rounding for the block formats).
pub fn quantize(dtype: DType, values: &[f32]) -> Result<Vec<u8>> {
    let format = weight_format(dtype, "upload them with upload_u32")?;
    let mut out = Vec::with_capacity(dtype.size_bytes(values.len())?);
    (format.encode)(values, &mut out);
    Ok(out)
}

/// BF16 has no storage type of its own on the GPU: it widens exactly to F32 at load.
pub fn bf16_to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
}

/// An f16 stored little-endian at `bytes[at..at + 2]`, as f32.
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Element `i` of a 32-element block of packed nibbles: the low nibble of byte `i` for the first
/// half, the high nibble of byte `i - 16` for the second.
fn nibble(qs: &[u8], i: usize) -> u8 {
    if i < QK / 2 { qs[i] & 0xF } else { qs[i - QK / 2] >> 4 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_consistent() {
        for (i, f) in FORMATS.iter().enumerate() {
            assert_eq!(DType::WEIGHTS[i], f.dtype);
            assert_eq!(f.dtype.format().map(|g| g.name), Some(f.name));
            assert_eq!(DType::from_ggml_type(f.ggml_type), Some(f.dtype));
            assert!(FORMATS.iter().filter(|g| g.ggml_type == f.ggml_type).count() == 1);
        }
        assert_eq!(DType::U32.format().map(|f| f.name), None);
        assert_eq!(DType::U32.block_bytes(), 4);
    }

    #[test]
    fn roundtrip_error_is_within_half_a_step() {
        let values: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        for dtype in DType::WEIGHTS {
            let decoded = dequantize(dtype, &quantize(dtype, &values).unwrap()).unwrap();
            for (block, got) in values.chunks(32).zip(decoded.chunks(32)) {
                let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
                let range =
                    block.iter().copied().fold(f32::MIN, f32::max) - block.iter().copied().fold(f32::MAX, f32::min);
                // Half a quantization step, plus the f16 rounding of the scale itself.
                let step = match dtype {
                    DType::F32 => 0.0,
                    DType::F16 => amax / 1024.0,
                    DType::Q8_0 => amax / 127.0,
                    // Codes run from -8 to 7 with the extreme at -8, so a value of the opposite
                    // sign and equal magnitude clamps a whole step short: allow two half steps.
                    DType::Q4_0 => amax / 4.0,
                    DType::Q4_1 => range / 15.0,
                    DType::U32 => unreachable!(),
                };
                for (a, b) in block.iter().zip(got) {
                    assert!((a - b).abs() <= step * 0.5 + amax * 2e-3, "{dtype}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn partial_blocks_and_indices_are_rejected() {
        assert!(quantize(DType::Q4_0, &[0.0; 31]).is_err());
        assert!(dequantize(DType::Q8_0, &[0; 33]).is_err());
        assert!(DType::Q4_1.size_bytes(48).is_err());
        assert_eq!(DType::Q4_1.size_bytes(64).unwrap(), 40);
        assert!(dequantize(DType::U32, &[0; 4]).is_err());
        assert!(quantize(DType::U32, &[0.0]).is_err());
    }
}
