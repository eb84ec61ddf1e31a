//! IQ3_XXS (ggml `block_iq3_xxs`, GGUF type 18), 256 elements in 98 bytes: each byte picks 4
//! magnitudes from a 256-entry codebook; per 32 elements a u32 holds four 7-bit sign indices
//! and a 4-bit scale:
//!
//! ```text
//! d: f16 | qs: [u8; 64] | scales_and_signs: [u32; 8] (LE)
//! sub-block j (32 elements), a = scales_and_signs[j], db = d·(0.5 + (a >> 28))·0.5
//!   group l (8 elements): signs = ksigns((a >> 7l) & 127)
//!   x[8l + e] = db · IQ3XXS_GRID[qs[8j + 2l + e/4]][e % 4] · (bit e of signs ? -1 : 1)
//! ```
//!
//! Grid values are 4, 12, …, 52 and 62 (`iq_grids.rs`); `ksigns` adds an eighth sign bit that
//! makes the minus signs even. Shader: `shaders/formats/iq3_xxs.wgsl`.

use half::f16;

use super::iq_grids::IQ3XXS_GRID;
use super::{DType, Format, QK, QK_K, f16_at, grid_value, ksigns, nearest_entry, scale_code, sign_bits};

pub const FORMAT: Format = Format {
    dtype: DType::IQ3_XXS,
    name: "IQ3_XXS",
    ggml_type: 18,
    block_elems: QK_K,
    block_bytes: 2 + QK_K / 4 + QK_K / 8,
    decode,
    encode,
};

/// The values of the bytes of ggml's `iq3xxs_grid`, by the 3-bit index `iq_grids.rs` stores.
const VALUES: [u8; 8] = [4, 12, 20, 28, 36, 44, 52, 62];

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let d = f16_at(block, 0);
        for j in 0..QK_K / QK {
            let a = u32::from_le_bytes(block[66 + 4 * j..70 + 4 * j].try_into().expect("4 bytes"));
            let db = d * (0.5 + (a >> 28) as f32) * 0.5;
            for l in 0..4 {
                let signs = ksigns(((a >> (7 * l)) & 127) as u16);
                out.extend((0..8).map(|e| {
                    let entry = IQ3XXS_GRID[usize::from(block[2 + 8 * j + 2 * l + e / 4])];
                    let sign = if signs & (1 << e) != 0 { -1.0 } else { 1.0 };
                    db * f32::from(grid_value(entry, e % 4, 3, &VALUES)) * sign
                }));
            }
        }
    }
}

/// A plain encoder: per 32 elements a scale that puts the largest magnitude on the grid's top
/// value (62), rounded to 4 bits of the super-block's d; per 4 elements the nearest codebook
/// entry to the magnitudes, per 8 their signs, the smallest flipped where the minus signs are
/// odd.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK_K) {
        let want: Vec<f32> = x.chunks_exact(QK).map(|s| s.iter().fold(0f32, |a, v| a.max(v.abs())) / 62.0).collect();
        let d = f16::from_f32(want.iter().copied().fold(0f32, f32::max) / (15.5 * 0.5));
        let d32 = d.to_f32();
        let ls: Vec<u8> = want.iter().map(|&w| scale_code(w, d32 * 0.5, 0.5)).collect();
        out.extend(d.to_le_bytes());
        let mut aux = [0u32; QK_K / QK];
        for (j, sub) in x.chunks_exact(QK).enumerate() {
            let db = d32 * (0.5 + f32::from(ls[j])) * 0.5;
            for (q, quad) in sub.chunks_exact(4).enumerate() {
                let mags: Vec<f32> = quad.iter().map(|v| if db > 0.0 { v.abs() / db } else { 0.0 }).collect();
                out.push(nearest_entry(&IQ3XXS_GRID, 3, &VALUES, &mags) as u8);
                if q % 2 == 1 {
                    let signs = u32::from(sign_bits(&sub[4 * q - 4..4 * q + 4], true) & 0x7F);
                    aux[j] |= signs << (7 * (q / 2));
                }
            }
            aux[j] |= u32::from(ls[j]) << 28;
        }
        out.extend(aux.iter().flat_map(|a| a.to_le_bytes()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = vec![0u8; 98];
        block[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        // Sub-block 2, group 1 (elements 72..80): entries qs[18] = 1 (0x04040414: element 0
        // is 20, the rest 4) and qs[19] = 0 (all 4); sign index 3 (elements 0 and 1 negative);
        // scale 3, so db = 2·3.5·0.5 = 3.5.
        block[2 + 18] = 1;
        let a = (3u32 << 28) | (3 << 7);
        block[66 + 8..70 + 8].copy_from_slice(&a.to_le_bytes());
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(&values[72..77], &[3.5 * -20.0, 3.5 * -4.0, 3.5 * 4.0, 3.5 * 4.0, 3.5 * 4.0]);
        // Sub-block 0: scale 0, db = 2·0.5·0.5; entry 0 is all 4s.
        assert_eq!(values[0], 0.5 * 4.0);
    }
}
