//! Q4_0 (ggml `block_q4_0`, GGUF type 2), 32 elements in 18 bytes:
//!
//! ```text
//! d: f16 | qs: [u8; 16]          x[i] = d * (nibble(i) - 8)
//! nibble(i) = qs[i] & 0xF for i < 16, qs[i - 16] >> 4 for i >= 16
//! ```
//!
//! Shader: `shaders/formats/q4_0.wgsl`.

use half::f16;

use super::{DType, Format, QK, f16_at, nibble};

pub const FORMAT: Format =
    Format { dtype: DType::Q4_0, name: "Q4_0", ggml_type: 2, block_elems: QK, block_bytes: 2 + QK / 2, decode, encode };

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let d = f16_at(block, 0);
        out.extend((0..QK).map(|i| d * (nibble(&block[2..], i) as f32 - 8.0)));
    }
}

fn encode(values: &[f32], out: &mut Vec<u8>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        // Byte i holds element i in its low nibble and element i + 16 in its high nibble.
        let mut block = f16::from_f32(2.0).to_le_bytes().to_vec();
        block.extend([0x1F_u8; 16]); // low nibble 15, high nibble 1
        block[2] = 0x80; // element 0: nibble 0 -> -8, element 16: nibble 8 -> 0
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[0], -16.0);
        assert_eq!(values[16], 0.0);
        assert_eq!(values[1], 14.0); // 2 * (15 - 8)
        assert_eq!(values[17], -14.0); // 2 * (1 - 8)
    }
}
