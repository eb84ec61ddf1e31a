//! Q4_K (ggml `block_q4_K`, GGUF type 12), 256 elements in 144 bytes:
//!
//! ```text
//! d: f16 | dmin: f16 | scales: [u8; 12] | qs: [u8; 128]
//! sub-block j (elements 32j .. 32j + 32), (sc, m) = scale_min_k4(j, scales) (6 bits each):
//!   x = d·sc · q - dmin·m,  q = qs[32·(j/2) + l] & 0xF for even j, >> 4 for odd j (l < 32)
//! ```
//!
//! Shader: `shaders/formats/q4_k.wgsl`.

use half::f16;

use super::{DType, Format, QK, QK_K, f16_at, nearest, pack_scale_min_k4, scale_min_k4};

pub const FORMAT: Format = Format {
    dtype: DType::Q4_K,
    name: "Q4_K",
    ggml_type: 12,
    block_elems: QK_K,
    block_bytes: 2 + 2 + 12 + QK_K / 2,
    decode,
    encode,
};

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let (scales, qs) = (&block[4..16], &block[16..]);
        for j in 0..QK_K / QK {
            let (sc, m) = scale_min_k4(j, scales);
            let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
            let shift = 4 * (j % 2);
            out.extend(qs[32 * (j / 2)..][..32].iter().map(|&q| d1 * f32::from((q >> shift) & 0xF) - m1));
        }
    }
}

/// A plain encoder: per sub-block the range [min(0, lo), hi] on 16 levels, its scale and min
/// rounded to 6 bits of the super-block's d and dmin.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK_K) {
        let (d, dmin, sc, m) = scales_and_mins(x, 15.0, 63.0);
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(f16::from_f32(dmin).to_le_bytes());
        out.extend(pack_scale_min_k4(&sc, &m));
        let codes = codes(x, f16::from_f32(d).to_f32(), f16::from_f32(dmin).to_f32(), &sc, &m, 15);
        for pair in codes.chunks_exact(64) {
            out.extend((0..32).map(|l| pair[l] | (pair[32 + l] << 4)));
        }
    }
}

/// The super-block scales and 6-bit sub-block scales and mins of Q4_K / Q5_K: each 32-element
/// sub-block spans [min(0, lo), hi] on `levels` + 1 codes.
pub(super) fn scales_and_mins(x: &[f32], levels: f32, max_code: f32) -> (f32, f32, [u8; 8], [u8; 8]) {
    let mut scale = [0f32; 8];
    let mut min = [0f32; 8];
    for (j, sub) in x.chunks_exact(QK).enumerate() {
        let lo = sub.iter().copied().fold(0f32, f32::min);
        let hi = sub.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        scale[j] = (hi - lo) / levels;
        min[j] = -lo;
    }
    let d = scale.iter().copied().fold(0f32, f32::max) / max_code;
    let dmin = min.iter().copied().fold(0f32, f32::max) / max_code;
    let code = |v: f32, unit: f32| if unit > 0.0 { nearest(v / unit).clamp(0, max_code as i32) as u8 } else { 0 };
    let d16 = f16::from_f32(d).to_f32();
    let dmin16 = f16::from_f32(dmin).to_f32();
    (d, dmin, scale.map(|s| code(s, d16)), min.map(|m| code(m, dmin16)))
}

/// The codes of every element given the rounded scales: q = round((x + dmin·m) / (d·sc)).
pub(super) fn codes(x: &[f32], d: f32, dmin: f32, sc: &[u8; 8], m: &[u8; 8], max_code: i32) -> Vec<u8> {
    x.chunks_exact(QK)
        .enumerate()
        .flat_map(|(j, sub)| {
            let (step, offset) = (d * f32::from(sc[j]), dmin * f32::from(m[j]));
            sub.iter().map(move |&v| if step > 0.0 { nearest((v + offset) / step).clamp(0, max_code) as u8 } else { 0 })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = f16::from_f32(0.5).to_le_bytes().to_vec();
        block.extend(f16::from_f32(0.25).to_le_bytes());
        // Sub-block 0: scale 3, min 4 (bytes 0 and 4); sub-block 5: scale 0x25 (low nibble of
        // byte 9, top bits 0b10 in byte 1), min 0x13 (high nibble of byte 9, top bits 0b01 in byte 5).
        let mut scales = [0u8; 12];
        scales[0] = 3;
        scales[4] = 4;
        scales[9] = 0x5 | (0x3 << 4);
        scales[1] = 0b10 << 6;
        scales[5] = 0b01 << 6;
        block.extend(scales);
        let mut qs = [0u8; 128];
        qs[0] = 0x7A; // element 0: low nibble 10; element 32: high nibble 7
        qs[64 + 3] = 0x90; // element 160 + 3 (sub-block 5, odd): high nibble 9
        block.extend(qs);
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[0], 0.5 * 3.0 * 10.0 - 0.25 * 4.0);
        assert_eq!(values[163], 0.5 * 37.0 * 9.0 - 0.25 * 19.0);
        assert_eq!(values[164], -0.25 * 19.0);
        // Sub-block 1 has scale and min 0 (its top bits are byte 1's and 5's low 6: zero).
        assert_eq!(values[32], 0.0);
    }
}
