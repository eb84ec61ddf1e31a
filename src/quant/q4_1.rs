//! Q4_1 (ggml `block_q4_1`, GGUF type 3), 32 elements in 20 bytes:
//!
//! ```text
//! d: f16 | m: f16 | qs: [u8; 16] x[i] = d * nibble(i) + m     (nibbles as in Q4_0)
//! ```
//!
//! Shader: `shaders/formats/q4_1.wgsl`.

use half::f16;

use super::{DType, Format, QK, f16_at, nibble};

pub const FORMAT: Format =
    Format { dtype: DType::Q4_1, name: "Q4_1", ggml_type: 3, block_elems: QK, block_bytes: 4 + QK / 2, decode, encode };

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let (d, m) = (f16_at(block, 0), f16_at(block, 2));
        out.extend((0..QK).map(|i| d * nibble(&block[4..], i) as f32 + m));
    }
}

fn encode(values: &[f32], out: &mut Vec<u8>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = f16::from_f32(0.25).to_le_bytes().to_vec();
        block.extend(f16::from_f32(-1.0).to_le_bytes());
        block.extend([0x3C_u8; 16]); // low 12, high 3
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[5], 2.0); // 0.25 * 12 - 1
        assert_eq!(values[21], -0.25); // 0.25 * 3 - 1
    }
}
