//! IQ2_XS (ggml `block_iq2_xs`, GGUF type 17), 256 elements in 74 bytes: each u16 picks 8
//! magnitudes from a 512-entry codebook and their signs, with a 4-bit scale per 16 elements:
//!
//! ```text
//! d: f16 | qs: [u16; 32] (LE) | scales: [u8; 8]
//! sub-block j (32 elements), group l (8 elements), q = qs[4j + l]:
//!   db = d·(0.5 + ((scales[j] >> 4·(l/2)) & 0xF))·0.25
//!   x[8l + e] = db · IQ2XS_GRID[q & 511][e] · (bit e of ksigns(q >> 9) ? -1 : 1)
//! ```
//!
//! Grid values are 8, 25 and 43 (`iq_grids.rs`); `ksigns` adds an eighth sign bit that makes
//! the minus signs even. Two scales per 32 elements: the shader decodes whole values (its block
//! scale is 1). Shader: `shaders/formats/iq2_xs.wgsl`.

use half::f16;

use super::iq_grids::IQ2XS_GRID;
use super::{DType, Format, IQ2_VALUES, QK, QK_K, f16_at, grid_value, ksigns, nearest_entry, scale_code, sign_bits};

pub const FORMAT: Format = Format {
    dtype: DType::IQ2_XS,
    name: "IQ2_XS",
    ggml_type: 17,
    block_elems: QK_K,
    block_bytes: 2 + QK_K / 4 + QK_K / 32,
    decode,
    encode,
};

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let d = f16_at(block, 0);
        for j in 0..QK_K / QK {
            let s = block[66 + j];
            let db = [d * (0.5 + f32::from(s & 0xF)) * 0.25, d * (0.5 + f32::from(s >> 4)) * 0.25];
            for l in 0..4 {
                let q = u16::from_le_bytes([block[2 + 8 * j + 2 * l], block[3 + 8 * j + 2 * l]]);
                let (entry, signs) = (IQ2XS_GRID[usize::from(q & 511)], ksigns(q >> 9));
                out.extend((0..8).map(|e| {
                    let sign = if signs & (1 << e) != 0 { -1.0 } else { 1.0 };
                    db[l / 2] * f32::from(grid_value(entry, e, 2, &IQ2_VALUES)) * sign
                }));
            }
        }
    }
}

/// A plain encoder: per 16 elements a scale that puts the largest magnitude on the grid's top
/// value (43), rounded to 4 bits of the super-block's d; per 8 elements the nearest codebook
/// entry to the magnitudes and their signs, the smallest flipped where the minus signs are odd.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK_K) {
        let want: Vec<f32> = x.chunks_exact(16).map(|h| h.iter().fold(0f32, |a, v| a.max(v.abs())) / 43.0).collect();
        let d = f16::from_f32(want.iter().copied().fold(0f32, f32::max) / (15.5 * 0.25));
        let d32 = d.to_f32();
        let ls: Vec<u8> = want.iter().map(|&w| scale_code(w, d32 * 0.25, 0.5)).collect();
        out.extend(d.to_le_bytes());
        for (g, group) in x.chunks_exact(8).enumerate() {
            let db = d32 * (0.5 + f32::from(ls[g / 2])) * 0.25;
            let mags: Vec<f32> = group.iter().map(|v| if db > 0.0 { v.abs() / db } else { 0.0 }).collect();
            let index = nearest_entry(&IQ2XS_GRID, 2, &IQ2_VALUES, &mags) as u16;
            let signs = u16::from(sign_bits(group, true) & 0x7F);
            out.extend((index | (signs << 9)).to_le_bytes());
        }
        out.extend((0..QK_K / QK).map(|j| ls[2 * j] | (ls[2 * j + 1] << 4)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = vec![0u8; 74];
        block[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        // Sub-block 1, group 2 (elements 48..56): qs[6] = entry 2, sign index 3 (elements 0
        // and 1 negative; ksigns(3) has an even count, no eighth bit); its scale is the high
        // nibble of scales[1]: 5, so db = 2·5.5·0.25 = 2.75.
        block[2 + 12..2 + 14].copy_from_slice(&(2u16 | (3 << 9)).to_le_bytes());
        block[66 + 1] = 0x50;
        // Entry 2 is 0x0808080808081919: elements 0 and 1 are 0x19 = 25, the rest 8.
        assert_eq!(IQ2XS_GRID[2], 0b0101);
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(&values[48..51], &[2.75 * -25.0, 2.75 * -25.0, 2.75 * 8.0]);
        // Sign index 1: one minus sign, so ksigns sets the eighth.
        assert_eq!(ksigns(1), 0x81);
        // Scale nibble 0: db = 2·0.5·0.25; entry 0 is all 8s.
        assert_eq!(values[0], 0.25 * 8.0);
    }
}
