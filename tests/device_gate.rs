//! The device check's correctness gate: `cargo xtask device-check` runs this binary first on the
//! GPU under test (from its packed folder), and CI runs it on lavapipe. Every kernel family the
//! adapter can run goes through the forward pass of models with the layer widths of Llama 3.2
//! 1B and Llama 3.1 8B, and through attention at head sizes 128, 256 and 512 over a context long
//! enough to split, against the plain CPU model (`cpu::llama`).
//!
//! Widths matter more than depth here: a subgroup reduction or a tile that loses a lane's or a
//! tile's share only shows once rows are wider than the lanes times the tile (the tiny models'
//! 64 are not), and the tiled prefill matmul only runs at 32 rows or more. So each model keeps
//! its real widths and one layer, and each step mixes a long prefill chunk (the tiled path) with
//! decode rows (the matrix-vector path).
//!
//! Tolerance: logits within 1e-4 · max|logit|. The CPU sums in f64; the GPU's f32 sums over
//! rows of up to 14336 elements err by about √k·u relative when the rounding errors are
//! independent, as they are for random weights (7e-6 at k = 14336; lavapipe's three families
//! stay under 1.2e-6), so 1e-4 leaves a wide margin. A wrong pairing, a dropped lane or a wrong
//! position moves logits by whole percents.
//!
//! A family the adapter cannot run is printed as not run with the reason. On a CPU driver the 8B
//! widths run only with `WEFT_FULL=1` (`cargo xtask test --full`, and the device check): the
//! baseline family's prefill of them takes minutes on lavapipe. `WEFT_LIMITS=webgpu` and
//! `WEFT_MAX_BINDING_BYTES` apply as everywhere.

use weft::DType;
use weft::gpu::{GpuOptions, GpuTensorFactory, KernelFamily};
use weft::kv::KvCacheConfig;
use weft::model::arch;
use weft::model::config::{ModelConfig, RopeScaling};
use weft::model::executor::GpuExecutor;
use weft::model::gguf::GgufFile;
use weft::model::load::GgufWeights;
use weft::model::tiny;
use weft::step::{SeqStep, StepBatch};

const TOLERANCE: f32 = 1e-4;
const BLOCK: usize = 16;

/// Every family the adapter runs, each with its own device. Families it cannot run are printed.
fn families() -> Vec<(KernelFamily, GpuTensorFactory)> {
    let mut out = Vec::new();
    for family in [KernelFamily::Cpu, KernelFamily::Baseline, KernelFamily::Subgroup] {
        let options = GpuOptions { kernels: Some(family), ..Default::default() };
        match weft::rt::block_on(weft::gpu::GpuContext::new(options)) {
            Ok(ctx) => {
                eprintln!("gate: the {} family on {}", family.name(), ctx.adapter_info().name);
                out.push((family, GpuTensorFactory::new(ctx)));
            }
            Err(weft::WeftError::NoAdapter { .. }) if std::env::var("WEFT_REQUIRE_GPU").as_deref() != Ok("1") => {
                eprintln!("gate: no adapter, nothing to check");
                return Vec::new();
            }
            Err(e) => eprintln!("gate: the {} family not run: {e}", family.name()),
        }
    }
    out
}

/// One layer at a real checkpoint's widths, Llama 3 RoPE included, and the tiny vocabulary
/// (the output matrix's width is the model's, its height does not matter to the kernels).
fn wide(hidden: usize, inter: usize, head_dim: usize, tied: bool, factor: f32) -> ModelConfig {
    ModelConfig {
        hidden_size: hidden,
        intermediate_size: inter,
        num_layers: 1,
        num_heads: hidden / head_dim,
        num_kv_heads: 8,
        head_dim,
        rope_theta: 500_000.0,
        rope_scaling: Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }),
        tie_word_embeddings: tied,
        ..tiny::tiny_config()
    }
}

fn seq(tokens: &[u32], start_pos: usize, block_table: &[u32], num_logits: usize) -> SeqStep {
    SeqStep { tokens: tokens.to_vec(), start_pos, block_table: block_table.to_vec(), num_logits, ..Default::default() }
}

fn batch(seqs: Vec<SeqStep>) -> StepBatch {
    StepBatch { seqs, ..Default::default() }
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    eprintln!("gate: {what}: max error {:.2e} of max |logit| {scale:.3}", worst / scale);
    assert!(worst <= TOLERANCE * scale, "{what}: max error {worst} vs max |logit| {scale}");
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + salt * 11 + i / 5) % 256).collect()
}

/// Per family: a 36-token prompt whose first step (33 tokens, beside another sequence's 5)
/// takes the tiled path, then decode steps of both sequences together.
fn check_model(name: &str, config: &ModelConfig, dtype: DType) {
    let families = families();
    if families.is_empty() {
        return;
    }
    let w = tiny::random_weights(config, 17, dtype);
    let gguf = GgufFile::from_bytes("gate.gguf", tiny::gguf_bytes(config, &w, dtype)).unwrap();
    let (a, b) = (tokens(36, 1), tokens(8, 2));
    let want_a = weft::cpu::llama::forward(config, &w, &a);
    let want_b = weft::cpu::llama::forward(config, &w, &b);
    let (table_a, table_b): (Vec<u32>, Vec<u32>) = (vec![5, 2, 7], vec![1]);
    for (family, f) in families {
        let what = |at: &str| format!("{name} {dtype} {} {at}", family.name());
        let model = arch::load(config.clone(), &GgufWeights { gguf: &gguf }, &f, &mut |_, _| {}).unwrap();
        let exec = GpuExecutor::new(f.clone(), model, KvCacheConfig::new(BLOCK, 8)).unwrap();
        let step = batch(vec![seq(&a[..33], 0, &table_a, 2), seq(&b[..5], 0, &table_b, 1)]);
        let out = weft::rt::block_on(exec.logits(&step)).unwrap();
        close(&what("prefill a[..32]"), &out[0], &want_a[31]);
        close(&what("prefill a[..33]"), &out[1], &want_a[32]);
        close(&what("prefill b[..5]"), &out[2], &want_b[4]);
        for p in 0..3 {
            let (pa, pb) = (33 + p, 5 + p);
            let step = batch(vec![seq(&a[pa..=pa], pa, &table_a, 1), seq(&b[pb..=pb], pb, &table_b, 1)]);
            let out = weft::rt::block_on(exec.logits(&step)).unwrap();
            close(&what(&format!("decode a at {pa}")), &out[0], &want_a[pa]);
            close(&what(&format!("decode b at {pb}")), &out[1], &want_b[pb]);
        }
    }
}

#[test]
fn llama_3_2_1b_widths_match_cpu_in_every_family() {
    check_model("1B widths", &wide(2048, 8192, 64, true, 32.0), DType::Q4_1);
}

#[test]
fn llama_3_1_8b_widths_match_cpu_in_every_family() {
    let full = std::env::var("WEFT_FULL").as_deref() == Ok("1");
    let on_cpu = weft::gpu::open_or_skip(GpuOptions::default())
        .unwrap()
        .is_some_and(|ctx| ctx.adapter_info().device_type == wgpu::DeviceType::Cpu);
    if on_cpu && !full {
        eprintln!("gate: the 8B widths not run: a CPU driver runs them only with WEFT_FULL=1 (minutes on lavapipe)");
        return;
    }
    check_model("8B widths", &wide(4096, 14_336, 128, false, 8.0), DType::Q4_1);
}

/// Attention at head sizes 128, 256 and 512 (Gemma 4's full layers) over 600 tokens (split
/// attention in the GPU families), then decode steps, in narrow models so the CPU's
/// whole-sequence recomputation stays cheap.
#[test]
fn attention_at_head_sizes_128_to_512_over_long_contexts_matches_cpu() {
    let families = families();
    for head_dim in [128, 256, 512] {
        let config = ModelConfig {
            hidden_size: 256,
            intermediate_size: 256,
            num_layers: 1,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim,
            ..tiny::tiny_config()
        };
        let w = tiny::random_weights(&config, 19, DType::F32);
        let gguf = GgufFile::from_bytes("gate.gguf", tiny::gguf_bytes(&config, &w, DType::F32)).unwrap();
        let t = tokens(603, 3);
        let want = weft::cpu::llama::forward(&config, &w, &t);
        // Physical blocks in reverse, so logical and physical never line up.
        let table: Vec<u32> = (0..40u32).rev().collect();
        for (family, f) in &families {
            let what = |at: &str| format!("head size {head_dim} {} {at}", family.name());
            let model = arch::load(config.clone(), &GgufWeights { gguf: &gguf }, f, &mut |_, _| {}).unwrap();
            let exec = GpuExecutor::new(f.clone(), model, KvCacheConfig::new(BLOCK, 40)).unwrap();
            let out = weft::rt::block_on(exec.logits(&batch(vec![seq(&t[..600], 0, &table, 1)]))).unwrap();
            close(&what("600-token prompt"), &out[0], &want[599]);
            for p in 600..603 {
                let out = weft::rt::block_on(exec.logits(&batch(vec![seq(&t[p..=p], p, &table, 1)]))).unwrap();
                close(&what(&format!("decode at {p}")), &out[0], &want[p]);
            }
        }
    }
}
