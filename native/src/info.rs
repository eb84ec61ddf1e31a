//! `weft info`: what weft runs (every architecture and tensor type) and the GPU self-check;
//! `weft info --model PATH`: what a model is and whether weft runs it.

use std::time::Instant;

use weft::DType;
use weft::gpu::kernels::matmul::matmul;
use weft::gpu::{GpuContext, GpuOptions, GpuTensorFactory, Recording};
use weft::tensor::TensorFactory;

/// What the KV-cache line assumes: `weft serve`'s flags of the same names.
pub struct KvLine {
    pub gpu_memory_utilization: f64,
    pub kv_cache_dtype: Option<DType>,
    pub max_model_len: usize,
}

impl KvLine {
    /// How `weft serve` with these flags would size the KV cache of the model at `path` on
    /// `ctx` (the weights estimated from the file), or why it would refuse to start.
    fn plan(&self, path: &std::path::Path, ctx: &GpuContext) -> weft::Result<weft::KvPlan> {
        let config = weft::engine::EngineConfig { max_model_len: self.max_model_len, ..serve_config() };
        let mut builder =
            weft::EngineBuilder::from_model(path)?.config(config).gpu_memory_utilization(self.gpu_memory_utilization);
        if let Some(dtype) = self.kv_cache_dtype {
            builder = builder.kv_cache_dtype(dtype);
        }
        builder.plan_kv(ctx)
    }
}

/// `weft serve`'s engine limits by default (64 sequences, 512 tokens a step).
fn serve_config() -> weft::engine::EngineConfig {
    weft::engine::EngineConfig { max_num_seqs: 64, max_num_batched_tokens: 512, ..Default::default() }
}

pub fn run(baseline: bool, kv: &KvLine) -> weft::Result<()> {
    println!("{}", weft::model::inspect::supported());
    let started = Instant::now();
    let ctx = weft::rt::block_on(GpuContext::new(GpuOptions { baseline_only: baseline, ..Default::default() }))?;
    println!("{}", ctx.describe());
    println!("opened in {:.0} ms", started.elapsed().as_secs_f64() * 1e3);
    let memory = ctx.plan().memory;
    if ctx.plan().cpu_adapter() {
        println!(
            "KV cache on a CPU adapter: {} MiB, or one sequence of max_model_len where that is more",
            weft::gpu::CPU_DRIVER_KV_BYTES >> 20
        );
    } else {
        println!(
            "KV cache at --gpu-memory-utilization {}: {} of {}, less a model's weights and workspace",
            kv.gpu_memory_utilization,
            weft::gpu::gib((memory.bytes as f64 * kv.gpu_memory_utilization) as u64),
            memory.describe()
        );
    }
    let default = std::path::Path::new(crate::generate::DEFAULT_MODEL);
    if default.exists() {
        match kv.plan(default, &ctx) {
            Ok(plan) => println!("the default model's {}", plan.describe()),
            Err(e) => println!("the default model's KV cache: {e}"),
        }
    }

    // One real kernel: a Q4_1 matrix (the default model's format) times a small batch, checked
    // against the CPU reference with the same tolerance as the kernel tests.
    let (m, k, n) = (4, 576, 1536);
    let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let w_values: Vec<f32> = (0..n * k).map(|i| ((i * 104_729) % 997) as f32 / 498.5 - 1.0).collect();
    let w_bytes = weft::quant::quantize(DType::Q4_1, &w_values)?;
    let w = weft::quant::dequantize(DType::Q4_1, &w_bytes)?;
    let factory = GpuTensorFactory::new(ctx.clone());
    let xt = factory.upload_f32(&[m, k], &x)?;
    let wt = factory.upload(&[n, k], DType::Q4_1, &w_bytes)?;
    let yt = factory.zeros(&[m, n], DType::F32)?;
    let mut rec = Recording::new();
    matmul(&ctx, &mut rec, &xt, &wt, &yt)?;
    let started = Instant::now();
    let gpu_seconds = weft::rt::block_on(ctx.submit_timed(&rec))?;
    let wall = started.elapsed().as_secs_f64();
    let got = weft::rt::block_on(factory.download_f32(&yt))?;
    let want = weft::cpu::matmul(&x, &w, m, k, n);
    let max_err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let bound = 2.0 * (k as f32 + 2.0) * f32::EPSILON / 2.0 * k as f32;
    println!(
        "self-check: matmul Q4_1 {m}x{k} · ({n}x{k})ᵀ: y[0][..4] = {:?}, max |gpu - cpu| = {max_err:.2e} \
         (bound {bound:.2e}), {:.2} ms GPU{}",
        &got[..4],
        gpu_seconds.unwrap_or(wall) * 1e3,
        if gpu_seconds.is_some() { "" } else { " (wall clock; no timestamp queries)" },
    );
    if max_err > bound {
        return Err(weft::WeftError::Unsupported(format!(
            "the GPU's matmul differs from the CPU by {max_err:e}, above the bound {bound:e}: this \
             driver computes wrong results"
        )));
    }
    println!("ok");
    Ok(())
}

/// Print [`weft::model::inspect::inspect`]'s report; when weft cannot run the model, what it
/// does run, and an error, so scripts can tell.
///
/// Then, where a GPU opens, how many KV tokens fit there at `kv`'s utilization and dtype
/// (the weights estimated from the file); an error when max_model_len would not fit.
pub fn model(path: std::path::PathBuf, kv: &KvLine) -> weft::Result<()> {
    let path = crate::hub::local_path(path)?;
    let report = weft::model::inspect::inspect(&path)?;
    println!("{report}");
    if !report.runnable() {
        println!("weft runs:\n{}", indent(&weft::model::inspect::supported()));
        return Err(weft::WeftError::model(&report.path, "weft cannot run this model (reasons above)"));
    }
    let ctx = match weft::rt::block_on(GpuContext::new(GpuOptions::default())) {
        Ok(ctx) => ctx,
        Err(e) => {
            println!("on this machine's GPU: none opened ({e})");
            return Ok(());
        }
    };
    println!("on {}, memory {}:", ctx.adapter_info().name, ctx.plan().memory.describe());
    let plan = kv.plan(&path, &ctx)?;
    println!("{}", plan.describe());
    Ok(())
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}
