//! IQ4_NL (ggml `block_iq4_nl`, GGUF type 20), 32 elements in 18 bytes: Q4_0's layout with a
//! non-linear grid instead of q - 8:
//!
//! ```text
//! d: f16 | qs: [u8; 16]          x[i] = d * IQ4_GRID[nibble(i)]
//! ```
//!
//! Shader: `shaders/formats/iq4_nl.wgsl`.

use half::f16;

use super::{DType, Format, IQ4_GRID, QK, f16_at, nearest_iq4, nibble, pack_nibbles, signed_max};

pub const FORMAT: Format = Format {
    dtype: DType::IQ4_NL,
    name: "IQ4_NL",
    ggml_type: 20,
    block_elems: QK,
    block_bytes: 2 + QK / 2,
    decode,
    encode,
};

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let d = f16_at(block, 0);
        out.extend((0..QK).map(|i| d * f32::from(IQ4_GRID[nibble(&block[2..], i) as usize])));
    }
}

/// A plain encoder: the signed extreme maps to the grid's -127, every value to its nearest
/// grid point.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK) {
        let d = signed_max(x) / -127.0;
        let d16 = f16::from_f32(d).to_f32();
        let codes: Vec<u8> = x.iter().map(|&v| if d16 != 0.0 { nearest_iq4(v / d16) } else { 8 }).collect();
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(pack_nibbles(&codes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = f16::from_f32(0.5).to_le_bytes().to_vec();
        block.extend([0xF0_u8; 16]); // low nibble 0 -> -127, high nibble 15 -> 113
        block[2 + 3] = 0x97; // element 3: 7 -> -10; element 19: 9 -> 13
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[0], -63.5);
        assert_eq!(values[16], 56.5);
        assert_eq!(values[3], -5.0);
        assert_eq!(values[19], 6.5);
    }
}
