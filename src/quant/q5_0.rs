//! Q5_0 (ggml `block_q5_0`, GGUF type 6), 32 elements in 22 bytes:
//!
//! ```text
//! d: f16 | qh: u32 (LE) | qs: [u8; 16]     x[i] = d * ((nibble(i) | bit i of qh << 4) - 16)
//! ```
//!
//! (nibbles as in Q4_0). Shader: `shaders/formats/q5_0.wgsl`.

use half::f16;

use super::{DType, Format, QK, f16_at, nibble, signed_max};

pub const FORMAT: Format = Format {
    dtype: DType::Q5_0,
    name: "Q5_0",
    ggml_type: 6,
    block_elems: QK,
    block_bytes: 2 + 4 + QK / 2,
    decode,
    encode,
};

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let d = f16_at(block, 0);
        let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
        out.extend((0..QK).map(|i| {
            let q = nibble(&block[6..], i) as i32 | (((qh >> i) & 1) << 4) as i32;
            d * (q - 16) as f32
        }));
    }
}

/// ggml's `quantize_row_q5_0_ref`: the signed extreme maps to -16.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK) {
        let d = signed_max(x) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let codes: Vec<u8> = x.iter().map(|&v| ((v * id + 16.5) as i32).clamp(0, 31) as u8).collect();
        let qh = codes.iter().enumerate().fold(0u32, |h, (i, &c)| h | (u32::from(c >> 4) << i));
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(qh.to_le_bytes());
        out.extend((0..QK / 2).map(|i| (codes[i] & 0xF) | ((codes[i + QK / 2] & 0xF) << 4)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = f16::from_f32(0.5).to_le_bytes().to_vec();
        block.extend(0x8000_0001u32.to_le_bytes()); // high bits of elements 0 and 31
        block.extend([0x3C_u8; 16]); // low nibbles 12, high nibbles 3
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[0], 6.0); // 0.5 * ((12 | 16) - 16)
        assert_eq!(values[1], -2.0); // 0.5 * (12 - 16)
        assert_eq!(values[16], -6.5); // 0.5 * (3 - 16)
        assert_eq!(values[31], 1.5); // 0.5 * ((3 | 16) - 16)
    }
}
