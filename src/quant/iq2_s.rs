//! IQ2_S (ggml `block_iq2_s`, GGUF type 22), 256 elements in 82 bytes: each 10-bit index picks
//! 8 magnitudes from a 1024-entry codebook, every element has its own sign bit, and a 4-bit
//! scale covers 16 elements:
//!
//! ```text
//! d: f16 | qs: [u8; 32] | signs: [u8; 32] | qh: [u8; 8] | scales: [u8; 8]
//! sub-block j (32 elements), group l (8 elements):
//!   db = d·(0.5 + ((scales[j] >> 4·(l/2)) & 0xF))·0.25
//!   index = qs[4j + l] | ((qh[j] >> 2l) & 3) << 8
//!   x[8l + e] = db · IQ2S_GRID[index][e] · (bit e of signs[4j + l] ? -1 : 1)
//! ```
//!
//! (ggml declares qs and signs as one array of 64 bytes.) Grid values are 8, 25 and 43
//! (`iq_grids.rs`). Two scales per 32 elements: the shader decodes whole values (its block
//! scale is 1). Shader: `shaders/formats/iq2_s.wgsl`.

use half::f16;

use super::iq_grids::IQ2S_GRID;
use super::{DType, Format, IQ2_VALUES, QK, QK_K, f16_at, grid_value, nearest_entry, scale_code, sign_bits};

pub const FORMAT: Format = Format {
    dtype: DType::IQ2_S,
    name: "IQ2_S",
    ggml_type: 22,
    block_elems: QK_K,
    block_bytes: 2 + QK_K / 4 + QK_K / 16,
    decode,
    encode,
};

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let d = f16_at(block, 0);
        let (qs, signs, qh, scales) = (&block[2..34], &block[34..66], &block[66..74], &block[74..82]);
        for j in 0..QK_K / QK {
            let s = scales[j];
            let db = [d * (0.5 + f32::from(s & 0xF)) * 0.25, d * (0.5 + f32::from(s >> 4)) * 0.25];
            for l in 0..4 {
                let index = usize::from(qs[4 * j + l]) | (usize::from((qh[j] >> (2 * l)) & 3) << 8);
                let sg = signs[4 * j + l];
                out.extend((0..8).map(|e| {
                    let sign = if sg & (1 << e) != 0 { -1.0 } else { 1.0 };
                    db[l / 2] * f32::from(grid_value(IQ2S_GRID[index], e, 2, &IQ2_VALUES)) * sign
                }));
            }
        }
    }
}

/// A plain encoder: per 16 elements a scale that puts the largest magnitude on the grid's top
/// value (43), rounded to 4 bits of the super-block's d; per 8 elements the nearest codebook
/// entry to the magnitudes, and every sign as it is.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK_K) {
        let want: Vec<f32> = x.chunks_exact(16).map(|h| h.iter().fold(0f32, |a, v| a.max(v.abs())) / 43.0).collect();
        let d = f16::from_f32(want.iter().copied().fold(0f32, f32::max) / (15.5 * 0.25));
        let d32 = d.to_f32();
        let ls: Vec<u8> = want.iter().map(|&w| scale_code(w, d32 * 0.25, 0.5)).collect();
        let (mut qs, mut qh) = ([0u8; 32], [0u8; 8]);
        for (g, group) in x.chunks_exact(8).enumerate() {
            let db = d32 * (0.5 + f32::from(ls[g / 2])) * 0.25;
            let mags: Vec<f32> = group.iter().map(|v| if db > 0.0 { v.abs() / db } else { 0.0 }).collect();
            let index = nearest_entry(&IQ2S_GRID, 2, &IQ2_VALUES, &mags);
            qs[g] = index as u8;
            qh[g / 4] |= ((index >> 8) as u8) << (2 * (g % 4));
        }
        out.extend(d.to_le_bytes());
        out.extend(qs);
        out.extend(x.chunks_exact(8).map(|group| sign_bits(group, false)));
        out.extend(qh);
        out.extend((0..QK_K / QK).map(|j| ls[2 * j] | (ls[2 * j + 1] << 4)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = vec![0u8; 82];
        block[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        // Sub-block 1, group 3 (elements 56..64): index qs[7] = 2 plus bits 6..7 of qh[1] = 3:
        // 770 (0x192b080819191908: 8, 25, 25, 25, 8, 8, 43, 25); signs[7] = 0b1000_0001;
        // scale: the high nibble of scales[1] = 5, db = 2·5.5·0.25 = 2.75.
        block[2 + 7] = 2;
        block[34 + 7] = 0x81;
        block[66 + 1] = 3 << 6;
        block[74 + 1] = 0x50;
        let mut values = Vec::new();
        decode(&block, &mut values);
        let want: Vec<f32> = [-8.0, 25.0, 25.0, 25.0, 8.0, 8.0, 43.0, -25.0].iter().map(|v| 2.75 * v).collect();
        assert_eq!(&values[56..64], &want[..]);
        // Sub-block 0: scale 0, db = 2·0.5·0.25; entry 0 is all 8s.
        assert_eq!(values[0], 0.25 * 8.0);
    }
}
