//! Q6_K (ggml `block_q6_K`, GGUF type 14), 256 elements in 210 bytes:
//!
//! ```text
//! ql: [u8; 128] | qh: [u8; 64] | scales: [i8; 16] | d: f16
//! half h (elements 128h ..), quarter r (32 elements each), l < 32:
//!   q = (ql[64h + 32·(r%2) + l] >> 4·(r/2)) & 0xF | ((qh[32h + l] >> 2r) & 3) << 4
//!   x = d · scales[8h + 2r + l/16] · (q - 32)
//! ```
//!
//! Two scales per 32 elements, so the shader folds them into its codes: d · (scale · (q - 32))
//! equals ggml's (d · scale) · (q - 32) exactly, both products of the first being exact in f32.
//! Shader: `shaders/formats/q6_k.wgsl`.

use half::f16;

use super::{DType, Format, QK_K, f16_at, nearest, signed_max};

pub const FORMAT: Format = Format {
    dtype: DType::Q6_K,
    name: "Q6_K",
    ggml_type: 14,
    block_elems: QK_K,
    block_bytes: QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
    decode,
    encode,
};

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let (ql, qh, scales) = (&block[..128], &block[128..192], &block[192..208]);
        let d = f16_at(block, 208);
        for h in 0..2 {
            for r in 0..4 {
                out.extend((0..32).map(|l| {
                    let lo = (ql[64 * h + 32 * (r % 2) + l] >> (4 * (r / 2))) & 0xF;
                    let q = (lo | (((qh[32 * h + l] >> (2 * r)) & 3) << 4)) as i32 - 32;
                    d * f32::from(scales[8 * h + 2 * r + l / 16] as i8) * q as f32
                }));
            }
        }
    }
}

/// A plain encoder: per 16 elements the signed extreme maps to -32; the 16 scales are rounded
/// to signed 8 bits of the super-block's d (as ggml's `quantize_row_q6_K_ref` does).
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK_K) {
        let scales: Vec<f32> = x.chunks_exact(16).map(|s| signed_max(s) / -32.0).collect();
        let max_scale = signed_max(&scales);
        let iscale = if max_scale != 0.0 { -128.0 / max_scale } else { 0.0 };
        let d = if iscale != 0.0 { 1.0 / iscale } else { 0.0 };
        let sc: Vec<i8> = scales.iter().map(|&s| nearest(iscale * s).clamp(-128, 127) as i8).collect();
        let d16 = f16::from_f32(d).to_f32();
        let codes: Vec<u8> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let step = d16 * f32::from(sc[i / 16]);
                if step != 0.0 { (nearest(v / step).clamp(-32, 31) + 32) as u8 } else { 32 }
            })
            .collect();
        let mut ql = [0u8; 128];
        let mut qh = [0u8; 64];
        for h in 0..2 {
            for r in 0..4 {
                for l in 0..32 {
                    let q = codes[128 * h + 32 * r + l];
                    ql[64 * h + 32 * (r % 2) + l] |= (q & 0xF) << (4 * (r / 2));
                    qh[32 * h + l] |= (q >> 4) << (2 * r);
                }
            }
        }
        out.extend(ql);
        out.extend(qh);
        out.extend(sc.iter().map(|&s| s as u8));
        out.extend(f16::from_f32(d).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = vec![0u8; 210];
        block[208..].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        // Element 128 + 3·32 + 20 (half 1, quarter 3, second 16): ql[64 + 32 + 20] high
        // nibble, qh[32 + 20] bits 6..7, scale 8 + 6 + 1.
        block[64 + 32 + 20] = 0xB0;
        block[128 + 32 + 20] = 0b10 << 6;
        block[192 + 15] = (-3i8) as u8;
        // Element 5 (half 0, quarter 0): ql[5] low nibble, qh[5] bits 0..1, scale 0.
        block[5] = 0x01;
        block[128 + 5] = 0b11;
        block[192] = 7;
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[244], 0.5 * -3.0 * ((0xB | 0b10 << 4) - 32) as f32);
        assert_eq!(values[5], 0.5 * 7.0 * ((1 | 0b11 << 4) - 32) as f32);
        assert_eq!(values[6], 0.5 * 7.0 * -32.0);
        assert_eq!(values[100], 0.0); // scale 0
    }
}
