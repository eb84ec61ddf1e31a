//! Q3_K (ggml `block_q3_K`, GGUF type 11), 256 elements in 110 bytes:
//!
//! ```text
//! hmask: [u8; 32] | qs: [u8; 64] | scales: [u8; 12] | d: f16
//! half h, quarter r (32 elements each), l < 32, s = 8h + 2r + l/16:
//!   q = (qs[32h + l] >> 2r) & 3, minus 4 unless bit 4h + r of hmask[l] is set
//!   x = d · (scale(s) - 32) · q,  scale(s) = 6 bits: low 4 = (scales[s % 8] >> 4·(s/8)) & 0xF,
//!                                  high 2 = (scales[8 + s % 4] >> 2·(s/4)) & 3
//! ```
//!
//! As Q6_K, two scales per 32 elements, folded into the shader's codes exactly.
//! Shader: `shaders/formats/q3_k.wgsl`.

use half::f16;

use super::{DType, Format, QK_K, f16_at, nearest, signed_max};

pub const FORMAT: Format = Format {
    dtype: DType::Q3_K,
    name: "Q3_K",
    ggml_type: 11,
    block_elems: QK_K,
    block_bytes: QK_K / 8 + QK_K / 4 + 12 + 2,
    decode,
    encode,
};

/// The 6-bit scale `s` (0..16), as ggml unpacks the 12 bytes.
fn scale(scales: &[u8], s: usize) -> i32 {
    let low = (scales[s % 8] >> (4 * (s / 8))) & 0xF;
    let high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    i32::from(low | (high << 4))
}

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let (hmask, qs, scales) = (&block[..32], &block[32..96], &block[96..108]);
        let d = f16_at(block, 108);
        for h in 0..2 {
            for r in 0..4 {
                out.extend((0..32).map(|l| {
                    let dl = d * (scale(scales, 8 * h + 2 * r + l / 16) - 32) as f32;
                    let high = (hmask[l] >> (4 * h + r)) & 1;
                    let q = i32::from((qs[32 * h + l] >> (2 * r)) & 3) - if high != 0 { 0 } else { 4 };
                    dl * q as f32
                }));
            }
        }
    }
}

/// A plain encoder: per 16 elements the signed extreme maps to -4; the scales are rounded to 6
/// signed bits of the super-block's d.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK_K) {
        let scales: Vec<f32> = x.chunks_exact(16).map(|s| signed_max(s) / -4.0).collect();
        let max_scale = signed_max(&scales);
        let iscale = if max_scale != 0.0 { -32.0 / max_scale } else { 0.0 };
        let d = if iscale != 0.0 { 1.0 / iscale } else { 0.0 };
        let sc: Vec<i32> = scales.iter().map(|&s| nearest(iscale * s).clamp(-32, 31)).collect();
        let d16 = f16::from_f32(d).to_f32();
        let mut hmask = [0u8; 32];
        let mut qs = [0u8; 64];
        let mut packed = [0u8; 12];
        for (s, &v) in sc.iter().enumerate() {
            let v = (v + 32) as u8;
            packed[s % 8] |= (v & 0xF) << (4 * (s / 8));
            packed[8 + s % 4] |= (v >> 4) << (2 * (s / 4));
        }
        for h in 0..2 {
            for r in 0..4 {
                for l in 0..32 {
                    let i = 128 * h + 32 * r + l;
                    let step = d16 * sc[i / 16] as f32;
                    let q = if step != 0.0 { nearest(x[i] / step).clamp(-4, 3) + 4 } else { 4 } as u8;
                    qs[32 * h + l] |= (q & 3) << (2 * r);
                    hmask[l] |= (q >> 2) << (4 * h + r);
                }
            }
        }
        out.extend(hmask);
        out.extend(qs);
        out.extend(packed);
        out.extend(f16::from_f32(d).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = vec![0u8; 110];
        block[108..].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        // Scale 13 (element 128 + 64 + 16 + 1: half 1, quarter 2, second 16): low nibble in
        // the high half of byte 5, top bits 2·3 = 6..7 of byte 8 + 1. Value 0b10_0110 = 38.
        block[96 + 5] = 0x6 << 4;
        block[96 + 9] = 0b10 << 6;
        // The element: qs[32 + 17] bits 4..5 = 2, hmask[17] bit 6 set: q = 2.
        block[32 + 32 + 17] = 2 << 4;
        block[17] = 1 << 6;
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[128 + 64 + 17], 0.5 * (38 - 32) as f32 * 2.0);
        // Its neighbour: code 0, high bit clear, q = -4, same scale.
        assert_eq!(values[128 + 64 + 18], 0.5 * 6.0 * -4.0);
        // Element 0: scale 0 - 32 = -32, q = -4.
        assert_eq!(values[0], 0.5 * -32.0 * -4.0);
    }
}
