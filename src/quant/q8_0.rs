//! Q8_0 (ggml `block_q8_0`, GGUF type 8), 32 elements in 34 bytes:
//!
//! ```text
//! d: f16 | qs: [i8; 32]          x[i] = d * qs[i]
//! ```
//!
//! Shader: `shaders/formats/q8_0.wgsl`.

use half::f16;

use super::{DType, Format, QK, f16_at};

pub const FORMAT: Format =
    Format { dtype: DType::Q8_0, name: "Q8_0", ggml_type: 8, block_elems: QK, block_bytes: 2 + QK, decode, encode };

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let d = f16_at(block, 0);
        out.extend(block[2..].iter().map(|&q| d * (q as i8) as f32));
    }
}

fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = f16::from_f32(0.5).to_le_bytes().to_vec();
        block.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[0], -8.0); // 0.5 * -16
        assert_eq!(values[16], 0.0);
        assert_eq!(values[31], 7.5); // 0.5 * 15
    }
}
