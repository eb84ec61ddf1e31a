//! RoPE fused with the KV write, in both pairings, against the CPU: the query heads of a qkv
//! row rotate in place (all of each head, or its first rope_dim dimensions: partial rotary); the key heads rotate into their tokens' cache slots and the value heads
//! are copied there; a token whose slot lies past the cache writes nothing. The angles come
//! from one table, so the only error is the rotation itself: two products and a sum, within
//! 2·u·(|xa| + |xb|) each, checked at 4·u. An f16 cache also rounds each key and value to a
//! half as it is written: within 2^-11 of the value (round to nearest), checked at 2^-10, which
//! also admits a driver that truncates.

use weft::DType;
use weft::gpu::kernels::paged::{PagedKv, QkvLayout, rope_kv_write};
use weft::gpu::kernels::rope::{RopePairing, cos_sin_table, inv_freq};
use weft::gpu::{GpuTensorFactory, KernelFamily, Recording};
use weft::tensor::TensorFactory;

use crate::common::*;

const BLOCK: usize = 4;

/// (tokens, heads, KV heads, head_dim, rope_dim): whole heads, and partial rotary (Phi-4-mini's
/// 96 of 128; 12 of 16; rope_dim not a multiple of 4, so a key's four dimensions straddle it).
const SHAPES: &[(usize, usize, usize, usize, usize)] = &[
    (1, 1, 1, 4, 4),
    (5, 3, 1, 64, 64),
    (33, 9, 3, 64, 64),
    (4, 2, 2, 128, 128),
    (6, 3, 1, 128, 96),
    (5, 4, 2, 16, 12),
    (3, 2, 1, 16, 6),
];

fn check(pairing: RopePairing) {
    // Every family: buffers (baseline, subgroup) and storage textures (CPU drivers) as the
    // cache, of f32 and f16.
    for family in [KernelFamily::Baseline, KernelFamily::Cpu, KernelFamily::Subgroup] {
        let Some(f) = gpu_with_family(family) else { continue };
        for dtype in [DType::F32, DType::F16] {
            check_on(f, pairing, dtype);
        }
    }
}

fn check_on(f: &GpuTensorFactory, pairing: RopePairing, dtype: DType) {
    let half = if dtype == DType::F16 { 2f64.powi(-10) } else { 0.0 };
    for &(tokens, heads, kv_heads, head_dim, rope_dim) in SHAPES {
        let layout = QkvLayout { num_heads: heads, num_kv_heads: kv_heads, head_dim };
        let stride = layout.row_stride();
        let table = cos_sin_table(&inv_freq(rope_dim, 100000.0), 8192);
        let qkv = random(tokens * stride, head_dim as u64, 2.0);
        let positions: Vec<u32> = (0..tokens as u32).map(|t| t * 97 % 8192 + t).collect();
        // Slots scattered over a two-layer cache; the last token's slot is past it.
        let num_slots = (tokens + 3).div_ceil(BLOCK) * BLOCK;
        let mut slots: Vec<u32> = (0..tokens as u32).map(|t| (t * 5 + 2) % num_slots as u32).collect();
        *slots.last_mut().unwrap() = num_slots as u32 + 7;
        let qt = f.upload_f32(&[tokens, stride], &qkv).unwrap();
        let pt = f.upload_u32(&[tokens], &positions).unwrap();
        let ct = f.upload_f32(&[8192, rope_dim / 2, 2], &table).unwrap();
        let st = f.upload_u32(&[tokens], &slots).unwrap();
        let k_cache = f.kv_cache(&[2 * num_slots, kv_heads, head_dim], dtype, None).unwrap();
        let v_cache = f.kv_cache(&[2 * num_slots, kv_heads, head_dim], dtype, None).unwrap();
        let cache =
            PagedKv { k_cache: &k_cache, v_cache: &v_cache, block_size: BLOCK, first_slot: num_slots, num_slots };
        let mut rec = Recording::new();
        rope_kv_write(ctx(f), &mut rec, &qt, layout, &pt, &ct, pairing, &st, &cache).unwrap();
        run(f, &rec);

        let neox = pairing == RopePairing::Neox;
        let (q_cols, kv_cols) = (heads * head_dim, kv_heads * head_dim);
        let column = |t: usize, from: usize, len: usize| qkv[t * stride + from..t * stride + from + len].to_vec();
        let mut want_q: Vec<f32> = (0..tokens).flat_map(|t| column(t, 0, q_cols)).collect();
        let mut want_k: Vec<f32> = (0..tokens).flat_map(|t| column(t, q_cols, kv_cols)).collect();
        weft::cpu::rope(&mut want_q, heads, head_dim, rope_dim, &positions, &table, neox);
        weft::cpu::rope(&mut want_k, kv_heads, head_dim, rope_dim, &positions, &table, neox);
        let got = read_f32(f, &qt);
        let (got_k, got_v) = (read_f32(f, &k_cache), read_f32(f, &v_cache));
        let bound = |row: &[f32]| 8.0 * U * row.iter().map(|v| f64::from(v.abs())).fold(0.0, f64::max) + 1e-30;
        for t in 0..tokens {
            let what = format!(
                "{pairing:?} {tokens}x{heads}/{kv_heads}x{head_dim} (rope_dim {rope_dim}) token {t}, {:?}, {dtype} cache",
                f.context().kernel_family()
            );
            let q_row = &column(t, 0, q_cols);
            assert_close(
                &format!("{what} q"),
                &got[t * stride..t * stride + q_cols],
                &want_q[t * q_cols..(t + 1) * q_cols],
                |_| bound(q_row),
            );
            assert_eq!(
                &got[t * stride + q_cols..(t + 1) * stride],
                &column(t, q_cols, stride - q_cols)[..],
                "{what}: k and v stay"
            );
            let slot = slots[t] as usize;
            if slot >= num_slots {
                continue;
            }
            let at = (num_slots + slot) * kv_cols;
            let k_row = &column(t, q_cols, kv_cols);
            let want_k = &want_k[t * kv_cols..(t + 1) * kv_cols];
            assert_close(&format!("{what} k"), &got_k[at..at + kv_cols], want_k, |i| {
                bound(k_row) + half * f64::from(want_k[i].abs())
            });
            let want_v = column(t, q_cols + kv_cols, kv_cols);
            if dtype == DType::F32 {
                assert_eq!(&got_v[at..at + kv_cols], &want_v[..], "{what} v");
            } else {
                assert_close(&format!("{what} v"), &got_v[at..at + kv_cols], &want_v, |i| {
                    half * f64::from(want_v[i].abs()) + 1e-30
                });
            }
        }
        // Layer 0 stays empty, and the skipped token wrote nowhere (a texture may hold padding
        // after the cache: only the cache's own floats count).
        let written = (tokens - 1) * kv_cols;
        assert!(got_v[..num_slots * kv_cols].iter().all(|&x| x == 0.0));
        assert!(got_v[..2 * num_slots * kv_cols].iter().filter(|&&x| x != 0.0).count() <= written);
        // The pairings differ, so each test also proves it used its own.
        let mut other: Vec<f32> = (0..tokens).flat_map(|t| column(t, 0, q_cols)).collect();
        weft::cpu::rope(&mut other, heads, head_dim, rope_dim, &positions, &table, !neox);
        let got_q: Vec<f32> = (0..tokens).flat_map(|t| got[t * stride..t * stride + q_cols].to_vec()).collect();
        if tokens > 1 {
            assert!(got_q != other, "{pairing:?} gave the other pairing's result");
        }
        // Partial rotary: the dimensions past rope_dim are the input's, bit for bit.
        for (t, h) in (0..tokens).flat_map(|t| (0..heads).map(move |h| (t, h))) {
            let at = t * stride + h * head_dim;
            assert_eq!(got[at + rope_dim..at + head_dim], qkv[at + rope_dim..at + head_dim], "pass-through q");
        }
    }
}

#[test]
fn neox_pairing_matches_cpu() {
    check(RopePairing::Neox);
}

#[test]
fn interleaved_pairing_matches_cpu() {
    check(RopePairing::Interleaved);
}

#[test]
fn head_dims_not_a_multiple_of_4_foreign_caches_and_tables_wider_than_a_head_are_errors() {
    let Some(f) = gpu() else { return };
    let p = f.zeros(&[1], DType::U32).unwrap();
    let err = |layout: QkvLayout, cache_head_dim: usize| {
        let x = f.zeros(&[1, layout.row_stride()], DType::F32).unwrap();
        let c = f.zeros(&[4, layout.head_dim / 2, 2], DType::F32).unwrap();
        let cache_t = f.zeros(&[4, 1, cache_head_dim], DType::F32).unwrap();
        let cache = PagedKv { k_cache: &cache_t, v_cache: &cache_t, block_size: 4, first_slot: 0, num_slots: 4 };
        rope_kv_write(ctx(f), &mut Recording::new(), &x, layout, &p, &c, RopePairing::Neox, &p, &cache)
            .unwrap_err()
            .to_string()
    };
    let e = err(QkvLayout { num_heads: 1, num_kv_heads: 1, head_dim: 6 }, 6);
    assert!(e.contains("multiple of 4"), "{e}");
    let e = err(QkvLayout { num_heads: 2, num_kv_heads: 2, head_dim: 8 }, 8);
    assert!(e.contains("KV heads"), "{e}");
    // A table wider than the head (rope_dim 8 > head_dim 4).
    let x = f.zeros(&[1, 12], DType::F32).unwrap();
    let c = f.zeros(&[4, 4, 2], DType::F32).unwrap();
    let cache_t = f.zeros(&[4, 1, 4], DType::F32).unwrap();
    let cache = PagedKv { k_cache: &cache_t, v_cache: &cache_t, block_size: 4, first_slot: 0, num_slots: 4 };
    let layout = QkvLayout { num_heads: 1, num_kv_heads: 1, head_dim: 4 };
    let e = rope_kv_write(ctx(f), &mut Recording::new(), &x, layout, &p, &c, RopePairing::Neox, &p, &cache)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rotates 8 dimensions"), "{e}");
}
