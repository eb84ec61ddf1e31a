//! Embedding gather for every table format. Decoding is exact (see matmul.rs), so the GPU must
//! equal `quant::dequantize` bit for bit: on encoded weights, and for the block formats on
//! random but valid blocks (every bit pattern of codes and packed scales). Ids past the table
//! read its row 0, as transformers gathers Gemma 3n's per-layer table.

use weft::DType;
use weft::gpu::Recording;
use weft::gpu::kernels::embedding::embedding;
use weft::tensor::TensorFactory;

use crate::common::*;

fn check(dtype: DType) {
    for setup in setups().into_iter().filter(|s| !s.window_x) {
        let Some(f) = setup.factory() else { continue };
        let widths: &[usize] = if dtype.block_elems() == 256 { &[256, 768] } else { &[32, 96, 576] };
        let tables =
            widths.iter().flat_map(|&k| [(k, false), (k, true)]).filter(|&(_, raw)| !raw || dtype.is_quantized());
        for (k, raw) in tables {
            let vocab = 300;
            let (bytes, table) =
                if raw { random_blocks(dtype, vocab * k, k as u64) } else { weights(dtype, vocab * k, k as u64) };
            // 300 and 1000 lie past the table: they read row 0.
            let ids: Vec<u32> = vec![0, 299, 7, 7, 150, 1, 300, 1000];
            let tt = setup.weights(f, &[vocab, k], dtype, &bytes);
            let it = f.upload_u32(&[ids.len()], &ids).unwrap();
            let out = f.zeros(&[ids.len(), k], DType::F32).unwrap();
            let mut rec = Recording::new();
            embedding(ctx(f), &mut rec, &tt, &it, &out).unwrap();
            run(f, &rec);
            assert!(
                read_f32(f, &out) == weft::cpu::embedding(&table, k, &ids),
                "{dtype} k={k} random blocks {raw}, {}",
                setup.name()
            );
        }
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// The shader decoders against outside truth directly: the blocks of
/// `tests/fixtures/quants/blocks.json` (gguf-py's dequantizers, see `tests/quant_fixtures.rs`),
/// one block a row (BF16's values 32 a row), gathered in every setup. Exact: each decoder computes ggml's products in
/// f32 and the gather writes them unchanged (a zero's sign aside, as there).
#[test]
fn every_decoder_matches_gguf_py_on_its_fixture_blocks() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/quants/blocks.json")).unwrap();
    let fixtures: serde_json::Value = serde_json::from_str(&text).unwrap();
    for setup in setups().into_iter().filter(|s| !s.window_x) {
        let Some(f) = setup.factory() else { continue };
        for dtype in DType::WEIGHTS {
            let Some(entry) = fixtures.get(dtype.name()) else { continue };
            let bytes = unhex(entry["bytes"].as_str().unwrap());
            let want: Vec<f32> = unhex(entry["values_f32_le"].as_str().unwrap())
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            // One block a row; plain floats (BF16) in rows of 32, the fewest a kernel reads.
            let k = dtype.block_elems().max(32);
            let rows = bytes.len() / dtype.size_bytes(k).unwrap();
            let ids: Vec<u32> = (0..rows as u32).rev().collect();
            let tt = setup.weights(f, &[rows, k], dtype, &bytes);
            let it = f.upload_u32(&[rows], &ids).unwrap();
            let out = f.zeros(&[rows, k], DType::F32).unwrap();
            let mut rec = Recording::new();
            embedding(ctx(f), &mut rec, &tt, &it, &out).unwrap();
            run(f, &rec);
            let got = read_f32(f, &out);
            for (i, &id) in ids.iter().enumerate() {
                let (g, w) = (&got[i * k..(i + 1) * k], &want[id as usize * k..(id as usize + 1) * k]);
                assert!(g == w, "{dtype} block {id}, {}: gpu {g:?}\ngguf-py {w:?}", setup.name());
            }
        }
    }
}

#[test]
fn f32_table_matches_cpu() {
    check(DType::F32);
}

#[test]
fn f16_table_matches_cpu() {
    check(DType::F16);
}

#[test]
fn bf16_table_matches_cpu() {
    check(DType::BF16);
}

#[test]
fn q8_0_table_matches_cpu() {
    check(DType::Q8_0);
}

#[test]
fn q4_0_table_matches_cpu() {
    check(DType::Q4_0);
}

#[test]
fn q4_1_table_matches_cpu() {
    check(DType::Q4_1);
}

#[test]
fn q5_0_table_matches_cpu() {
    check(DType::Q5_0);
}

#[test]
fn q5_1_table_matches_cpu() {
    check(DType::Q5_1);
}

#[test]
fn q2_k_table_matches_cpu() {
    check(DType::Q2_K);
}

#[test]
fn q3_k_table_matches_cpu() {
    check(DType::Q3_K);
}

#[test]
fn q4_k_table_matches_cpu() {
    check(DType::Q4_K);
}

#[test]
fn q5_k_table_matches_cpu() {
    check(DType::Q5_K);
}

#[test]
fn q6_k_table_matches_cpu() {
    check(DType::Q6_K);
}

#[test]
fn q8_k_table_matches_cpu() {
    check(DType::Q8_K);
}

#[test]
fn iq4_nl_table_matches_cpu() {
    check(DType::IQ4_NL);
}

#[test]
fn iq4_xs_table_matches_cpu() {
    check(DType::IQ4_XS);
}

#[test]
fn mxfp4_table_matches_cpu() {
    check(DType::MXFP4);
}

#[test]
fn iq2_xs_table_matches_cpu() {
    check(DType::IQ2_XS);
}

#[test]
fn iq3_xxs_table_matches_cpu() {
    check(DType::IQ3_XXS);
}

#[test]
fn iq3_s_table_matches_cpu() {
    check(DType::IQ3_S);
}

#[test]
fn iq2_s_table_matches_cpu() {
    check(DType::IQ2_S);
}
