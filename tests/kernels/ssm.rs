//! The Mamba2 kernels against the CPU (`weft::cpu::ssm`): the conv with its window (also in
//! LFM2's gated form), the selective scan with its state, the gated norm. Sequences of different lengths share a
//! dispatch, some continuing a state and some starting at position 0 over a slot's stale
//! contents; a sequence gives the same bits alone or batched, and chunked or in one pass.

use weft::DType;
use weft::gpu::kernels::ssm::{
    ConvForm, GateAt, NO_SLOT, SEQ_STATE_COLS, ScanShape, ScanWeights, SeqStates, SsdChunks, SsdScratch,
    gated_rms_norm, ssd_scan, ssm_conv, ssm_scan,
};
use weft::gpu::{GpuTensor, GpuTensorFactory, Recording};
use weft::tensor::TensorFactory;

use crate::common::*;

const CHANNELS: usize = 70;
const KERNEL: usize = 4;
/// Columns before the conv input in each row of x (it is read out of a wider projection).
const X_OFFSET: usize = 5;
const X_STRIDE: usize = X_OFFSET + CHANNELS + 3;
const SHAPE: ScanShape = ScanShape { num_heads: 4, head_dim: 8, state_size: 16, num_groups: 2 };
const INNER: usize = 32;
const XBC: usize = INNER + 2 * 2 * 16;
const STATE: usize = INNER * 16;
const DT_OFFSET: usize = 3;
const DT_STRIDE: usize = 9;

/// One sequence of a test step: its rows, its slot and its start position; `read` is a slot
/// to start from instead of its own (a snapshot restored), `save` one that also receives its
/// final state.
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

fn seq_table(f: &GpuTensorFactory, seqs: &[Seq]) -> GpuTensor {
    let mut table = Vec::new();
    let mut row = 0;
    for s in seqs {
        let read = s.read.unwrap_or(s.slot) as u32;
        let save = s.save.map_or(NO_SLOT, |slot| slot as u32);
        table.extend([row as u32, s.num_rows as u32, s.slot as u32, s.start_pos as u32, read, save]);
        row += s.num_rows;
    }
    f.upload_u32(&[seqs.len(), SEQ_STATE_COLS], &table).unwrap()
}

/// The slice of `all` (rows of `width`) belonging to sequence `i`.
fn rows_of<'a>(all: &'a [f32], seqs: &[Seq], i: usize, width: usize) -> &'a [f32] {
    let first: usize = seqs[..i].iter().map(|s| s.num_rows).sum();
    &all[first * width..(first + seqs[i].num_rows) * width]
}

/// Run the conv over `seqs` with rows `x` (tokens, X_STRIDE) and slots `state`; (y, state).
fn gpu_conv(
    f: &GpuTensorFactory,
    seqs: &[Seq],
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    state: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    gpu_conv_of(f, ConvForm::Silu, X_STRIDE, seqs, x, w, bias, state)
}

/// [`gpu_conv`] in `form`, with rows of `stride` columns.
#[allow(clippy::too_many_arguments)]
fn gpu_conv_of(
    f: &GpuTensorFactory,
    form: ConvForm,
    stride: usize,
    seqs: &[Seq],
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    state: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let (rows, kernel) = (x.len() / stride, w.len() / CHANNELS);
    let xt = f.upload_f32(&[rows, stride], x).unwrap();
    let wt = f.upload_f32(&[CHANNELS, kernel], w).unwrap();
    let bt = f.upload_f32(&[CHANNELS], bias).unwrap();
    let st = f.upload_f32(&[state.len() / ((kernel - 1) * CHANNELS), kernel - 1, CHANNELS], state).unwrap();
    let yt = f.zeros(&[rows, CHANNELS], DType::F32).unwrap();
    let table = seq_table(f, seqs);
    let mut rec = Recording::new();
    let s = SeqStates { seqs: &table, num_seqs: seqs.len() };
    ssm_conv(ctx(f), &mut rec, &xt, X_OFFSET, form, &wt, &bt, &s, &st, &yt).unwrap();
    run(f, &rec);
    (read_f32(f, &yt), read_f32(f, &st))
}

struct ScanParams {
    a: Vec<f32>,
    d: Vec<f32>,
    dt_bias: Vec<f32>,
}

fn scan_params() -> ScanParams {
    let a = random(4, 31, 1.0).iter().map(|v| -(v.abs() + 0.2)).collect();
    ScanParams { a, d: random(4, 32, 1.0), dt_bias: random(4, 33, 1.0) }
}

/// Both scans' operands on the GPU: x/B/C rows, raw dt, the per-head parameters, the state
/// slots and room for y.
struct ScanOperands {
    xbc: GpuTensor,
    dt: GpuTensor,
    a: GpuTensor,
    d: GpuTensor,
    dt_bias: GpuTensor,
    state: GpuTensor,
    y: GpuTensor,
}

impl ScanOperands {
    fn upload(f: &GpuTensorFactory, xbc: &[f32], dt: &[f32], p: &ScanParams, state: &[f32]) -> Self {
        let rows = xbc.len() / XBC;
        let heads = |v: &[f32]| f.upload_f32(&[4], v).unwrap();
        ScanOperands {
            xbc: f.upload_f32(&[rows, XBC], xbc).unwrap(),
            dt: f.upload_f32(&[rows, DT_STRIDE], dt).unwrap(),
            a: heads(&p.a),
            d: heads(&p.d),
            dt_bias: heads(&p.dt_bias),
            state: f.upload_f32(&[state.len() / STATE, 4, 8, 16], state).unwrap(),
            y: f.zeros(&[rows, INNER], DType::F32).unwrap(),
        }
    }

    fn weights(&self) -> ScanWeights<'_> {
        ScanWeights { a: &self.a, d: &self.d, dt_bias: &self.dt_bias }
    }

    /// Run `rec` and read back (y, state).
    fn run_and_read(&self, f: &GpuTensorFactory, rec: &Recording) -> (Vec<f32>, Vec<f32>) {
        run(f, rec);
        (read_f32(f, &self.y), read_f32(f, &self.state))
    }
}

/// Run the scan over `seqs`; (y, state).
fn gpu_scan(
    f: &GpuTensorFactory,
    seqs: &[Seq],
    xbc: &[f32],
    dt: &[f32],
    p: &ScanParams,
    state: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let o = ScanOperands::upload(f, xbc, dt, p, state);
    let table = seq_table(f, seqs);
    let mut rec = Recording::new();
    let s = SeqStates { seqs: &table, num_seqs: seqs.len() };
    ssm_scan(ctx(f), &mut rec, SHAPE, &o.xbc, &o.dt, DT_OFFSET, &o.weights(), &s, &o.state, &o.y).unwrap();
    o.run_and_read(f, &rec)
}

/// Run the chunked (SSD) scan over `seqs`, each `num_rows` a multiple of `q` and cut into
/// chunks of `q` rows; (y, state). Rows keep their order, as in [`gpu_scan`].
fn gpu_ssd(
    f: &GpuTensorFactory,
    seqs: &[Seq],
    q: usize,
    xbc: &[f32],
    dt: &[f32],
    p: &ScanParams,
    state: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let o = ScanOperands::upload(f, xbc, dt, p, state);
    let (mut firsts, mut runs, mut row) = (Vec::new(), Vec::new(), 0);
    for s in seqs {
        assert_eq!(s.num_rows % q, 0);
        let (read, save) = (s.read.unwrap_or(s.slot) as u32, s.save.map_or(NO_SLOT, |slot| slot as u32));
        let first_chunk = firsts.len() as u32;
        firsts.extend((0..s.num_rows / q).map(|c| (row + c * q) as u32));
        runs.extend([first_chunk, (s.num_rows / q) as u32, s.slot as u32, s.start_pos as u32, read, save]);
        row += s.num_rows;
    }
    let chunks_t = f.upload_u32(&[firsts.len()], &firsts).unwrap();
    let runs_t = f.upload_u32(&[seqs.len(), SEQ_STATE_COLS], &runs).unwrap();
    let chunks = SsdChunks {
        chunks: &chunks_t,
        num_chunks: firsts.len(),
        rows_per_chunk: q,
        runs: SeqStates { seqs: &runs_t, num_seqs: seqs.len() },
    };
    // Room for one chunk more than asked, as a workspace sized for bigger steps has.
    let scratch = SsdScratch::new(f, SHAPE, firsts.len() + 1, q).unwrap();
    let mut rec = Recording::new();
    ssd_scan(ctx(f), &mut rec, SHAPE, &o.xbc, &o.dt, DT_OFFSET, &o.weights(), &chunks, &scratch, &o.state, &o.y)
        .unwrap();
    o.run_and_read(f, &rec)
}

/// Three sequences over four slots: a decode continuing slot 2, a prefill from position 0 over
/// slot 0's stale contents, a chunk continuing slot 3.
fn mixed_step() -> Vec<Seq> {
    vec![seq(1, 2, 9), seq(11, 0, 0), seq(5, 3, 4)]
}

/// Tolerance: each output is one f64-exact sum of KERNEL + 1 products rounded in f32 (a few u
/// relative to the sum of |terms|), then SiLU (exp to 3 + 2|x| ULP with |x| < 8 here, a divide):
/// 40·u relative to the larger of |y| and 1 covers both.
#[test]
fn ssm_conv_matches_cpu_and_leaves_the_window() {
    let Some(f) = gpu() else { return };
    let seqs = mixed_step();
    let rows: usize = seqs.iter().map(|s| s.num_rows).sum();
    let x = random(rows * X_STRIDE, 11, 2.0);
    let w = random(CHANNELS * KERNEL, 12, 1.0);
    let bias = random(CHANNELS, 13, 0.5);
    let slot_len = (KERNEL - 1) * CHANNELS;
    let state = random(4 * slot_len, 14, 2.0);
    let (y, new_state) = gpu_conv(f, &seqs, &x, &w, &bias, &state);
    for (i, s) in seqs.iter().enumerate() {
        let u: Vec<f32> = rows_of(&x, &seqs, i, X_STRIDE)
            .chunks(X_STRIDE)
            .flat_map(|r| r[X_OFFSET..X_OFFSET + CHANNELS].to_vec())
            .collect();
        let mut window = if s.start_pos == 0 {
            vec![0.0; slot_len]
        } else {
            state[s.slot * slot_len..(s.slot + 1) * slot_len].to_vec()
        };
        let want = weft::cpu::ssm::conv1d_silu(&u, &w, &bias, KERNEL, &mut window);
        let got = rows_of(&y, &seqs, i, CHANNELS);
        assert_close(&format!("ssm_conv seq {i}"), got, &want, |j| 40.0 * U * f64::from(want[j].abs().max(1.0)));
        assert!(
            new_state[s.slot * slot_len..(s.slot + 1) * slot_len] == window[..],
            "seq {i}'s window is its last inputs"
        );
    }
    assert!(new_state[slot_len..2 * slot_len] == state[slot_len..2 * slot_len], "a slot nobody holds is untouched");
}

/// LFM2's gated short convolution (kernel 3, no bias: a zero one), B, C and x read out of a
/// wider row: y = C · conv(B · x) as the CPU computes it, the window holding the products, and
/// a restored snapshot continued as the plain form continues it.
/// Tolerance: one f64-exact sum of 3 products of products, rounded a few times in f32, then
/// times C: 16·u relative to the sum of |terms| times |C|, with |B · x| < 4 and |w| < 1 here.
#[test]
fn ssm_conv_gated_matches_cpu_short_conv() {
    let Some(f) = gpu() else { return };
    const L: usize = 3;
    let stride = X_OFFSET + 3 * CHANNELS + 2;
    let mut seqs = mixed_step();
    seqs.push(Seq { read: Some(5), save: Some(1), ..seq(4, 4, 6) });
    let rows: usize = seqs.iter().map(|s| s.num_rows).sum();
    let x = random(rows * stride, 91, 2.0);
    let w = random(CHANNELS * L, 92, 1.0);
    let zero_bias = vec![0.0; CHANNELS];
    let slot_len = (L - 1) * CHANNELS;
    let state = random(6 * slot_len, 94, 4.0);
    let (y, new_state) = gpu_conv_of(f, ConvForm::Gated, stride, &seqs, &x, &w, &zero_bias, &state);
    for (i, s) in seqs.iter().enumerate() {
        let bcx: Vec<f32> = rows_of(&x, &seqs, i, stride)
            .chunks(stride)
            .flat_map(|r| r[X_OFFSET..X_OFFSET + 3 * CHANNELS].to_vec())
            .collect();
        let read = s.read.unwrap_or(s.slot);
        let mut window =
            if s.start_pos == 0 { vec![0.0; slot_len] } else { state[read * slot_len..(read + 1) * slot_len].to_vec() };
        let want = weft::cpu::ssm::short_conv(&bcx, &w, L, &mut window);
        let got = rows_of(&y, &seqs, i, CHANNELS);
        assert_close(&format!("gated ssm_conv seq {i}"), got, &want, |j| {
            16.0 * U * 12.0 * f64::from(bcx_gate(&bcx, j))
        });
        assert!(
            new_state[s.slot * slot_len..(s.slot + 1) * slot_len] == window[..],
            "seq {i}'s window is its last B · x"
        );
        if let Some(save) = s.save {
            assert!(new_state[save * slot_len..(save + 1) * slot_len] == window[..], "seq {i}'s snapshot");
        }
    }
    assert!(new_state[5 * slot_len..] == state[5 * slot_len..], "the snapshot read is unchanged");
}

/// |C| of output `j` (row-major over (rows, CHANNELS)) in rows of B, C, x.
fn bcx_gate(bcx: &[f32], j: usize) -> f32 {
    let (row, c) = (j / CHANNELS, j % CHANNELS);
    bcx[row * 3 * CHANNELS + CHANNELS + c].abs().max(1.0)
}

/// Tolerance: per step the state is s · exp(dt · a) + dt · B · x (softplus and exp to a few ULP
/// each, three roundings) and y a state_size-term dot product; over the 11 steps of the longest
/// sequence the relative error stays below 1e-4 of the magnitudes involved (|y| + 1).
#[test]
fn ssm_scan_matches_cpu_and_leaves_the_state() {
    let Some(f) = gpu() else { return };
    let seqs = mixed_step();
    let rows: usize = seqs.iter().map(|s| s.num_rows).sum();
    let xbc = random(rows * XBC, 21, 1.0);
    let dt = random(rows * DT_STRIDE, 22, 3.0);
    let p = scan_params();
    let state = random(4 * STATE, 23, 1.0);
    let (y, new_state) = gpu_scan(f, &seqs, &xbc, &dt, &p, &state);
    let dims = weft::cpu::ssm::ScanDims { num_heads: 4, head_dim: 8, state_size: 16, num_groups: 2 };
    for (i, s) in seqs.iter().enumerate() {
        let dt_raw: Vec<f32> = rows_of(&dt, &seqs, i, DT_STRIDE)
            .chunks(DT_STRIDE)
            .flat_map(|r| r[DT_OFFSET..DT_OFFSET + 4].to_vec())
            .collect();
        let mut st =
            if s.start_pos == 0 { vec![0.0; STATE] } else { state[s.slot * STATE..(s.slot + 1) * STATE].to_vec() };
        let want =
            weft::cpu::ssm::ssm_scan(dims, rows_of(&xbc, &seqs, i, XBC), &dt_raw, &p.a, &p.d, &p.dt_bias, &mut st);
        let got = rows_of(&y, &seqs, i, INNER);
        assert_close(&format!("ssm_scan seq {i}"), got, &want, |j| 1e-4 * f64::from(want[j].abs() + 1.0));
        let got_state = &new_state[s.slot * STATE..(s.slot + 1) * STATE];
        assert_close(&format!("ssm_scan state {i}"), got_state, &st, |j| 1e-4 * f64::from(st[j].abs() + 1.0));
    }
    assert!(new_state[STATE..2 * STATE] == state[STATE..2 * STATE], "a slot nobody holds is untouched");
}

/// A 13-token prefill in one pass, in chunks of 5, 1 and 7 carried through the slot, and
/// alone versus among other sequences: the same bits, for y and for the final state.
#[test]
fn chunked_and_batched_equal_one_pass_alone_bit_for_bit() {
    let Some(f) = gpu() else { return };
    let n = 13;
    let x = random(n * X_STRIDE, 41, 2.0);
    let w = random(CHANNELS * KERNEL, 42, 1.0);
    let bias = random(CHANNELS, 43, 0.5);
    let xbc = random(n * XBC, 44, 1.0);
    let dt = random(n * DT_STRIDE, 45, 3.0);
    let p = scan_params();
    let conv_slot = (KERNEL - 1) * CHANNELS;
    let alone = [seq(n, 0, 0)];
    let (conv_y, conv_state) = gpu_conv(f, &alone, &x, &w, &bias, &vec![0.0; conv_slot]);
    let (scan_y, scan_state) = gpu_scan(f, &alone, &xbc, &dt, &p, &vec![0.0; STATE]);

    // In chunks, the state going from one dispatch to the next.
    let (mut cy, mut cs, mut sy, mut ss) = (Vec::new(), vec![7.0; conv_slot], Vec::new(), vec![7.0; STATE]);
    let mut start = 0;
    for len in [5, 1, 7] {
        let chunk = [seq(len, 0, start)];
        let (y, s) = gpu_conv(f, &chunk, &x[start * X_STRIDE..(start + len) * X_STRIDE], &w, &bias, &cs);
        cy.extend(y);
        cs = s;
        let (y, s) = gpu_scan(
            f,
            &chunk,
            &xbc[start * XBC..(start + len) * XBC],
            &dt[start * DT_STRIDE..(start + len) * DT_STRIDE],
            &p,
            &ss,
        );
        sy.extend(y);
        ss = s;
        start += len;
    }
    assert!(cy == conv_y && cs == conv_state, "conv: chunked differs from one pass");
    assert!(sy == scan_y && ss == scan_state, "scan: chunked differs from one pass");

    // Among others: the same sequence in slot 2, second of three.
    let others = [seq(3, 0, 0), seq(n, 2, 0), seq(1, 1, 6)];
    let pad = |v: &[f32], width: usize, seed: u64| {
        let mut all = random(3 * width, seed, 1.0);
        all.extend_from_slice(v);
        all.extend(random(width, seed + 1, 1.0));
        all
    };
    let (y, s) = gpu_conv(f, &others, &pad(&x, X_STRIDE, 50), &w, &bias, &random(3 * conv_slot, 52, 1.0));
    assert!(
        rows_of(&y, &others, 1, CHANNELS) == conv_y && s[2 * conv_slot..] == conv_state[..],
        "conv: batched differs"
    );
    let (y, s) = gpu_scan(f, &others, &pad(&xbc, XBC, 60), &pad(&dt, DT_STRIDE, 62), &p, &random(3 * STATE, 64, 1.0));
    assert!(rows_of(&y, &others, 1, INNER) == scan_y && s[2 * STATE..] == scan_state[..], "scan: batched differs");
}

/// The chunked (SSD) scan against the CPU's token-by-token recurrence: three runs in one
/// dispatch (three chunks from position 0 over a slot's stale contents; one chunk continuing
/// a slot; two chunks restored from a snapshot slot and saved to another), chunks of 4 and of
/// 8 rows. Tolerance as the token-by-token scan's: the SSD form regroups the same sums (state
/// decays as exp(cs_t - cs_s) instead of products of per-step decays, a few ULP apart), so
/// 1e-4 of the magnitudes involved covers it, while a wrong decay, a chunk read from the wrong
/// state or an off-by-one in the causal sum moves values by whole percents.
#[test]
fn ssd_scan_matches_the_recurrence_and_leaves_the_states() {
    let Some(f) = gpu() else { return };
    for q in [4, 8] {
        let seqs = [seq(3 * q, 0, 0), seq(q, 2, 9), Seq { read: Some(4), save: Some(1), ..seq(2 * q, 3, 2 * q) }];
        let rows: usize = seqs.iter().map(|s| s.num_rows).sum();
        let xbc = random(rows * XBC, 91, 1.0);
        let dt = random(rows * DT_STRIDE, 92, 3.0);
        let p = scan_params();
        let state = random(5 * STATE, 93, 1.0);
        let (y, new_state) = gpu_ssd(f, &seqs, q, &xbc, &dt, &p, &state);
        let dims = weft::cpu::ssm::ScanDims { num_heads: 4, head_dim: 8, state_size: 16, num_groups: 2 };
        for (i, s) in seqs.iter().enumerate() {
            let dt_raw: Vec<f32> = rows_of(&dt, &seqs, i, DT_STRIDE)
                .chunks(DT_STRIDE)
                .flat_map(|r| r[DT_OFFSET..DT_OFFSET + 4].to_vec())
                .collect();
            let from = s.read.unwrap_or(s.slot);
            let mut st =
                if s.start_pos == 0 { vec![0.0; STATE] } else { state[from * STATE..(from + 1) * STATE].to_vec() };
            let want =
                weft::cpu::ssm::ssm_scan(dims, rows_of(&xbc, &seqs, i, XBC), &dt_raw, &p.a, &p.d, &p.dt_bias, &mut st);
            let what = format!("ssd_scan q={q} run {i}");
            assert_close(&what, rows_of(&y, &seqs, i, INNER), &want, |j| 1e-4 * f64::from(want[j].abs() + 1.0));
            for slot in std::iter::once(s.slot).chain(s.save) {
                let got = &new_state[slot * STATE..(slot + 1) * STATE];
                assert_close(&format!("{what} state in slot {slot}"), got, &st, |j| {
                    1e-4 * f64::from(st[j].abs() + 1.0)
                });
            }
        }
        assert!(new_state[4 * STATE..] == state[4 * STATE..], "the snapshot read is unchanged");
    }
}

/// Tolerance as rms_norm's plus the gate: SiLU (exp to 19 ULP for |z| <= 8, a divide) and one
/// product before the sum of squares: 64·u relative, plus 1e-6 absolute for outputs near zero.
#[test]
fn gated_rms_norm_matches_cpu() {
    let Some(f) = gpu() else { return };
    for &(rows, groups, group_size) in &[(1, 1, 32), (3, 2, 40), (5, 4, 100)] {
        let width = groups * group_size;
        let (z_offset, z_stride) = (7, width + 9);
        let x = random(rows * width, 71, 2.0);
        let z_all = random(rows * z_stride, 72, 8.0);
        let weight = random(width, 73, 1.0);
        let xt = f.upload_f32(&[rows, width], &x).unwrap();
        let zt = f.upload_f32(&[rows, z_stride], &z_all).unwrap();
        let wt = f.upload_f32(&[width], &weight).unwrap();
        let yt = f.zeros(&[rows, width], DType::F32).unwrap();
        let mut rec = Recording::new();
        gated_rms_norm(ctx(f), &mut rec, &xt, &zt, z_offset, &wt, group_size, &yt, 1e-5, GateAt::Input).unwrap();
        run(f, &rec);
        let z: Vec<f32> = z_all.chunks(z_stride).flat_map(|r| r[z_offset..z_offset + width].to_vec()).collect();
        let want = weft::cpu::ssm::gated_rms_norm(&x, &z, &weight, group_size, 1e-5, false);
        assert_close(&format!("gated_rms_norm {rows}x{groups}x{group_size}"), &read_f32(f, &yt), &want, |i| {
            64.0 * U * f64::from(want[i].abs()) + 1e-6
        });
    }
}

#[test]
fn bad_shapes_are_errors() {
    let Some(f) = gpu() else { return };
    let t = |shape: &[usize]| f.zeros(shape, DType::F32).unwrap();
    let table = f.upload_u32(&[1, SEQ_STATE_COLS], &[0, 1, 0, 0, 0, NO_SLOT]).unwrap();
    let s = SeqStates { seqs: &table, num_seqs: 1 };
    let err = ssm_conv(
        ctx(f),
        &mut Recording::new(),
        &t(&[1, 8]),
        4,
        ConvForm::Silu,
        &t(&[8, 4]),
        &t(&[8]),
        &s,
        &t(&[1, 3, 8]),
        &t(&[1, 8]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("x has 8 columns; columns 4..12 were asked for"), "{err}");
    let err = ssm_conv(
        ctx(f),
        &mut Recording::new(),
        &t(&[1, 8]),
        0,
        ConvForm::Silu,
        &t(&[8, 9]),
        &t(&[8]),
        &s,
        &t(&[1, 8, 8]),
        &t(&[1, 8]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("conv kernel 9; 2 to 8 are supported"), "{err}");
    // The gated form reads B, C and x: three times the channels.
    let err = ssm_conv(
        ctx(f),
        &mut Recording::new(),
        &t(&[1, 20]),
        0,
        ConvForm::Gated,
        &t(&[8, 3]),
        &t(&[8]),
        &s,
        &t(&[1, 2, 8]),
        &t(&[1, 8]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("x has 20 columns; columns 0..24 were asked for"), "{err}");
    let (a, d, b) = (t(&[4]), t(&[4]), t(&[4]));
    let w = ScanWeights { a: &a, d: &d, dt_bias: &b };
    // An invocation runs four channels of one head: a head of 6 channels is refused.
    let odd = ScanShape { head_dim: 6, ..SHAPE };
    let err = ssm_scan(
        ctx(f),
        &mut Recording::new(),
        odd,
        &t(&[1, XBC]),
        &t(&[1, 4]),
        0,
        &w,
        &s,
        &t(&[1, 4, 6, 16]),
        &t(&[1, INNER]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("head size 6"), "{err}");
}

/// A prefix-state restore and snapshot: a chunk continuing from snapshot slot 3 (not its own
/// slot 0) and also saving its final state to slot 2 gives the CPU's numbers from slot 3's
/// state; slots 0 and 2 end equal, and the snapshot read stays as it was.
#[test]
fn a_chunk_restores_from_one_slot_and_saves_to_another() {
    let Some(f) = gpu() else { return };
    let restore = [Seq { read: Some(3), save: Some(2), ..seq(6, 0, 8) }];
    let x = random(6 * X_STRIDE, 81, 2.0);
    let w = random(CHANNELS * KERNEL, 82, 1.0);
    let bias = random(CHANNELS, 83, 0.5);
    let slot_len = (KERNEL - 1) * CHANNELS;
    let conv_before = random(4 * slot_len, 84, 2.0);
    let (y, conv_after) = gpu_conv(f, &restore, &x, &w, &bias, &conv_before);
    let u: Vec<f32> = x.chunks(X_STRIDE).flat_map(|r| r[X_OFFSET..X_OFFSET + CHANNELS].to_vec()).collect();
    let mut window = conv_before[3 * slot_len..4 * slot_len].to_vec();
    let want = weft::cpu::ssm::conv1d_silu(&u, &w, &bias, KERNEL, &mut window);
    assert_close("ssm_conv restored", &y, &want, |j| 40.0 * U * f64::from(want[j].abs().max(1.0)));
    assert!(conv_after[..slot_len] == window[..] && conv_after[2 * slot_len..3 * slot_len] == window[..]);
    assert!(conv_after[3 * slot_len..] == conv_before[3 * slot_len..], "the snapshot read is unchanged");

    let xbc = random(6 * XBC, 85, 1.0);
    let dt = random(6 * DT_STRIDE, 86, 3.0);
    let p = scan_params();
    let state_before = random(4 * STATE, 87, 1.0);
    let (y, state_after) = gpu_scan(f, &restore, &xbc, &dt, &p, &state_before);
    let dims = weft::cpu::ssm::ScanDims { num_heads: 4, head_dim: 8, state_size: 16, num_groups: 2 };
    let dt_raw: Vec<f32> = dt.chunks(DT_STRIDE).flat_map(|r| r[DT_OFFSET..DT_OFFSET + 4].to_vec()).collect();
    let mut st = state_before[3 * STATE..].to_vec();
    let want = weft::cpu::ssm::ssm_scan(dims, &xbc, &dt_raw, &p.a, &p.d, &p.dt_bias, &mut st);
    assert_close("ssm_scan restored", &y, &want, |j| 1e-4 * f64::from(want[j].abs() + 1.0));
    assert!(state_after[..STATE] == state_after[2 * STATE..3 * STATE], "own slot and snapshot differ");
    assert_close("ssm_scan saved state", &state_after[2 * STATE..3 * STATE], &st, |j| {
        1e-4 * f64::from(st[j].abs() + 1.0)
    });
    assert!(state_after[3 * STATE..] == state_before[3 * STATE..], "the snapshot read is unchanged");
}
