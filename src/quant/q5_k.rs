//! Q5_K (ggml `block_q5_K`, GGUF type 13), 256 elements in 176 bytes:
//!
//! ```text
//! d: f16 | dmin: f16 | scales: [u8; 12] | qh: [u8; 32] | qs: [u8; 128]
//! sub-block j, (sc, m) = scale_min_k4(j, scales) as in Q4_K, l < 32:
//!   x = d·sc · q - dmin·m,  q = (qs[32·(j/2) + l] >> 4·(j%2)) & 0xF | (bit j of qh[l]) << 4
//! ```
//!
//! Shader: `shaders/formats/q5_k.wgsl`.

use half::f16;

use super::q4_k::{codes, scales_and_mins};
use super::{DType, Format, QK, QK_K, f16_at, pack_scale_min_k4, scale_min_k4};

pub const FORMAT: Format = Format {
    dtype: DType::Q5_K,
    name: "Q5_K",
    ggml_type: 13,
    block_elems: QK_K,
    block_bytes: 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
    decode,
    encode,
};

fn decode(bytes: &[u8], out: &mut Vec<f32>) {
    for block in bytes.chunks_exact(FORMAT.block_bytes) {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let (scales, qh, qs) = (&block[4..16], &block[16..48], &block[48..]);
        for j in 0..QK_K / QK {
            let (sc, m) = scale_min_k4(j, scales);
            let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
            let shift = 4 * (j % 2);
            out.extend((0..32).map(|l| {
                let q = ((qs[32 * (j / 2) + l] >> shift) & 0xF) | (((qh[l] >> j) & 1) << 4);
                d1 * f32::from(q) - m1
            }));
        }
    }
}

/// A plain encoder, as Q4_K's on 32 levels.
fn encode(values: &[f32], out: &mut Vec<u8>) {
    for x in values.chunks_exact(QK_K) {
        let (d, dmin, sc, m) = scales_and_mins(x, 31.0, 63.0);
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(f16::from_f32(dmin).to_le_bytes());
        out.extend(pack_scale_min_k4(&sc, &m));
        let codes = codes(x, f16::from_f32(d).to_f32(), f16::from_f32(dmin).to_f32(), &sc, &m, 31);
        out.extend((0..32).map(|l| (0..8).fold(0u8, |h, j| h | ((codes[32 * j + l] >> 4) << j))));
        for pair in codes.chunks_exact(64) {
            out.extend((0..32).map(|l| (pair[l] & 0xF) | ((pair[32 + l] & 0xF) << 4)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_decodes_by_hand() {
        let mut block = f16::from_f32(0.5).to_le_bytes().to_vec();
        block.extend(f16::from_f32(0.25).to_le_bytes());
        let mut scales = [0u8; 12];
        scales[3] = 2; // sub-block 3: scale 2, min 1
        scales[7] = 1;
        block.extend(scales);
        let mut qh = [0u8; 32];
        qh[4] = 1 << 3; // element 3·32 + 4 gets 16
        block.extend(qh);
        let mut qs = [0u8; 128];
        qs[32 + 4] = 0x50; // sub-block 3 (odd) reads the high nibble of qs[32 + l]
        qs[32 + 5] = 0x0F; // ... so element 3·32 + 5 sees 0
        block.extend(qs);
        let mut values = Vec::new();
        decode(&block, &mut values);
        assert_eq!(values[100], 0.5 * 2.0 * 21.0 - 0.25);
        assert_eq!(values[101], -0.25);
        assert_eq!(values[68], 0.0); // sub-block 2 has scale and min 0
    }
}
