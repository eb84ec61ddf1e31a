//! Element types of tensors and the weight formats weft computes with: one file per format
//! (its block layout, CPU codec and GGUF type id), mirroring `shaders/formats/`, all listed in
//! [`FORMATS`], the one table the GGUF reader, the tiny-model writer and the shader pipelines
//! read.
//!
//! Quantized weights stay in their file's block layout on the GPU; the shader decoder of a
//! format (`shaders/formats/<name>.wgsl`) decodes exactly what its CPU codec here decodes, which
//! is exactly what ggml decodes (`dequantize_row_*` in ggml-quants.c; `tests/quant_fixtures.rs`
//! holds every decoder to gguf-py's independent dequantizers). The encoders of the 32-element
//! formats follow ggml's reference quantizers; those of the super-block formats (the K-quants and
//! IQ4_XS, whose ggml quantizers search for scales) and IQ4_NL are plain nearest-value encoders:
//! they make valid blocks that look like real weights, which is all tests need.
//!
//! The K-quants pack 256 elements into a super-block with one or two f16 scales and a small
//! scale (and min) per 16 or 32 elements. The shaders iterate 32-element blocks, so a K-quant
//! decoder reads sub-block `b % 8` of super-block `b / 8`.
//!
//! Adding a format: a file here with its [`Format`], a line in [`FORMATS`] and a variant of
//! [`DType`], and its decoder in `shaders/formats/`.

mod bf16;
mod f16;
mod f32;
mod iq2_s;
mod iq2_xs;
mod iq3_s;
mod iq3_xxs;
mod iq4_nl;
mod iq4_xs;
mod iq_grids;
mod mxfp4;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;
mod q8_k;

use crate::error::{Result, WeftError};

/// Elements per quantization block of the 32-element block formats (Q8_0, Q4_0, Q4_1, Q5_0,
/// Q5_1, IQ4_NL, MXFP4), and of the sub-blocks the shaders decode one at a time.
pub const QK: usize = 32;

/// Elements per super-block of the K-quants and IQ4_XS.
pub const QK_K: usize = 256;

/// How the elements of a tensor are stored (weight formats by ggml's names).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    /// bfloat16: kept 16-bit on the GPU, widened exactly by its decoder.
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
    IQ2_XS,
    IQ3_XXS,
    IQ3_S,
    IQ2_S,
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
pub const FORMATS: [&Format; 21] = [
    &f32::FORMAT,
    &f16::FORMAT,
    &bf16::FORMAT,
    &q8_0::FORMAT,
    &q4_0::FORMAT,
    &q4_1::FORMAT,
    &q5_0::FORMAT,
    &q5_1::FORMAT,
    &q2_k::FORMAT,
    &q3_k::FORMAT,
    &q4_k::FORMAT,
    &q5_k::FORMAT,
    &q6_k::FORMAT,
    &q8_k::FORMAT,
    &iq4_nl::FORMAT,
    &iq4_xs::FORMAT,
    &mxfp4::FORMAT,
    &iq2_xs::FORMAT,
    &iq3_xxs::FORMAT,
    &iq3_s::FORMAT,
    &iq2_s::FORMAT,
];

const fn weight_dtypes() -> [DType; FORMATS.len()] {
    let mut out = [DType::U32; FORMATS.len()];
    let mut i = 0;
    while i < FORMATS.len() {
        out[i] = FORMATS[i].dtype;
        i += 1;
    }
    out
}

impl DType {
    /// Every format a weight matrix or embedding table may have on the GPU.
    pub const WEIGHTS: [DType; FORMATS.len()] = weight_dtypes();

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

/// An f16 stored little-endian at `bytes[at..at + 2]`, as f32.
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Element `i` of a 32-element block of packed nibbles: the low nibble of byte `i` for the first
/// half, the high nibble of byte `i - 16` for the second.
fn nibble(qs: &[u8], i: usize) -> u8 {
    if i < QK / 2 { qs[i] & 0xF } else { qs[i - QK / 2] >> 4 }
}

/// Pack 32 codes (each < 16) as [`nibble`] reads them.
fn pack_nibbles(codes: &[u8]) -> impl Iterator<Item = u8> + '_ {
    (0..QK / 2).map(|i| codes[i] | (codes[i + QK / 2] << 4))
}

/// ggml's `nearest_int`: round to nearest, ties to even (its float trick does what the FPU
/// does), as an integer.
fn nearest(v: f32) -> i32 {
    v.round_ties_even() as i32
}

/// The value of largest magnitude (its sign kept; the first of equal magnitudes).
fn signed_max(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |a, &v| if v.abs() > a.abs() { v } else { a })
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) from the 12
/// packed bytes of a Q4_K / Q5_K super-block. Sub-blocks 0..3 keep theirs in the low 6 bits of
/// bytes j and j + 4; 4..7 in the nibbles of byte j + 4, with the top 2 bits in the spare high
/// bits of bytes j - 4 (scale) and j (min).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The inverse of [`scale_min_k4`]: pack eight 6-bit (scale, min) pairs into 12 bytes.
fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            q[j] |= sc[j] & 63;
            q[j + 4] |= m[j] & 63;
        } else {
            q[j + 4] = (sc[j] & 0xF) | ((m[j] & 0xF) << 4);
            q[j - 4] |= (sc[j] >> 4) << 6;
            q[j] |= (m[j] >> 4) << 6;
        }
    }
    q
}

/// The 16 values of the non-linear 4-bit grid of IQ4_NL and IQ4_XS (ggml's `kvalues_iq4nl`).
const IQ4_GRID: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// The index of the grid value nearest to `v` (in grid units); ties to the lower one.
fn nearest_iq4(v: f32) -> u8 {
    let mut best = 0;
    for (i, &g) in IQ4_GRID.iter().enumerate() {
        if (v - f32::from(g)).abs() < (v - f32::from(IQ4_GRID[best])).abs() {
            best = i;
        }
    }
    best as u8
}

/// The IQ codebooks of [`iq_grids`] by the names the shaders use (`#include codebook NAME`):
/// the GPU holds them in one buffer, in this order.
pub const CODEBOOKS: [(&str, &[u16]); 4] = [
    ("IQ2XS_GRID", &iq_grids::IQ2XS_GRID),
    ("IQ2S_GRID", &iq_grids::IQ2S_GRID),
    ("IQ3XXS_GRID", &iq_grids::IQ3XXS_GRID),
    ("IQ3S_GRID", &iq_grids::IQ3S_GRID),
];

/// The values of the bytes of ggml's IQ2 codebooks (`iq2xs_grid`, `iq2s_grid`), by the 2-bit
/// index [`iq_grids`] stores.
const IQ2_VALUES: [u8; 3] = [0x08, 0x19, 0x2B];

/// Element `j` of the packed codebook entry `entry`, whose elements take `bits` bits each, as
/// its grid value in `values`.
fn grid_value(entry: u16, j: usize, bits: usize, values: &[u8]) -> u8 {
    values[usize::from(entry >> (bits * j)) & ((1 << bits) - 1)]
}

/// ggml's `ksigns_iq2xs[i]`: 7 sign bits and an eighth that makes the number of minus signs
/// even (bit e set: element e is negative).
fn ksigns(i: u16) -> u8 {
    (i as u8 & 0x7F) | (((i.count_ones() & 1) as u8) << 7)
}

/// The minus signs of up to 8 values as bits (bit e: value e is negative). With `even`, as
/// [`ksigns`] can store: an odd count is made even by flipping the sign of the smallest
/// magnitude, the cheapest value to get wrong.
fn sign_bits(x: &[f32], even: bool) -> u8 {
    let mut bits = x.iter().enumerate().fold(0u8, |b, (e, &v)| b | (u8::from(v < 0.0) << e));
    if even && bits.count_ones() % 2 == 1 {
        let smallest = (0..x.len()).fold(0, |m, e| if x[e].abs() < x[m].abs() { e } else { m });
        bits ^= 1 << smallest;
    }
    bits
}

/// The index of the codebook entry nearest to `mags` (magnitudes in grid units, one per
/// element of an entry) in squared error; the first of equals.
fn nearest_entry(table: &[u16], bits: usize, values: &[u8], mags: &[f32]) -> usize {
    let err = |entry: u16| -> f32 {
        mags.iter().enumerate().map(|(j, &m)| (m - f32::from(grid_value(entry, j, bits, values))).powi(2)).sum()
    };
    let mut best = (0, f32::INFINITY);
    for (i, &entry) in table.iter().enumerate() {
        let e = err(entry);
        if e < best.1 {
            best = (i, e);
        }
    }
    best.0
}

/// A 4-bit scale code for a wanted scale `want`, in units of `unit` with the offset `offset`
/// (the scale is `unit · (offset + code)`): the nearest code, 0 where there is no unit.
fn scale_code(want: f32, unit: f32, offset: f32) -> u8 {
    if unit > 0.0 { nearest(want / unit - offset).clamp(0, 15) as u8 } else { 0 }
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
        let values: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        for dtype in DType::WEIGHTS {
            let decoded = dequantize(dtype, &quantize(dtype, &values).unwrap()).unwrap();
            for (block, got) in values.chunks(32).zip(decoded.chunks(32)) {
                let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
                let range =
                    block.iter().copied().fold(f32::MIN, f32::max) - block.iter().copied().fold(f32::MAX, f32::min);
                // Half a quantization step, plus the f16 rounding of the scale itself. The
                // super-block formats also round each sub-block's scale (and min) to a few bits
                // of the super-block's, which can stretch a step by up to half a unit of those.
                let step = match dtype {
                    DType::F32 => 0.0,
                    DType::F16 => amax / 1024.0,
                    DType::BF16 => amax / 128.0,
                    DType::Q8_0 => amax / 127.0,
                    // Codes run from -8 to 7 with the extreme at -8, so a value of the opposite
                    // sign and equal magnitude clamps a whole step short: allow two half steps.
                    DType::Q4_0 => amax / 4.0,
                    DType::Q4_1 => range / 15.0,
                    DType::Q5_0 => amax / 8.0,
                    DType::Q5_1 => range / 31.0,
                    // The 16-element scales stretch by up to half of d / amax's 4-bit unit.
                    DType::Q2_K => range / 1.5,
                    DType::Q3_K => amax / 1.5,
                    DType::Q4_K => range / 7.0,
                    DType::Q5_K => range / 15.0,
                    // As Q4_0: the extreme of a 16-element group maps to -32, so its opposite clamps a
                    // whole step short.
                    DType::Q6_K => amax / 8.0,
                    DType::Q8_K => amax / 63.0,
                    // Grid points lie up to 24 apart (of 127), and the grid ends at 113 on the
                    // side opposite the extreme's -127: 14 short.
                    DType::IQ4_NL => amax * 28.0 / 127.0,
                    // ... and the sub-block scale is rounded to 6 bits.
                    DType::IQ4_XS => amax * 32.0 / 127.0,
                    // The largest magnitude lies in [8, 16) scale units and the values run
                    // 0, 1, 2, 3, 4, 6, 8, 12: gaps of up to 4 units, and up to 4 lost where the
                    // top clamps to 12. A unit is at most amax / 8.
                    DType::MXFP4 => amax,
                    // Sparse codebooks in 8 or 4 dimensions (IQ2_XS: 512 of the 3^8 points of
                    // 8, 25, 43): only a bound on a wrong scale or sign. gguf-py's dequantizer is the truth
                    // (tests/quant_fixtures.rs).
                    DType::IQ2_XS | DType::IQ3_XXS | DType::IQ3_S | DType::IQ2_S => 2.0 * amax,
                    DType::U32 => unreachable!(),
                };
                for (a, b) in block.iter().zip(got) {
                    assert!((a - b).abs() <= step * 0.5 + amax * 2e-3, "{dtype}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn the_k_quants_pack_their_scales_as_ggml_unpacks_them() {
        let sc = [1, 63, 17, 32, 5, 48, 33, 62];
        let m = [0, 2, 63, 40, 16, 31, 47, 9];
        let packed = pack_scale_min_k4(&sc, &m);
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &packed), (sc[j], m[j]), "sub-block {j}");
        }
    }

    #[test]
    fn partial_blocks_and_indices_are_rejected() {
        assert!(quantize(DType::Q4_0, &[0.0; 31]).is_err());
        assert!(dequantize(DType::Q8_0, &[0; 33]).is_err());
        assert!(DType::Q4_1.size_bytes(48).is_err());
        assert_eq!(DType::Q4_1.size_bytes(64).unwrap(), 40);
        // Super-block formats: rows of whole 256-element super-blocks only.
        let err = DType::Q4_K.size_bytes(96).unwrap_err().to_string();
        assert!(err.contains("Q4_K stores blocks of 256 elements"), "{err}");
        assert_eq!(DType::Q6_K.size_bytes(512).unwrap(), 420);
        assert!(quantize(DType::Q5_K, &[0.0; 128]).is_err());
        assert!(dequantize(DType::Q3_K, &[0; 111]).is_err());
        assert!(dequantize(DType::U32, &[0; 4]).is_err());
        assert!(quantize(DType::U32, &[0.0]).is_err());
    }
}
