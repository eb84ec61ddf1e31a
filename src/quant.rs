//! Element types of tensors and the GGUF block formats, decoded and encoded on the CPU.
//!
//! Quantized weights stay in their file's block layout on the GPU (ggml's `block_q8_0`,
//! `block_q4_0`, `block_q4_1`); the shaders in `shaders/formats/` decode exactly what
//! [`dequantize`] decodes here. Each block covers 32 consecutive elements of one row:
//!
//! ```text
//! Q8_0  34 bytes: d: f16 | qs: [i8; 32]          x[i] = d * qs[i]
//! Q4_0  18 bytes: d: f16 | qs: [u8; 16]          x[i] = d * (nibble(i) - 8)
//! Q4_1  20 bytes: d: f16 | m: f16 | qs: [u8; 16] x[i] = d * nibble(i) + m
//! nibble(i) = qs[i] & 0xF for i < 16, qs[i - 16] >> 4 for i >= 16
//! ```
//!
//! The encoders follow ggml's reference quantizers so that test weights look like real ones.

use half::f16;

use crate::error::{Result, WeftError};

/// Elements per quantization block in every block format weft reads.
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

impl DType {
    /// Every format a weight matrix or embedding table may have on the GPU.
    pub const WEIGHTS: [DType; 5] = [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::U32 => "U32",
        }
    }

    /// Elements covered by one storage unit (a block, or one element for float types).
    pub fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::U32 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => QK,
        }
    }

    /// Bytes of one storage unit.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 => 2,
            DType::Q8_0 => 2 + QK,
            DType::Q4_0 => 2 + QK / 2,
            DType::Q4_1 => 4 + QK / 2,
        }
    }

    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes taken by `num_elems` consecutive elements; block formats need whole blocks.
    pub fn size_bytes(self, num_elems: usize) -> Result<usize> {
        if num_elems % self.block_elems() != 0 {
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

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

fn nibble(qs: &[u8], i: usize) -> u8 {
    if i < QK / 2 { qs[i] & 0xF } else { qs[i - QK / 2] >> 4 }
}

/// Decode `bytes` (a whole number of storage units of `dtype`) into f32 values.
pub fn dequantize(dtype: DType, bytes: &[u8]) -> Result<Vec<f32>> {
    if dtype == DType::U32 {
        return Err(WeftError::Unsupported("U32 tensors hold indices, not values to dequantize".into()));
    }
    let unit = dtype.block_bytes();
    if bytes.len() % unit != 0 {
        return Err(WeftError::shape(
            "dequantize",
            format!("{} bytes is not a whole number of {dtype} units of {unit} bytes", bytes.len()),
        ));
    }
    let mut out = Vec::with_capacity(bytes.len() / unit * dtype.block_elems());
    for block in bytes.chunks_exact(unit) {
        match dtype {
            DType::F32 => out.push(f32::from_le_bytes([block[0], block[1], block[2], block[3]])),
            DType::F16 => out.push(f16_at(block, 0)),
            DType::U32 => unreachable!("rejected above"),
            DType::Q8_0 => {
                let d = f16_at(block, 0);
                out.extend(block[2..].iter().map(|&q| d * (q as i8) as f32));
            }
            DType::Q4_0 => {
                let d = f16_at(block, 0);
                out.extend((0..QK).map(|i| d * (nibble(&block[2..], i) as f32 - 8.0)));
            }
            DType::Q4_1 => {
                let (d, m) = (f16_at(block, 0), f16_at(block, 2));
                out.extend((0..QK).map(|i| d * nibble(&block[4..], i) as f32 + m));
            }
        }
    }
    Ok(out)
}

/// Encode f32 values as `dtype` (ggml's reference rounding for the block formats).
pub fn quantize(dtype: DType, values: &[f32]) -> Result<Vec<u8>> {
    if dtype == DType::U32 {
        return Err(WeftError::Unsupported("U32 tensors hold indices; upload them with upload_u32".into()));
    }
    dtype.size_bytes(values.len())?;
    let mut out = Vec::with_capacity(values.len() / dtype.block_elems() * dtype.block_bytes());
    match dtype {
        DType::F32 => out.extend(values.iter().flat_map(|v| v.to_le_bytes())),
        DType::F16 => out.extend(values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes())),
        DType::Q8_0 => {
            for x in values.chunks_exact(QK) {
                let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
            }
        }
        DType::Q4_0 => {
            for x in values.chunks_exact(QK) {
                // The signed value of largest magnitude maps to -8, so the grid uses all 16 codes.
                let max = x.iter().fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
                out.extend((0..QK / 2).map(|i| q(x[i]) | (q(x[i + QK / 2]) << 4)));
            }
        }
        DType::Q4_1 => {
            for x in values.chunks_exact(QK) {
                let min = x.iter().copied().fold(f32::INFINITY, f32::min);
                let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(f16::from_f32(min).to_le_bytes());
                let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                out.extend((0..QK / 2).map(|i| q(x[i]) | (q(x[i + QK / 2]) << 4)));
            }
        }
        DType::U32 => unreachable!("rejected above"),
    }
    Ok(out)
}

/// BF16 has no storage type of its own on the GPU: it widens exactly to F32 at load.
pub fn bf16_to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le16(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    #[test]
    fn q8_0_block_decodes_by_hand() {
        let mut block = le16(0.5).to_vec();
        block.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let values = dequantize(DType::Q8_0, &block).unwrap();
        assert_eq!(values[0], -8.0); // 0.5 * -16
        assert_eq!(values[16], 0.0);
        assert_eq!(values[31], 7.5); // 0.5 * 15
    }

    #[test]
    fn q4_0_block_decodes_by_hand() {
        // Byte i holds element i in its low nibble and element i + 16 in its high nibble.
        let mut block = le16(2.0).to_vec();
        block.extend([0x1F_u8; 16]); // low nibble 15, high nibble 1
        block[2] = 0x80; // element 0: nibble 0 -> -8, element 16: nibble 8 -> 0
        let values = dequantize(DType::Q4_0, &block).unwrap();
        assert_eq!(values[0], -16.0);
        assert_eq!(values[16], 0.0);
        assert_eq!(values[1], 14.0); // 2 * (15 - 8)
        assert_eq!(values[17], -14.0); // 2 * (1 - 8)
    }

    #[test]
    fn q4_1_block_decodes_by_hand() {
        let mut block = le16(0.25).to_vec();
        block.extend(le16(-1.0));
        block.extend([0x3C_u8; 16]); // low 12, high 3
        let values = dequantize(DType::Q4_1, &block).unwrap();
        assert_eq!(values[5], 2.0); // 0.25 * 12 - 1
        assert_eq!(values[21], -0.25); // 0.25 * 3 - 1
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
    fn partial_blocks_are_rejected() {
        assert!(quantize(DType::Q4_0, &[0.0; 31]).is_err());
        assert!(dequantize(DType::Q8_0, &[0; 33]).is_err());
        assert!(DType::Q4_1.size_bytes(48).is_err());
        assert_eq!(DType::Q4_1.size_bytes(64).unwrap(), 40);
    }
}
