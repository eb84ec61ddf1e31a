//! Embedding gather for every table format. Decoding is exact (see matmul.rs), so the GPU must
//! equal `quant::dequantize` bit for bit.

use weft::DType;
use weft::gpu::Recording;
use weft::gpu::kernels::embedding::embedding;
use weft::tensor::TensorFactory;

use crate::common::*;

fn check(dtype: DType) {
    for setup in setups().into_iter().filter(|s| !s.window_x) {
        let Some(f) = setup.factory() else { return };
        for k in [32, 96, 576] {
            let vocab = 300;
            let (bytes, table) = weights(dtype, vocab * k, k as u64);
            let ids: Vec<u32> = vec![0, 299, 7, 7, 150, 1];
            let tt = setup.weights(f, &[vocab, k], dtype, &bytes);
            let it = f.upload_u32(&[ids.len()], &ids).unwrap();
            let out = f.zeros(&[ids.len(), k], DType::F32).unwrap();
            let mut rec = Recording::new();
            embedding(ctx(f), &mut rec, &tt, &it, &out).unwrap();
            run(f, &rec);
            assert!(read_f32(f, &out) == weft::cpu::embedding(&table, k, &ids), "{dtype} k={k}, {}", setup.name());
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
