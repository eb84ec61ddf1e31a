//! Batch invariance (DESIGN.md principle 3): a row's result is bit-identical whether it is
//! computed alone or among other rows, for matmul in every format, RMSNorm and attention.

use weft::DType;
use weft::gpu::kernels::matmul::matmul;
use weft::gpu::kernels::reduce::rms_norm;
use weft::gpu::{KernelFamily, Recording};
use weft::tensor::TensorFactory;

use crate::common::*;

/// A row's sum order comes from the kernel's tile and the block size, not from how a format
/// decodes, and compiling every format's variants in every setup takes lavapipe minutes: CI
/// checks a float, a half, a 32-element block, a super-block and MXFP4's 32-element block
/// with its shared exponent; `WEFT_FULL=1` every format.
#[test]
fn matmul_rows_are_bit_identical_alone_and_in_a_batch() {
    let full = std::env::var("WEFT_FULL").as_deref() == Ok("1");
    let formats: Vec<DType> = if full {
        DType::WEIGHTS.to_vec()
    } else {
        vec![DType::F32, DType::F16, DType::Q4_0, DType::Q4_K, DType::MXFP4]
    };
    // 37 rows of k = 1536 span four uniform windows of 10 rows; k = 288, one. In the baseline
    // family 37 rows are tiled and a lone row is not: k = 288 ends in a part chunk (9 blocks
    // in chunks of 4; the super-block formats take 512), k = 1536 in a part round (12 chunks
    // for 8 lanes).
    for (k, n, m) in [(288_usize, 96, 37), (1536, 40, 37)] {
        for setup in setups() {
            let Some(f) = setup.factory() else { continue };
            for &dtype in &formats {
                let k = k.next_multiple_of(dtype.block_elems());
                let (w_bytes, _) = weights(dtype, n * k, 5);
                let wt = setup.weights(f, &[n, k], dtype, &w_bytes);
                let x = random(m * k, 6, 1.0);
                let run_rows = |x: &[f32], rows: usize| {
                    let xt = setup.x(f, &[rows, k], x);
                    let yt = f.zeros(&[rows, n], DType::F32).unwrap();
                    let mut rec = Recording::new();
                    matmul(ctx(f), &mut rec, &xt, &wt, &yt).unwrap();
                    run(f, &rec);
                    read_f32(f, &yt)
                };
                let batch = run_rows(&x, m);
                // Rows at every position of a 4-row tile and of a window, alone.
                for r in [0, 1, 2, 3, 9, 10, 17, 36] {
                    let alone = run_rows(&x[r * k..(r + 1) * k], 1);
                    let same = alone.iter().zip(&batch[r * n..(r + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{dtype} k={k}: row {r} differs alone vs in a batch of {m}, {}", setup.name());
                }
            }
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

/// At head sizes 64 (9 heads over 3 KV heads; a long context of 900) and 512 (2 over 1:
/// Gemma 4's full layers; 300, still split in the GPU families, keeps lavapipe's time down).
#[test]
fn attention_is_bit_identical_alone_and_in_a_batch() {
    use weft::gpu::kernels::paged::QkvLayout;
    for family in [KernelFamily::Cpu, KernelFamily::Baseline, KernelFamily::Subgroup] {
        let Some(f) = gpu_with_family(family) else { continue };
        let split = family.splits_attention();
        for (layout, long) in [
            (QkvLayout { num_heads: 9, num_kv_heads: 3, head_dim: 64 }, 900),
            (QkvLayout { num_heads: 2, num_kv_heads: 1, head_dim: 512 }, 300),
        ] {
            let filled = crate::paged::fill_layout(f, &[5, 33, 70, long], DType::F32, layout);
            // The first query (a split one where splitting is on) alone and among others.
            for queries in [[(0, 4), (1, 32), (2, 69), (2, 10)], [(3, long - 1), (1, 32), (3, 10), (2, 69)]] {
                // Same seed: the batch's first query row equals the lone query's row.
                let (_, batch, _) = crate::paged::attend(f, &filled, &queries, None, split, 11, false);
                let (_, alone, _) = crate::paged::attend(f, &filled, &queries[..1], None, split, 11, false);
                let row = alone.len();
                let same = alone.iter().zip(&batch[..row]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{family:?} {layout:?}: {:?} alone differs from in a batch", queries[0]);
            }
        }
    }
}

/// Chunk invariance of flash attention (the GPU families'): each token of a 40-token prefill
/// chunk, its rows sharing workgroups and K/V tiles with its neighbours' and, split-K, over
/// the last 40 positions of 900, has the bits it has decoded alone; at head sizes 64 (rows
/// straddling tokens: 16 rows, 3 heads a token), 256 (4 rows, the 4 heads of a token) and 512
/// (2 rows, the 2 heads of a token; of 300 positions, still split, for lavapipe's time), with
/// a sliding window too.
#[test]
fn attention_prefill_rows_are_bit_identical_to_decodes() {
    use weft::gpu::kernels::paged::QkvLayout;
    for family in [KernelFamily::Baseline, KernelFamily::Subgroup] {
        let Some(f) = gpu_with_family(family) else { continue };
        for (layout, len) in [
            (QkvLayout { num_heads: 9, num_kv_heads: 3, head_dim: 64 }, 900),
            (QkvLayout { num_heads: 4, num_kv_heads: 1, head_dim: 256 }, 900),
            (QkvLayout { num_heads: 2, num_kv_heads: 1, head_dim: 512 }, 300),
        ] {
            let filled = crate::paged::fill_layout(f, &[5, len], DType::F32, layout);
            let chunk: Vec<(usize, usize)> = (len - 40..len).map(|p| (1, p)).collect();
            for window in [None, Some(100)] {
                let (q, batch, _) = crate::paged::attend_with_q(f, &filled, &chunk, window, None);
                let row = layout.num_heads * layout.head_dim;
                for t in [0, 1, 15, 16, 17, 39] {
                    let q_t = &q[t * row..(t + 1) * row];
                    let (_, alone, _) = crate::paged::attend_with_q(f, &filled, &chunk[t..=t], window, Some(q_t));
                    let same =
                        alone.iter().zip(&batch[t * row..(t + 1) * row]).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{family:?} {layout:?} window {window:?}: token {} alone differs", chunk[t].1);
                }
            }
        }
    }
}
