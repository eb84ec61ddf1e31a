//! What weft asks of an adapter and what it runs there, decided from what the adapter reports
//! of itself (info, features, limits) and the caller's options alone. No device is opened here,
//! so the choice for adapters this machine lacks (an NVIDIA, AMD, Intel or Apple GPU, Chrome's
//! or Firefox's WebGPU) is tested from their profiles (the table at the end of this file), and
//! the same profiles can be faked through wgpu's no-op backend to open a device
//! (`GpuOptions::fake_adapter`).
//!
//! **Invariant:** `GpuContext::new` opens the device with exactly a plan's features and limits,
//! and every later choice of kernel family, matmul kernel or tile reads the plan, never the
//! adapter: one function decides, and the tests hold it to each profile.

use crate::error::{Result, WeftError};
use crate::gpu::context::{GpuFeatures, GpuOptions, KernelFamily};
use crate::gpu::memory::DeviceMemory;
use crate::gpu::pipelines::{
    CpuDriver, Epilogue, MOE_CPU_ROWS_PER_LANE, MOE_GPU_ROWS_PER_LANE, SUBGROUP_GEMM_TILE, TILED_TILE, X_WINDOW_BYTES,
    matmul_tile, moe_tile, rows_tile, subgroup_tile,
};

/// What an adapter says of itself, and what the host can tell about it.
#[derive(Clone, Debug)]
pub struct AdapterProfile {
    pub info: wgpu::AdapterInfo,
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
    /// The threads a CPU driver runs a dispatch's workgroups on, where the host can count them
    /// (natively: llvmpipe's); `None` in a browser, where a page cannot.
    pub driver_threads: Option<usize>,
    /// The device's memory, where the adapter reports it (natively on Vulkan: the largest
    /// device-local heap); `None` elsewhere (see `gpu::memory`).
    pub memory_bytes: Option<u64>,
}

/// An adapter that is not there: wgpu's no-op backend reporting this profile's type,
/// subgroup sizes, features and limits. Nothing given to it runs (dispatches and copies do
/// nothing; a readback reads zeros: every sampled token is id 0), so a step costs only the
/// host's work: how weft measures its host cost at GPU speed (`weft bench --host-only`), and
/// how tests open a device on an adapter this machine lacks. Natively only.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeAdapter {
    pub device_type: wgpu::DeviceType,
    pub subgroup_sizes: (u32, u32),
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
    /// The memory it reports having (wgpu's no-op backend reports none, as Metal, DX12 and
    /// browsers do): `Some` stands in for a Vulkan GPU's device-local heap, so the KV pool is
    /// sized from it. Keep it small: the no-op backend holds every buffer in host memory.
    pub memory_bytes: Option<u64>,
}

impl FakeAdapter {
    /// A discrete GPU like NVIDIA's: 32-lane subgroups, shader-f16, timestamps, 2 GiB bindings
    /// and 4 GiB buffers, 48 KiB of workgroup memory, 1024 invocations (what its Vulkan driver
    /// reports in the limits weft reads). Weft runs the subgroup family there.
    pub fn discrete_gpu() -> Self {
        FakeAdapter {
            device_type: wgpu::DeviceType::DiscreteGpu,
            subgroup_sizes: (32, 32),
            features: wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY,
            limits: wgpu::Limits {
                max_storage_buffer_binding_size: 2 << 30,
                max_buffer_size: 4 << 30,
                max_compute_workgroup_storage_size: 49152,
                max_compute_invocations_per_workgroup: 1024,
                max_compute_workgroup_size_x: 1024,
                max_compute_workgroup_size_y: 1024,
                max_storage_buffers_per_shader_stage: 1 << 20,
                max_storage_textures_per_shader_stage: 1 << 20,
                min_uniform_buffer_offset_alignment: 64,
                min_storage_buffer_offset_alignment: 32,
                ..wgpu::Limits::defaults()
            },
            memory_bytes: None,
        }
    }
}

/// Which limits weft requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LimitsMode {
    /// Everything the adapter offers: WebGPU's defaults (128 MiB bindings, 256 MiB buffers)
    /// would split tensors the hardware could hold whole.
    #[default]
    Adapter,
    /// Only the WebGPU specification's default limits (8 storage buffers and 4 storage textures
    /// per stage, 128 MiB storage bindings, 256 MiB buffers, 16 KiB of workgroup memory, 256
    /// invocations), capped by the adapter's own: what a browser grants a page that asks for
    /// nothing, so the weight splits and kernel choices it forces run natively too.
    WebGpuDefaults,
}

impl LimitsMode {
    /// `adapter` or `webgpu` (what `WEFT_LIMITS` takes).
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "adapter" => Ok(LimitsMode::Adapter),
            "webgpu" | "webgpu-defaults" => Ok(LimitsMode::WebGpuDefaults),
            other => Err(WeftError::Unsupported(format!(
                "unknown limits mode {other:?}; use adapter (the adapter's own limits) or webgpu (WebGPU's default \
                 limits, as a browser grants)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LimitsMode::Adapter => "adapter",
            LimitsMode::WebGpuDefaults => "webgpu",
        }
    }
}

/// The device weft opens on an adapter and the kernels it runs there.
#[derive(Clone, Debug, PartialEq)]
pub struct DevicePlan {
    pub required_features: wgpu::Features,
    pub required_limits: wgpu::Limits,
    pub features: GpuFeatures,
    pub family: KernelFamily,
    pub limits_mode: LimitsMode,
    /// Largest byte span of one storage binding (a multiple of 4); tensors above it are split.
    pub max_binding_bytes: u64,
    /// See [`CpuDriver::threads`].
    pub cpu_threads: Option<usize>,
    /// The adapter is a browser's WebGPU.
    pub browser: bool,
    /// FLOP/s the adapter surely sustains on weft's matmuls, for sizing the first step before
    /// one is measured (`engine::step_budget`): the slowest adapter of its class with weft's
    /// kernels at a fraction of peak. Integrated and unknown GPUs (a browser does not say)
    /// start where a small laptop iGPU is, a browser's CPU adapter where SwiftShader is on 2
    /// cores. `None` for a native CPU driver: it runs on the host's threads, where no watchdog
    /// ends a long submission, so its steps are not limited by time (and stay the same from
    /// run to run whatever the machine's load).
    pub cautious_flops_per_s: Option<f64>,
    /// What the adapter is (a CPU adapter's KV pool stays modest: `gpu::memory`).
    pub device_type: wgpu::DeviceType,
    /// The device's memory: reported, or the largest buffer of `required_limits` standing in.
    pub memory: DeviceMemory,
    /// Rows of x from which the baseline and subgroup families' matmul runs tiled (GEMM) rather
    /// than row-parallel (GEMV): [`gemm_min_rows`] for the adapter, or the options' override.
    /// The CPU family's matmul has one kernel for every batch size and ignores it.
    pub gemm_min_rows: usize,
}

impl DevicePlan {
    /// Decide, from `profile` and `options` alone (environment variables are read before, by
    /// [`GpuOptions::with_env`]). Fails only where the options ask what the adapter cannot do.
    pub fn choose(profile: &AdapterProfile, options: &GpuOptions) -> Result<DevicePlan> {
        let info = &profile.info;
        let mut wanted = wgpu::Features::TIMESTAMP_QUERY;
        if !options.baseline_only {
            wanted |= wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP;
        }
        let required_features = profile.features & wanted;
        let limits_mode = options.limits.unwrap_or_default();
        let required_limits = match limits_mode {
            LimitsMode::Adapter => profile.limits.clone(),
            LimitsMode::WebGpuDefaults => wgpu::Limits::defaults().or_worse_values_from(&profile.limits),
        };
        let features = GpuFeatures {
            shader_f16: required_features.contains(wgpu::Features::SHADER_F16),
            subgroups: required_features.contains(wgpu::Features::SUBGROUP),
            timestamp_query: required_features.contains(wgpu::Features::TIMESTAMP_QUERY),
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
        };
        let family = match options.kernels {
            Some(family) => family,
            None => KernelFamily::default_for(info.device_type, &features),
        };
        if family == KernelFamily::Subgroup && !KernelFamily::subgroups_fit(&features) {
            return Err(WeftError::Unsupported(format!(
                "the subgroup kernels need subgroups of at least 8 lanes; {} offers {} (sizes {}..={}); use \
                 WEFT_KERNELS=baseline",
                info.name,
                if features.subgroups { "subgroups" } else { "no subgroups" },
                features.subgroup_min_size,
                features.subgroup_max_size
            )));
        }
        let device_cap = required_limits.max_storage_buffer_binding_size.min(required_limits.max_buffer_size);
        let max_binding_bytes = options.max_binding_bytes.map_or(device_cap, |c| c.min(device_cap)) & !3;
        let browser = info.backend == wgpu::Backend::BrowserWebGpu;
        let memory = DeviceMemory::of(profile.memory_bytes, &required_limits);
        let cpu_threads = match options.cpu_threads {
            Some(threads) => Some(threads.max(1)),
            None => profile.driver_threads.filter(|_| !browser),
        };
        Ok(DevicePlan {
            required_features,
            required_limits,
            features,
            family,
            limits_mode,
            max_binding_bytes,
            cpu_threads,
            browser,
            cautious_flops_per_s: match info.device_type {
                wgpu::DeviceType::DiscreteGpu => Some(1e12),
                wgpu::DeviceType::Cpu if browser => Some(2e10),
                wgpu::DeviceType::Cpu => None,
                wgpu::DeviceType::IntegratedGpu | wgpu::DeviceType::VirtualGpu | wgpu::DeviceType::Other => Some(2e11),
            },
            device_type: info.device_type,
            memory,
            gemm_min_rows: options.gemm_min_rows.unwrap_or_else(|| gemm_min_rows(info.vendor, family)).max(1),
        })
    }

    /// Whether the adapter runs on the CPU (lavapipe, SwiftShader), whose memory is the host's.
    pub fn cpu_adapter(&self) -> bool {
        self.device_type == wgpu::DeviceType::Cpu
    }

    /// Whether weights live in textures and matmuls read activations through uniform windows:
    /// the CPU family on a native driver, where llvmpipe loads storage buffers lane by lane but
    /// gathers image loads and broadcasts uniform loads. A browser's CPU adapter (SwiftShader)
    /// reads storage buffers faster: the default model decoded at 3.3 tokens/s alone and 9.2
    /// four at once from buffers, 2.6 and 7.6 from textures and windows (headless Chromium).
    pub fn reads_textures(&self) -> bool {
        self.family == KernelFamily::Cpu && !self.browser
    }

    /// Invocations in one SIMD group of a native CPU driver, which the CPU family's matmul puts
    /// in a workgroup: llvmpipe's subgroup size, 8 with its default 256-bit vectors and 16 with
    /// `LP_NATIVE_VECTOR_WIDTH=512` (on a CPU with AVX-512 the wider code runs the matmuls
    /// 1.3-1.9x faster, bench/README.md). 8 for every other adapter.
    pub fn cpu_lanes(&self) -> u16 {
        let f = self.features;
        match (f.subgroup_min_size, f.subgroup_max_size) {
            (16, 16) if self.reads_textures() => 16,
            _ => 8,
        }
    }

    /// What the CPU family's matmul tiles are sized for: the driver's SIMD width and threads.
    pub fn cpu_driver(&self) -> CpuDriver {
        CpuDriver { lanes: self.cpu_lanes(), threads: self.cpu_threads }
    }

    /// The matmul kernel and its tile (WG, TN, TM) for `m` rows of x times a weight part of
    /// `n` output columns whose rows are `k` values long, with `epilogue`.
    pub fn matmul_kernel(&self, m: usize, n: usize, k: usize, epilogue: Epilogue) -> (&'static str, [u16; 3]) {
        match self.family {
            KernelFamily::Cpu => {
                let window_rows =
                    if self.reads_textures() { (X_WINDOW_BYTES / (k as u64 * 4)) as usize } else { usize::MAX };
                ("matmul", matmul_tile(m, n, window_rows, epilogue, self.cpu_driver()))
            }
            KernelFamily::Baseline if m >= self.gemm_min_rows => ("matmul_tiled", TILED_TILE),
            KernelFamily::Baseline => ("matmul_rows", rows_tile(m)),
            KernelFamily::Subgroup if m >= self.gemm_min_rows => ("matmul_subgroup", SUBGROUP_GEMM_TILE),
            KernelFamily::Subgroup => ("matmul_subgroup", subgroup_tile(m)),
        }
    }

    /// The tile (WG, TN, TM) of the experts' grouped matmul (`moe_matmul_grouped`) with
    /// `epilogue`: a SIMD group of the CPU driver, or 64 invocations on a GPU.
    pub fn moe_tile(&self, epilogue: Epilogue) -> [u16; 3] {
        match self.family {
            KernelFamily::Cpu => moe_tile(self.cpu_lanes(), MOE_CPU_ROWS_PER_LANE, epilogue),
            KernelFamily::Baseline | KernelFamily::Subgroup => moe_tile(64, MOE_GPU_ROWS_PER_LANE, epilogue),
        }
    }

    /// Whether an MLP's gate and up projections for `m` rows and its gate run as one pass
    /// (`matmul_gated`): every family but the baseline's tiled matmul (from `gemm_min_rows`).
    pub fn supports_gated(&self, m: usize) -> bool {
        self.family != KernelFamily::Baseline || m < self.gemm_min_rows
    }
}

/// Rows of x from which a GPU family's matmul tiles, by adapter vendor (PCI vendor id, or
/// Vulkan's for drivers without one) and kernel family, as the device check measured it
/// (`cargo xtask device-check` prints the row to add: the batch size from which the tiled
/// kernel beats the row-parallel one on every shape it times). Adapters not listed take
/// [`DEFAULT_GEMM_MIN_ROWS`]. Either way a switch changes no bits: each family's two kernels
/// sum every output in one order (shaders/matmul_tiled.wgsl, shaders/matmul_subgroup.wgsl).
pub const GEMM_MIN_ROWS: &[GemmMinRows] = &[
    // lavapipe (Mesa's Vulkan vendor id), 2 threads, 512-bit vectors, the default model's shapes:
    // the GEMM 1.5-4x the GEMV from 16 rows on all three (bench/README.md, "GEMV or GEMM"). Its
    // baseline timings were too noisy to call (the default stays). Only tests force these
    // families there: lavapipe runs the CPU family.
    GemmMinRows { vendor: VENDOR_MESA, family: KernelFamily::Subgroup, min_rows: 16 },
];

/// One row of [`GEMM_MIN_ROWS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmMinRows {
    pub vendor: u32,
    pub family: KernelFamily,
    pub min_rows: usize,
}

/// Vulkan's vendor id for Mesa's software drivers (VK_VENDOR_ID_MESA: lavapipe).
pub const VENDOR_MESA: u32 = 0x10005;

/// Rows of x from which a GPU family tiles on an adapter the table does not list (or no GPU has
/// measured yet): a full tile of the kernel (32 rows of matmul_tiled.wgsl, 16 of the subgroup
/// GEMM), below which rows of the tile are computed and discarded.
pub fn default_gemm_min_rows(family: KernelFamily) -> usize {
    match family {
        KernelFamily::Subgroup => usize::from(SUBGROUP_GEMM_TILE[2]),
        KernelFamily::Baseline | KernelFamily::Cpu => usize::from(TILED_TILE[2]),
    }
}

/// [`GEMM_MIN_ROWS`]'s row for `vendor` and `family`, else the family's default.
pub fn gemm_min_rows(vendor: u32, family: KernelFamily) -> usize {
    GEMM_MIN_ROWS
        .iter()
        .find(|r| r.vendor == vendor && r.family == family)
        .map_or_else(|| default_gemm_min_rows(family), |r| r.min_rows)
}

#[cfg(test)]
mod tests {
    //! Adapters weft has never met, from what their drivers report: NVIDIA, AMD and Intel
    //! subgroup sizes as Vulkan's subgroup-size-control properties give them (DX12's wave lane
    //! counts agree), Apple's as wgpu's Metal backend reports them (4..=64 for every Apple GPU),
    //! the browsers' WebGPU limits as Chrome and Firefox grant them, lavapipe and SwiftShader.
    use super::*;

    fn profile(
        name: &str,
        device_type: wgpu::DeviceType,
        backend: wgpu::Backend,
        subgroups: (u32, u32),
        features: wgpu::Features,
        limits: wgpu::Limits,
    ) -> AdapterProfile {
        let mut info = wgpu::AdapterInfo::new(device_type, backend);
        info.name = name.into();
        (info.subgroup_min_size, info.subgroup_max_size) = subgroups;
        let driver_threads = (backend != wgpu::Backend::BrowserWebGpu).then_some(2);
        AdapterProfile { info, features, limits, driver_threads, memory_bytes: None }
    }

    /// A discrete GPU's limits as Vulkan drivers report them (NVIDIA's and AMD's are alike in
    /// what weft reads: 2-4 GiB bindings, 48-64 KiB of workgroup memory, 1024 invocations).
    fn discrete_limits(binding: u64) -> wgpu::Limits {
        wgpu::Limits {
            max_storage_buffer_binding_size: binding,
            max_buffer_size: binding.max(1 << 32),
            max_compute_workgroup_storage_size: 49152,
            max_compute_invocations_per_workgroup: 1024,
            max_storage_buffers_per_shader_stage: 1 << 20,
            max_storage_textures_per_shader_stage: 1 << 20,
            min_uniform_buffer_offset_alignment: 64,
            min_storage_buffer_offset_alignment: 32,
            ..wgpu::Limits::defaults()
        }
    }

    /// Chrome's WebGPU on a discrete GPU: what it grants when asked for the adapter's limits.
    fn chrome_limits() -> wgpu::Limits {
        wgpu::Limits {
            max_storage_buffer_binding_size: (4 << 30) - 4,
            max_buffer_size: 4 << 30,
            max_compute_workgroup_storage_size: 32768,
            max_compute_invocations_per_workgroup: 1024,
            max_storage_buffers_per_shader_stage: 10,
            ..wgpu::Limits::defaults()
        }
    }

    /// Firefox's WebGPU (wgpu inside): 1 GiB bindings and buffers where the GPU allows.
    fn firefox_limits() -> wgpu::Limits {
        wgpu::Limits {
            max_storage_buffer_binding_size: 1 << 30,
            max_buffer_size: 1 << 30,
            max_compute_workgroup_storage_size: 32768,
            max_compute_invocations_per_workgroup: 1024,
            ..wgpu::Limits::defaults()
        }
    }

    const ALL: wgpu::Features =
        wgpu::Features::SHADER_F16.union(wgpu::Features::SUBGROUP).union(wgpu::Features::TIMESTAMP_QUERY);

    struct Expect {
        family: KernelFamily,
        f16: bool,
        binding_mib: u64,
        textures: bool,
        /// The matmul kernel and tile for a lone decode and for a 512-token prefill of a
        /// 2048 × 2048 weight.
        decode: (&'static str, [u16; 3]),
        prefill: (&'static str, [u16; 3]),
    }

    fn check(p: &AdapterProfile, want: Expect) {
        let plan = DevicePlan::choose(p, &GpuOptions::default()).unwrap();
        let name = &p.info.name;
        assert_eq!(plan.family, want.family, "{name}: kernel family");
        assert_eq!(plan.features.shader_f16, want.f16, "{name}: shader-f16");
        assert_eq!(plan.max_binding_bytes >> 20, want.binding_mib, "{name}: binding MiB");
        assert_eq!(plan.reads_textures(), want.textures, "{name}: weights in textures");
        assert_eq!(plan.matmul_kernel(1, 2048, 2048, Epilogue::None), want.decode, "{name}: decode matmul");
        assert_eq!(plan.matmul_kernel(512, 2048, 2048, Epilogue::None), want.prefill, "{name}: prefill matmul");
        // The first step of a model of 1 GFLOP a token, before any is measured: half a second
        // of the slowest adapter of its class.
        let first_step_tokens = plan.cautious_flops_per_s.map(|f| f * 0.5 / 1e9);
        let expected = match (p.info.device_type, plan.browser) {
            (wgpu::DeviceType::DiscreteGpu, _) => Some(500.0),
            (wgpu::DeviceType::Cpu, true) => Some(10.0),
            (wgpu::DeviceType::Cpu, false) => None,
            _ => Some(100.0),
        };
        assert_eq!(first_step_tokens, expected, "{name}: first step's tokens");
        // The device is opened with what the adapter offers, never more.
        assert!(plan.required_limits.check_limits(&p.limits), "{name}: limits beyond the adapter's");
        assert!(p.features.contains(plan.required_features), "{name}: features beyond the adapter's");
    }

    #[test]
    fn nvidia_runs_the_subgroup_family_with_its_own_limits() {
        use wgpu::{Backend::Vulkan, DeviceType::DiscreteGpu};
        let rtx = profile("NVIDIA GeForce RTX 4090", DiscreteGpu, Vulkan, (32, 32), ALL, discrete_limits(4 << 30));
        let gpu = |m| Expect {
            family: KernelFamily::Subgroup,
            f16: true,
            binding_mib: m,
            textures: false,
            decode: ("matmul_subgroup", [64, 8, 1]),
            prefill: ("matmul_subgroup", [64, 16, 16]),
        };
        check(&rtx, gpu(4096));
        let h100 = profile("NVIDIA H100 80GB HBM3", DiscreteGpu, Vulkan, (32, 32), ALL, discrete_limits(4 << 30));
        check(&h100, gpu(4096));
    }

    #[test]
    fn amd_gcn_runs_subgroups_and_rdna_whose_size_varies_the_baseline() {
        use wgpu::{Backend::Vulkan, DeviceType::DiscreteGpu};
        // GCN and CDNA run 64-lane waves only; RDNA runs 32 or 64 per pipeline, and the subgroup
        // family needs one size for every pipeline (KernelFamily::default_for).
        let gcn = profile("AMD Radeon RX Vega 64", DiscreteGpu, Vulkan, (64, 64), ALL, discrete_limits(4 << 30));
        check(
            &gcn,
            Expect {
                family: KernelFamily::Subgroup,
                f16: true,
                binding_mib: 4096,
                textures: false,
                decode: ("matmul_subgroup", [64, 8, 1]),
                prefill: ("matmul_subgroup", [64, 16, 16]),
            },
        );
        let rdna = profile("AMD Radeon RX 7900 XTX", DiscreteGpu, Vulkan, (32, 64), ALL, discrete_limits(4 << 30));
        check(
            &rdna,
            Expect {
                family: KernelFamily::Baseline,
                f16: true,
                binding_mib: 4096,
                textures: false,
                decode: ("matmul_rows", [64, 8, 1]),
                prefill: ("matmul_tiled", [64, 32, 32]),
            },
        );
    }

    #[test]
    fn intel_and_apple_whose_subgroup_sizes_vary_run_the_baseline() {
        let arc = profile(
            "Intel(R) Arc(tm) A770 Graphics (DG2)",
            wgpu::DeviceType::DiscreteGpu,
            wgpu::Backend::Vulkan,
            (8, 32),
            ALL,
            discrete_limits(4 << 30),
        );
        let iris = profile(
            "Intel(R) Iris(R) Xe Graphics",
            wgpu::DeviceType::IntegratedGpu,
            wgpu::Backend::Vulkan,
            (8, 32),
            wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY,
            discrete_limits(1 << 30),
        );
        let apple = profile(
            "Apple M3 Max",
            wgpu::DeviceType::IntegratedGpu,
            wgpu::Backend::Metal,
            (4, 64),
            ALL,
            discrete_limits(1 << 30),
        );
        let baseline = |f16, binding_mib| Expect {
            family: KernelFamily::Baseline,
            f16,
            binding_mib,
            textures: false,
            decode: ("matmul_rows", [64, 8, 1]),
            prefill: ("matmul_tiled", [64, 32, 32]),
        };
        check(&arc, baseline(true, 4096));
        check(&iris, baseline(false, 1024));
        check(&apple, baseline(true, 1024));
    }

    #[test]
    fn browsers_run_the_baseline_with_what_they_grant() {
        // wgpu's WebGPU backend cannot request subgroups, so browsers report none.
        let f16 = wgpu::Features::SHADER_F16 | wgpu::Features::TIMESTAMP_QUERY;
        let chrome = profile(
            "Chrome: NVIDIA GeForce RTX 4090",
            wgpu::DeviceType::DiscreteGpu,
            wgpu::Backend::BrowserWebGpu,
            (32, 32),
            f16,
            chrome_limits(),
        );
        let firefox = profile(
            "Firefox: AMD Radeon RX 7900 XTX",
            wgpu::DeviceType::DiscreteGpu,
            wgpu::Backend::BrowserWebGpu,
            (32, 64),
            wgpu::Features::empty(),
            firefox_limits(),
        );
        let baseline = |f16, binding_mib| Expect {
            family: KernelFamily::Baseline,
            f16,
            binding_mib,
            textures: false,
            decode: ("matmul_rows", [64, 8, 1]),
            prefill: ("matmul_tiled", [64, 32, 32]),
        };
        check(&chrome, baseline(true, 4095));
        check(&firefox, baseline(false, 1024));
        // Headless Chromium's SwiftShader: the CPU family over storage buffers, with the few
        // small tiles of a driver whose threads a page cannot count.
        let swiftshader = profile(
            "SwiftShader Device (Subzero)",
            wgpu::DeviceType::Cpu,
            wgpu::Backend::BrowserWebGpu,
            (4, 4),
            wgpu::Features::TIMESTAMP_QUERY,
            wgpu::Limits { max_storage_buffer_binding_size: 1 << 30, max_buffer_size: 1 << 30, ..chrome_limits() },
        );
        check(
            &swiftshader,
            Expect {
                family: KernelFamily::Cpu,
                f16: false,
                binding_mib: 1024,
                textures: false,
                decode: ("matmul", [8, 8, 1]),
                prefill: ("matmul", [8, 8, 4]),
            },
        );
    }

    #[test]
    fn lavapipe_runs_the_cpu_family_at_its_vector_width() {
        let lavapipe = |lanes| {
            profile(
                "llvmpipe (LLVM 15.0.6, 256 bits)",
                wgpu::DeviceType::Cpu,
                wgpu::Backend::Vulkan,
                (lanes, lanes),
                ALL,
                wgpu::Limits {
                    max_storage_buffer_binding_size: 128 << 20,
                    max_buffer_size: 1 << 31,
                    ..discrete_limits(0)
                },
            )
        };
        let cpu = |lanes| Expect {
            family: KernelFamily::Cpu,
            f16: true,
            binding_mib: 128,
            textures: true,
            decode: ("matmul", [lanes, 16, 1]),
            prefill: ("matmul", [lanes, 16, 8]),
        };
        check(&lavapipe(8), cpu(8));
        check(&lavapipe(16), cpu(16));
    }

    #[test]
    fn webgpu_default_limits_are_requested_when_asked_and_capped_by_the_adapter() {
        let p = profile(
            "NVIDIA GeForce RTX 4090",
            wgpu::DeviceType::DiscreteGpu,
            wgpu::Backend::Vulkan,
            (32, 32),
            ALL,
            discrete_limits(4 << 30),
        );
        let options = GpuOptions { limits: Some(LimitsMode::WebGpuDefaults), ..Default::default() };
        let plan = DevicePlan::choose(&p, &options).unwrap();
        let l = &plan.required_limits;
        assert_eq!(l.max_storage_buffers_per_shader_stage, 8);
        assert_eq!(l.max_storage_buffer_binding_size, 128 << 20);
        assert_eq!(l.max_buffer_size, 256 << 20);
        assert_eq!(l.max_compute_workgroup_storage_size, 16 << 10);
        assert_eq!(l.max_compute_invocations_per_workgroup, 256);
        // Alignments are "better" when smaller: the defaults' 256 bytes, not the adapter's 64.
        assert_eq!(l.min_uniform_buffer_offset_alignment, 256);
        assert_eq!(plan.max_binding_bytes, 128 << 20);
        assert_eq!(plan.family, KernelFamily::Subgroup, "limits do not change the family");
        // An adapter below a default keeps its own value.
        let small = AdapterProfile {
            limits: wgpu::Limits { max_storage_buffer_binding_size: 64 << 20, ..p.limits.clone() },
            ..p.clone()
        };
        assert_eq!(DevicePlan::choose(&small, &options).unwrap().max_binding_bytes, 64 << 20);
    }

    #[test]
    fn each_gpu_family_tiles_from_its_vendors_threshold_or_the_options() {
        use wgpu::{Backend::Vulkan, DeviceType::DiscreteGpu};
        let mut rtx = profile("NVIDIA GeForce RTX 4090", DiscreteGpu, Vulkan, (32, 32), ALL, discrete_limits(4 << 30));
        rtx.info.vendor = 0x10de;
        let mut lavapipe = profile("llvmpipe (LLVM 15.0.6, 512 bits)", wgpu::DeviceType::Cpu, Vulkan, (16, 16), ALL, {
            discrete_limits(128 << 20)
        });
        lavapipe.info.vendor = VENDOR_MESA;
        for (p, family) in [
            (&rtx, KernelFamily::Subgroup),
            (&rtx, KernelFamily::Baseline),
            (&lavapipe, KernelFamily::Subgroup),
            (&lavapipe, KernelFamily::Baseline),
        ] {
            let name = format!("{} {family:?}", p.info.name);
            let options = GpuOptions { kernels: Some(family), ..Default::default() };
            let plan = DevicePlan::choose(p, &options).unwrap();
            // The table's row for the vendor, else the family's default: a full tile of its GEMM.
            let listed = GEMM_MIN_ROWS.iter().find(|r| r.vendor == p.info.vendor && r.family == family);
            let want = listed.map_or(default_gemm_min_rows(family), |r| r.min_rows);
            assert_eq!(plan.gemm_min_rows, want, "{name}");
            let (gemv, gemm) = match family {
                KernelFamily::Subgroup => ("matmul_subgroup", ("matmul_subgroup", SUBGROUP_GEMM_TILE)),
                _ => ("matmul_rows", ("matmul_tiled", TILED_TILE)),
            };
            let t = plan.gemm_min_rows;
            assert_eq!(plan.matmul_kernel(t - 1, 576, 576, Epilogue::None).0, gemv, "{name}: below the threshold");
            assert_ne!(plan.matmul_kernel(t - 1, 576, 576, Epilogue::None).1, SUBGROUP_GEMM_TILE, "{name}");
            assert_eq!(plan.matmul_kernel(t, 576, 576, Epilogue::None), gemm, "{name}: at the threshold");
            assert_eq!(plan.supports_gated(t), family == KernelFamily::Subgroup, "{name}: gated at the threshold");
            // The options' threshold (the device check's, the tests') wins over the table.
            let forced = DevicePlan::choose(p, &GpuOptions { gemm_min_rows: Some(5), ..options.clone() }).unwrap();
            assert_eq!(forced.matmul_kernel(4, 576, 576, Epilogue::None).0, gemv, "{name}: forced, 4 rows");
            assert_eq!(forced.matmul_kernel(5, 576, 576, Epilogue::None), gemm, "{name}: forced, 5 rows");
        }
        // An adapter the table lacks tiles from a full tile of its family's GEMM.
        assert_eq!(gemm_min_rows(0xffff, KernelFamily::Subgroup), usize::from(SUBGROUP_GEMM_TILE[2]));
        assert_eq!(gemm_min_rows(0xffff, KernelFamily::Baseline), usize::from(TILED_TILE[2]));
    }

    #[test]
    fn options_override_the_adapter_and_impossible_ones_are_refused() {
        let iris = profile(
            "Intel(R) Iris(R) Xe Graphics",
            wgpu::DeviceType::IntegratedGpu,
            wgpu::Backend::Vulkan,
            (8, 32),
            ALL,
            discrete_limits(1 << 30),
        );
        let forced = GpuOptions { kernels: Some(KernelFamily::Subgroup), ..Default::default() };
        assert_eq!(DevicePlan::choose(&iris, &forced).unwrap().family, KernelFamily::Subgroup);
        let baseline_only = GpuOptions { baseline_only: true, ..Default::default() };
        let plan = DevicePlan::choose(&iris, &baseline_only).unwrap();
        assert!(!plan.features.shader_f16 && !plan.features.subgroups);
        assert_eq!(plan.family, KernelFamily::Baseline);
        let err = DevicePlan::choose(&iris, &GpuOptions { baseline_only: true, ..forced }).unwrap_err();
        assert!(err.to_string().contains("WEFT_KERNELS=baseline"), "{err}");
        let capped = GpuOptions { max_binding_bytes: Some((1 << 20) + 3), ..Default::default() };
        assert_eq!(DevicePlan::choose(&iris, &capped).unwrap().max_binding_bytes, 1 << 20);
        let err = LimitsMode::parse("browser").unwrap_err().to_string();
        assert!(err.contains("adapter") && err.contains("webgpu"), "{err}");
    }
}
