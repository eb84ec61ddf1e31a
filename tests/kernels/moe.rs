//! The mixture-of-experts kernels against `cpu::moe`: `moe_route` (softmax top-k, with and
//! without renormalisation, and gpt-oss's softmax over the top-k logits; ties to the lower
//! expert; Gemma 4's per-expert weight scales), the grouping of rows by expert (`moe_group`), and the experts' MLP as a layer
//! records it (`moe_group`, `moe_matmul` by tiles, gated and plain, `moe_combine`) over stacked
//! experts in F32, Q8_0 and Q4_0 (and gpt-oss's biased experts with the clamped SwiGLU in F32
//! and MXFP4), in every kernel setup, for 1, 7 and 64 tokens. Every setup sums in the same
//! order, so all give the same bits; a token's bits are the same alone as in a batch; experts
//! split over several bindings give the same bits as in one; the grouped kernel gives the
//! per-row kernel's bits in every weight format.

use weft::DType;
use weft::gpu::kernels::moe::{
    MAX_EXPERTS, Routing, TILE_ROWS, TILE_WORDS, max_tiles, moe_combine, moe_group, moe_matmul, moe_route,
};
use weft::gpu::{Epilogue, GpuTensorFactory, Recording};
use weft::tensor::TensorFactory;

use crate::common::*;

const EXPERTS: usize = 8;
const TOP_K: usize = 2;
const HIDDEN: usize = 64;
const FF: usize = 32;

fn route_on_gpu(
    f: &GpuTensorFactory,
    logits: &[f32],
    routing: Routing,
    bias: Option<&[f32]>,
    scale: Option<&[f32]>,
) -> (Vec<u32>, Vec<f32>) {
    let tokens = logits.len() / EXPERTS;
    let lt = f.upload_f32(&[tokens, EXPERTS], logits).unwrap();
    let ids = f.zeros(&[tokens, TOP_K], DType::U32).unwrap();
    let weights = f.zeros(&[tokens, TOP_K], DType::F32).unwrap();
    let bias = bias.map(|b| f.upload_f32(&[EXPERTS], b).unwrap());
    let scale = scale.map(|s| f.upload_f32(&[EXPERTS], s).unwrap());
    let mut rec = Recording::new();
    moe_route(ctx(f), &mut rec, &lt, &ids, &weights, routing, bias.as_ref(), scale.as_ref()).unwrap();
    run(f, &rec);
    (read_u32(f, &ids), read_f32(f, &weights))
}

/// Ids equal; weights within a few roundings of the f64 reference (a softmax: an exp, a sum of
/// 8 terms and a division; renormalised, one more sum and division; over the top k logits, an
/// exp, a sum of k terms and a division).
#[test]
fn route_matches_cpu() {
    let Some(f) = gpu() else { return };
    for tokens in [1, 7, 64] {
        let mut logits = random(tokens * EXPERTS, tokens as u64, 3.0);
        // Token 0: all equal (ties to the lower experts); token 1 (when there is one): the
        // second and third largest equal.
        logits[..EXPERTS].fill(0.5);
        if tokens > 1 {
            logits[EXPERTS..2 * EXPERTS].copy_from_slice(&[0.0, 1.0, 2.0, 1.0, -1.0, 3.0, 2.0, 0.0]);
        }
        for routing in [
            Routing::Softmax { normalize: false },
            Routing::Softmax { normalize: true },
            Routing::TopKSoftmax,
            Routing::Sigmoid { normalize: false },
            Routing::Sigmoid { normalize: true },
        ] {
            let (ids, weights) = route_on_gpu(f, &logits, routing, None, None);
            let (want_ids, want_weights) = weft::cpu::moe::moe_route(&logits, EXPERTS, TOP_K, routing, None, None);
            assert_eq!(ids, want_ids, "{tokens} tokens, {routing:?}");
            assert_close(&format!("route weights, {tokens} tokens"), &weights, &want_weights, |i| {
                (2 * EXPERTS + 8) as f64 * U * f64::from(want_weights[i]) + 1e-30
            });
            assert_eq!(&ids[..TOP_K], &[0, 1], "all equal: the lowest experts");
            if tokens > 1 {
                assert_eq!(&ids[TOP_K..2 * TOP_K], &[5, 2], "2 and 6 tie for second: the lower");
            }
        }
    }
}

/// Sigmoid routing with a choice bias (LFM2-MoE's): the bias moves which experts are chosen,
/// not their weights, which stay each chosen expert's sigmoid (renormalised or not). Bias
/// values are spaced so that no two keys nearly tie.
#[test]
fn sigmoid_route_with_a_bias_matches_cpu() {
    let Some(f) = gpu() else { return };
    let tokens = 7;
    let logits = random(tokens * EXPERTS, 5, 3.0);
    let bias: Vec<f32> = (0..EXPERTS).map(|e| if e % 3 == 0 { 1.5 } else { -0.25 * e as f32 }).collect();
    for normalize in [false, true] {
        let routing = Routing::Sigmoid { normalize };
        let (ids, weights) = route_on_gpu(f, &logits, routing, Some(&bias), None);
        let (want_ids, want_weights) = weft::cpu::moe::moe_route(&logits, EXPERTS, TOP_K, routing, Some(&bias), None);
        assert_eq!(ids, want_ids, "{routing:?}");
        assert_close(&format!("sigmoid route weights, {routing:?}"), &weights, &want_weights, |i| {
            (2 * TOP_K + 8) as f64 * U * f64::from(want_weights[i]) + 1e-30
        });
        let (unbiased, _) = weft::cpu::moe::moe_route(&logits, EXPERTS, TOP_K, routing, None, None);
        assert_ne!(ids, unbiased, "the bias changed no choice");
    }
}

/// Gemma 4's routing: softmax, top k, renormalised, then each weight times its expert's scale.
/// The scales change the weights only, never the choice; the weights are within the
/// renormalised route's tolerance plus one rounding (the product) of the f64 reference.
#[test]
fn route_with_per_expert_scales_matches_cpu() {
    let Some(f) = gpu() else { return };
    let tokens = 7;
    let logits = random(tokens * EXPERTS, 9, 3.0);
    let scale: Vec<f32> = (0..EXPERTS).map(|e| 0.5 + 0.125 * e as f32).collect();
    let routing = Routing::Softmax { normalize: true };
    let (ids, weights) = route_on_gpu(f, &logits, routing, None, Some(&scale));
    let (want_ids, want_weights) = weft::cpu::moe::moe_route(&logits, EXPERTS, TOP_K, routing, None, Some(&scale));
    assert_eq!(ids, want_ids);
    assert_close("scaled route weights", &weights, &want_weights, |i| {
        (2 * EXPERTS + 9) as f64 * U * f64::from(want_weights[i]) + 1e-30
    });
    let (plain_ids, plain) = route_on_gpu(f, &logits, routing, None, None);
    assert_eq!(ids, plain_ids, "the scales changed a choice");
    for (i, (w, p)) in weights.iter().zip(&plain).enumerate() {
        assert_eq!(*w, p * scale[ids[i] as usize], "slot {i}: not the unscaled weight times its expert's scale");
    }
}

/// Each token's `top_k` distinct experts of `experts`, from random router logits.
fn random_ids(tokens: usize, experts: usize, top_k: usize, seed: u64) -> Vec<u32> {
    let logits = random(tokens * experts, seed, 3.0);
    weft::cpu::moe::moe_route(&logits, experts, top_k, Routing::Softmax { normalize: false }, None, None).0
}

/// `moe_group`'s tile table for `ids` (tokens, top_k), read back as (expert, rows) per tile.
fn group_on_gpu(f: &GpuTensorFactory, ids: &[u32], top_k: usize, experts: usize) -> Vec<(u32, Vec<u32>)> {
    let rows = ids.len();
    let idt = f.upload_u32(&[rows / top_k, top_k], ids).unwrap();
    // Filled with a pattern, so a tile the kernel forgot to write shows.
    let capacity = 1 + max_tiles(rows, experts);
    let tiles = f.upload_u32(&[capacity, TILE_WORDS], &vec![0xDEAD; capacity * TILE_WORDS]).unwrap();
    let mut rec = Recording::new();
    moe_group(ctx(f), &mut rec, &idt, experts, &tiles).unwrap();
    run(f, &rec);
    let words = read_u32(f, &tiles);
    let count = words[0] as usize;
    assert!(count < capacity, "{count} tiles overflow the table's {}", capacity - 1);
    (1..=count)
        .map(|t| {
            let tile = &words[t * TILE_WORDS..][..TILE_WORDS];
            let n = tile[1] as usize;
            assert!((1..=TILE_ROWS).contains(&n), "tile {t} holds {n} rows");
            (tile[0], tile[2..2 + n].to_vec())
        })
        .collect()
}

/// The tile table against `cpu::moe::moe_group`: the same tiles (expert and row count) in the
/// same order, and each expert's rows the same set (the GPU places them in any order).
fn check_grouping(got: &[(u32, Vec<u32>)], want: &[(u32, Vec<u32>)], what: &str) {
    let shape = |t: &[(u32, Vec<u32>)]| t.iter().map(|(e, r)| (*e, r.len())).collect::<Vec<_>>();
    assert_eq!(shape(got), shape(want), "{what}: tiles (expert, rows)");
    let by_expert = |t: &[(u32, Vec<u32>)]| {
        let mut m = std::collections::BTreeMap::<u32, Vec<u32>>::new();
        t.iter().for_each(|(e, r)| m.entry(*e).or_default().extend(r));
        m.values_mut().for_each(|r| r.sort_unstable());
        m
    };
    assert_eq!(by_expert(got), by_expert(want), "{what}: each expert's rows");
}

/// Rows grouped by expert on the GPU as the CPU groups them: 8 experts, top 2 (one partial
/// tile per expert or none), and Qwen3-30B-A3B's 128 experts, top 8, over more rows than the
/// kernel's 256 invocations (each places several); a row whose id names no expert is left out.
#[test]
fn group_matches_cpu() {
    let Some(f) = gpu() else { return };
    for (experts, top_k, tokens) in [(8, 2, 1), (8, 2, 7), (8, 2, 64), (128, 8, 1), (128, 8, 300)] {
        let mut ids = random_ids(tokens, experts, top_k, tokens as u64);
        let what = format!("{tokens} tokens, top {top_k} of {experts}");
        check_grouping(
            &group_on_gpu(f, &ids, top_k, experts),
            &weft::cpu::moe::moe_group(&ids, experts, TILE_ROWS),
            &what,
        );
        ids[0] = experts as u32;
        let got = group_on_gpu(f, &ids, top_k, experts);
        check_grouping(
            &got,
            &weft::cpu::moe::moe_group(&ids, experts, TILE_ROWS),
            &format!("{what}, row 0 out of range"),
        );
        assert!(got.iter().all(|(_, rows)| !rows.contains(&0)), "{what}: the row naming no expert was placed");
    }
}

/// The grouping refuses more experts than its workgroup tables hold, and it and the grouped
/// matmul a tile table too short for the rows' worst case.
#[test]
fn group_refuses_what_it_cannot_hold() {
    let Some(f) = gpu() else { return };
    let ids = f.upload_u32(&[4, 2], &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    let tiles = f.zeros(&[1 + max_tiles(8, 8), TILE_WORDS], DType::U32).unwrap();
    let mut rec = Recording::new();
    let err = moe_group(ctx(f), &mut rec, &ids, MAX_EXPERTS + 1, &tiles).unwrap_err().to_string();
    assert!(err.contains("experts"), "{err}");
    let short = f.zeros(&[max_tiles(8, 8), TILE_WORDS], DType::U32).unwrap();
    let err = moe_group(ctx(f), &mut rec, &ids, 8, &short).unwrap_err().to_string();
    assert!(err.contains("tiles has"), "{err}");
    // The matmul by tiles refuses it too: its grid covers the rows' worst case.
    let (x, w) = (f.zeros(&[4, 32], DType::F32).unwrap(), f.zeros(&[8 * 16, 32], DType::F32).unwrap());
    let y = f.zeros(&[8, 16], DType::F32).unwrap();
    let err = moe_matmul(ctx(f), &mut rec, &x, &w, 8, &ids, Some(&short), &y, Epilogue::None, None).unwrap_err();
    assert!(err.to_string().contains("tiles has"), "{err}");
    assert!(rec.is_empty(), "a refused grouping recorded a dispatch");
}

/// One projection of the experts for (token, slot) rows by `kernel`: the per-row kernel, or the
/// grouping and the grouped kernel. y starts as a NaN pattern, so a row left unwritten shows.
#[allow(clippy::too_many_arguments)]
fn projection(
    f: &GpuTensorFactory,
    grouped: bool,
    x: &weft::gpu::GpuTensor,
    w: &weft::gpu::GpuTensor,
    ids: &weft::gpu::GpuTensor,
    n: usize,
    epilogue: Epilogue,
    bias: Option<&weft::gpu::GpuTensor>,
) -> Vec<f32> {
    let rows = ids.shape()[0] * ids.shape()[1];
    let y = f.upload_f32(&[rows, n], &vec![f32::from_bits(UNWRITTEN); rows * n]).unwrap();
    let mut rec = Recording::new();
    if grouped {
        let tiles = f.zeros(&[1 + max_tiles(rows, EXPERTS), TILE_WORDS], DType::U32).unwrap();
        moe_group(ctx(f), &mut rec, ids, EXPERTS, &tiles).unwrap();
        moe_matmul(ctx(f), &mut rec, x, w, EXPERTS, ids, Some(&tiles), &y, epilogue, bias).unwrap();
    } else {
        moe_matmul(ctx(f), &mut rec, x, w, EXPERTS, ids, None, &y, epilogue, bias).unwrap();
    }
    run(f, &rec);
    read_f32(f, &y)
}

/// A NaN no kernel writes.
const UNWRITTEN: u32 = 0x7FC0_DEAD;

/// The grouped kernel gives the per-row kernel's bits for `dtype`'s experts: gate and up with
/// the SwiGLU and with the GeGLU (a row of x per token) and down (a row per slot), and with `biased`, gpt-oss's
/// biases and clamped SwiGLU, over random routings of 1, 7 and 64 tokens (top 2 of 8: from one
/// row an expert to 16, partial and full tiles), in `setups`.
fn check_grouped(dtype: DType, setups: &[Setup], biased: bool) {
    // Rows of whole super-blocks for the 256-element formats.
    let (hidden, ff) = if dtype.block_elems() == 256 { (256, 256) } else { (64, 32) };
    let gate_up_bytes = weights(dtype, EXPERTS * 2 * ff * hidden, 50).0;
    let down_bytes = weights(dtype, EXPERTS * hidden * ff, 51).0;
    for tokens in [1, 7, 64] {
        let ids = random_ids(tokens, EXPERTS, TOP_K, 60 + tokens as u64);
        let x = random(tokens * hidden, 61, 1.0);
        let act = random(tokens * TOP_K * ff, 62, 1.0);
        let (gate_up_bias, down_bias) = (random(EXPERTS * 2 * ff, 63, 1.0), random(EXPERTS * hidden, 64, 1.0));
        for setup in setups {
            let Some(f) = setup.factory() else { continue };
            let gate_up = setup.weights(f, &[EXPERTS * 2 * ff, hidden], dtype, &gate_up_bytes);
            let down = setup.weights(f, &[EXPERTS * hidden, ff], dtype, &down_bytes);
            let idt = f.upload_u32(&[tokens, TOP_K], &ids).unwrap();
            let xt = f.upload_f32(&[tokens, hidden], &x).unwrap();
            let actt = f.upload_f32(&[tokens * TOP_K, ff], &act).unwrap();
            let gu_bias = f.upload_f32(&[EXPERTS, 2 * ff], &gate_up_bias).unwrap();
            let d_bias = f.upload_f32(&[EXPERTS, hidden], &down_bias).unwrap();
            let cases = [
                ("gate and up", &xt, &gate_up, ff, Epilogue::SiluMul, None),
                ("Gemma 4's GeGLU gate and up", &xt, &gate_up, ff, Epilogue::GeluMul, None),
                ("down", &actt, &down, hidden, Epilogue::None, None),
                ("gpt-oss's gate and up", &xt, &gate_up, ff, Epilogue::SwigluOai, Some(&gu_bias)),
                ("biased down", &actt, &down, hidden, Epilogue::None, Some(&d_bias)),
            ];
            for (name, x, w, n, epilogue, bias) in cases.into_iter().filter(|c| biased || c.5.is_none()) {
                let what = format!("{dtype} {name}, {tokens} tokens, {}", setup.name());
                let per_row = projection(f, false, x, w, &idt, n, epilogue, bias);
                let grouped = projection(f, true, x, w, &idt, n, epilogue, bias);
                assert!(per_row.iter().all(|v| v.to_bits() != UNWRITTEN), "{what}: the per-row kernel left a row");
                if let Some(i) = per_row.iter().zip(&grouped).position(|(a, b)| a.to_bits() != b.to_bits()) {
                    panic!("{what}: element {i} is {} grouped, {} row by row", grouped[i], per_row[i]);
                }
            }
        }
    }
}

/// `formats` through [`check_grouped`]. Compiling both kernels for a format, a setup and an
/// epilogue takes lavapipe about a second, so CI checks four formats (a float, a 32-element
/// block, a super-block with mins, and gpt-oss's MXFP4 with its biases) in the CPU family's
/// setup (weights in a texture, as lavapipe runs models) and the GPU families' tile (the
/// subgroup family's setup; the baseline's runs the same kernels); `WEFT_FULL=1` checks every
/// format, biased too, in every setup.
fn check_grouped_formats(formats: impl Iterator<Item = DType>) {
    let full = std::env::var("WEFT_FULL").as_deref() == Ok("1");
    let every: Vec<Setup> = setups().into_iter().filter(|s| !s.window_x).collect();
    let some: Vec<Setup> =
        every.iter().filter(|s| s.texture_weights || s.family == weft::gpu::KernelFamily::Subgroup).copied().collect();
    for dtype in formats {
        if full {
            check_grouped(dtype, &every, true);
        } else if [DType::F32, DType::Q4_0, DType::Q4_K, DType::MXFP4].contains(&dtype) {
            check_grouped(dtype, &some, dtype == DType::MXFP4);
        }
    }
}

#[test]
fn grouped_experts_give_the_per_row_bits_in_32_element_formats() {
    check_grouped_formats(DType::WEIGHTS.into_iter().filter(|d| d.block_elems() != 256));
}

#[test]
fn grouped_experts_give_the_per_row_bits_in_super_block_formats() {
    check_grouped_formats(DType::WEIGHTS.into_iter().filter(|d| d.block_elems() == 256));
}

/// Stacked experts of a format: gate_up (EXPERTS · 2 · FF, HIDDEN), each expert's gate rows then
/// up rows, and down (EXPERTS · HIDDEN, FF): bytes and exact decodings; with `biases`,
/// gpt-oss's experts: gate_up's (EXPERTS, 2 · FF) and down's (EXPERTS, HIDDEN) biases and the
/// clamped SwiGLU.
struct Experts {
    gate_up: (Vec<u8>, Vec<f32>),
    down: (Vec<u8>, Vec<f32>),
    biases: Option<(Vec<f32>, Vec<f32>)>,
}

fn experts(dtype: DType, hidden: usize, ff: usize) -> Experts {
    Experts {
        gate_up: weights(dtype, EXPERTS * 2 * ff * hidden, 11),
        down: weights(dtype, EXPERTS * hidden * ff, 12),
        biases: None,
    }
}

fn oai_experts(dtype: DType, hidden: usize, ff: usize) -> Experts {
    let biases = Some((random(EXPERTS * 2 * ff, 13, 1.0), random(EXPERTS * hidden, 14, 1.0)));
    Experts { biases, ..experts(dtype, hidden, ff) }
}

impl Experts {
    fn cpu(&self, x: &[f32], ids: &[u32], weights: &[f32], hidden: usize, ff: usize) -> Vec<f32> {
        let biases = self.biases.as_ref().map(|(gate_up, down)| weft::cpu::moe::ExpertBiases { gate_up, down });
        weft::cpu::moe::moe_mlp_with(x, ids, weights, &self.gate_up.1, &self.down.1, hidden, ff, biases.as_ref())
    }
}

/// The MLP's output (tokens, hidden) on the GPU as a layer records it (the rows grouped by
/// expert, the grouped kernel), with `upload` placing each stacked weight.
#[allow(clippy::too_many_arguments)]
fn mlp_on_gpu(
    f: &GpuTensorFactory,
    upload: &dyn Fn(&[usize], &[u8]) -> weft::gpu::GpuTensor,
    x: &[f32],
    ids: &[u32],
    weights: &[f32],
    w: &Experts,
    hidden: usize,
    ff: usize,
) -> Vec<f32> {
    let tokens = x.len() / hidden;
    let xt = f.upload_f32(&[tokens, hidden], x).unwrap();
    let gate_up = upload(&[EXPERTS * 2 * ff, hidden], &w.gate_up.0);
    let down = upload(&[EXPERTS * hidden, ff], &w.down.0);
    let idt = f.upload_u32(&[tokens, TOP_K], ids).unwrap();
    let wt = f.upload_f32(&[tokens, TOP_K], weights).unwrap();
    let act = f.zeros(&[tokens * TOP_K, ff], DType::F32).unwrap();
    let y = f.zeros(&[tokens * TOP_K, hidden], DType::F32).unwrap();
    let out = f.zeros(&[tokens, hidden], DType::F32).unwrap();
    let biases = w.biases.as_ref().map(|(gate_up, down)| {
        (f.upload_f32(&[EXPERTS, 2 * ff], gate_up).unwrap(), f.upload_f32(&[EXPERTS, hidden], down).unwrap())
    });
    let (gate, gate_up_bias, down_bias) = match &biases {
        Some((gate_up, down)) => (Epilogue::SwigluOai, Some(gate_up), Some(down)),
        None => (Epilogue::SiluMul, None, None),
    };
    let tiles = f.zeros(&[1 + max_tiles(tokens * TOP_K, EXPERTS), TILE_WORDS], DType::U32).unwrap();
    let mut rec = Recording::new();
    moe_group(ctx(f), &mut rec, &idt, EXPERTS, &tiles).unwrap();
    let t = Some(&tiles);
    moe_matmul(ctx(f), &mut rec, &xt, &gate_up, EXPERTS, &idt, t, &act, gate, gate_up_bias).unwrap();
    moe_matmul(ctx(f), &mut rec, &act, &down, EXPERTS, &idt, t, &y, Epilogue::None, down_bias).unwrap();
    moe_combine(ctx(f), &mut rec, &y, &wt, &out, false).unwrap();
    run(f, &rec);
    read_f32(f, &out)
}

/// Routing of `tokens` random rows, from the CPU (so every setup gets the same).
fn routing(tokens: usize, seed: u64) -> (Vec<u32>, Vec<f32>) {
    weft::cpu::moe::moe_route(
        &random(tokens * EXPERTS, seed, 3.0),
        EXPERTS,
        TOP_K,
        Routing::Softmax { normalize: true },
        None,
        None,
    )
}

/// Tolerance: f32 dot products of HIDDEN (gate, up) then FF (down) terms, against f64. The
/// gate and up sums are each within (HIDDEN + 2)·u·Σ|x·w| of exact; silu and the product add a
/// few roundings; down adds (FF + 2)·u·Σ|act·w|; the combine two more. Bounded by
/// 4·(HIDDEN + FF)·u times Σ_s weight_s · Σ_j |down_jc| · (|act_j| + Σ_p |x_p·w_p|) (the
/// gate's error passes through silu'(g) ≤ 1.1 times the up value, and vice versa). gpt-oss's
/// experts: the same with up + 1 for up (the clamps only flatten), the biases in each sum's
/// |terms|, and the down bias's rounding.
fn mlp_bound(x: &[f32], ids: &[u32], weights: &[f32], w: &Experts, hidden: usize, ff: usize) -> Vec<f64> {
    let (gu, down) = (&w.gate_up.1, &w.down.1);
    let (one, no_bias) =
        (if w.biases.is_some() { 1.0 } else { 0.0 }, (vec![0.0; EXPERTS * 2 * ff], vec![0.0; EXPERTS * hidden]));
    let (gu_bias, down_bias) = w.biases.as_ref().map_or((&no_bias.0, &no_bias.1), |(g, d)| (g, d));
    let mut out = Vec::new();
    for (t, row) in x.chunks(hidden).enumerate() {
        let mut bound = vec![0f64; hidden];
        for s in 0..TOP_K {
            let e = ids[t * TOP_K + s] as usize;
            let dots: Vec<(f64, f64)> = (0..2 * ff)
                .map(|r| {
                    let wr = &gu[(e * 2 * ff + r) * hidden..][..hidden];
                    let bias = f64::from(gu_bias[e * 2 * ff + r]);
                    let exact: f64 = row.iter().zip(wr).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() + bias;
                    let abs: f64 = row.iter().zip(wr).map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs()).sum::<f64>()
                        + bias.abs();
                    (exact, abs)
                })
                .collect();
            for (c, b) in bound.iter_mut().enumerate() {
                let dr = &down[(e * hidden + c) * ff..][..ff];
                let m: f64 = (0..ff)
                    .map(|j| {
                        let (g, up) = (dots[j], dots[ff + j]);
                        let up_abs = up.0.abs() + one + up.1;
                        let scale = g.0.abs().max(1.0) * up_abs + g.1 * up_abs;
                        f64::from(dr[j]).abs() * scale
                    })
                    .sum();
                *b += f64::from(weights[t * TOP_K + s]) * (m + f64::from(down_bias[e * hidden + c]).abs());
            }
        }
        out.extend(bound.into_iter().map(|b| 4.0 * (hidden + ff) as f64 * U * b + 1e-30));
    }
    out
}

fn check(dtype: DType) {
    check_experts(dtype, experts(dtype, HIDDEN, FF))
}

fn check_experts(dtype: DType, w: Experts) {
    for tokens in [1, 7, 64] {
        let x = random(tokens * HIDDEN, 20 + tokens as u64, 1.0);
        let (ids, weights) = routing(tokens, 30 + tokens as u64);
        let want = w.cpu(&x, &ids, &weights, HIDDEN, FF);
        let bound = mlp_bound(&x, &ids, &weights, &w, HIDDEN, FF);
        let mut first: Option<Vec<f32>> = None;
        for setup in setups().into_iter().filter(|s| !s.window_x) {
            let Some(f) = setup.factory() else { continue };
            let upload = |shape: &[usize], bytes: &[u8]| setup.weights(f, shape, dtype, bytes);
            let got = mlp_on_gpu(f, &upload, &x, &ids, &weights, &w, HIDDEN, FF);
            let what = format!("{dtype} experts, {tokens} tokens, {}", setup.name());
            assert_close(&what, &got, &want, |i| bound[i]);
            match &first {
                None => first = Some(got),
                Some(first) => assert!(
                    first.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: bits differ from the first setup's (every setup runs the same kernel)"
                ),
            }
        }
        // Batch invariance: rows 0 and the last alone give the batch's bits.
        let Some(f) = gpu() else { continue };
        let upload = |shape: &[usize], bytes: &[u8]| f.upload_weight(shape, dtype, bytes).unwrap();
        let batch = mlp_on_gpu(f, &upload, &x, &ids, &weights, &w, HIDDEN, FF);
        for t in [0, tokens - 1] {
            let (x1, ids1, w1) =
                (&x[t * HIDDEN..][..HIDDEN], &ids[t * TOP_K..][..TOP_K], &weights[t * TOP_K..][..TOP_K]);
            let alone = mlp_on_gpu(f, &upload, x1, ids1, w1, &w, HIDDEN, FF);
            assert!(
                alone.iter().zip(&batch[t * HIDDEN..][..HIDDEN]).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype}: token {t} of {tokens} alone differs from the batch"
            );
        }
    }
}

#[test]
fn f32_experts_match_cpu() {
    check(DType::F32);
}

#[test]
fn q8_0_experts_match_cpu() {
    check(DType::Q8_0);
}

#[test]
fn q4_0_experts_match_cpu() {
    check(DType::Q4_0);
}

/// gpt-oss's experts (biased gate/up and down, the clamped SwiGLU) in F32 and MXFP4, the format
/// its checkpoints ship experts in. Gate and up sums here have a spread of about 2.7, so the
/// limit of 7 clips some of them: checked, so the clamps are exercised.
#[test]
fn gpt_oss_experts_match_cpu() {
    for dtype in [DType::F32, DType::MXFP4] {
        let w = oai_experts(dtype, HIDDEN, FF);
        let (tokens, (b_gu, _)) = (64, w.biases.as_ref().unwrap());
        let x = random(tokens * HIDDEN, 20 + tokens as u64, 1.0);
        let (ids, _) = routing(tokens, 30 + tokens as u64);
        let clipped = (0..tokens * TOP_K)
            .flat_map(|r| {
                let e = ids[r] as usize;
                let row = &x[r / TOP_K * HIDDEN..][..HIDDEN];
                weft::cpu::matmul(row, &w.gate_up.1[e * 2 * FF * HIDDEN..][..2 * FF * HIDDEN], 1, HIDDEN, 2 * FF)
                    .into_iter()
                    .zip(&b_gu[e * 2 * FF..][..2 * FF])
                    .enumerate()
                    .map(|(c, (v, b))| if c < FF { v + b > 7.0 } else { (v + b).abs() > 7.0 })
                    .collect::<Vec<_>>()
            })
            .filter(|&c| c)
            .count();
        assert!(clipped > 0, "{dtype}: no gate or up value reaches the SwiGLU limit; the test would miss the clamps");
        check_experts(dtype, w);
    }
}

/// Experts whose projection outgrows a binding (1 MiB here: 96 · 2 gate-up rows of 1024 F32 a
/// expert, so a part of 256 rows would end inside the second expert) are uploaded a whole
/// expert per part and give the bits of one binding.
#[test]
fn experts_split_over_bindings_give_the_same_bits() {
    let (Some(tiny), Some(f)) = (gpu_with_tiny_bindings(), gpu()) else { return };
    let (hidden, ff, tokens) = (1024, 96, 5);
    let w = experts(DType::F32, hidden, ff);
    let x = random(tokens * hidden, 40, 1.0);
    let (ids, weights) = routing(tokens, 41);
    let split = |shape: &[usize], bytes: &[u8]| {
        let t = weft::model::weights::upload_experts(
            "test",
            "experts",
            [shape[0], shape[1]],
            DType::F32,
            &bytes,
            EXPERTS,
            tiny,
        )
        .unwrap();
        assert!(t.parts().len() > 1, "{shape:?} fits one binding");
        t
    };
    let got = mlp_on_gpu(tiny, &split, &x, &ids, &weights, &w, hidden, ff);
    let whole = |shape: &[usize], bytes: &[u8]| f.upload_weight(shape, DType::F32, bytes).unwrap();
    let want = mlp_on_gpu(f, &whole, &x, &ids, &weights, &w, hidden, ff);
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "split experts differ");
}

/// With `accumulate`, the weighted sum lands on what `out` held (a shared expert's output),
/// added after the slots: the bits of the plain sum plus that value, one f32 addition. (WGSL's
/// fma need not fuse, so the plain sum is held to f64 within a rounding a term instead.)
#[test]
fn combine_adds_onto_out_when_asked() {
    let Some(f) = gpu() else { return };
    let (tokens, cols) = (7, HIDDEN);
    let y = random(tokens * TOP_K * cols, 41, 1.0);
    let (_, weights) = routing(tokens, 42);
    let before = random(tokens * cols, 43, 1.0);
    let combine = |accumulate: bool| {
        let yt = f.upload_f32(&[tokens * TOP_K, cols], &y).unwrap();
        let wt = f.upload_f32(&[tokens, TOP_K], &weights).unwrap();
        let out = f.upload_f32(&[tokens, cols], &before).unwrap();
        let mut rec = Recording::new();
        moe_combine(ctx(f), &mut rec, &yt, &wt, &out, accumulate).unwrap();
        run(f, &rec);
        read_f32(f, &out)
    };
    let plain = combine(false);
    let terms = |i: usize| (0..TOP_K).map(move |s| (i / cols * TOP_K + s, (i / cols * TOP_K + s) * cols + i % cols));
    let want: Vec<f32> = (0..plain.len())
        .map(|i| terms(i).map(|(w, v)| f64::from(weights[w]) * f64::from(y[v])).sum::<f64>() as f32)
        .collect();
    assert_close("combine", &plain, &want, |i| {
        2.0 * TOP_K as f64 * U * terms(i).map(|(w, v)| f64::from(weights[w] * y[v]).abs()).sum::<f64>() + 1e-30
    });
    let added = combine(true);
    for (i, (&a, (&p, &b))) in added.iter().zip(plain.iter().zip(&before)).enumerate() {
        assert_eq!(a.to_bits(), (p + b).to_bits(), "element {i}: {a} is not {p} + {b}");
    }
}
