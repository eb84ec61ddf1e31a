//! Q5_1 (ggml `block_q5_1`, GGUF type 7), 32 elements in 24 bytes:
//!
//! ```text
//! d: f16 | m: f16 | qh: u32 (LE) | qs: [u8; 16]     x[i] = d * (nibble(i) | bit i of qh << 4) + m
//! ```
//!
//! Shader: `shaders/formats/q5_1.wgsl`.

use half::f16;

use super::{DType, Format, QK, f16_at, nibble};

pub const FORMAT: Format = Format {
    dtype: DType::Q5_1,
    name: "Q5_1",
    ggml_type: 7,
    block_elems: QK,
    block_bytes: 2 + 2 + 4 + QK / 2,
    decode,
    encode,
};

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let (d, m) = (f16_at(block, 0), f16_at(block, 2));
        let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
        out.extend((0..QK).map(|i| d * (nibble(&block[8..], i) as u32 | (((qh >> i) & 1) << 4)) as f32 + m));
    }
}

/// ggml's `quantize_row_q5_1_ref`.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK) {
        let min = x.iter().copied().fold(f32::INFINITY, f32::min);
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let codes: Vec<u8> = x.iter().map(|&v| (((v - min) * id + 0.5) as i32).clamp(0, 31) as u8).collect();
        let qh = codes.iter().enumerate().fold(0u32, |h, (i, &c)| h | (u32::from(c >> 4) << i));
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(f16::from_f32(min).to_le_bytes());
        out.extend(qh.to_le_bytes());
        out.extend((0..QK / 2).map(|i| (codes[i] & 0xF) | ((codes[i + QK / 2] & 0xF) << 4)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = f16::from_f32(0.25).to_le_bytes().to_vec();
        block.extend(f16::from_f32(-1.0).to_le_bytes());
        block.extend(0x0001_0004u32.to_le_bytes()); // high bits of elements 2 and 16
        block.extend([0x3C_u8; 16]); // low nibbles 12, high nibbles 3
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[0], 2.0); // 0.25 * 12 - 1
        assert_eq!(values[2], 6.0); // 0.25 * 28 - 1
        assert_eq!(values[16], 3.75); // 0.25 * 19 - 1
        assert_eq!(values[17], -0.25); // 0.25 * 3 - 1
    }
}
