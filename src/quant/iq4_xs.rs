//! IQ4_XS (ggml `block_iq4_xs`, GGUF type 23), 256 elements in 136 bytes: IQ4_NL's grid with
//! a 6-bit scale per 32 elements:
//!
//! ```text
//! d: f16 | scales_h: u16 (LE) | scales_l: [u8; 4] | qs: [u8; 128]
//! sub-block j: ls = (scales_l[j/2] >> 4·(j%2)) & 0xF | ((scales_h >> 2j) & 3) << 4
//!   x = d·(ls - 32) · IQ4_GRID[nibble(l) of qs[16j .. 16j + 16]]   (nibbles as in Q4_0)
//! ```
//!
//! Shader: `shaders/formats/iq4_xs.wgsl`.

use half::f16;

use super::{DType, Format, IQ4_GRID, QK, QK_K, f16_at, nearest, nearest_iq4, nibble, pack_nibbles, signed_max};

pub const FORMAT: Format = Format {
    dtype: DType::IQ4_XS,
    name: "IQ4_XS",
    ggml_type: 23,
    block_elems: QK_K,
    block_bytes: 2 + 2 + QK_K / 64 + QK_K / 2,
    decode,
    encode,
};

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let d = f16_at(block, 0);
        let scales_h = u16::from_le_bytes([block[2], block[3]]);
        for j in 0..QK_K / QK {
            let ls = ((block[4 + j / 2] >> (4 * (j % 2))) & 0xF) as i32 | ((((scales_h >> (2 * j)) & 3) << 4) as i32);
            let dl = d * (ls - 32) as f32;
            let qs = &block[8 + 16 * j..][..16];
            out.extend((0..QK).map(|i| dl * f32::from(IQ4_GRID[nibble(qs, i) as usize])));
        }
    }
}

/// A plain encoder: per sub-block the signed extreme maps to the grid's -127; the sub-block
/// scales are rounded to 6 signed bits of the super-block's d.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK_K) {
        let scales: Vec<f32> = x.chunks_exact(QK).map(|s| signed_max(s) / -127.0).collect();
        let amax = scales.iter().fold(0f32, |a, s| a.max(s.abs()));
        let d = amax / 31.0;
        let d16 = f16::from_f32(d).to_f32();
        let ls: Vec<i32> =
            scales.iter().map(|&s| if d16 != 0.0 { nearest(s / d16).clamp(-32, 31) } else { 0 }).collect();
        let scales_h = ls.iter().enumerate().fold(0u16, |h, (j, &l)| h | ((((l + 32) as u16) >> 4) << (2 * j)));
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(scales_h.to_le_bytes());
        out.extend((0..4).map(|p| (((ls[2 * p] + 32) & 0xF) | (((ls[2 * p + 1] + 32) & 0xF) << 4)) as u8));
        for (j, sub) in x.chunks_exact(QK).enumerate() {
            let step = d16 * ls[j] as f32;
            let codes: Vec<u8> = sub.iter().map(|&v| if step != 0.0 { nearest_iq4(v / step) } else { 8 }).collect();
            out.extend(pack_nibbles(&codes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = vec![0u8; 136];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        // Sub-block 5: ls low nibble from the high half of scales_l[2], top bits 10..11 of
        // scales_h: 0b01_0011 = 19, so dl = 0.5 · (19 - 32).
        block[4 + 2] = 0x3 << 4;
        block[2..4].copy_from_slice(&(0b01u16 << 10).to_le_bytes());
        block[8 + 16 * 5 + 2] = 0xE1; // element 2: grid[1] = -104; element 18: grid[14] = 89
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[160 + 2], 0.5 * -13.0 * -104.0);
        assert_eq!(values[160 + 18], 0.5 * -13.0 * 89.0);
        // Sub-block 0: ls = 0, dl = -16; nibble 0 is grid[0] = -127.
        assert_eq!(values[0], -16.0 * -127.0);
    }
}
