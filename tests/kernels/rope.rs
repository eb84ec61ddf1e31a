//! RoPE in both pairings against the CPU. The angles come from one table, so the only error is
//! the rotation itself: two products and a sum, within 2·u·(|xa| + |xb|) each, checked at 4·u.

use weft::DType;
use weft::gpu::kernels::rope::{RopePairing, cos_sin_table, inv_freq, rope};
use weft::gpu::Recording;
use weft::tensor::TensorFactory;

use crate::common::*;

fn check(pairing: RopePairing) {
    let Some(f) = gpu() else { return };
    for &(tokens, heads, head_dim) in &[(1, 1, 2), (5, 3, 64), (33, 9, 64), (4, 2, 128)] {
        let table = cos_sin_table(&inv_freq(head_dim, 100000.0), 8192);
        let x = random(tokens * heads * head_dim, head_dim as u64, 2.0);
        let positions: Vec<u32> = (0..tokens as u32).map(|t| t * 97 % 8192 + t).collect();
        let xt = f.upload_f32(&[tokens, heads, head_dim], &x).unwrap();
        let pt = f.upload_u32(&[tokens], &positions).unwrap();
        let ct = f.upload_f32(&[8192, head_dim / 2, 2], &table).unwrap();
        let mut rec = Recording::new();
        rope(ctx(f), &mut rec, &xt, &pt, &ct, pairing).unwrap();
        run(f, &rec);
        let mut want = x.clone();
        weft::cpu::rope(&mut want, heads, head_dim, &positions, &table, pairing == RopePairing::Neox);
        let got = read_f32(f, &xt);
        let norm = |i: usize| {
            let base = i / head_dim * head_dim;
            x[base..base + head_dim].iter().map(|v| f64::from(v.abs())).fold(0.0, f64::max)
        };
        assert_close(&format!("{pairing:?} {tokens}x{heads}x{head_dim}"), &got, &want, |i| 8.0 * U * norm(i) + 1e-30);
        // The pairings differ, so each test also proves it used its own.
        let mut other = x.clone();
        weft::cpu::rope(&mut other, heads, head_dim, &positions, &table, pairing != RopePairing::Neox);
        if tokens > 1 {
            assert!(got != other, "{pairing:?} gave the other pairing's result");
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
fn odd_head_dim_is_an_error() {
    let Some(f) = gpu() else { return };
    let x = f.zeros(&[1, 1, 3], DType::F32).unwrap();
    let p = f.zeros(&[1], DType::U32).unwrap();
    let c = f.zeros(&[4, 1, 2], DType::F32).unwrap();
    assert!(rope(ctx(f), &mut Recording::new(), &x, &p, &c, RopePairing::Neox).is_err());
}
