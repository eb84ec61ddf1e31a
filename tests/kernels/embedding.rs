//! Embedding gather for every table format. Decoding is exact (see matmul.rs), so the GPU must
//! equal `quant::dequantize` bit for bit: on encoded weights, and for the block formats on
//! random but valid blocks (every bit pattern of codes and packed scales).

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
            let ids: Vec<u32> = vec![0, 299, 7, 7, 150, 1];
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

#[test]
fn f32_table_matches_cpu() {
    check(DType::F32);
}

#[test]
fn f16_table_matches_cpu() {
    check(DType::F16);
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
