//! MXFP4 (ggml `block_mxfp4`, GGUF type 39; gpt-oss's experts), 32 elements in 17 bytes: an
//! OCP microscaling block, a power-of-two scale and 32 E2M1 floats:
//!
//! ```text
//! e: u8 (E8M0) | qs: [u8; 16]          x[i] = MXFP4_VALUES[nibble(i)] * 2^(e - 128)
//! ```
//!
//! The values are E2M1's doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives as small
//! integers), so the scale is halved: ggml's `GGML_E8M0_TO_FP32_HALF`, 2^(e - 128), which is
//! subnormal for e < 2. Every product is exact (an integer below 16 times a power of two), short
//! of overflow: e past 251 makes infinities no encoder writes. Blocks are 17 bytes, so a block
//! may start at any byte.
//!
//! Shader: `shaders/formats/mxfp4.wgsl`.

use super::{DType, Format, QK, nibble, pack_nibbles};

pub const FORMAT: Format = Format {
    dtype: DType::MXFP4,
    name: "MXFP4",
    ggml_type: 39,
    block_elems: QK,
    block_bytes: 1 + QK / 2,
    decode,
    encode,
};

/// E2M1's values doubled, by code (ggml's `kvalues_mxfp4`): bit 3 is the sign.
const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// 2^(e - 128), exactly (subnormal below e = 2), as ggml's `ggml_e8m0_to_fp32_half`.
fn half_scale(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    f32::from_bits(bits)
}

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let d = half_scale(block[0]);
        out.extend((0..QK).map(|i| f32::from(MXFP4_VALUES[nibble(&block[1..], i) as usize]) * d));
    }
}

/// ggml's reference quantizer: the scale puts the largest magnitude in [8, 16) (the top value
/// is 12, so the largest values may clamp), each value to its nearest code (the first of equals).
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8 } else { 0 };
        let d = half_scale(e);
        let code = |v: f32| {
            (0..16).fold(0u8, |best, i| {
                let err = |c: u8| (f32::from(MXFP4_VALUES[c as usize]) * d - v).abs();
                if err(i) < err(best) { i } else { best }
            })
        };
        let codes: Vec<u8> = x.iter().map(|&v| code(v)).collect();
        out.push(e);
        out.extend(pack_nibbles(&codes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = vec![130u8]; // d = 2^(130 - 128) = 4
        block.extend([0x7F_u8; 16]); // low nibble 15 -> -12, high nibble 7 -> 12
        block[1 + 2] = 0x95; // element 2: 5 -> 6; element 18: 9 -> -1
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[0], -48.0);
        assert_eq!(values[16], 48.0);
        assert_eq!(values[2], 24.0);
        assert_eq!(values[18], -4.0);
        assert_eq!(half_scale(0), 2f32.powi(-128));
        assert_eq!(half_scale(1), 2f32.powi(-127));
        assert_eq!(half_scale(2), 2f32.powi(-126));
        assert_eq!(half_scale(255), 2f32.powi(127));
    }
}
