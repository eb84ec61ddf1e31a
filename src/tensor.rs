//! The tensor factory seam: what makes tensors and reads them back, as the engine's seed
//! constructors take it (`Arc<dyn TensorFactory>`). It lives outside `gpu/` so that code which
//! only passes a factory along (the engine) never imports the GPU module; the wgpu
//! implementation is `gpu::GpuTensorFactory`.

use crate::error::{Result, WeftError};
use crate::gpu::GpuTensor;
use crate::quant::DType;
use crate::rt::BoxFuture;

/// Makes tensors and reads them back.
pub trait TensorFactory: Send + Sync {
    /// Upload raw bytes laid out as `dtype` (block formats as their GGUF blocks).
    fn upload(&self, shape: &[usize], dtype: DType, bytes: &[u8]) -> Result<GpuTensor>;

    /// Upload a weight matrix or embedding table: like [`upload`](Self::upload), but the
    /// factory may keep it where its device's weight kernels read fastest (a texture on CPU
    /// drivers).
    fn upload_weight(&self, shape: &[usize], dtype: DType, bytes: &[u8]) -> Result<GpuTensor> {
        self.upload(shape, dtype, bytes)
    }

    /// Uploading is done for now (a model is loaded): wait for the copies in flight and free
    /// what staged them.
    fn finish_uploads(&self) -> Result<()> {
        Ok(())
    }

    /// F32 zeros for activations: like `zeros(shape, F32)`, but the factory may make them
    /// readable in the ways its device's matmul reads fastest (uniform windows on CPU drivers).
    fn activations(&self, shape: &[usize]) -> Result<GpuTensor> {
        self.zeros(shape, DType::F32)
    }

    /// A tensor of zero bytes (all-zero floats).
    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<GpuTensor>;

    /// Read a tensor's bytes back, in its own layout.
    fn download<'a>(&'a self, tensor: &'a GpuTensor) -> BoxFuture<'a, Result<Vec<u8>>>;

    fn upload_f32(&self, shape: &[usize], values: &[f32]) -> Result<GpuTensor> {
        self.upload(shape, DType::F32, bytemuck::cast_slice(values))
    }

    fn upload_u32(&self, shape: &[usize], values: &[u32]) -> Result<GpuTensor> {
        self.upload(shape, DType::U32, bytemuck::cast_slice(values))
    }

    fn download_f32<'a>(&'a self, tensor: &'a GpuTensor) -> BoxFuture<'a, Result<Vec<f32>>> {
        Box::pin(async move {
            let bytes = self.download(tensor).await?;
            crate::quant::dequantize(tensor.dtype(), &bytes)
        })
    }

    fn download_u32<'a>(&'a self, tensor: &'a GpuTensor) -> BoxFuture<'a, Result<Vec<u32>>> {
        Box::pin(async move {
            if tensor.dtype() != DType::U32 {
                return Err(WeftError::shape("download_u32", format!("tensor is {}", tensor.dtype())));
            }
            let bytes = self.download(tensor).await?;
            Ok(bytemuck::pod_collect_to_vec(&bytes))
        })
    }
}
