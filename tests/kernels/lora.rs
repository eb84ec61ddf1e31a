//! lora_shrink + lora_expand against the CPU: rows of several adapters of different ranks (1 to
//! 64, the highest rank weft promises) and rows of the base model in one dispatch pair. Base
//! rows must come out bit for bit as they went in, and each row's delta must not depend on its
//! neighbours (batch invariance).

use weft::DType;
use weft::gpu::Recording;
use weft::gpu::kernels::lora::{LoraMatrices, LoraRows, NO_SLOT, lora};
use weft::tensor::TensorFactory;

use crate::common::*;

const IN: usize = 72;
const OUT: usize = 40;
const MAX_RANK: usize = 64;
const SLOTS: usize = 3;
/// Slot s: (rank, scale).
const ADAPTERS: [(usize, f32); SLOTS] = [(4, 2.0), (64, 0.5), (1, -3.0)];

/// y (rows, y_cols) after the pair of dispatches, writing columns col..col + OUT.
fn run_lora(row_slots: &[u32], x: &[f32], y0: &[f32], y_cols: usize, col: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
    let f = gpu().unwrap();
    let rows = row_slots.len();
    let info: Vec<u32> = ADAPTERS.iter().flat_map(|&(r, s)| [r as u32, s.to_bits()]).collect();
    let (xt, yt) = (f.upload_f32(&[rows, IN], x).unwrap(), f.upload_f32(&[rows, y_cols], y0).unwrap());
    // The kernels read each slot's Aᵀ (IN, MAX_RANK) and Bᵀ (MAX_RANK, OUT).
    let a_t: Vec<f32> = (0..SLOTS * IN * MAX_RANK)
        .map(|i| {
            let (s, k, r) = (i / (IN * MAX_RANK), (i / MAX_RANK) % IN, i % MAX_RANK);
            a[(s * MAX_RANK + r) * IN + k]
        })
        .collect();
    let b_t: Vec<f32> = (0..SLOTS * MAX_RANK * OUT)
        .map(|i| {
            let (s, r, j) = (i / (MAX_RANK * OUT), (i / OUT) % MAX_RANK, i % OUT);
            b[(s * OUT + j) * MAX_RANK + r]
        })
        .collect();
    let at = f.upload_f32(&[SLOTS * IN, MAX_RANK], &a_t).unwrap();
    let bt = f.upload_f32(&[SLOTS * MAX_RANK, OUT], &b_t).unwrap();
    let slots = f.upload_u32(&[rows], row_slots).unwrap();
    let info = f.upload_u32(&[SLOTS, 2], &info).unwrap();
    let u = f.zeros(&[rows, MAX_RANK], DType::F32).unwrap();
    let mut rec = Recording::new();
    let m = LoraMatrices { a: &at, b: &bt };
    lora(ctx(f), &mut rec, &xt, &m, &LoraRows { row_slots: &slots, slot_info: &info, u: &u }, &yt, col).unwrap();
    run(f, &rec);
    read_f32(f, &yt)
}

/// Tolerance: the GPU sums in f32 in a fixed order (in_dim products, then rank products), the
/// CPU in f64; each sum of n terms of |t| is within n·u·Σ|t| of exact, so the bound is
/// (IN + MAX_RANK + 2)·u times the sum of the products' magnitudes, here bounded by scale ·
/// Σ_r |u_r|·|b_r| with |u_r| ≤ Σ|x·a|.
#[test]
fn lora_matches_cpu_and_leaves_base_rows_alone() {
    let Some(_) = gpu() else { return };
    let a = random(SLOTS * MAX_RANK * IN, 1, 1.0);
    let b = random(SLOTS * OUT * MAX_RANK, 2, 1.0);
    let row_slots = [0, NO_SLOT, 1, 2, 1, NO_SLOT, 0];
    let rows = row_slots.len();
    let (y_cols, col) = (OUT + 24, 16);
    let x = random(rows * IN, 3, 1.0);
    let y0 = random(rows * y_cols, 4, 1.0);
    let got = run_lora(&row_slots, &x, &y0, y_cols, col, &a, &b);
    for (row, &slot) in row_slots.iter().enumerate() {
        let (y_row, got_row) = (&y0[row * y_cols..][..y_cols], &got[row * y_cols..][..y_cols]);
        if slot == NO_SLOT {
            assert_eq!(got_row, y_row, "row {row} runs the base model: untouched");
            continue;
        }
        let (rank, scale) = ADAPTERS[slot as usize];
        let s = slot as usize;
        let a_s: Vec<f32> = a[s * MAX_RANK * IN..][..rank * IN].to_vec();
        let b_s: Vec<f32> = (0..OUT).flat_map(|j| b[(s * OUT + j) * MAX_RANK..][..rank].to_vec()).collect();
        let x_row = &x[row * IN..][..IN];
        let delta = weft::cpu::lora_delta(x_row, &a_s, &b_s, rank, scale);
        let want: Vec<f32> = (0..y_cols)
            .map(|c| if (col..col + OUT).contains(&c) { y_row[c] + delta[c - col] } else { y_row[c] })
            .collect();
        let magnitude: f64 = (0..rank)
            .map(|r| {
                let ur: f64 = (0..IN).map(|k| f64::from((x_row[k] * a_s[r * IN + k]).abs())).sum();
                ur * (0..OUT).map(|j| f64::from(b_s[j * rank + r].abs())).fold(0.0, f64::max)
            })
            .sum::<f64>()
            * f64::from(scale.abs());
        assert_close(&format!("lora row {row} (slot {slot})"), got_row, &want, |c| {
            (IN + MAX_RANK + 2) as f64 * U * magnitude + 2.0 * U * f64::from(want[c].abs()) + 1e-30
        });
    }
    // The same row alone gives the same bits.
    for row in [0, 3] {
        let alone = run_lora(
            &row_slots[row..row + 1],
            &x[row * IN..][..IN],
            &y0[row * y_cols..][..y_cols],
            y_cols,
            col,
            &a,
            &b,
        );
        assert_eq!(alone, got[row * y_cols..][..y_cols], "row {row} alone");
    }
}
