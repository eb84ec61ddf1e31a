//! Q2_K (ggml `block_q2_K`, GGUF type 10), 256 elements in 84 bytes:
//!
//! ```text
//! scales: [u8; 16] | qs: [u8; 64] | d: f16 | dmin: f16
//! half h, quarter r (32 elements each), l < 32, s = scales[8h + 2r + l/16]:
//!   x = d·(s & 0xF) · ((qs[32h + l] >> 2r) & 3) - dmin·(s >> 4)
//! ```
//!
//! A scale and a min per 16 elements: the shader decodes whole values (its block scale is 1).
//! Shader: `shaders/formats/q2_k.wgsl`.

use half::f16;

use super::{DType, Format, QK_K, f16_at, nearest};

pub const FORMAT: Format = Format {
    dtype: DType::Q2_K,
    name: "Q2_K",
    ggml_type: 10,
    block_elems: QK_K,
    block_bytes: QK_K / 16 + QK_K / 4 + 2 + 2,
    decode,
    encode,
};

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let (scales, qs) = (&block[..16], &block[16..80]);
        let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
        for h in 0..2 {
            for r in 0..4 {
                out.extend((0..32).map(|l| {
                    let s = scales[8 * h + 2 * r + l / 16];
                    let (dl, ml) = (d * f32::from(s & 0xF), dmin * f32::from(s >> 4));
                    dl * f32::from((qs[32 * h + l] >> (2 * r)) & 3) - ml
                }));
            }
        }
    }
}

/// A plain encoder: per 16 elements the range [min(0, lo), hi] on 4 levels, scales and mins
/// rounded to 4 bits of the super-block's d and dmin.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK_K) {
        let subs: Vec<(f32, f32)> = x
            .chunks_exact(16)
            .map(|s| {
                let lo = s.iter().copied().fold(0f32, f32::min);
                let hi = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                ((hi - lo) / 3.0, -lo)
            })
            .collect();
        let d = subs.iter().map(|s| s.0).fold(0f32, f32::max) / 15.0;
        let dmin = subs.iter().map(|s| s.1).fold(0f32, f32::max) / 15.0;
        let (d16, dmin16) = (f16::from_f32(d).to_f32(), f16::from_f32(dmin).to_f32());
        let code = |v: f32, unit: f32| if unit > 0.0 { nearest(v / unit).clamp(0, 15) as u8 } else { 0 };
        let sm: Vec<(u8, u8)> = subs.iter().map(|&(s, m)| (code(s, d16), code(m, dmin16))).collect();
        let mut qs = [0u8; 64];
        for h in 0..2 {
            for r in 0..4 {
                for l in 0..32 {
                    let i = 128 * h + 32 * r + l;
                    let (sc, m) = sm[i / 16];
                    let step = d16 * f32::from(sc);
                    let q = if step > 0.0 { nearest((x[i] + dmin16 * f32::from(m)) / step).clamp(0, 3) } else { 0 };
                    qs[32 * h + l] |= (q as u8) << (2 * r);
                }
            }
        }
        // The 16 scale bytes run in element order: 16 elements each.
        out.extend(sm.iter().map(|&(sc, m)| sc | (m << 4)));
        out.extend(qs);
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(f16::from_f32(dmin).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = vec![0u8; 84];
        block[80..82].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        block[82..].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        // Element 128 + 32 + 20: half 1, quarter 1, second 16: scale byte 8 + 2 + 1, code
        // (qs[32 + 20] >> 2) & 3.
        block[11] = 0x3A; // scale 10, min 3
        block[16 + 32 + 20] = 0b11 << 2;
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[180], 0.5 * 10.0 * 3.0 - 0.25 * 3.0);
        assert_eq!(values[181], -0.75); // code 0, same scale byte
        assert_eq!(values[0], 0.0);
    }
}
