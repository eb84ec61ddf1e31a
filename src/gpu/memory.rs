//! How much of a device the KV cache takes: vLLM's `gpu_memory_utilization` of the device's
//! memory, less the weights and what else weft allocates (a step's workspace, recurrent state,
//! a draft model), decided from what the adapter reports and the model's numbers alone. No
//! device is opened here, so the rule is tested for adapters this machine lacks (the table at
//! the end of this file), as `plan.rs` tests the rest of what weft picks per adapter.
//!
//! What wgpu 30 tells of memory: nothing in `AdapterInfo` or `Limits` but the largest buffer
//! (`max_buffer_size`; Vulkan's `maxMemoryAllocationSize` capped by `maxBufferSize`, Metal's
//! `maxBufferLength`, 2 GiB on DX12, what a browser grants). `Device::generate_allocator_report`
//! and `get_internal_counters` count what was allocated, not what there is, and
//! `MemoryBudgetThresholds` only makes allocations fail early. So natively on Vulkan weft reads
//! the heaps itself (`Adapter::as_hal`: the largest device-local heap, `GpuContext::new`); on
//! every other backend, and in a browser, the largest buffer stands in.
//!
//! The rule (`DevicePlan::kv_budget`):
//! - on a GPU the pool gets `utilization × memory − weights − other`, and where the memory is
//!   only the largest buffer (nothing reported) at most what `max_num_seqs` sequences of
//!   `max_model_len` fill: that stand-in bounds one allocation, not what the device has free
//!   (a browser shares its GPU with every tab);
//! - a CPU adapter (lavapipe, SwiftShader) gets [`CPU_DRIVER_KV_BYTES`], or one sequence of
//!   `max_model_len` where that is more, whatever its memory: that memory is the host's RAM,
//!   shared with the system, the mapped model file and every other process (CI runs many tests
//!   at once on lavapipe), its report says little (lavapipe of Mesa 22.3 reports a 2 GiB heap
//!   on a 24 GiB machine, and holds an 8B model's 4.6 GiB of weights beyond it), and a CPU
//!   decodes too slowly to fill more than a few thousand tokens of context anyway;
//! - at most what one binding per layer holds (each layer's K and V is one binding).

use crate::gpu::plan::DevicePlan;

/// vLLM's default `gpu_memory_utilization`: the fraction of the device's memory weft plans to
/// use in all (weights, workspace and the KV cache).
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// The KV pool of a CPU adapter when one sequence of `max_model_len` needs less (see the
/// module's rule): 256 MiB, what every adapter got before the pool followed the device.
pub const CPU_DRIVER_KV_BYTES: u64 = 256 << 20;

/// A device's memory, as weft knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    pub bytes: u64,
    pub source: MemorySource,
}

/// Where [`DeviceMemory`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemorySource {
    /// The adapter's own report: natively on Vulkan, its largest device-local heap (a
    /// discrete GPU's VRAM; the host's RAM on lavapipe).
    Reported,
    /// None reported (Metal, DX12, a browser's WebGPU, wgpu's no-op adapter): the largest
    /// buffer the device was opened to allow.
    MaxBuffer,
}

impl DeviceMemory {
    /// `reported` where the adapter reported a size, else `limits.max_buffer_size` (the limits
    /// the device is opened with: WebGPU's defaults give 256 MiB).
    pub fn of(reported: Option<u64>, limits: &wgpu::Limits) -> DeviceMemory {
        match reported.filter(|&b| b > 0) {
            Some(bytes) => DeviceMemory { bytes, source: MemorySource::Reported },
            None => DeviceMemory { bytes: limits.max_buffer_size, source: MemorySource::MaxBuffer },
        }
    }

    /// E.g. "80.0 GiB (reported by the adapter)".
    pub fn describe(&self) -> String {
        let how = match self.source {
            MemorySource::Reported => "reported by the adapter",
            MemorySource::MaxBuffer => "its largest buffer; the adapter reports no memory size",
        };
        format!("{} ({how})", gib(self.bytes))
    }
}

/// What the KV pool shares the device with and what it must hold, for
/// [`DevicePlan::kv_budget`].
#[derive(Clone, Debug, PartialEq)]
pub struct KvDemand {
    /// The fraction of the device's memory weft uses in all, in (0, 1].
    pub utilization: f64,
    /// The weights on the device (a draft model's included).
    pub weights_bytes: u64,
    /// Everything else: a step's workspace, recurrent-state slots.
    pub other_bytes: u64,
    /// One token's K and V over every attention layer (of both models with a draft model).
    pub token_bytes: u64,
    /// Tokens of one sequence of `max_model_len`, in whole blocks.
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    /// The largest pool whose every layer's K (or V) fits one binding.
    pub max_pool_bytes: u64,
}

/// What decided the pool's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvLimit {
    /// `utilization × memory − weights − other`.
    Utilization,
    /// A CPU adapter's cap.
    CpuDriver,
    /// `max_num_seqs` sequences of `max_model_len`, where the memory is a guess.
    Sequences,
    /// One binding per layer.
    Binding,
}

/// The pool [`DevicePlan::kv_budget`] chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvBudget {
    pub memory: DeviceMemory,
    /// `utilization × memory`.
    pub usable_bytes: u64,
    /// What the KV pool gets (0 when the weights and workspace take all of `usable_bytes`).
    pub pool_bytes: u64,
    pub limit: KvLimit,
}

impl DevicePlan {
    /// The KV pool's bytes on this device for `demand` (see the module's rule).
    pub fn kv_budget(&self, demand: &KvDemand) -> KvBudget {
        let memory = self.memory;
        let usable_bytes = (memory.bytes as f64 * demand.utilization.clamp(0.0, 1.0)) as u64;
        let left = usable_bytes.saturating_sub(demand.weights_bytes).saturating_sub(demand.other_bytes);
        let one_sequence = demand.token_bytes.saturating_mul(demand.max_model_len as u64);
        let mut caps = Vec::new();
        if self.cpu_adapter() {
            caps.push((CPU_DRIVER_KV_BYTES.max(one_sequence), KvLimit::CpuDriver));
        } else {
            caps.push((left, KvLimit::Utilization));
            if memory.source == MemorySource::MaxBuffer {
                caps.push((one_sequence.saturating_mul(demand.max_num_seqs.max(1) as u64), KvLimit::Sequences));
            }
        }
        caps.push((demand.max_pool_bytes, KvLimit::Binding));
        // The first of the smallest: the device's share wins a tie.
        let (pool_bytes, limit) = caps
            .into_iter()
            .fold((u64::MAX, KvLimit::Utilization), |best, cap| if cap.0 < best.0 { cap } else { best });
        KvBudget { memory, usable_bytes, pool_bytes, limit }
    }
}

/// Bytes as GiB with one decimal.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    //! The rule for adapters weft meets, with the Llama 3.2 1B and Llama 3.1 8B shapes
    //! (`model::synthetic`): 16 layers of 8 KV heads of 64 values and 32 of 8 of 128, so 32
    //! KiB and 128 KiB of f16 K and V a token; about 0.8 GiB and 4.6 GiB of Q4_K_M weights.
    use super::*;
    use crate::gpu::context::GpuOptions;
    use crate::gpu::plan::AdapterProfile;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn plan(
        device_type: wgpu::DeviceType,
        backend: wgpu::Backend,
        reported: Option<u64>,
        max_buffer: u64,
    ) -> DevicePlan {
        let info = wgpu::AdapterInfo::new(device_type, backend);
        let limits = wgpu::Limits {
            max_buffer_size: max_buffer,
            max_storage_buffer_binding_size: max_buffer.min(4 * GIB - 4),
            ..wgpu::Limits::defaults()
        };
        let profile = AdapterProfile {
            info,
            features: wgpu::Features::empty(),
            limits,
            driver_threads: None,
            memory_bytes: reported,
        };
        DevicePlan::choose(&profile, &GpuOptions::default()).unwrap()
    }

    /// An 8B (`big`) or 1B model's demand at the defaults: utilization 0.9, f16 KV, 4096
    /// tokens, 64 sequences (`weft serve`'s), bindings of `binding` bytes.
    fn demand(big: bool, binding: u64) -> KvDemand {
        let (layers, token_bytes, weights) =
            if big { (32, 128 << 10, 46 * GIB / 10) } else { (16, 32 << 10, 8 * GIB / 10) };
        KvDemand {
            utilization: DEFAULT_GPU_MEMORY_UTILIZATION,
            weights_bytes: weights,
            other_bytes: 300 * MIB,
            token_bytes,
            max_model_len: 4096,
            max_num_seqs: 64,
            max_pool_bytes: 2 * layers * binding,
        }
    }

    fn tokens(b: &KvBudget, d: &KvDemand) -> u64 {
        b.pool_bytes / d.token_bytes
    }

    #[test]
    fn a_gpu_that_reports_its_memory_gives_the_kv_cache_the_rest_of_its_share() {
        use wgpu::{Backend::Vulkan, DeviceType::DiscreteGpu};
        // NVIDIA's H100 80GB reports a device-local heap of 79.6 GiB (81 559 MiB).
        let h100 = plan(DiscreteGpu, Vulkan, Some(81559 * MIB), 4 * GIB);
        assert_eq!(h100.memory, DeviceMemory { bytes: 81559 * MIB, source: MemorySource::Reported });
        let (d8, d1) = (demand(true, 4 * GIB), demand(false, 4 * GIB));
        let (b8, b1) = (h100.kv_budget(&d8), h100.kv_budget(&d1));
        assert_eq!(b8.limit, KvLimit::Utilization);
        assert_eq!(b8.pool_bytes, (81559 * MIB) * 9 / 10 - d8.weights_bytes - d8.other_bytes);
        // About 547 000 tokens of an 8B model (133 sequences of 4096), 2.3 million of a 1B.
        assert_eq!(tokens(&b8, &d8) / 1000, 547);
        assert_eq!(tokens(&b1, &d1) / 1000, 2313);
        // An RTX 4090 or a Radeon RX 7900 XTX (24 GiB): about 137 000 tokens of the 8B.
        let rtx = plan(DiscreteGpu, Vulkan, Some(24 * GIB), 4 * GIB);
        assert_eq!(tokens(&rtx.kv_budget(&d8), &d8) / 1000, 136);
        // A GPU too small for the weights gets nothing (the builder refuses the model).
        let small = plan(DiscreteGpu, Vulkan, Some(4 * GIB), 4 * GIB);
        assert_eq!(small.kv_budget(&d8).pool_bytes, 0);
        // At 0.5, half the memory in all.
        let half = KvDemand { utilization: 0.5, ..d8.clone() };
        assert_eq!(h100.kv_budget(&half).pool_bytes, (81559 * MIB) / 2 - d8.weights_bytes - d8.other_bytes);
    }

    #[test]
    fn where_nothing_is_reported_the_largest_buffer_stands_in_for_as_many_sequences_as_run() {
        use wgpu::Backend::{BrowserWebGpu, Dx12, Metal};
        use wgpu::DeviceType::{DiscreteGpu, IntegratedGpu};
        // Apple's Metal: maxBufferLength (here a Mac's 24 GiB) stands in for its unified memory,
        // and the pool holds at most 64 sequences of 4096 tokens.
        let apple = plan(IntegratedGpu, Metal, None, 24 * GIB);
        assert_eq!(apple.memory, DeviceMemory { bytes: 24 * GIB, source: MemorySource::MaxBuffer });
        let d8 = demand(true, 24 * GIB);
        let b = apple.kv_budget(&d8);
        assert_eq!(
            (b.limit, b.pool_bytes),
            (KvLimit::Utilization, 24 * GIB * 9 / 10 - d8.weights_bytes - d8.other_bytes)
        );
        let d1 = demand(false, 24 * GIB);
        let b = apple.kv_budget(&d1);
        assert_eq!((b.limit, tokens(&b, &d1)), (KvLimit::Sequences, 64 * 4096));
        // DX12's 2 GiB buffers hold a 1B model and 23 000 tokens; not an 8B model.
        let dx12 = plan(DiscreteGpu, Dx12, None, 2 * GIB);
        assert_eq!(tokens(&dx12.kv_budget(&d1), &d1) / 1000, 23);
        assert_eq!(dx12.kv_budget(&d8).pool_bytes, 0);
        // Chrome on a discrete GPU grants 4 GiB buffers: a 1B model at 4096 tokens by 16
        // sequences (the browser build's) fills 2 GiB.
        let chrome = plan(DiscreteGpu, BrowserWebGpu, None, 4 * GIB);
        let page = KvDemand { max_num_seqs: 16, ..d1.clone() };
        let b = chrome.kv_budget(&page);
        assert_eq!((b.limit, b.pool_bytes), (KvLimit::Sequences, 2 * GIB));
        // WebGPU's default limits (256 MiB buffers) with the default model (SmolLM2-135M: 93
        // MiB of Q4_1 weights, 45 KiB of f32 K and V a token): 107 MiB, 2443 tokens.
        let defaults = plan(DiscreteGpu, BrowserWebGpu, None, 256 * MIB);
        let smollm = KvDemand {
            weights_bytes: 93 * MIB,
            other_bytes: 30 * MIB,
            token_bytes: 2 * 30 * 3 * 64 * 4,
            max_model_len: 2048,
            max_num_seqs: 16,
            max_pool_bytes: 60 * 128 * MIB,
            ..d1
        };
        let b = defaults.kv_budget(&smollm);
        assert_eq!((b.limit, b.pool_bytes >> 20, tokens(&b, &smollm)), (KvLimit::Utilization, 107, 2443));
    }

    #[test]
    fn a_cpu_adapter_keeps_a_modest_pool_unless_one_sequence_needs_more() {
        use wgpu::Backend::{BrowserWebGpu, Vulkan};
        use wgpu::DeviceType::Cpu;
        // lavapipe (Mesa 22.3) reports a 2 GiB heap, on a machine of any size.
        let lavapipe = plan(Cpu, Vulkan, Some(2 * GIB), 2 * GIB);
        let d1 = demand(false, 128 * MIB);
        let b = lavapipe.kv_budget(&d1);
        assert_eq!((b.limit, b.pool_bytes), (KvLimit::CpuDriver, CPU_DRIVER_KV_BYTES));
        // An 8B model's one sequence of 4096 tokens takes 512 MiB: it gets that, though its
        // weights are more than the heap reported.
        let d8 = demand(true, 128 * MIB);
        let b = lavapipe.kv_budget(&d8);
        assert_eq!((b.limit, tokens(&b, &d8)), (KvLimit::CpuDriver, 4096));
        // SwiftShader in a browser (1 GiB buffers) with the default model: the same cap.
        let swiftshader = plan(Cpu, BrowserWebGpu, None, GIB);
        let smollm = KvDemand {
            weights_bytes: 93 * MIB,
            other_bytes: 30 * MIB,
            token_bytes: 2 * 30 * 3 * 64 * 4,
            max_model_len: 2048,
            max_num_seqs: 16,
            ..d1
        };
        let b = swiftshader.kv_budget(&smollm);
        assert_eq!((b.limit, b.pool_bytes), (KvLimit::CpuDriver, CPU_DRIVER_KV_BYTES));
    }

    #[test]
    fn every_layer_fits_one_binding() {
        // A 2-layer model on a reported 80 GiB: K and V of each layer in 128 MiB bindings.
        let p = plan(wgpu::DeviceType::DiscreteGpu, wgpu::Backend::Vulkan, Some(80 * GIB), 4 * GIB);
        let d = KvDemand { max_pool_bytes: 4 * 128 * MIB, ..demand(false, 0) };
        let b = p.kv_budget(&d);
        assert_eq!((b.limit, b.pool_bytes), (KvLimit::Binding, 512 * MIB));
    }
}
