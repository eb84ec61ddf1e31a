//! Batch invariance (DESIGN.md principle 3): a row's result is bit-identical whether it is
//! computed alone or among other rows, for matmul in every format, RMSNorm and attention.

use weft::DType;
use weft::gpu::kernels::matmul::matmul;
use weft::gpu::kernels::reduce::rms_norm;
use weft::gpu::Recording;
use weft::tensor::TensorFactory;

use crate::common::*;

#[test]
fn matmul_rows_are_bit_identical_alone_and_in_a_batch() {
    let Some(f) = gpu() else { return };
    let (k, n, m) = (256, 96, 37);
    for dtype in DType::WEIGHTS {
        let (w_bytes, _) = weights(dtype, n * k, 5);
        let wt = f.upload(&[n, k], dtype, &w_bytes).unwrap();
        let x = random(m * k, 6, 1.0);
        let batch = {
            let xt = f.upload_f32(&[m, k], &x).unwrap();
            let yt = f.zeros(&[m, n], DType::F32).unwrap();
            let mut rec = Recording::new();
            matmul(ctx(f), &mut rec, &xt, &wt, &yt).unwrap();
            run(f, &rec);
            read_f32(f, &yt)
        };
        // Rows at every position of the 4-row tile, alone.
        for r in [0, 1, 2, 3, 17, 36] {
            let xt = f.upload_f32(&[1, k], &x[r * k..(r + 1) * k]).unwrap();
            let yt = f.zeros(&[1, n], DType::F32).unwrap();
            let mut rec = Recording::new();
            matmul(ctx(f), &mut rec, &xt, &wt, &yt).unwrap();
            run(f, &rec);
            let alone = read_f32(f, &yt);
            let same = alone.iter().zip(&batch[r * n..(r + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{dtype}: row {r} differs alone vs in a batch of {m}");
        }
    }
}

#[test]
fn rms_norm_rows_are_bit_identical_alone_and_in_a_batch() {
    let Some(f) = gpu() else { return };
    let (rows, n) = (9, 576);
    let x = random(rows * n, 8, 2.0);
    let wt = f.upload_f32(&[n], &random(n, 9, 1.0)).unwrap();
    let norm = |x: &[f32], rows: usize| {
        let xt = f.upload_f32(&[rows, n], x).unwrap();
        let yt = f.zeros(&[rows, n], DType::F32).unwrap();
        let mut rec = Recording::new();
        rms_norm(ctx(f), &mut rec, &xt, &wt, &yt, 1e-5).unwrap();
        run(f, &rec);
        read_f32(f, &yt)
    };
    let batch = norm(&x, rows);
    for r in [0, 4, 8] {
        assert!(norm(&x[r * n..(r + 1) * n], 1) == batch[r * n..(r + 1) * n], "row {r}");
    }
}

#[test]
fn attention_is_bit_identical_alone_and_in_a_batch() {
    let Some(f) = gpu() else { return };
    let filled = crate::paged::fill(f, &[5, 33, 70]);
    let queries = [(0, 4), (1, 32), (2, 69), (2, 10)];
    // Same seed: the batch's first query row equals the lone query's row.
    let (_, batch) = crate::paged::attend(f, &filled, &queries, None, 11);
    let (_, alone) = crate::paged::attend(f, &filled, &queries[..1], None, 11);
    let row = alone.len();
    assert!(alone.iter().zip(&batch[..row]).all(|(a, b)| a.to_bits() == b.to_bits()));
}
