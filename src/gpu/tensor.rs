//! Tensors in GPU buffers, split by rows when they outgrow one storage binding.
//!
//! A tensor of shape `(rows, ...)` is row-major; a row is everything after the first dimension
//! (a 1-D tensor is a single row). When the bytes exceed [`GpuContext::max_binding_bytes`], the
//! rows are spread over several buffers ([`TensorPart`]s), each a whole number of rows, so a
//! kernel can run once per part. Block-format rows keep their raw GGUF bytes; a part's buffer is
//! padded to a multiple of 4 bytes because shaders read it as `array<u32>`.

use std::ops::Range;
use std::sync::Arc;

use crate::error::{Result, WeftError};
use crate::gpu::GpuContext;
use crate::quant::DType;
use crate::rt::BoxFuture;
use crate::tensor::TensorFactory;

/// A contiguous run of rows of a tensor, living in one buffer.
#[derive(Clone, Debug)]
pub struct TensorPart {
    pub(crate) buffer: wgpu::Buffer,
    /// Where the first row starts in `buffer`.
    pub(crate) offset_bytes: u64,
    /// First row of the tensor held here, and how many rows.
    pub rows: Range<usize>,
}

/// A tensor on the GPU: shape, element type and the buffers that hold it.
#[derive(Clone, Debug)]
pub struct GpuTensor {
    shape: Vec<usize>,
    dtype: DType,
    row_bytes: usize,
    parts: Vec<TensorPart>,
}

impl GpuTensor {
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn num_rows(&self) -> usize {
        if self.shape.len() <= 1 { 1 } else { self.shape[0] }
    }

    /// Elements in one row (everything after the first dimension).
    pub fn row_elems(&self) -> usize {
        match self.shape.len() {
            0 => 1,
            1 => self.shape[0],
            _ => self.shape[1..].iter().product(),
        }
    }

    pub fn num_elems(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    pub fn size_bytes(&self) -> usize {
        self.row_bytes * self.num_rows()
    }

    pub fn parts(&self) -> &[TensorPart] {
        &self.parts
    }

    /// The single buffer of a tensor that kernels need whole (activations, caches, tables).
    pub(crate) fn single_part(&self, op: &'static str) -> Result<&TensorPart> {
        match self.parts.as_slice() {
            [part] => Ok(part),
            parts => Err(WeftError::shape(
                op,
                format!(
                    "this operand must fit one storage binding but its {} bytes are split over {} \
                     buffers; use a smaller batch or a device with larger bindings",
                    self.size_bytes(),
                    parts.len()
                ),
            )),
        }
    }

    /// A view of rows `rows` sharing this tensor's buffers (no copy).
    pub fn slice_rows(&self, rows: Range<usize>) -> Result<GpuTensor> {
        if rows.start > rows.end || rows.end > self.num_rows() || self.shape.len() < 2 {
            return Err(WeftError::shape("slice_rows", format!("rows {rows:?} of a tensor of shape {:?}", self.shape)));
        }
        let parts = self
            .parts
            .iter()
            .filter(|p| p.rows.start < rows.end && rows.start < p.rows.end)
            .map(|p| {
                let first = p.rows.start.max(rows.start);
                TensorPart {
                    buffer: p.buffer.clone(),
                    offset_bytes: p.offset_bytes + ((first - p.rows.start) * self.row_bytes) as u64,
                    rows: first - rows.start..p.rows.end.min(rows.end) - rows.start,
                }
            })
            .collect();
        let mut shape = self.shape.clone();
        shape[0] = rows.len();
        Ok(GpuTensor { shape, dtype: self.dtype, row_bytes: self.row_bytes, parts })
    }

    /// The same buffers seen with another shape of equal byte size and row split.
    pub fn reshape(&self, shape: &[usize]) -> Result<GpuTensor> {
        let candidate = GpuTensor { shape: shape.to_vec(), ..self.clone() };
        let row_bytes = self.dtype.size_bytes(candidate.row_elems())?;
        let fits = candidate.num_elems() == self.num_elems() && (self.parts.len() == 1 || row_bytes == self.row_bytes);
        if !fits {
            return Err(WeftError::shape(
                "reshape",
                format!("shape {:?} does not fit a tensor of shape {:?}", shape, self.shape),
            ));
        }
        let mut parts = self.parts.clone();
        if let [part] = parts.as_mut_slice() {
            part.rows = 0..candidate.num_rows();
        }
        Ok(GpuTensor { row_bytes, parts, ..candidate })
    }
}

impl TensorPart {
    pub fn num_rows(&self) -> usize {
        self.rows.len()
    }

    /// The binding of this part for a shader reading `row_bytes`-byte rows.
    pub(crate) fn binding(&self, ctx: &GpuContext, row_bytes: usize) -> Result<wgpu::BindingResource<'_>> {
        let align = u64::from(ctx.limits().min_storage_buffer_offset_alignment);
        if !self.offset_bytes.is_multiple_of(align) {
            return Err(WeftError::shape(
                "bind tensor",
                format!(
                    "a view starting at byte {} cannot be bound: the device needs offsets that are \
                     multiples of {align}",
                    self.offset_bytes
                ),
            ));
        }
        // The shader reads whole u32 words: round up into the padding every buffer carries.
        let len = ((self.rows.len() * row_bytes) as u64).next_multiple_of(4).max(4);
        let size = len.min(self.buffer.size() - self.offset_bytes);
        Ok(wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.offset_bytes,
            size: std::num::NonZeroU64::new(size),
        }))
    }
}

/// The wgpu-backed [`TensorFactory`].
#[derive(Clone, Debug)]
pub struct GpuTensorFactory {
    ctx: Arc<GpuContext>,
}

impl GpuTensorFactory {
    pub fn new(ctx: Arc<GpuContext>) -> Self {
        GpuTensorFactory { ctx }
    }

    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    fn layout(&self, shape: &[usize], dtype: DType) -> Result<(usize, usize, usize)> {
        let probe = GpuTensor { shape: shape.to_vec(), dtype, row_bytes: 0, parts: Vec::new() };
        if shape.contains(&0) {
            return Err(WeftError::shape("create tensor", format!("shape {shape:?} has an empty dimension")));
        }
        let row_bytes = dtype.size_bytes(probe.row_elems())?;
        let cap = self.ctx.max_binding_bytes() as usize;
        if row_bytes > cap {
            return Err(WeftError::Unsupported(format!(
                "one row of a {dtype} tensor of shape {shape:?} takes {row_bytes} bytes, more than \
                 the {cap} bytes this device can bind at once"
            )));
        }
        Ok((probe.num_rows(), row_bytes, (cap / row_bytes).max(1)))
    }

    fn create(&self, shape: &[usize], dtype: DType, bytes: Option<&[u8]>) -> Result<GpuTensor> {
        let (num_rows, row_bytes, rows_per_part) = self.layout(shape, dtype)?;
        if let Some(bytes) = bytes
            && bytes.len() != num_rows * row_bytes
        {
            return Err(WeftError::shape(
                "upload",
                format!(
                    "a {dtype} tensor of shape {shape:?} takes {} bytes, got {}",
                    num_rows * row_bytes,
                    bytes.len()
                ),
            ));
        }
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
        let mut parts = Vec::new();
        for first in (0..num_rows).step_by(rows_per_part) {
            let rows = first..(first + rows_per_part).min(num_rows);
            let size = (rows.len() * row_bytes).next_multiple_of(4) as u64;
            let buffer = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tensor"),
                size,
                usage,
                mapped_at_creation: bytes.is_some(),
            });
            if let Some(bytes) = bytes {
                let src = &bytes[rows.start * row_bytes..rows.end * row_bytes];
                let mut view = buffer
                    .slice(..)
                    .get_mapped_range_mut()
                    .map_err(|e| WeftError::Gpu { context: "upload".into(), reason: e.to_string() })?;
                view.slice(..src.len()).copy_from_slice(src);
                drop(view);
                buffer.unmap();
            }
            parts.push(TensorPart { buffer, offset_bytes: 0, rows });
        }
        Ok(GpuTensor { shape: shape.to_vec(), dtype, row_bytes, parts })
    }
}

impl TensorFactory for GpuTensorFactory {
    fn upload(&self, shape: &[usize], dtype: DType, bytes: &[u8]) -> Result<GpuTensor> {
        self.create(shape, dtype, Some(bytes))
    }

    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<GpuTensor> {
        // wgpu zero-initialises new buffers.
        self.create(shape, dtype, None)
    }

    fn download<'a>(&'a self, tensor: &'a GpuTensor) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(self.ctx.read_tensor(tensor))
    }
}

/// A tensor's bytes on their way back to the CPU: copied into `staging` by an encoder, then
/// mapped once the submission completes.
pub(crate) struct Readback {
    staging: wgpu::Buffer,
    /// Per part: (bytes copied, bytes of padding before the part's first row).
    spans: Vec<(u64, u64, usize)>,
}

impl GpuContext {
    /// Record copies of every part of `tensor` into one staging buffer. Copies need 4-byte
    /// aligned offsets and sizes, so the aligned span around each part is copied.
    pub(crate) fn encode_readback(&self, encoder: &mut wgpu::CommandEncoder, tensor: &GpuTensor) -> Readback {
        let spans: Vec<(u64, u64, usize)> = tensor
            .parts()
            .iter()
            .map(|p| {
                let start = p.offset_bytes & !3;
                let end = (p.offset_bytes + (p.rows.len() * tensor.row_bytes()) as u64).next_multiple_of(4);
                (end.min(p.buffer.size()) - start, p.offset_bytes - start, p.rows.len() * tensor.row_bytes())
            })
            .collect();
        let total: u64 = spans.iter().map(|s| s.0).sum();
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: total.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut at = 0;
        for (part, (len, _, _)) in tensor.parts().iter().zip(&spans) {
            encoder.copy_buffer_to_buffer(&part.buffer, part.offset_bytes & !3, &staging, at, *len);
            at += len;
        }
        Readback { staging, spans }
    }

    /// Map a submitted readback and return the tensor's bytes.
    pub(crate) async fn finish_readback(&self, readback: Readback) -> Result<Vec<u8>> {
        let (sender, receiver) = futures::channel::oneshot::channel();
        readback.staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = sender.send(r);
        });
        self.settle(receiver)
            .await?
            .map_err(|_| WeftError::Readback("the device was lost before the copy finished".into()))?
            .map_err(|e| WeftError::Readback(e.to_string()))?;
        let view = readback.staging.get_mapped_range(..).map_err(|e| WeftError::Readback(e.to_string()))?;
        let mut out = Vec::with_capacity(readback.spans.iter().map(|s| s.2).sum());
        let mut at = 0;
        for (len, skip, bytes) in &readback.spans {
            let from = (at + skip) as usize;
            out.extend_from_slice(&view[from..from + bytes]);
            at += len;
        }
        Ok(out)
    }

    /// Copy a tensor back to the CPU in a submission of its own.
    pub(crate) async fn read_tensor(&self, tensor: &GpuTensor) -> Result<Vec<u8>> {
        let mut encoder = self.device.create_command_encoder(&Default::default());
        let readback = self.encode_readback(&mut encoder, tensor);
        self.queue.submit([encoder.finish()]);
        self.finish_readback(readback).await
    }
}
