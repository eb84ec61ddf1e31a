//! Qwen3.5's kernels against the CPU (`weft::cpu::ssm::gated_delta_rule`,
//! `gated_rms_norm` with the gate after the norm, `weft::cpu::sigmoid_mul` element by element
//! and one gate a row), in every kernel
//! family: the Gated DeltaNet recurrence over sequences of different lengths sharing a
//! dispatch (a decode continuing its slot, a prefill from position 0 over a slot's stale
//! contents, a chunk restoring a snapshot and saving another), in both v-head orders; the same
//! bits alone or batched, chunked or in one pass.

use weft::DType;
use weft::gpu::kernels::elementwise::sigmoid_mul;
use weft::gpu::kernels::ssm::{
    DeltaShape, GateAt, NO_SLOT, SEQ_STATE_COLS, SeqStates, gated_delta_net, gated_rms_norm,
};
use weft::gpu::{GpuTensorFactory, KernelFamily, Recording};
use weft::tensor::TensorFactory;

use crate::common::*;

const FAMILIES: [KernelFamily; 3] = [KernelFamily::Baseline, KernelFamily::Cpu, KernelFamily::Subgroup];

/// 2 q/k heads of 8, 4 v heads of 12: each q/k head serves two v heads.
const fn shape(v_heads_tiled: bool) -> DeltaShape {
    DeltaShape { num_k_heads: 2, num_v_heads: 4, head_k_dim: 8, head_v_dim: 12, v_heads_tiled }
}
const KEY: usize = 2 * 8;
const QKV: usize = 2 * KEY + 4 * 12;
const WIDTH: usize = 4 * 12;
const STATE: usize = 4 * 12 * 8;
/// b and a sit at these columns of a wider row, as in the layer's fused projection.
const BA_OFFSET: usize = 5;
const BA_STRIDE: usize = BA_OFFSET + 8 + 3;

/// A sequence of a test step: rows, own slot, start position, slot read from, snapshot saved.
#[derive(Clone, Copy)]
struct Seq {
    num_rows: usize,
    slot: usize,
    start_pos: usize,
    read: Option<usize>,
    save: Option<usize>,
}

const fn seq(num_rows: usize, slot: usize, start_pos: usize) -> Seq {
    Seq { num_rows, slot, start_pos, read: None, save: None }
}

struct Weights {
    a_neg: Vec<f32>,
    dt_bias: Vec<f32>,
}

fn weights() -> Weights {
    let a_neg = random(4, 61, 2.0).iter().map(|v| -(v.abs() + 0.1)).collect();
    Weights { a_neg, dt_bias: random(4, 62, 1.0) }
}

/// Run the recurrence over `seqs` with rows `qkv` (tokens, QKV), `ba` (tokens, BA_STRIDE) and
/// slots `state`; (y, state).
fn gpu_delta(
    f: &GpuTensorFactory,
    tiled: bool,
    seqs: &[Seq],
    qkv: &[f32],
    ba: &[f32],
    w: &Weights,
    state: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let rows = qkv.len() / QKV;
    let mut table = Vec::new();
    let mut row = 0;
    for s in seqs {
        let (read, save) = (s.read.unwrap_or(s.slot) as u32, s.save.map_or(NO_SLOT, |slot| slot as u32));
        table.extend([row as u32, s.num_rows as u32, s.slot as u32, s.start_pos as u32, read, save]);
        row += s.num_rows;
    }
    let table = f.upload_u32(&[seqs.len(), SEQ_STATE_COLS], &table).unwrap();
    let qkv_t = f.upload_f32(&[rows, QKV], qkv).unwrap();
    let ba_t = f.upload_f32(&[rows, BA_STRIDE], ba).unwrap();
    let a_neg = f.upload_f32(&[4], &w.a_neg).unwrap();
    let dt_bias = f.upload_f32(&[4], &w.dt_bias).unwrap();
    let state_t = f.upload_f32(&[state.len() / STATE, 4, 12, 8], state).unwrap();
    let y = f.zeros(&[rows, WIDTH], DType::F32).unwrap();
    let mut rec = Recording::new();
    let s = SeqStates { seqs: &table, num_seqs: seqs.len() };
    gated_delta_net(ctx(f), &mut rec, shape(tiled), &qkv_t, &ba_t, BA_OFFSET, &a_neg, &dt_bias, &s, &state_t, &y)
        .unwrap();
    run(f, &rec);
    (read_f32(f, &y), read_f32(f, &state_t))
}

fn rows_of<'a>(all: &'a [f32], seqs: &[Seq], i: usize, width: usize) -> &'a [f32] {
    let first: usize = seqs[..i].iter().map(|s| s.num_rows).sum();
    &all[first * width..(first + seqs[i].num_rows) * width]
}

/// Tolerance: per step each state entry takes a decay (softplus and exp, a few ULP each), a
/// product and an add, and each output and S^T k is a head_k-term dot product over
/// L2-normalised q and k (|q̂|, |k̂| <= 1, so terms stay within the state's magnitude); over the
/// 9 steps of the longest sequence the error stays below 1e-4 of (|value| + 1), while a wrong
/// head pairing, transposition or decay moves outputs by 1e-2 or more.
#[test]
fn gated_delta_net_matches_cpu_in_every_family() {
    for family in FAMILIES {
        let Some(f) = gpu_with_family(family) else { return };
        for tiled in [false, true] {
            // A decode continuing slot 2; a prefill from 0 over slot 0's stale contents; a chunk
            // restoring snapshot slot 4 into slot 3 and saving its end into slot 5.
            let seqs = [seq(1, 2, 9), seq(9, 0, 0), Seq { read: Some(4), save: Some(5), ..seq(4, 3, 6) }];
            let rows: usize = seqs.iter().map(|s| s.num_rows).sum();
            let qkv = random(rows * QKV, 63, 2.0);
            let ba = random(rows * BA_STRIDE, 64, 3.0);
            let w = weights();
            let state = random(6 * STATE, 65, 1.0);
            let (y, new_state) = gpu_delta(f, tiled, &seqs, &qkv, &ba, &w, &state);
            let dims = weft::cpu::ssm::DeltaDims {
                num_k_heads: 2,
                num_v_heads: 4,
                head_k_dim: 8,
                head_v_dim: 12,
                v_heads_tiled: tiled,
            };
            for (i, s) in seqs.iter().enumerate() {
                let ba_rows = rows_of(&ba, &seqs, i, BA_STRIDE);
                let b: Vec<f32> =
                    ba_rows.chunks(BA_STRIDE).flat_map(|r| r[BA_OFFSET..BA_OFFSET + 4].to_vec()).collect();
                let a: Vec<f32> =
                    ba_rows.chunks(BA_STRIDE).flat_map(|r| r[BA_OFFSET + 4..BA_OFFSET + 8].to_vec()).collect();
                let from = s.read.unwrap_or(s.slot);
                let mut st =
                    if s.start_pos == 0 { vec![0.0; STATE] } else { state[from * STATE..(from + 1) * STATE].to_vec() };
                let want = weft::cpu::ssm::gated_delta_rule(
                    dims,
                    rows_of(&qkv, &seqs, i, QKV),
                    &b,
                    &a,
                    &w.a_neg,
                    &w.dt_bias,
                    &mut st,
                );
                let what = format!("gated_delta_net {family:?} tiled={tiled} seq {i}");
                assert_close(&what, rows_of(&y, &seqs, i, WIDTH), &want, |j| 1e-4 * f64::from(want[j].abs() + 1.0));
                for slot in std::iter::once(s.slot).chain(s.save) {
                    let got = &new_state[slot * STATE..(slot + 1) * STATE];
                    assert_close(&format!("{what} state in slot {slot}"), got, &st, |j| {
                        1e-4 * f64::from(st[j].abs() + 1.0)
                    });
                }
            }
            assert!(new_state[STATE..2 * STATE] == state[STATE..2 * STATE], "a slot nobody holds is untouched");
            assert!(new_state[4 * STATE..5 * STATE] == state[4 * STATE..5 * STATE], "the snapshot read is unchanged");
        }
    }
}

/// A 13-token prefill in one pass, in chunks of 5, 1 and 7 carried through the slot, and among
/// other sequences: the same bits, for y and the final state.
#[test]
fn gated_delta_net_chunked_and_batched_equal_one_pass_bit_for_bit() {
    for family in FAMILIES {
        let Some(f) = gpu_with_family(family) else { return };
        let n = 13;
        let qkv = random(n * QKV, 71, 2.0);
        let ba = random(n * BA_STRIDE, 72, 3.0);
        let w = weights();
        let (y, state) = gpu_delta(f, true, &[seq(n, 0, 0)], &qkv, &ba, &w, &vec![0.0; STATE]);
        let (mut cy, mut cs, mut start) = (Vec::new(), vec![7.0; STATE], 0);
        for len in [5, 1, 7] {
            let rows = start..start + len;
            let (part, s) = gpu_delta(
                f,
                true,
                &[seq(len, 0, start)],
                &qkv[rows.start * QKV..rows.end * QKV],
                &ba[rows.start * BA_STRIDE..rows.end * BA_STRIDE],
                &w,
                &cs,
            );
            cy.extend(part);
            cs = s;
            start += len;
        }
        assert!(cy == y && cs == state, "{family:?}: chunked differs from one pass");
        let others = [seq(3, 0, 0), seq(n, 2, 0), seq(1, 1, 6)];
        let pad = |v: &[f32], width: usize, seed: u64| {
            let mut all = random(3 * width, seed, 1.0);
            all.extend_from_slice(v);
            all.extend(random(width, seed + 1, 1.0));
            all
        };
        let (by, bs) =
            gpu_delta(f, true, &others, &pad(&qkv, QKV, 80), &pad(&ba, BA_STRIDE, 82), &w, &random(3 * STATE, 84, 1.0));
        assert!(rows_of(&by, &others, 1, WIDTH) == y && bs[2 * STATE..] == state[..], "{family:?}: batched differs");
    }
}

/// Tolerance as the gate-first norm's: SiLU (exp to 19 ULP for |z| <= 8, a divide) and the
/// norm's products: 64·u relative, plus 1e-6 absolute for outputs near zero.
#[test]
fn gated_rms_norm_with_the_gate_after_matches_cpu() {
    for family in FAMILIES {
        let Some(f) = gpu_with_family(family) else { return };
        let (rows, groups, group_size) = (3, 4, 12);
        let width = groups * group_size;
        let (z_offset, z_stride) = (7, width + 9);
        let x = random(rows * width, 91, 2.0);
        let z_all = random(rows * z_stride, 92, 8.0);
        let weight = random(width, 93, 1.0);
        let xt = f.upload_f32(&[rows, width], &x).unwrap();
        let zt = f.upload_f32(&[rows, z_stride], &z_all).unwrap();
        let wt = f.upload_f32(&[width], &weight).unwrap();
        let yt = f.zeros(&[rows, width], DType::F32).unwrap();
        let mut rec = Recording::new();
        gated_rms_norm(ctx(f), &mut rec, &xt, &zt, z_offset, &wt, group_size, &yt, 1e-6, GateAt::Output).unwrap();
        run(f, &rec);
        let z: Vec<f32> = z_all.chunks(z_stride).flat_map(|r| r[z_offset..z_offset + width].to_vec()).collect();
        let want = weft::cpu::ssm::gated_rms_norm(&x, &z, &weight, group_size, 1e-6, true);
        assert_close(&format!("gated_rms_norm (gate after) {family:?}"), &read_f32(f, &yt), &want, |i| {
            64.0 * U * f64::from(want[i].abs()) + 1e-6
        });
    }
}

/// Tolerance: exp to 19 ULP for |gate| <= 8, then an add, a divide and a multiply: 24·u
/// relative. Element by element (x and gate (len)) and one gate a row (x (rows, cols), gate
/// (rows, 1): Qwen3.5-MoE's shared expert); lengths straddle the 256-invocation workgroup.
#[test]
fn sigmoid_mul_matches_cpu() {
    for family in FAMILIES {
        let Some(f) = gpu_with_family(family) else { return };
        for (x_shape, gate_shape) in [
            (vec![1], vec![1]),
            (vec![255], vec![255]),
            (vec![1000], vec![1000]),
            (vec![1, 64], vec![1, 1]),
            (vec![7, 100], vec![7, 1]),
            (vec![300, 3], vec![300, 1]),
        ] {
            let x = random(x_shape.iter().product(), 95, 2.0);
            let gate = random(gate_shape.iter().product(), 96, 8.0);
            let xt = f.upload_f32(&x_shape, &x).unwrap();
            let gt = f.upload_f32(&gate_shape, &gate).unwrap();
            let mut rec = Recording::new();
            sigmoid_mul(ctx(f), &mut rec, &xt, &gt).unwrap();
            run(f, &rec);
            let want = weft::cpu::sigmoid_mul(&x, &gate);
            assert_close(&format!("sigmoid_mul {family:?} {x_shape:?}"), &read_f32(f, &xt), &want, |i| {
                24.0 * U * f64::from(want[i].abs()) + 1e-30
            });
        }
    }
}

/// A gate of neither x's shape nor one column of x's rows is refused, naming the operands.
#[test]
fn bad_sigmoid_mul_shapes_are_errors() {
    let Some(f) = gpu() else { return };
    let t = |shape: &[usize]| f.zeros(shape, DType::F32).unwrap();
    for (x, gate) in [(&[4, 8][..], &[4, 2][..]), (&[4, 8], &[3, 1]), (&[32], &[4, 1])] {
        let err = sigmoid_mul(ctx(f), &mut Recording::new(), &t(x), &t(gate)).unwrap_err().to_string();
        assert!(err.contains("sigmoid_mul") && err.contains("gate must be F32 of shape"), "{x:?} {gate:?}: {err}");
    }
}

#[test]
fn bad_delta_net_shapes_are_errors() {
    let Some(f) = gpu() else { return };
    let t = |shape: &[usize]| f.zeros(shape, DType::F32).unwrap();
    let table = f.upload_u32(&[1, SEQ_STATE_COLS], &[0, 1, 0, 0, 0, NO_SLOT]).unwrap();
    let s = SeqStates { seqs: &table, num_seqs: 1 };
    let (ba, heads) = (t(&[1, BA_STRIDE]), t(&[4]));
    let odd = DeltaShape { num_k_heads: 3, ..shape(false) };
    let err = gated_delta_net(
        ctx(f),
        &mut Recording::new(),
        odd,
        &t(&[1, QKV]),
        &ba,
        BA_OFFSET,
        &heads,
        &heads,
        &s,
        &t(&[1, 4, 12, 8]),
        &t(&[1, WIDTH]),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("multiple of the k heads"), "{err}");
    let err = gated_delta_net(
        ctx(f),
        &mut Recording::new(),
        shape(false),
        &t(&[1, QKV]),
        &ba,
        BA_OFFSET + 5,
        &heads,
        &heads,
        &s,
        &t(&[1, 4, 12, 8]),
        &t(&[1, WIDTH]),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("columns"), "{err}");
}
