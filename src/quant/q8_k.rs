//! Q8_K (ggml `block_q8_K`, GGUF type 15), 256 elements in 292 bytes:
//!
//! ```text
//! d: f32 | qs: [i8; 256] | bsums: [i16; 16]     x[i] = d * qs[i]
//! ```
//!
//! ggml uses it for activations in its dot products; a file may still hold a tensor of it.
//! `bsums` (the sums of each 16 codes) only speed those dot products up and are not read.
//! Shader: `shaders/formats/q8_k.wgsl`.

use super::{DType, Format, QK_K, nearest, signed_max};

pub const FORMAT: Format = Format {
    dtype: DType::Q8_K,
    name: "Q8_K",
    ggml_type: 15,
    block_elems: QK_K,
    block_bytes: 4 + QK_K + QK_K / 8,
    decode,
    encode,
};

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let d = f32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        out.extend(block[4..4 + QK_K].iter().map(|&q| d * f32::from(q as i8)));
    }
}

/// ggml's `quantize_row_q8_K_ref`: the signed extreme maps to -127.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK_K) {
        let max = signed_max(x);
        if max == 0.0 {
            out.extend([0u8; 4 + QK_K + QK_K / 8]);
            continue;
        }
        let iscale = -127.0 / max;
        let codes: Vec<i8> = x.iter().map(|&v| nearest(iscale * v).min(127) as i8).collect();
        out.extend((1.0 / iscale).to_le_bytes());
        out.extend(codes.iter().map(|&q| q as u8));
        for sums in codes.chunks_exact(16) {
            out.extend(sums.iter().map(|&q| i16::from(q)).sum::<i16>().to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = 0.25f32.to_le_bytes().to_vec();
        block.extend((0..256).map(|i| (i as i8).wrapping_sub(100) as u8));
        block.extend([0u8; 32]);
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[0], -25.0);
        assert_eq!(values[227], 31.75); // 0.25 * 127
        assert_eq!(values[228], -32.0); // 0.25 * -128
    }
}
