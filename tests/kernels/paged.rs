//! Paged attention over scattered blocks equals plain attention over each sequence's keys, for
//! decode tokens and prefill chunks that start mid-sequence, with and without a sliding window,
//! on a layer that is not the first, with the queries read from a fused qkv row, in one pass or
//! split-K over long contexts, causal or bidirectional (an encoder's whole prompt). (Writing the cache is `rope_kv_write`'s, tested in rope.rs.)

use weft::DType;
use weft::gpu::kernels::paged::{AttentionMask, PagedKv, QkvLayout, attention_partials_cols, paged_attention};
use weft::gpu::{GpuTensor, GpuTensorFactory, KernelFamily, Recording};
use weft::tensor::TensorFactory;

use crate::common::*;

const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const BLOCK: usize = 16;
const LAYOUT: QkvLayout = QkvLayout { num_heads: HEADS, num_kv_heads: KV_HEADS, head_dim: HEAD_DIM };

/// Sequences with their K/V written into a two-layer cache, addressed through layer 1.
pub struct Filled {
    pub layout: QkvLayout,
    pub lens: Vec<usize>,
    /// Per sequence, per position: K and V rows of num_kv_heads · head_dim.
    pub k: Vec<Vec<Vec<f32>>>,
    pub v: Vec<Vec<Vec<f32>>>,
    pub tables: Vec<u32>,
    pub max_blocks: usize,
    pub k_cache: GpuTensor,
    pub v_cache: GpuTensor,
    pub slots_per_layer: usize,
}

impl Filled {
    pub fn cache(&self) -> PagedKv<'_> {
        PagedKv {
            k_cache: &self.k_cache,
            v_cache: &self.v_cache,
            block_size: BLOCK,
            first_slot: self.slots_per_layer,
            num_slots: self.slots_per_layer,
        }
    }
}

pub fn fill(f: &GpuTensorFactory, lens: &[usize]) -> Filled {
    fill_as(f, lens, DType::F32)
}

/// [`fill`] into a cache of `dtype`; for F16 the CPU's rows are the halves the cache holds.
pub fn fill_as(f: &GpuTensorFactory, lens: &[usize], dtype: DType) -> Filled {
    fill_layout(f, lens, dtype, LAYOUT)
}

/// [`fill_as`] for heads of another layout.
pub fn fill_layout(f: &GpuTensorFactory, lens: &[usize], dtype: DType, layout: QkvLayout) -> Filled {
    let kv_dim = layout.num_kv_heads * layout.head_dim;
    let round = |row: Vec<f32>| -> Vec<f32> {
        if dtype == DType::F16 { row.into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect() } else { row }
    };
    let max_blocks = lens.iter().map(|l| l.div_ceil(BLOCK)).max().unwrap();
    let needed: usize = lens.iter().map(|l| l.div_ceil(BLOCK)).sum();
    let num_blocks = needed + 3;
    // Hand out physical blocks in a scrambled order so logical and physical never line up.
    let mut free: Vec<u32> = (0..num_blocks as u32).map(|b| (b * 7 + 3) % num_blocks as u32).collect();
    let mut tables = vec![u32::MAX; lens.len() * max_blocks];
    let (mut k, mut v) = (Vec::new(), Vec::new());
    let slots_per_layer = num_blocks * BLOCK;
    // Layer 1 of a two-layer cache, filled on the CPU.
    let mut k_cache = vec![0f32; 2 * slots_per_layer * kv_dim];
    let mut v_cache = k_cache.clone();
    for (s, &len) in lens.iter().enumerate() {
        for b in 0..len.div_ceil(BLOCK) {
            tables[s * max_blocks + b] = free.pop().unwrap();
        }
        let ks: Vec<Vec<f32>> = (0..len).map(|p| round(random(kv_dim, (s * 1000 + p) as u64, 1.0))).collect();
        let vs: Vec<Vec<f32>> = (0..len).map(|p| round(random(kv_dim, (s * 1000 + p) as u64 + 500_000, 1.0))).collect();
        for p in 0..len {
            let slot = slots_per_layer + tables[s * max_blocks + p / BLOCK] as usize * BLOCK + p % BLOCK;
            k_cache[slot * kv_dim..(slot + 1) * kv_dim].copy_from_slice(&ks[p]);
            v_cache[slot * kv_dim..(slot + 1) * kv_dim].copy_from_slice(&vs[p]);
        }
        k.push(ks);
        v.push(vs);
    }
    let shape = [2 * slots_per_layer, layout.num_kv_heads, layout.head_dim];
    Filled {
        layout,
        lens: lens.to_vec(),
        k,
        v,
        tables,
        max_blocks,
        k_cache: f.kv_cache(&shape, dtype, Some(&k_cache)).unwrap(),
        v_cache: f.kv_cache(&shape, dtype, Some(&v_cache)).unwrap(),
        slots_per_layer,
    }
}

/// Attention for the given (sequence, position) query tokens, with room for split-K partials
/// or not, and qkv in a buffer a uniform window may bind (as a model's activations are) or not;
/// returns (q, gpu output, the recording).
pub fn attend(
    f: &GpuTensorFactory,
    filled: &Filled,
    queries: &[(usize, usize)],
    window: Option<usize>,
    split: bool,
    seed: u64,
    windows: bool,
) -> (Vec<f32>, Vec<f32>, Recording) {
    attend_with_sinks(f, filled, queries, window, split, seed, windows, None)
}

/// [`attend`] with each head's attention-sink logit, when `sinks` (num_heads) is given.
#[allow(clippy::too_many_arguments)]
pub fn attend_with_sinks(
    f: &GpuTensorFactory,
    filled: &Filled,
    queries: &[(usize, usize)],
    window: Option<usize>,
    split: bool,
    seed: u64,
    windows: bool,
    sinks: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>, Recording) {
    let q = random(queries.len() * filled.layout.num_heads * filled.layout.head_dim, seed, 1.0);
    attend_q(f, filled, queries, q, window, split, seed, windows, sinks)
}

/// [`attend`] as a model's step in the device's family runs it (split-K where the family
/// splits), with these queries (num_tokens, num_heads · head_dim) or random ones.
pub fn attend_with_q(
    f: &GpuTensorFactory,
    filled: &Filled,
    queries: &[(usize, usize)],
    window: Option<usize>,
    q: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>, Recording) {
    let split = f.context().kernel_family().splits_attention();
    let cols = filled.layout.num_heads * filled.layout.head_dim;
    let q = q.map_or_else(|| random(queries.len() * cols, 42, 1.0), <[f32]>::to_vec);
    attend_q(f, filled, queries, q, window, split, 42, false, None)
}

#[allow(clippy::too_many_arguments)]
fn attend_q(
    f: &GpuTensorFactory,
    filled: &Filled,
    queries: &[(usize, usize)],
    q: Vec<f32>,
    window: Option<usize>,
    split: bool,
    seed: u64,
    windows: bool,
    sinks: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>, Recording) {
    let n = queries.len();
    let layout = filled.layout;
    let q_cols = layout.num_heads * layout.head_dim;
    let info: Vec<u32> = queries.iter().flat_map(|&(s, p)| [s as u32, p as u32]).collect();
    // The queries in a qkv row, the other columns junk the kernel must not read as queries.
    let stride = layout.row_stride();
    let mut qkv = random(n * stride, seed + 1, 100.0);
    for t in 0..n {
        qkv[t * stride..t * stride + q_cols].copy_from_slice(&q[t * q_cols..(t + 1) * q_cols]);
    }
    let qt = if windows { f.upload_activations(&[n, stride], &qkv) } else { f.upload_f32(&[n, stride], &qkv) }.unwrap();
    let bt = f.upload_u32(&[filled.lens.len(), filled.max_blocks], &filled.tables).unwrap();
    let it = f.upload_u32(&[n, 2], &info).unwrap();
    let out = f.zeros(&[n, q_cols], DType::F32).unwrap();
    // Junk in the partials: a split must write before the merge reads.
    let cols = attention_partials_cols(split, layout.num_heads, layout.head_dim);
    let partials = f.upload_f32(&[n, cols], &random(n * cols, seed + 2, 1e3)).unwrap();
    let mut rec = Recording::new();
    let scale = 1.0 / (layout.head_dim as f32).sqrt();
    let cache = filled.cache();
    let sinks = sinks.map(|s| f.upload_f32(&[layout.num_heads], s).unwrap());
    let sinks = sinks.as_ref();
    paged_attention(ctx(f), &mut rec, &qt, layout, &cache, &bt, &it, &out, &partials, window, scale, sinks).unwrap();
    run(f, &rec);
    (q, read_f32(f, &out), rec)
}

/// Tolerance: a score's f32 dot product errs by at most (head_dim + 2)·u·Σ|q·k|·scale, which is
/// also the relative error it puts on that key's weight; exp adds up to 3 + 2·|score| ULP and
/// the running sums (each position's weight added in turn: the CPU family's 8 lanes each sum
/// an eighth, flash attention each row its own) at most L + 2·L/16 roundings for L positions,
/// split-K's join at most 8 more (inside the 60 spare). The output, a weighted mean of V rows,
/// moves by at most twice the relative weight error times max|v| (1 here).
#[test]
fn attention_matches_cpu_for_decode_and_prefill_chunks() {
    for family in [KernelFamily::Baseline, KernelFamily::Subgroup, KernelFamily::Cpu] {
        let Some(f) = gpu_with_family(family) else { continue };
        check_attention(f, family.splits_attention(), DType::F32);
    }
}

/// An f16 cache (halves in a buffer, or an rgba16float texture on CPU drivers) read as the
/// same halves widened: the reference attends over the rounded keys and values, within the
/// f32 bound above.
#[test]
fn attention_reads_an_f16_cache() {
    for family in [KernelFamily::Baseline, KernelFamily::Cpu] {
        let Some(f) = gpu_with_family(family) else { return };
        check_attention(f, family.splits_attention(), DType::F16);
    }
}

/// Flash attention (the GPU families') at the head sizes models use, each with its GQA group
/// and its tile (keys a tile, rows a workgroup: rows that straddle tokens and sequences), over
/// scattered blocks, decode and mid-sequence prefill rows, sliding windows and split-K over
/// 2100 positions, f32 and f16 caches, with sinks at two of them: the CPU's attention within
/// the bound above. Small head counts keep lavapipe's time down.
#[test]
fn flash_attention_matches_cpu_at_every_head_size() {
    // (query heads, KV heads, head size, cache, sinks)
    let shapes = [
        (8, 2, 64, DType::F16, false),
        (4, 2, 96, DType::F32, true),
        (4, 1, 128, DType::F16, false),
        (4, 1, 256, DType::F32, true), // Gemma 3 270M's heads
        (2, 1, 512, DType::F32, true), // Gemma 4's full-attention heads: 4 keys a tile, 2 rows
    ];
    for family in [KernelFamily::Baseline, KernelFamily::Subgroup] {
        let Some(f) = gpu_with_family(family) else { continue };
        for (num_heads, num_kv_heads, head_dim, dtype, with_sinks) in shapes {
            let layout = QkvLayout { num_heads, num_kv_heads, head_dim };
            let sinks: Vec<f32> = (0..num_heads).map(|h| [0.5, -1.0, 2.0, 8.0][h % 4]).collect();
            let sinks = with_sinks.then_some(&sinks[..]);
            check_attention_in(f, layout, true, dtype, sinks);
        }
    }
}

/// The CPU family's kernel at Gemma 4's full-attention heads of 512 (its lanes' outputs merged
/// in two turns of 64 vec4s), f32 and f16 caches, with sinks, the query heads of a KV head
/// apart or grouped as the driver's threads decide (decode rows alone, a prefill chunk
/// together on a driver of up to 5 threads): the CPU's attention within the bound above.
#[test]
fn cpu_family_attention_matches_cpu_at_head_size_512() {
    let Some(f) = gpu_with_family(KernelFamily::Cpu) else { return };
    let layout = QkvLayout { num_heads: 2, num_kv_heads: 1, head_dim: 512 };
    check_attention_in(f, layout, false, DType::F32, Some(&[0.5, -1.0]));
    check_attention_in(f, layout, false, DType::F16, None);
}

/// Split contexts of 300 to 2100 positions take 2 to 8 splits (and one under a window of 8);
/// the CPU family does not split.
#[test]
fn split_attention_matches_cpu_over_long_contexts() {
    let Some(f) = gpu_with_family(KernelFamily::Baseline) else { return };
    check_attention(f, true, DType::F32);
}

/// The CPU family takes the 3 query heads of a KV head in one workgroup and reads the queries
/// from uniform windows of 17 tokens' rows (3 dispatches for 40 tokens): the same bits as its
/// one head a workgroup from a storage buffer (a device sized for 100 driver threads, which
/// keeps heads apart), and as its own storage path.
#[test]
fn grouped_heads_and_query_windows_keep_the_bits() {
    let (Some(apart), Some(cpu)) = (gpu_with_cpu_threads(100), gpu_with_family(KernelFamily::Cpu)) else {
        return;
    };
    let lens = [1, 17, 40, 100];
    let mut queries = vec![(0, 0), (1, 16), (3, 99), (3, 50)];
    queries.extend((0..40).map(|p| (2, p))); // a whole prompt: 44 tokens
    for dtype in [DType::F32, DType::F16] {
        let (_, want, rec) = attend(&apart, &fill_as(&apart, &lens, dtype), &queries, None, false, 5, false);
        assert!(rec.kernels().filter(|v| v.kernel == "paged_attention").all(|v| v.query_heads == 1));
        let filled = fill_as(cpu, &lens, dtype);
        for windows in [true, false] {
            let (_, got, rec) = attend(cpu, &filled, &queries, None, false, 5, windows);
            let dispatches: Vec<_> = rec.kernels().filter(|v| v.kernel == "paged_attention").collect();
            assert!(dispatches.iter().all(|v| v.query_heads == 3), "{dispatches:?}");
            let uniform = dispatches.iter().filter(|v| v.x_in == weft::gpu::XSource::Uniform).count();
            assert_eq!((dispatches.len(), uniform), if windows { (3, 3) } else { (1, 0) });
            let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{dtype}, windows {windows}: the bits moved");
        }
    }
}

/// Grouped heads (the largest divisor of the group up to 4, up to 2 at heads of 512) where the
/// dispatch keeps two workgroups per driver thread, else one.
#[test]
fn query_heads_group_where_the_threads_stay_busy() {
    use weft::gpu::attention_query_heads;
    let heads = |heads, group, tokens, threads| attention_query_heads(heads, group, 64, tokens, threads);
    // SmolLM2: 9 query heads over 3 KV heads.
    assert_eq!(heads(9, 3, 1, Some(2)), 1); // a lone decode: 3 workgroups, 2 threads
    assert_eq!(heads(9, 3, 2, Some(2)), 3); // 6
    assert_eq!(heads(9, 3, 16, Some(16)), 3); // 48 for 16 threads
    assert_eq!(heads(9, 3, 8, Some(16)), 1); // 24
    // Groups of 4 (Llama 3.2 1B), 6 (Qwen2.5 1.5B: 3 divides it) and 7 (nothing up to 4 does).
    assert_eq!(heads(32, 4, 1, Some(2)), 4);
    assert_eq!(heads(12, 6, 4, Some(2)), 3);
    assert_eq!(heads(28, 7, 64, Some(2)), 1);
    // Threads unknown (a browser): as for one thread.
    assert_eq!(heads(9, 3, 1, None), 3);
    assert_eq!(heads(32, 8, 1, None), 4);
    // Heads of 256 group as many; of 512 (Gemma 4's full layers: 8 over 2) at most 2.
    assert_eq!(attention_query_heads(32, 4, 256, 16, Some(2)), 4);
    assert_eq!(attention_query_heads(8, 4, 512, 16, Some(2)), 2);
    assert_eq!(attention_query_heads(8, 4, 512, 1, Some(4)), 1); // a lone decode: 4 workgroups, 4 threads
    assert_eq!(weft::gpu::max_query_heads(128), 4);
}

/// Bidirectional attention (an encoder's mask): every token of a sequence sees all of its
/// positions, the ones after it too — the CPU's attention over the whole sequence, within the
/// causal bound above; in one pass and, over 320 positions, split-K. (29 blocks in all: `fill`
/// scrambles blocks by multiples of 7, which a multiple of 7 would collide.)
#[test]
fn bidirectional_attention_sees_the_whole_sequence() {
    for family in [KernelFamily::Baseline, KernelFamily::Cpu] {
        let Some(f) = gpu_with_family(family) else { return };
        let split = family.splits_attention();
        let lens = [1, 17, 40, 320];
        let filled = fill(f, &lens);
        let mut tokens: Vec<(usize, usize)> = (0..40).map(|p| (2, p)).collect();
        tokens.extend([(0, 0), (1, 0), (1, 9), (3, 0), (3, 150)]);
        let info: Vec<(usize, usize)> = tokens
            .iter()
            .map(|&(s, p)| {
                let [s, last] = AttentionMask::Bidirectional.token_info(s, p, lens[s]);
                (s as usize, last as usize)
            })
            .collect();
        let (q, got, _) = attend(f, &filled, &info, None, split, 11, false);
        for (t, &(s, p)) in tokens.iter().enumerate() {
            let what = format!("{family:?}: seq {s} token {p} of {}", lens[s]);
            assert_row_close(&what, &filled, &q, &got, t, (s, 0..lens[s]), None);
        }
    }
    assert_eq!(AttentionMask::Causal.token_info(3, 5, 9), [3, 5]);
    assert_eq!(AttentionMask::Bidirectional.token_info(3, 5, 9), [3, 8]);
}

/// Query token t's output row against the CPU's attention over `keys` (sequence, positions),
/// within the tolerance above.
fn assert_row_close(
    what: &str,
    filled: &Filled,
    q: &[f32],
    got: &[f32],
    t: usize,
    (s, keys): (usize, std::ops::Range<usize>),
    sinks: Option<&[f32]>,
) {
    let QkvLayout { num_heads, num_kv_heads, head_dim } = filled.layout;
    let cols = num_heads * head_dim;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let k: Vec<&[f32]> = filled.k[s][keys.clone()].iter().map(|r| &r[..]).collect();
    let v: Vec<&[f32]> = filled.v[s][keys].iter().map(|r| &r[..]).collect();
    let q_t = &q[t * cols..(t + 1) * cols];
    let want = weft::cpu::attention_one_with_sinks(q_t, &k, &v, num_heads, num_kv_heads, scale, sinks);
    // The bound on a weight's relative error (see above).
    let group = num_heads / num_kv_heads;
    let max_qk: f64 = k
        .iter()
        .map(|k| {
            (0..cols)
                .map(|i| f64::from((q_t[i] * k[(i / head_dim / group) * head_dim + i % head_dim]).abs()))
                .sum::<f64>()
        })
        .fold(0.0, f64::max);
    let positions = k.len() as f64;
    let weight_err = (head_dim as f64 + 2.0) * U * max_qk * f64::from(scale) + (positions * 1.125 + 60.0) * U;
    assert_close(what, &got[t * cols..(t + 1) * cols], &want, |_| 2.0 * weight_err);
}

/// Attention sinks (gpt-oss): each head's sink logit joins the softmax's denominator, in every
/// kernel family, in one pass and (where the family splits) split-K and merged, within the
/// tolerance above (the sink adds one exp and one sum to the denominator: inside the spare
/// roundings). Sinks far below every score give the bits of no sinks at all.
#[test]
fn attention_with_sinks_matches_cpu_in_every_family() {
    for family in [KernelFamily::Baseline, KernelFamily::Subgroup, KernelFamily::Cpu] {
        let Some(f) = gpu_with_family(family) else { continue };
        let split = family.splits_attention();
        // Sinks around the scores (|score| is about 1 here), and one well above them.
        let sinks: [f32; HEADS] = [0.5, -1.0, 2.0, 8.0, -0.25, 1.5, 0.0, -3.0, 1.0];
        check_attention_in(f, LAYOUT, split, DType::F32, Some(&sinks));
        let filled = fill(f, &[5, 40, 300]);
        let queries = [(0, 4), (1, 39), (2, 299), (2, 17)];
        let (_, none, _) = attend(f, &filled, &queries, None, split, 3, false);
        let far = [-1e30; HEADS];
        let (_, vanishing, _) = attend_with_sinks(f, &filled, &queries, None, split, 3, false, Some(&far));
        let same = none.iter().zip(&vanishing).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{family:?}: sinks of -1e30 moved the bits of attention without sinks");
    }
}

fn check_attention(f: &GpuTensorFactory, split: bool, dtype: DType) {
    check_attention_in(f, LAYOUT, split, dtype, None)
}

/// Decode rows, a prefill chunk from position 30 and (with `split`) rows over 2100 positions,
/// with no window, one of 8 and one of 600, against the CPU.
fn check_attention_in(f: &GpuTensorFactory, layout: QkvLayout, split: bool, dtype: DType, sinks: Option<&[f32]>) {
    let long = split.then_some(2100);
    let lens: Vec<usize> = [1, 17, 40, 100].into_iter().chain(long).collect();
    let filled = fill_layout(f, &lens, dtype, layout);
    assert_eq!(filled.k_cache.dtype(), dtype);
    assert_eq!(filled.k_cache.parts()[0].in_texture(), f.context().kernel_family() == KernelFamily::Cpu);
    let mut queries = vec![(0, 0), (1, 16), (3, 99), (3, 50)];
    queries.extend((30..40).map(|p| (2, p))); // a prefill chunk starting at position 30
    if long.is_some() {
        queries.extend([(4, 2099), (4, 300), (4, 256), (4, 700)]);
    }
    let flash = f.context().kernel_family() != KernelFamily::Cpu;
    for window in [None, Some(8), Some(600)] {
        let (q, got, rec) = attend_with_sinks(f, &filled, &queries, window, split, 42, false, sinks);
        assert_eq!(rec.kernels().any(|v| v.kernel == "flash_attention"), flash);
        for (t, &(s, p)) in queries.iter().enumerate() {
            let first = window.map_or(0, |w| (p + 1).saturating_sub(w));
            let what = format!("{layout:?} seq {s} pos {p} window {window:?}");
            assert_row_close(&what, &filled, &q, &got, t, (s, first..p + 1), sinks);
        }
    }
}

/// Flash attention's workgroup memory fits WebGPU's default 16 KiB at every head size weft
/// compiles for; a device that allows less is refused with the sizes named.
#[test]
fn flash_attention_fits_webgpu_workgroup_memory() {
    use weft::gpu::kernels::paged::check_flash_memory;
    for &head_dim in weft::gpu::HEAD_DIMS {
        check_flash_memory(usize::from(head_dim), 16384).unwrap();
    }
    let err = check_flash_memory(128, 8192).unwrap_err().to_string();
    assert!(err.contains("head size 128") && err.contains("8192") && err.contains("workgroup memory"), "{err}");
}

#[test]
fn attention_rejects_heads_that_do_not_group() {
    let Some(f) = gpu() else { return };
    let filled = fill(f, &[4]);
    let layout = QkvLayout { num_heads: 4, ..LAYOUT }; // 4 heads over 3 KV heads
    let q = f.zeros(&[1, layout.row_stride()], DType::F32).unwrap();
    let bt = f.upload_u32(&[1, 1], &filled.tables).unwrap();
    let it = f.upload_u32(&[1, 2], &[0, 0]).unwrap();
    let out = f.zeros(&[1, 4 * HEAD_DIM], DType::F32).unwrap();
    let partials = f.zeros(&[1, 4], DType::F32).unwrap();
    let cache = filled.cache();
    let err =
        paged_attention(ctx(f), &mut Recording::new(), &q, layout, &cache, &bt, &it, &out, &partials, None, 1.0, None)
            .unwrap_err();
    assert!(err.to_string().contains("multiple of num_kv_heads"), "{err}");
}

#[test]
fn attention_rejects_partials_of_another_shape() {
    let Some(f) = gpu() else { return };
    let filled = fill(f, &[4]);
    let q = f.zeros(&[1, LAYOUT.row_stride()], DType::F32).unwrap();
    let bt = f.upload_u32(&[1, 1], &filled.tables).unwrap();
    let it = f.upload_u32(&[1, 2], &[0, 3]).unwrap();
    let out = f.zeros(&[1, HEADS * HEAD_DIM], DType::F32).unwrap();
    let partials = f.zeros(&[1, 8], DType::F32).unwrap();
    let cache = filled.cache();
    let err =
        paged_attention(ctx(f), &mut Recording::new(), &q, LAYOUT, &cache, &bt, &it, &out, &partials, None, 1.0, None)
            .unwrap_err();
    assert!(err.to_string().contains("partials need"), "{err}");
}

/// A context that takes one split gives the same bits whether the kernel may split or not
/// (a third sequence of 300 positions widens the tables, so the kernel does split mode).
#[test]
fn short_contexts_are_untouched_by_splitting() {
    let Some(f) = gpu_with_family(KernelFamily::Baseline) else { return };
    let filled = fill(f, &[100, 256, 300]);
    let queries = [(0, 99), (1, 255), (1, 40)];
    let (_, split, _) = attend(f, &filled, &queries, None, true, 7, false);
    let (_, whole, _) = attend(f, &filled, &queries, None, false, 7, false);
    assert!(split.iter().zip(&whole).all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// The CPU family never splits (its driver's threads are busy with heads and tokens): partials
/// with room for splits over a context of 300 record no merge and change no bit.
#[test]
fn cpu_family_never_splits() {
    let Some(f) = gpu_with_family(KernelFamily::Cpu) else { return };
    let filled = fill(f, &[100, 300]);
    let queries = [(1, 299), (0, 99), (1, 40)];
    let (_, room, rec) = attend(f, &filled, &queries, None, true, 7, false);
    assert!(rec.kernels().all(|v| v.kernel != "attention_merge"));
    let (_, none, _) = attend(f, &filled, &queries, None, false, 7, false);
    assert!(room.iter().zip(&none).all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// With room for splits, tables too narrow for any context to pass SPLIT_MIN_POSITIONS record
/// attention alone; one block wider, the merge too.
#[test]
fn narrow_tables_record_no_merge() {
    let Some(f) = gpu_with_family(KernelFamily::Baseline) else { return };
    let min = weft::gpu::kernels::paged::SPLIT_MIN_POSITIONS;
    for (len, merges) in [(min, false), (min + 1, true)] {
        let filled = fill(f, &[len]);
        let q = f.zeros(&[1, LAYOUT.row_stride()], DType::F32).unwrap();
        let bt = f.upload_u32(&[1, filled.max_blocks], &filled.tables).unwrap();
        let it = f.upload_u32(&[1, 2], &[0, len as u32 - 1]).unwrap();
        let out = f.zeros(&[1, HEADS * HEAD_DIM], DType::F32).unwrap();
        let partials = f.zeros(&[1, attention_partials_cols(true, HEADS, HEAD_DIM)], DType::F32).unwrap();
        let mut rec = Recording::new();
        let cache = filled.cache();
        paged_attention(ctx(f), &mut rec, &q, LAYOUT, &cache, &bt, &it, &out, &partials, None, 1.0, None).unwrap();
        let kernels: Vec<&str> = rec.kernels().map(|v| v.kernel).collect();
        assert_eq!(kernels.contains(&"attention_merge"), merges, "{len} positions: {kernels:?}");
    }
}
