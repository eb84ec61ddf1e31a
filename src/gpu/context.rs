//! Opening the GPU: instance, adapter choice, device with the adapter's real limits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Result, WeftError};
use crate::gpu::pipelines::{CpuDriver, PipelineCache};
use crate::gpu::plan::{AdapterProfile, DevicePlan, FakeAdapter, LimitsMode};
use crate::quant::DType;

/// Choices made when opening the device. Environment variables are read too (see [`GpuContext::new`]).
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Cap on the bytes one storage binding may span, below the device's own limit. Tensors
    /// larger than this are split over several buffers; tests force a tiny cap to exercise that.
    pub max_binding_bytes: Option<u64>,
    /// Use only core WebGPU even where the adapter offers more (shader-f16, subgroups).
    pub baseline_only: bool,
    /// Force a family of kernel variants instead of the adapter's own choice.
    pub kernels: Option<KernelFamily>,
    /// Threads a CPU driver spreads a dispatch's workgroups over, which the CPU family sizes
    /// its matmul tiles for (default: natively llvmpipe's own count, `LP_NUM_THREADS` where
    /// set, else the CPUs this process may run on; in a browser unknown, see
    /// [`CpuDriver::threads`]). Tests set it to reach every tile.
    pub cpu_threads: Option<usize>,
    /// Request the adapter's own limits (the default) or only WebGPU's default limits, as a
    /// browser grants a page that asks for nothing.
    pub limits: Option<LimitsMode>,
    /// Open wgpu's no-op backend reporting this adapter instead of a real one (natively only;
    /// see [`FakeAdapter`]). `WEFT_HOST_ONLY=1` asks for [`FakeAdapter::discrete_gpu`].
    pub fake_adapter: Option<FakeAdapter>,
    /// Rows of x from which a GPU family's matmul runs tiled (GEMM) instead of row-parallel
    /// (GEMV), instead of the per-adapter table's (`gpu::plan::GEMM_MIN_ROWS`): what the device
    /// check sets to time both kernels at every batch size, and tests to reach both.
    pub gemm_min_rows: Option<usize>,
    /// Bytes of a tensor read from its source and uploaded at a time (default
    /// [`UPLOAD_SLICE_BYTES`]; at least 16): tests set a few hundred bytes so that slices cut
    /// through blocks and rows.
    pub upload_slice_bytes: Option<u64>,
}

/// Bytes of a weight read from its file and uploaded at a time: what a load holds of a tensor
/// on the host (in the browser, in WebAssembly memory) whatever the tensor's size.
pub const UPLOAD_SLICE_BYTES: u64 = 16 << 20;

impl GpuOptions {
    /// These options with what the environment says filled in where they leave a choice open:
    /// `WEFT_KERNELS` (a family), `WEFT_MAX_BINDING_BYTES` (a cap on one storage binding) and
    /// `WEFT_LIMITS` (`adapter` or `webgpu`), `WEFT_HOST_ONLY=1` (a fake GPU) and
    /// `WEFT_GEMM_MIN_ROWS` (rows from which the GPU families' matmul tiles). A value that does
    /// not parse is an error naming it.
    pub fn with_env(mut self) -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if self.kernels.is_none()
            && let Some(name) = var("WEFT_KERNELS")
        {
            self.kernels = Some(KernelFamily::parse(&name)?);
        }
        if self.max_binding_bytes.is_none()
            && let Some(bytes) = var("WEFT_MAX_BINDING_BYTES")
        {
            let parsed = bytes.trim().parse().map_err(|_| {
                WeftError::Unsupported(format!("WEFT_MAX_BINDING_BYTES={bytes:?} is not a number of bytes"))
            })?;
            self.max_binding_bytes = Some(parsed);
        }
        if self.limits.is_none()
            && let Some(mode) = var("WEFT_LIMITS")
        {
            self.limits = Some(LimitsMode::parse(&mode)?);
        }
        if self.gemm_min_rows.is_none()
            && let Some(rows) = var("WEFT_GEMM_MIN_ROWS")
        {
            let parsed = rows.trim().parse().ok().filter(|&r: &usize| r > 0).ok_or_else(|| {
                WeftError::Unsupported(format!(
                    "WEFT_GEMM_MIN_ROWS={rows:?} is not a positive number of rows (the batch size from which the \
                     GPU families' matmul tiles)"
                ))
            })?;
            self.gemm_min_rows = Some(parsed);
        }
        if self.fake_adapter.is_none() && var("WEFT_HOST_ONLY").is_some_and(|v| v.trim() == "1") {
            self.fake_adapter = Some(FakeAdapter::discrete_gpu());
        }
        Ok(self)
    }
}

/// Which kernel variants a device runs. Every family computes the same numbers to within
/// rounding and is batch invariant; they differ in how they read memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelFamily {
    /// Core WebGPU and storage buffers only: what a browser without extensions runs, and what
    /// GPUs run.
    Baseline,
    /// For drivers that run on the CPU (lavapipe, SwiftShader): one SIMD group (8 or 16 lanes)
    /// per workgroup, tiles unrolled into registers and sized for the driver's threads (few and
    /// small in a browser, which cannot count them), and natively weights in textures and
    /// matmul activations in uniform windows, which llvmpipe loads vectorized where it loads
    /// storage buffers lane by lane (see `GpuContext::reads_textures`).
    Cpu,
    /// GPUs with subgroups of one fixed size of at least 8 lanes: the baseline with matmuls
    /// whose subgroup lanes share each weight row (coalesced reads, joined by `subgroupAdd`).
    Subgroup,
}

impl KernelFamily {
    /// `baseline`, `cpu` or `subgroup` (what `WEFT_KERNELS` takes).
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "baseline" => Ok(KernelFamily::Baseline),
            "cpu" => Ok(KernelFamily::Cpu),
            "subgroup" => Ok(KernelFamily::Subgroup),
            other => {
                Err(WeftError::Unsupported(format!("unknown kernel family {other:?}; use baseline, cpu or subgroup")))
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KernelFamily::Baseline => "baseline",
            KernelFamily::Cpu => "cpu",
            KernelFamily::Subgroup => "subgroup",
        }
    }

    /// The family an adapter runs unless told otherwise. Subgroup matmuls need one subgroup
    /// size for every pipeline (a size chosen per pipeline would let one tensor's sums differ
    /// between the batch sizes' tiles) and at least 8 lanes (8 weight rows per workgroup of 64).
    pub(crate) fn default_for(device_type: wgpu::DeviceType, features: &GpuFeatures) -> Self {
        if device_type == wgpu::DeviceType::Cpu {
            KernelFamily::Cpu
        } else if Self::subgroups_fit(features) && features.subgroup_min_size == features.subgroup_max_size {
            KernelFamily::Subgroup
        } else {
            KernelFamily::Baseline
        }
    }

    /// Whether the subgroup kernels can run at all: subgroups of at least 8 lanes.
    pub(crate) fn subgroups_fit(features: &GpuFeatures) -> bool {
        features.subgroups && features.subgroup_min_size >= 8
    }

    /// Whether attention shares a long context among workgroups (split-K). A GPU's decode
    /// step has too few (head, sequence) pairs to fill it; a CPU driver's two to sixteen
    /// threads are filled already, and a second pass would only add work.
    pub fn splits_attention(self) -> bool {
        self != KernelFamily::Cpu
    }
}

/// How many GPU objects a context has created: a warm engine step creates none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Creations {
    pub buffers: u64,
    pub textures: u64,
    pub bind_groups: u64,
    /// Bytes of every buffer and texture created (freed ones included).
    pub bytes: u64,
    /// Compute pipelines compiled (each shader variant once, on first use or ahead).
    pub pipelines: u64,
}

/// The threads llvmpipe runs a dispatch's workgroups on: `LP_NUM_THREADS` where set (0 runs
/// them on the submitting thread), else one per CPU, at most 32 (its `LP_MAX_THREADS`).
#[cfg(not(target_arch = "wasm32"))]
fn driver_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = std::env::var("LP_NUM_THREADS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(cpus);
    threads.clamp(1, 32)
}

/// The device's memory as the adapter reports it: on Vulkan the largest device-local heap (a
/// discrete GPU's VRAM, not the small BAR heap beside it; the host's RAM on lavapipe). wgpu 30
/// reports no memory size itself, so this reads Vulkan's memory properties through
/// `Adapter::as_hal`; `None` on every other backend.
#[cfg(any(windows, target_os = "linux", target_os = "android"))]
fn reported_memory(adapter: &wgpu::Adapter) -> Option<u64> {
    // SAFETY: the hal adapter is only read (its instance and physical device), while `adapter`
    // keeps it alive; nothing is created or destroyed through it.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    // SAFETY: a physical device of this very instance, queried for plain properties.
    let properties = unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
    // VK_MEMORY_HEAP_DEVICE_LOCAL_BIT is bit 0.
    properties.memory_heaps_as_slice().iter().filter(|h| h.flags.as_raw() & 1 != 0).map(|h| h.size).max()
}

#[cfg(not(any(windows, target_os = "linux", target_os = "android")))]
fn reported_memory(_: &wgpu::Adapter) -> Option<u64> {
    None
}

/// Queued upload bytes [`GpuContext::staged_upload`] lets the browser hold before it flushes them.
#[cfg(target_arch = "wasm32")]
const STAGING_FLUSH_BYTES: u64 = 16 << 20;

#[derive(Debug, Default)]
pub(crate) struct CreationCounters {
    pub buffers: AtomicU64,
    pub textures: AtomicU64,
    pub bind_groups: AtomicU64,
    pub bytes: AtomicU64,
}

/// Optional adapter features weft knows how to use. Every kernel has a path that needs none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuFeatures {
    pub shader_f16: bool,
    pub subgroups: bool,
    pub timestamp_query: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
}

/// The opened device. Cheap to share: hand it around as `Arc<GpuContext>`.
pub struct GpuContext {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    plan: DevicePlan,
    pub(crate) pipelines: PipelineCache,
    pub(crate) creations: CreationCounters,
    /// The IQ codebooks ([`super::pipelines::codebook_words`]), made for the first dispatch
    /// whose decoder reads them.
    codebooks: std::sync::OnceLock<wgpu::Buffer>,
    /// Bytes queued through the browser's staging memory (every upload) since the last flush.
    #[cfg(target_arch = "wasm32")]
    staged: AtomicU64,
    /// Natively, the staging ring uploads go through (`staging.rs`), while a load lasts.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) staging: Mutex<Option<super::staging::Ring>>,
    /// Bytes of a tensor uploaded at a time ([`GpuOptions::upload_slice_bytes`]), a multiple of
    /// 16 (a texel; buffers' copies move 4-byte words).
    pub(crate) upload_slice_bytes: u64,
    /// Command submissions so far (each a round trip when waited for).
    submissions: AtomicU64,
    /// Why the device was lost, once it is (wgpu's device-lost callback).
    lost: Arc<Mutex<Option<String>>>,
    /// The first error wgpu raised outside any error scope (e.g. a shader that failed to
    /// compile when its pipeline was built); reported with the next failed submission.
    uncaptured: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .field("features", &self.plan.features)
            .field("max_binding_bytes", &self.plan.max_binding_bytes)
            .finish()
    }
}

impl GpuContext {
    /// Open the best adapter, with the device [`DevicePlan::choose`] plans for it.
    ///
    /// Honours wgpu's environment overrides: `WGPU_BACKEND` (e.g. `vulkan`, `metal`, `dx12`),
    /// `WGPU_ADAPTER_NAME` (substring of the adapter name), `WGPU_POWER_PREF` (`low`/`high`);
    /// and weft's own, where `options` leave the choice open ([`GpuOptions::with_env`]).
    pub async fn new(options: GpuOptions) -> Result<Arc<GpuContext>> {
        let options = options.with_env()?;
        let adapter = match &options.fake_adapter {
            Some(fake) => fake_adapter(fake).await?,
            None => {
                // The GL backend lacks what compute-only inference needs; it is not even compiled in.
                let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
                desc.backends = wgpu::Backends::PRIMARY;
                pick_adapter(&wgpu::Instance::new(desc.with_env())).await?
            }
        };
        let mut info = adapter.get_info();
        if let Some(fake) = &options.fake_adapter {
            // wgpu 30's no-op backend reports itself a CPU whatever type it was given.
            info.device_type = fake.device_type;
        }
        #[cfg(not(target_arch = "wasm32"))]
        let driver_threads = Some(driver_threads());
        #[cfg(target_arch = "wasm32")]
        let driver_threads = None;
        let memory_bytes = match &options.fake_adapter {
            Some(fake) => fake.memory_bytes,
            None => reported_memory(&adapter),
        };
        let profile = AdapterProfile {
            info,
            features: adapter.features(),
            limits: adapter.limits(),
            driver_threads,
            memory_bytes,
        };
        let plan = DevicePlan::choose(&profile, &options)?;
        let info = profile.info;
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("weft"),
                required_features: plan.required_features,
                required_limits: plan.required_limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| WeftError::Device { adapter: info.name.clone(), reason: e.to_string() })?;
        let uncaptured = Arc::new(Mutex::new(None));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e| {
            tracing::error!("GPU error: {e}");
            // Keep the first: later errors are usually its consequences.
            sink.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| e.to_string());
        }));
        let lost = Arc::new(Mutex::new(None));
        let sink = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            tracing::error!("GPU device lost: {reason:?} {message}");
            let why = if message.is_empty() { format!("{reason:?}") } else { format!("{reason:?}: {message}") };
            sink.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(why);
        });
        tracing::info!(
            adapter = %info.name,
            backend = ?info.backend,
            features = ?plan.features,
            kernels = plan.family.name(),
            limits = plan.limits_mode.name(),
            "GPU opened"
        );
        Ok(Arc::new(GpuContext {
            device,
            queue,
            info,
            plan,
            pipelines: PipelineCache::default(),
            creations: CreationCounters::default(),
            codebooks: std::sync::OnceLock::new(),
            #[cfg(target_arch = "wasm32")]
            staged: AtomicU64::new(0),
            #[cfg(not(target_arch = "wasm32"))]
            staging: Mutex::new(None),
            upload_slice_bytes: (options.upload_slice_bytes.unwrap_or(UPLOAD_SLICE_BYTES) / 16).max(1) * 16,
            submissions: AtomicU64::new(0),
            lost,
            uncaptured,
        }))
    }

    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// The device this context opened and the kernels it runs.
    pub fn plan(&self) -> &DevicePlan {
        &self.plan
    }

    pub fn features(&self) -> GpuFeatures {
        self.plan.features
    }

    /// The limits the device was opened with.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.plan.required_limits
    }

    /// The limits the device reports having (what it was granted).
    pub fn device_limits(&self) -> wgpu::Limits {
        self.device.limits()
    }

    /// The kernel variants this device runs.
    pub fn kernel_family(&self) -> KernelFamily {
        self.plan.family
    }

    /// See [`DevicePlan::reads_textures`].
    pub fn reads_textures(&self) -> bool {
        self.plan.reads_textures()
    }

    /// See [`DevicePlan::cpu_lanes`].
    pub fn cpu_lanes(&self) -> u16 {
        self.plan.cpu_lanes()
    }

    /// What the CPU family's matmul tiles are sized for: the driver's SIMD width and threads.
    pub fn cpu_driver(&self) -> CpuDriver {
        self.plan.cpu_driver()
    }

    /// Buffers, textures and bind groups created so far (a warm engine step adds none).
    pub fn creations(&self) -> Creations {
        let c = &self.creations;
        Creations {
            buffers: c.buffers.load(Ordering::Relaxed),
            textures: c.textures.load(Ordering::Relaxed),
            bind_groups: c.bind_groups.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            pipelines: self.pipelines.len() as u64,
        }
    }

    /// `Err(DeviceLost)` once the device is lost: every submission and wait checks it, so a
    /// step on a lost device fails with the reason instead of hanging or reading garbage.
    pub fn check_lost(&self) -> Result<()> {
        match self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            Some(reason) => Err(WeftError::DeviceLost { adapter: self.info.name.clone(), reason }),
            None => Ok(()),
        }
    }

    /// Destroy the device, as a driver reset would: everything after fails with
    /// [`WeftError::DeviceLost`]. For tests of what a lost device does to the engine.
    pub fn destroy_device(&self) {
        self.device.destroy();
        // wgpu reports the loss from its next poll; make it known now.
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| "destroyed".into());
    }

    /// Command buffers handed to the queue so far: an engine step makes one (a draft model's
    /// passes one each).
    pub fn submissions(&self) -> u64 {
        self.submissions.load(Ordering::Relaxed)
    }

    /// Hand `commands` to the queue, counted in [`submissions`](Self::submissions).
    pub(crate) fn submit_commands(&self, commands: impl IntoIterator<Item = wgpu::CommandBuffer>) -> Result<()> {
        self.check_lost()?;
        self.submissions.fetch_add(1, Ordering::Relaxed);
        self.queue.submit(commands);
        Ok(())
    }

    /// Make a buffer, counted in [`creations`](Self::creations).
    pub(crate) fn create_buffer(&self, label: &str, size: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
        self.creations.buffers.fetch_add(1, Ordering::Relaxed);
        self.creations.bytes.fetch_add(size, Ordering::Relaxed);
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        })
    }

    /// The buffer of IQ codebooks the IQ formats' decoders read, made on first use.
    pub(crate) fn codebooks(&self) -> &wgpu::Buffer {
        self.codebooks.get_or_init(|| {
            let words = super::pipelines::codebook_words();
            let buffer = self.create_buffer(
                "iq codebooks",
                (words.len() * 4) as u64,
                wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            );
            self.queue.write_buffer(&buffer, 0, bytemuck::cast_slice(&words));
            buffer
        })
    }

    /// Largest byte span of one storage binding; tensors above it are split by rows.
    pub fn max_binding_bytes(&self) -> u64 {
        self.plan.max_binding_bytes
    }

    /// A human-readable report of adapter, features and the limits weft cares about.
    pub fn describe(&self) -> String {
        let l = self.limits();
        let f = &self.plan.features;
        format!(
            "adapter: {} ({:?}, {:?}, driver {} {})\n\
             features: shader-f16={} subgroups={} (size {}..{}) timestamp-query={}\n\
             kernels: {}\n\
             limits: {} ({}), storage binding {} MiB, uniform binding {} KiB, buffer {} MiB, workgroup {} \
             invocations, workgroup memory {} KiB, {} storage buffers per stage\n\
             memory: {}",
            self.info.name,
            self.info.device_type,
            self.info.backend,
            self.info.driver,
            self.info.driver_info,
            f.shader_f16,
            f.subgroups,
            f.subgroup_min_size,
            f.subgroup_max_size,
            f.timestamp_query,
            self.plan.family.name(),
            self.plan.limits_mode.name(),
            if self.plan.limits_mode == LimitsMode::Adapter { "the adapter's own" } else { "WebGPU's defaults" },
            l.max_storage_buffer_binding_size >> 20,
            l.max_uniform_buffer_binding_size >> 10,
            l.max_buffer_size >> 20,
            l.max_compute_invocations_per_workgroup,
            l.max_compute_workgroup_storage_size >> 10,
            l.max_storage_buffers_per_shader_stage,
            self.plan.memory.describe(),
        )
    }

    /// Compile now, one at a time, every shader variant of this device's kernel family that
    /// `keep` accepts into a pipeline, and name the first that the device rejects. Returns how
    /// many variants were compiled. (Serving compiles only what it dispatches:
    /// `GpuExecutor::warm_up`.)
    pub async fn compile_shaders(&self, keep: impl Fn(&crate::gpu::ShaderVariant) -> bool) -> Result<usize> {
        let variants: Vec<_> = self.own_shader_variants().into_iter().filter(|v| keep(v)).collect();
        for &variant in &variants {
            let compile = || self.pipelines.get(&self.device, variant).map(drop);
            self.with_error_scope(&format!("compiling the {variant} shader"), compile).await?;
        }
        Ok(variants.len())
    }

    /// Parse and validate, one at a time, every shader variant of this device's kernel family
    /// that reads weights in one of `formats` (or none) with the device's own WGSL compiler,
    /// without compiling pipelines, and name the first it rejects. A browser's compiler (Tint)
    /// is stricter than naga in places; this checks every variant against it at a fraction of
    /// the cost of compiling them all (on SwiftShader about half a second each). Returns how
    /// many variants were checked.
    pub async fn check_shaders(&self, formats: &[DType]) -> Result<usize> {
        let variants = self.own_shader_variants_for(formats);
        for &variant in &variants {
            let check = || {
                let wgsl = crate::gpu::compose_shader(variant)?;
                drop(crate::gpu::pipelines::shader_module(&self.device, &variant.to_string(), wgsl));
                Ok(())
            };
            self.with_error_scope(&format!("checking the {variant} shader"), check).await?;
        }
        Ok(variants.len())
    }

    /// [`own_shader_variants`](Self::own_shader_variants) that read weights in one of
    /// `formats`, or none.
    fn own_shader_variants_for(&self, formats: &[DType]) -> Vec<crate::gpu::ShaderVariant> {
        self.own_shader_variants().into_iter().filter(|v| v.weight.is_none_or(|w| formats.contains(&w))).collect()
    }

    /// Run `f`, which may create pipelines (building an engine records warm-up steps), and
    /// fail with the first validation error the device raised meanwhile, naming `what`. In a
    /// browser, a shader its compiler rejects raises such an error rather than failing the call
    /// that made the pipeline.
    pub async fn with_error_scope<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        if let Some(error) = self.settle(scope.pop()).await? {
            return Err(WeftError::Gpu { context: what.into(), reason: error.to_string() });
        }
        out
    }

    /// The shader variants this device's kernel family can dispatch.
    pub fn own_shader_variants(&self) -> Vec<crate::gpu::ShaderVariant> {
        use crate::gpu::pipelines::{KvSource, WeightSource, XSource};
        let cpu = self.plan.family == KernelFamily::Cpu;
        let own = |v: &crate::gpu::ShaderVariant| {
            if v.weight.is_some() {
                // CPU drivers also read activations (stored in buffers) as embedding tables;
                // every family runs the one experts' matmul.
                let shared = v.kernel == "embedding" || v.kernel == "moe_matmul";
                let gpu_buffers = v.weights_in == WeightSource::Storage && v.x_in == XSource::Storage;
                // The experts' grouped matmul comes in each family's tile.
                let grouped = v.kernel == "moe_matmul_grouped" && v.tile == self.plan.moe_tile(v.epilogue);
                return match self.plan.family {
                    KernelFamily::Cpu => shared || grouped || (v.kernel == "matmul" && v.tile[0] == self.cpu_lanes()),
                    KernelFamily::Baseline => {
                        gpu_buffers && (shared || grouped || v.kernel == "matmul_rows" || v.kernel == "matmul_tiled")
                    }
                    KernelFamily::Subgroup => gpu_buffers && (shared || grouped || v.kernel == "matmul_subgroup"),
                };
            }
            let kv_kernel = matches!(v.kernel, "flash_attention" | "paged_attention" | "rope_kv_write");
            !kv_kernel || (v.kv_in == KvSource::Texture) == cpu
        };
        crate::gpu::pipelines::shader_variants().into_iter().filter(own).collect()
    }

    /// The error wgpu raised outside a scope since the last call, if any.
    pub(crate) fn take_uncaptured_error(&self) -> Option<String> {
        self.uncaptured.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Count `bytes` just queued through the browser's staging memory, and past
    /// [`STAGING_FLUSH_BYTES`] submit them, so that the browser can free that memory as the
    /// copies complete rather than at the first step.
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn staged_upload(&self, bytes: u64) -> Result<()> {
        if self.staged.fetch_add(bytes, Ordering::Relaxed) + bytes < STAGING_FLUSH_BYTES {
            return Ok(());
        }
        self.staged.store(0, Ordering::Relaxed);
        self.submit_commands([])
    }

    /// Uploading is done (a model is loaded): wait for the copies in flight and free the
    /// staging ring natively (`staging.rs`); the next upload makes it again.
    pub fn finish_uploads(&self) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        self.release_staging()?;
        Ok(())
    }

    /// Wait for the GPU until `future` (a map callback or error scope) can finish.
    ///
    /// Natively nothing advances wgpu's callbacks unless someone polls, so this blocks in
    /// `poll`; in the browser the event loop delivers them and this only awaits.
    pub(crate) async fn settle<T>(&self, future: impl std::future::Future<Output = T>) -> Result<T> {
        self.check_lost()?;
        #[cfg(not(target_arch = "wasm32"))]
        if let Err(e) = self.device.poll(wgpu::PollType::wait_indefinitely()) {
            self.check_lost()?;
            return Err(WeftError::Gpu { context: "waiting for the GPU".into(), reason: e.to_string() });
        }
        let out = future.await;
        self.check_lost()?;
        Ok(out)
    }
}

/// wgpu's no-op backend, reporting `fake`.
#[cfg(not(target_arch = "wasm32"))]
async fn fake_adapter(fake: &FakeAdapter) -> Result<wgpu::Adapter> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::NOOP;
    desc.backend_options.noop = wgpu::NoopBackendOptions {
        enable: true,
        limits: Some(fake.limits.clone()),
        features: Some(fake.features),
        device_type: Some(fake.device_type),
        subgroup_min_size: Some(fake.subgroup_sizes.0),
        subgroup_max_size: Some(fake.subgroup_sizes.1),
    };
    wgpu::Instance::new(desc)
        .request_adapter(&wgpu::RequestAdapterOptions::default())
        .await
        .map_err(|e| WeftError::Device { adapter: "wgpu's no-op backend".into(), reason: e.to_string() })
}

#[cfg(target_arch = "wasm32")]
async fn fake_adapter(_: &FakeAdapter) -> Result<wgpu::Adapter> {
    Err(WeftError::Unsupported("a fake adapter (wgpu's no-op backend) exists only natively".into()))
}

async fn pick_adapter(instance: &wgpu::Instance) -> Result<wgpu::Adapter> {
    #[cfg(not(target_arch = "wasm32"))]
    if let Ok(wanted) = std::env::var("WGPU_ADAPTER_NAME") {
        let adapters = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        let needle = wanted.to_lowercase();
        return adapters.into_iter().find(|a| a.get_info().name.to_lowercase().contains(&needle)).ok_or_else(|| {
            WeftError::AdapterNotFound {
                wanted,
                available: if names.is_empty() { "none".into() } else { names.join(", ") },
            }
        });
    }
    instance
        .request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::from_env().unwrap_or(wgpu::PowerPreference::HighPerformance),
            ..Default::default()
        })
        .await
        .map_err(|e| {
            tracing::debug!("request_adapter: {e}");
            WeftError::NoAdapter { hint: no_adapter_hint() }
        })
}

/// What to do about a missing adapter, with the environment variables that may explain it.
#[cfg(not(target_arch = "wasm32"))]
fn no_adapter_hint() -> String {
    let mut hint = String::from(
        " (Vulkan/Metal/DX12/WebGPU). On a machine without a GPU, install Mesa's software Vulkan \
         driver: apt-get install mesa-vulkan-drivers",
    );
    if let Ok(icd) = std::env::var("VK_ICD_FILENAMES") {
        hint.push_str(&format!(
            " (VK_ICD_FILENAMES={icd} is set; check that it names an installed driver, e.g. \
             /usr/share/vulkan/icd.d/lvp_icd.x86_64.json)"
        ));
    }
    if let Ok(backend) = std::env::var("WGPU_BACKEND") {
        hint.push_str(&format!(" (WGPU_BACKEND={backend} limits the backends searched)"));
    }
    hint
}

/// What to do about a missing adapter in a browser.
#[cfg(target_arch = "wasm32")]
fn no_adapter_hint() -> String {
    " by WebGPU: the browser offers none (WebGPU may be turned off, or this GPU blocklisted). Try \
     a current Chrome or Edge; on Linux start Chromium with --enable-unsafe-webgpu"
        .into()
}

/// For tests and tools: open a device, or `None` (after printing why) where there is no
/// adapter — unless `WEFT_REQUIRE_GPU=1`, where a missing adapter is an error like any other —
/// or where the subgroup family was forced on an adapter whose subgroups cannot run it.
#[cfg(not(target_arch = "wasm32"))]
pub fn open_or_skip(options: GpuOptions) -> Result<Option<Arc<GpuContext>>> {
    let forced_subgroups = options.kernels == Some(KernelFamily::Subgroup);
    match crate::rt::block_on(GpuContext::new(options)) {
        Ok(ctx) => Ok(Some(ctx)),
        Err(e @ WeftError::NoAdapter { .. }) if std::env::var("WEFT_REQUIRE_GPU").as_deref() != Ok("1") => {
            eprintln!("skipping: {e}");
            Ok(None)
        }
        Err(e @ WeftError::Unsupported(_)) if forced_subgroups => {
            eprintln!("skipping the subgroup family: {e}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
