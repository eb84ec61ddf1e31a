//! Everything that touches wgpu: the device, tensors in GPU buffers, the pipeline cache and the
//! typed dispatch functions of every kernel.
//!
//! **Invariant:** this module (and `rt`) is the only place with `cfg(target_arch)` or a blocking
//! `poll`; model and engine code only record dispatches over prepared tensors.

mod context;
pub mod kernels;
mod memory;
mod pipelines;
mod plan;
mod probe;
mod recording;
#[cfg(not(target_arch = "wasm32"))]
mod staging;
mod tensor;

#[cfg(not(target_arch = "wasm32"))]
pub use context::open_or_skip;
pub use context::{Creations, GpuContext, GpuFeatures, GpuOptions, KernelFamily, UPLOAD_SLICE_BYTES};
pub use memory::{
    CPU_DRIVER_KV_BYTES, DEFAULT_GPU_MEMORY_UTILIZATION, DeviceMemory, KvBudget, KvDemand, KvLimit, MemorySource, gib,
};
pub use pipelines::{
    BindingKind, CpuDriver, Epilogue, HEAD_DIMS, KvSource, SUBGROUP_GEMM_TILE, SUBGROUP_KERNELS, ShaderVariant,
    WeightSource, XSource, attention_query_heads, binding_kinds, compose_shader, embedded_shader_files, flash_tile,
    flash_workgroup_bytes, matmul_tile, max_query_heads, shader_variants,
};
pub use plan::{
    AdapterProfile, DevicePlan, FakeAdapter, GEMM_MIN_ROWS, GemmMinRows, LimitsMode, VENDOR_MESA,
    default_gemm_min_rows, gemm_min_rows,
};
pub use recording::{Dispatch, Recording, SubmitTimes};
pub use tensor::{GpuTensor, GpuTensorFactory, TEXTURE_WIDTH, TensorPart};
