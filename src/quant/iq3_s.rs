//! IQ3_S (ggml `block_iq3_s`, GGUF type 21), 256 elements in 110 bytes: each 9-bit index picks
//! 4 magnitudes from a 512-entry codebook, every element has its own sign bit, and a 4-bit
//! scale covers 32 elements:
//!
//! ```text
//! d: f16 | qs: [u8; 64] | qh: [u8; 8] | signs: [u8; 32] | scales: [u8; 4]
//! sub-block j (32 elements), db = d·(1 + 2·((scales[j/2] >> 4·(j%2)) & 0xF))
//!   group g (4 elements): index = qs[8j + g] | ((qh[j] >> g) & 1) << 8
//!   x[4g + e] = db · IQ3S_GRID[index][e] · (bit 4·(g%2) + e of signs[4j + g/2] ? -1 : 1)
//! ```
//!
//! Grid values are 1, 3, …, 15 (`iq_grids.rs`). Shader: `shaders/formats/iq3_s.wgsl`.

use half::f16;

use super::iq_grids::IQ3S_GRID;
use super::{DType, Format, QK, QK_K, f16_at, grid_value, nearest_entry, scale_code, sign_bits};

pub const FORMAT: Format = Format {
    dtype: DType::IQ3_S,
    name: "IQ3_S",
    ggml_type: 21,
    block_elems: QK_K,
    block_bytes: 2 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64,
    decode,
    encode,
};

/// The values of the bytes of ggml's `iq3s_grid`, by the 3-bit index `iq_grids.rs` stores.
const VALUES: [u8; 8] = [1, 3, 5, 7, 9, 11, 13, 15];

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let d = f16_at(block, 0);
        let (qs, qh, signs, scales) = (&block[2..66], &block[66..74], &block[74..106], &block[106..110]);
        for j in 0..QK_K / QK {
            let db = d * (1 + 2 * ((scales[j / 2] >> (4 * (j % 2))) & 0xF) as i32) as f32;
            for g in 0..8 {
                let index = usize::from(qs[8 * j + g]) | (usize::from((qh[j] >> g) & 1) << 8);
                let s = signs[4 * j + g / 2] >> (4 * (g % 2));
                out.extend((0..4).map(|e| {
                    let sign = if s & (1 << e) != 0 { -1.0 } else { 1.0 };
                    db * f32::from(grid_value(IQ3S_GRID[index], e, 3, &VALUES)) * sign
                }));
            }
        }
    }
}

/// A plain encoder: per 32 elements a scale that puts the largest magnitude on the grid's top
/// value (15), rounded to 4 bits of the super-block's d; per 4 elements the nearest codebook
/// entry to the magnitudes, and every sign as it is.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK_K) {
        let want: Vec<f32> = x.chunks_exact(QK).map(|s| s.iter().fold(0f32, |a, v| a.max(v.abs())) / 15.0).collect();
        let d = f16::from_f32(want.iter().copied().fold(0f32, f32::max) / 31.0);
        let d32 = d.to_f32();
        let ls: Vec<u8> = want.iter().map(|&w| scale_code(w, d32 * 2.0, 0.5)).collect();
        let (mut qs, mut qh) = ([0u8; 64], [0u8; 8]);
        for (j, sub) in x.chunks_exact(QK).enumerate() {
            let db = d32 * (1 + 2 * i32::from(ls[j])) as f32;
            for (g, quad) in sub.chunks_exact(4).enumerate() {
                let mags: Vec<f32> = quad.iter().map(|v| if db > 0.0 { v.abs() / db } else { 0.0 }).collect();
                let index = nearest_entry(&IQ3S_GRID, 3, &VALUES, &mags);
                qs[8 * j + g] = index as u8;
                qh[j] |= ((index >> 8) as u8) << g;
            }
        }
        out.extend(d.to_le_bytes());
        out.extend(qs);
        out.extend(qh);
        out.extend(x.chunks_exact(8).map(|group| sign_bits(group, false)));
        out.extend((0..QK_K / 64).map(|p| ls[2 * p] | (ls[2 * p + 1] << 4)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = vec![0u8; 110];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        // Sub-block 3, group 5 (elements 116..120): index qs[29] = 2 plus bit 5 of qh[3]:
        // 258 (0x0509070b: 11, 7, 9, 5); signs[14] high nibble 0b0011 (elements 0 and 1
        // negative); scale: the high nibble of scales[1] = 2, db = 0.5·5.
        block[2 + 29] = 2;
        block[66 + 3] = 1 << 5;
        block[74 + 14] = 0x30;
        block[106 + 1] = 0x20;
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(&values[116..120], &[2.5 * -11.0, 2.5 * -7.0, 2.5 * 9.0, 2.5 * 5.0]);
        // Sub-block 0: scale 0, db = 0.5; entry 0 is all 1s.
        assert_eq!(values[0], 0.5);
    }
}
