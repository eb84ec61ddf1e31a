//! Devices this machine lacks, opened for real on wgpu's no-op backend (`FakeAdapter`): the
//! plan a profile gets reaches the device (family, features, limits), the whole engine builds
//! and steps there (every kernel of the family accepted by wgpu's validation, every buffer
//! and bind group made), and a step then costs only host work, which `weft bench --host-only`
//! measures. The table of profiles without a device is `gpu::plan`'s unit tests.

use weft::DType;
use weft::engine::EngineConfig;
use weft::engine::api::InferenceEngine;
use weft::engine::request::{FinishReason, GenerationParams, InferenceRequest, Prompt};
use weft::gpu::{DeviceMemory, FakeAdapter, GpuContext, GpuOptions, KernelFamily, KvLimit, LimitsMode, MemorySource};
use weft::model::tiny;
use weft::sampling::SamplingParams;

fn open(options: GpuOptions) -> std::sync::Arc<GpuContext> {
    weft::rt::block_on(GpuContext::new(options)).unwrap()
}

fn fake(fake: FakeAdapter) -> GpuOptions {
    GpuOptions { fake_adapter: Some(fake), ..Default::default() }
}

#[test]
fn a_fake_discrete_gpu_opens_with_its_plan() {
    let ctx = open(fake(FakeAdapter::discrete_gpu()));
    assert_eq!(ctx.adapter_info().backend, wgpu::Backend::Noop);
    assert_eq!(ctx.kernel_family(), KernelFamily::Subgroup);
    let f = ctx.features();
    assert!(f.shader_f16 && f.subgroups && (f.subgroup_min_size, f.subgroup_max_size) == (32, 32), "{f:?}");
    assert_eq!(ctx.max_binding_bytes(), 2 << 30);
    assert_eq!(ctx.device_limits().max_storage_buffer_binding_size, 2 << 30, "the device got the plan's limits");

    // WebGPU's defaults on the same adapter: what a browser grants, and what the device gets.
    let ctx = open(GpuOptions { limits: Some(LimitsMode::WebGpuDefaults), ..fake(FakeAdapter::discrete_gpu()) });
    let l = ctx.device_limits();
    assert_eq!((l.max_storage_buffers_per_shader_stage, l.max_storage_buffer_binding_size), (8, 128 << 20));
    assert_eq!(ctx.max_binding_bytes(), 128 << 20);

    // An Intel-like adapter whose subgroup size varies per pipeline runs the baseline.
    let intel = FakeAdapter { subgroup_sizes: (8, 32), ..FakeAdapter::discrete_gpu() };
    assert_eq!(open(fake(intel)).kernel_family(), KernelFamily::Baseline);
    // A forced family the adapter cannot run is refused, saying what to use instead.
    let narrow = FakeAdapter { subgroup_sizes: (4, 4), ..FakeAdapter::discrete_gpu() };
    let forced = GpuOptions { kernels: Some(KernelFamily::Subgroup), ..fake(narrow) };
    let err = weft::rt::block_on(GpuContext::new(forced)).unwrap_err().to_string();
    assert!(err.contains("WEFT_KERNELS=baseline"), "{err}");
}

/// Every GPU family builds the engine on a fake discrete GPU (its kernels pass wgpu's
/// validation at the adapter's limits and at WebGPU's defaults) and serves requests to their
/// end; with no GPU behind it every sampled token is id 0.
#[test]
fn the_engine_builds_and_serves_on_a_fake_gpu_in_every_gpu_family() {
    let c = tiny::tiny_config();
    let w = tiny::random_weights(&c, 21, DType::Q8_0);
    let bytes = tiny::gguf_bytes(&c, &w, DType::Q8_0);
    for (family, limits) in [
        (KernelFamily::Subgroup, LimitsMode::Adapter),
        (KernelFamily::Baseline, LimitsMode::Adapter),
        (KernelFamily::Baseline, LimitsMode::WebGpuDefaults),
    ] {
        let options = GpuOptions { kernels: Some(family), limits: Some(limits), ..fake(FakeAdapter::discrete_gpu()) };
        let ctx = open(options);
        let config = EngineConfig { max_num_seqs: 4, max_num_batched_tokens: 64, ..Default::default() };
        let engine = weft::EngineBuilder::from_gguf_bytes("tiny.gguf", bytes.clone())
            .unwrap()
            .config(config)
            .kv_memory_bytes(1 << 20)
            .build_on(ctx.clone())
            .unwrap();
        let params = GenerationParams {
            sampling: SamplingParams::greedy(),
            max_tokens: Some(5),
            ignore_eos: true,
            ..Default::default()
        };
        let requests: Vec<_> = (0..3)
            .map(|i| engine.submit(InferenceRequest::new(Prompt::Text("ab".repeat(i + 1)), params.clone())).unwrap().1)
            .collect();
        while weft::rt::block_on(engine.step()).unwrap() {}
        for stream in requests {
            let chunks: Vec<_> = weft::rt::block_on(futures::StreamExt::collect::<Vec<_>>(stream));
            let last = chunks.last().unwrap().as_ref().unwrap();
            assert_eq!(last.finish_reason, Some(FinishReason::Length), "{family:?} {limits:?}");
            let tokens: Vec<u32> = chunks.iter().flat_map(|c| c.as_ref().unwrap().token_ids.clone()).collect();
            assert_eq!(tokens, vec![0; 5], "{family:?} {limits:?}: a fake GPU samples id 0");
        }
        assert_eq!(engine.cache_metrics_snapshot().kv.used_blocks, 0, "{family:?}: blocks returned");
    }
}

/// One round trip per engine step, prefills, decodes and steps that verify drafted tokens
/// alike: on a fake GPU every sampled token is id 0, so prompt lookup keeps drafting zeros and
/// every draft is accepted.
#[test]
fn every_step_is_one_submission_even_when_it_verifies_drafts() {
    use weft::engine::spec::SpeculationConfig;
    let c = tiny::tiny_config();
    let w = tiny::random_weights(&c, 21, DType::Q8_0);
    let ctx = open(fake(FakeAdapter::discrete_gpu()));
    let engine = weft::EngineBuilder::from_gguf_bytes("tiny.gguf", tiny::gguf_bytes(&c, &w, DType::Q8_0))
        .unwrap()
        .speculation(SpeculationConfig::prompt_lookup())
        .kv_memory_bytes(1 << 20)
        .build_on(ctx.clone())
        .unwrap();
    let params = GenerationParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(32),
        ignore_eos: true,
        ..Default::default()
    };
    let streams: Vec<_> = ["abcabc", "xyz"]
        .iter()
        .map(|p| engine.submit(InferenceRequest::new(Prompt::Text(p.to_string()), params.clone())).unwrap().1)
        .collect();
    let before = ctx.submissions();
    let mut steps = 0;
    while weft::rt::block_on(engine.step()).unwrap() {
        steps += 1;
    }
    assert_eq!(ctx.submissions() - before, steps, "submissions in {steps} steps");
    let m = engine.metrics();
    assert!(m.spec_drafted_tokens > 0 && m.spec_accepted_tokens > 0, "no step verified drafts: {m:?}");
    for stream in streams {
        let chunks: Vec<_> = weft::rt::block_on(futures::StreamExt::collect::<Vec<_>>(stream));
        let tokens: usize = chunks.iter().map(|c| c.as_ref().unwrap().token_ids.len()).sum();
        assert_eq!(tokens, 32);
    }
}

/// On a GPU that reports its memory, a model built with defaults gets vLLM's share: the KV
/// pool holds 0.9 of the device less the weights and the workspace, in f16 (the fake has
/// shader-f16); where the weights and workspace leave nothing, the build is refused saying so.
#[test]
fn a_default_kv_pool_takes_the_share_of_a_gpu_that_reports_its_memory() {
    let c = tiny::tiny_config();
    let w = tiny::random_weights(&c, 21, DType::Q8_0);
    let bytes = tiny::gguf_bytes(&c, &w, DType::Q8_0);
    let memory = 256u64 << 20;
    let ctx = open(fake(FakeAdapter { memory_bytes: Some(memory), ..FakeAdapter::discrete_gpu() }));
    assert_eq!(ctx.plan().memory, DeviceMemory { bytes: memory, source: MemorySource::Reported });
    let config = EngineConfig { max_num_seqs: 4, max_num_batched_tokens: 64, ..Default::default() };
    let builder = || weft::EngineBuilder::from_gguf_bytes("tiny.gguf", bytes.clone()).unwrap().config(config.clone());
    let plan = builder().plan_kv(&ctx).unwrap();
    let budget = plan.budget.expect("sized from the device");
    assert_eq!((budget.limit, budget.usable_bytes), (KvLimit::Utilization, memory * 9 / 10));
    assert_eq!(budget.pool_bytes, budget.usable_bytes - plan.weights_bytes - plan.other_bytes);
    let block_bytes = weft::kv::KvCacheConfig::block_bytes(16, c.kv_token_values(), DType::F16);
    assert_eq!(plan.config.num_blocks, budget.pool_bytes as usize / block_bytes);
    let engine = builder().build_on(ctx.clone()).unwrap();
    let kv = weft::step::ModelExecutor::kv_config(engine.executor().as_ref());
    assert_eq!(kv.dtype, DType::F16);
    // The build counts the weights as it uploads them; the plan estimated them from the file.
    assert!(kv.num_blocks.abs_diff(plan.config.num_blocks) * block_bytes <= 64 << 10, "{kv:?} vs {plan:?}");
    // Everything it made fits the device's share: weights, workspace and the pool.
    assert!(ctx.creations().bytes <= budget.usable_bytes, "{} bytes made", ctx.creations().bytes);
    drop(engine);
    // At 0.05 of 256 MiB the workspace alone takes more than the share.
    let err = builder().gpu_memory_utilization(0.05).build_on(ctx).err().expect("refused").to_string();
    assert!(err.contains("does not fit the KV cache, which holds 0 tokens: the weights"), "{err}");
    assert!(err.contains("raise gpu_memory_utilization (--gpu-memory-utilization, now 0.05)"), "{err}");
}
