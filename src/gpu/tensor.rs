//! Tensors in GPU buffers (or, for weights on CPU drivers, textures), split by rows when they
//! outgrow one binding.
//!
//! A tensor of shape `(rows, ...)` is row-major; a row is everything after the first dimension
//! (a 1-D tensor is a single row). When the bytes exceed [`GpuContext::max_binding_bytes`], the
//! rows are spread over several buffers ([`TensorPart`]s), each a whole number of rows, so a
//! kernel can run once per part. Block-format rows keep their raw GGUF bytes; a part's buffer is
//! padded to a multiple of 4 bytes because shaders read it as `array<u32>`. A texture part holds
//! the same bytes in an rgba32uint texture [`TEXTURE_WIDTH`] texels wide (`shared/weight_texture.wgsl`
//! reads it), its rows interleaved in groups of [`INTERLEAVE`] ([`interleave_rows`]); a texture
//! part starts at a whole group, and a kernel reads a view of one only from a whole group on.
//! Weights that cannot be grouped (rows that are not whole blocks, or fewer than a group per
//! binding) stay in buffers there too.

use std::ops::Range;
use std::sync::Arc;

use crate::error::{Result, WeftError};
use crate::gpu::GpuContext;
use crate::gpu::pipelines::X_WINDOW_BYTES;
use crate::gpu::recording::Resource;
use crate::quant::DType;
use crate::rt::BoxFuture;
use crate::tensor::{ByteSource, TensorFactory, Window};

/// Texels per row of a weight or KV texture, the core WebGPU 2D texture limit;
/// `shared/weight_texture.wgsl` finds word i at texel (i/4 % 8192, i/4 / 8192).
pub const TEXTURE_WIDTH: u32 = 8192;

/// Bytes of one row of a texture of `format`: 128 KiB of rgba32uint or rgba32float texels, 64
/// KiB of rgba16float.
fn texture_row_bytes(format: wgpu::TextureFormat) -> u64 {
    u64::from(TEXTURE_WIDTH) * u64::from(format.block_copy_size(None).unwrap_or(16))
}

/// Rows per group of a weight texture: a group holds block (unit) 0 of each of its rows, then
/// block 1 of each, and so on (`shared/weight_texture.wgsl` has the why).
pub(crate) const INTERLEAVE: usize = 16;

/// Bytes of grouped weight rows made on the host at a time while uploading.
const UPLOAD_CHUNK_BYTES: usize = 1 << 20;

/// The bytes of whole rows (`row_bytes` each, `unit` bytes per block) in groups of
/// [`INTERLEAVE`], the last group padded with zero rows.
pub(crate) fn interleave_rows(src: &[u8], row_bytes: usize, unit: usize) -> Vec<u8> {
    let mut out = vec![0u8; (src.len() / row_bytes).div_ceil(INTERLEAVE) * INTERLEAVE * row_bytes];
    interleave_rows_into(src, row_bytes, unit, &mut wgpu::WriteOnly::from(&mut out[..]));
    out
}

/// [`interleave_rows`] into `out`, which holds exactly the groups (zeroed here where the last
/// one is padded).
fn interleave_rows_into(src: &[u8], row_bytes: usize, unit: usize, out: &mut wgpu::WriteOnly<'_, [u8]>) {
    let group_bytes = INTERLEAVE * row_bytes;
    if !src.len().is_multiple_of(group_bytes) {
        let last = src.len() / group_bytes * group_bytes;
        out.slice(last..).fill(0);
    }
    for (r, row) in src.chunks_exact(row_bytes).enumerate() {
        let at = r / INTERLEAVE * group_bytes + r % INTERLEAVE * unit;
        for (u, block) in row.chunks_exact(unit).enumerate() {
            let at = at + u * INTERLEAVE * unit;
            out.slice(at..at + unit).copy_from_slice(block);
        }
    }
}

/// `rows` rows in row-major order from `groups`, whole groups of [`interleave_rows`], starting
/// with row `first` of the first group.
fn deinterleave_rows(groups: &[u8], row_bytes: usize, unit: usize, first: usize, rows: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows * row_bytes);
    for r in first..first + rows {
        let at = r / INTERLEAVE * INTERLEAVE * row_bytes + r % INTERLEAVE * unit;
        for u in 0..row_bytes / unit {
            out.extend_from_slice(&groups[at + u * INTERLEAVE * unit..][..unit]);
        }
    }
    out
}

/// The block size weight textures of `dtype` interleave (what the shaders call W_UNIT_BYTES:
/// 32 elements, or a k-quant's super-block), or `None` when a row is not whole blocks (no
/// kernel reads such a tensor as weights).
fn interleave_unit(dtype: DType, row_bytes: usize) -> Option<usize> {
    let unit = dtype.size_bytes(dtype.block_elems().max(32)).ok()?;
    row_bytes.is_multiple_of(unit).then_some(unit)
}

/// Where a part's bytes live.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PartStorage {
    Buffer(wgpu::Buffer),
    /// An rgba32uint texture [`TEXTURE_WIDTH`] texels wide holding the bytes in order.
    Texture(wgpu::Texture, wgpu::TextureView),
}

/// A contiguous run of rows of a tensor, living in one buffer or texture.
#[derive(Clone, Debug)]
pub struct TensorPart {
    pub(crate) storage: PartStorage,
    /// Where the first row starts in the buffer or texture.
    pub(crate) offset_bytes: u64,
    /// First row of the tensor held here, and how many rows.
    pub rows: Range<usize>,
    /// For a weight texture, the block size its rows are interleaved by ([`interleave_rows`]);
    /// `offset_bytes` then counts rows as if they were in order.
    pub(crate) interleave: Option<usize>,
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
                    storage: p.storage.clone(),
                    offset_bytes: p.offset_bytes + ((first - p.rows.start) * self.row_bytes) as u64,
                    rows: first - rows.start..p.rows.end.min(rows.end) - rows.start,
                    interleave: p.interleave,
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

    /// The first elements of this single-buffer tensor seen with `shape` (no copy): a step's
    /// activations made for the widest layer, viewed at a narrower layer's width.
    pub fn prefix(&self, shape: &[usize]) -> Result<GpuTensor> {
        let candidate = GpuTensor { shape: shape.to_vec(), ..self.clone() };
        let row_bytes = self.dtype.size_bytes(candidate.row_elems())?;
        if self.parts.len() != 1 || candidate.num_elems() > self.num_elems() {
            return Err(WeftError::shape(
                "prefix",
                format!("shape {:?} does not fit the first elements of a tensor of shape {:?}", shape, self.shape),
            ));
        }
        let mut parts = self.parts.clone();
        parts[0].rows = 0..candidate.num_rows();
        Ok(GpuTensor { row_bytes, parts, ..candidate })
    }

    /// This tensor's rows followed by `next`'s, as one view over both tensors' buffers (no
    /// copy), so that a single readback copies both. Rows must be equally long; the view keeps
    /// this tensor's dtype, so a reader reinterprets `next`'s bytes itself.
    pub fn then_rows(&self, next: &GpuTensor) -> Result<GpuTensor> {
        if self.row_bytes != next.row_bytes || self.shape.len() != 2 || next.shape.len() != 2 {
            return Err(WeftError::shape(
                "then_rows",
                format!("rows of shapes {:?} and {:?} differ in length", self.shape, next.shape),
            ));
        }
        let num_rows = self.num_rows();
        let mut parts = self.parts.clone();
        parts.extend(
            next.parts.iter().map(|p| TensorPart { rows: p.rows.start + num_rows..p.rows.end + num_rows, ..p.clone() }),
        );
        let shape = vec![num_rows + next.num_rows(), self.shape[1]];
        Ok(GpuTensor { shape, parts, ..self.clone() })
    }
}

impl TensorPart {
    pub fn num_rows(&self) -> usize {
        self.rows.len()
    }

    /// Whether the bytes are in a texture (read with `shared/weight_texture.wgsl`).
    pub fn in_texture(&self) -> bool {
        matches!(self.storage, PartStorage::Texture(..))
    }

    /// Where the part's first row starts, for kernels that read it from a texture (a buffer
    /// binding starts at the row, so there it is 0); an error for a view of an interleaved
    /// texture that does not start at a whole group.
    pub(crate) fn base_bytes(&self, row_bytes: usize) -> Result<u64> {
        if !self.in_texture() {
            return Ok(0);
        }
        let group_bytes = (INTERLEAVE * row_bytes) as u64;
        if self.interleave.is_some() && !self.offset_bytes.is_multiple_of(group_bytes) {
            return Err(WeftError::shape(
                "weights",
                format!(
                    "a view of weight rows from row {} cannot be read: weight textures keep rows in \
                     groups of {INTERLEAVE}, so a view must start at a multiple of {INTERLEAVE}",
                    self.offset_bytes / row_bytes as u64
                ),
            ));
        }
        Ok(self.offset_bytes)
    }

    /// The part as a resource to bind. A buffer is bound from its first row to the buffer's
    /// end: kernels take their extents from their parameters, so the same binding serves every
    /// batch size.
    pub(crate) fn resource(&self, ctx: &GpuContext) -> Result<Resource> {
        let buffer = match &self.storage {
            PartStorage::Texture(_, view) => return Ok(Resource::Texture(view.clone())),
            PartStorage::Buffer(buffer) => buffer,
        };
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
        Ok(Resource::Buffer(buffer.clone(), self.offset_bytes))
    }

    /// The part as the uniform activation window of a matmul: the buffer, and the window's
    /// dynamic offset for rows starting `row_offset` bytes into the part; `None` when the buffer
    /// has no room for a whole window there or the offset is not a multiple of the device's
    /// uniform offset alignment.
    pub(crate) fn window(&self, ctx: &GpuContext, row_offset: u64) -> Option<(Resource, u32)> {
        let PartStorage::Buffer(buffer) = &self.storage else { return None };
        let at = self.offset_bytes + row_offset;
        let aligned = at.is_multiple_of(u64::from(ctx.limits().min_uniform_buffer_offset_alignment));
        let fits = buffer.usage().contains(wgpu::BufferUsages::UNIFORM) && at + X_WINDOW_BYTES <= buffer.size();
        let offset = u32::try_from(at).ok()?;
        (aligned && fits).then(|| (Resource::Window(buffer.clone()), offset))
    }

    /// Rows of `row_bytes` each that one window takes, a multiple of `multiple`, for rows read
    /// a window at a time from the part's first row: `None` when not even `multiple` rows fit,
    /// a window after the first would start at an offset a uniform binding may not take, or the
    /// part has no room for windows ([`Self::window`]).
    pub(crate) fn window_rows(&self, ctx: &GpuContext, row_bytes: u64, multiple: usize) -> Option<usize> {
        let rows = (X_WINDOW_BYTES / row_bytes) as usize / multiple * multiple;
        let align = u64::from(ctx.limits().min_uniform_buffer_offset_alignment);
        let aligned = (rows as u64 * row_bytes).is_multiple_of(align);
        (rows > 0 && aligned && self.window(ctx, 0).is_some()).then_some(rows)
    }
}

/// `each(offset, bytes)` over `src` in slices of `slice` bytes (the last shorter), in order:
/// borrowed where `src` is in memory, else read into one reused buffer; each released once
/// `each` is done with it. The first error (a failed read, a failed write) ends it.
fn for_each_slice(src: &dyn ByteSource, slice: usize, each: &mut dyn FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
    let len = src.len_bytes();
    let mut scratch = Vec::new();
    let mut at = 0;
    while at < len {
        // At most a slice: fits in usize.
        let take = (slice.max(1) as u64).min(len - at) as usize;
        let bytes = match src.in_memory() {
            Some(whole) => &whole[at as usize..at as usize + take],
            None => {
                scratch.resize(take, 0);
                src.read_into(at, &mut scratch)?;
                &scratch[..]
            }
        };
        each(at, bytes)?;
        src.release(at..at + take as u64);
        at += take as u64;
    }
    Ok(())
}

/// The wgpu-backed [`TensorFactory`].
#[derive(Clone, Debug)]
pub struct GpuTensorFactory {
    ctx: Arc<GpuContext>,
}

impl GpuTensorFactory {
    /// Write `bytes` into `tensor`'s first part from its first row on (step inputs): queued, no
    /// buffer created.
    pub fn write(&self, tensor: &GpuTensor, bytes: &[u8]) -> Result<()> {
        let part = tensor.single_part("write")?;
        let PartStorage::Buffer(buffer) = &part.storage else {
            return Err(WeftError::Unsupported("step inputs live in buffers, not textures".into()));
        };
        if bytes.len() > part.rows.len() * tensor.row_bytes() || !bytes.len().is_multiple_of(4) {
            return Err(WeftError::shape(
                "write",
                format!("{} bytes do not fit a tensor of shape {:?}", bytes.len(), tensor.shape()),
            ));
        }
        if !bytes.is_empty() {
            self.ctx.queue.write_buffer(buffer, part.offset_bytes, bytes);
        }
        Ok(())
    }

    pub fn new(ctx: Arc<GpuContext>) -> Self {
        GpuTensorFactory { ctx }
    }

    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// (rows, bytes per row, rows per part) of a tensor, in buffers or in textures of `texture`'s
    /// format.
    fn layout(
        &self,
        shape: &[usize],
        dtype: DType,
        texture: Option<wgpu::TextureFormat>,
    ) -> Result<(usize, usize, usize)> {
        let probe = GpuTensor { shape: shape.to_vec(), dtype, row_bytes: 0, parts: Vec::new() };
        if shape.contains(&0) {
            return Err(WeftError::shape("create tensor", format!("shape {shape:?} has an empty dimension")));
        }
        let row_bytes = dtype.size_bytes(probe.row_elems())?;
        let mut cap = self.ctx.max_binding_bytes();
        if let Some(format) = texture {
            cap = cap.min(u64::from(self.ctx.limits().max_texture_dimension_2d) * texture_row_bytes(format));
        }
        let cap = cap as usize;
        if row_bytes > cap {
            return Err(WeftError::Unsupported(format!(
                "one row of a {dtype} tensor of shape {shape:?} takes {row_bytes} bytes, more than \
                 the {cap} bytes this device can bind at once"
            )));
        }
        Ok((probe.num_rows(), row_bytes, (cap / row_bytes).max(1)))
    }

    fn create(&self, shape: &[usize], dtype: DType, bytes: Option<&dyn ByteSource>, kind: Kind) -> Result<GpuTensor> {
        let texture = match kind {
            Kind::Texture => Some(wgpu::TextureFormat::Rgba32Uint),
            Kind::KvTexture(format) => Some(format),
            Kind::Buffer | Kind::Activations => None,
        };
        let (num_rows, row_bytes, mut rows_per_part) = self.layout(shape, dtype, texture)?;
        // Weight textures hold whole groups of rows (a part too, so each starts at one).
        let interleave =
            if kind == Kind::Texture && rows_per_part >= INTERLEAVE { interleave_unit(dtype, row_bytes) } else { None };
        if interleave.is_some() {
            rows_per_part -= rows_per_part % INTERLEAVE;
        }
        // Weights that cannot be grouped (rows that are not whole blocks, or fewer than a group
        // per binding) stay in buffers, which every kernel reads in order, split by a buffer's
        // binding limit.
        let texture = if kind == Kind::Texture && interleave.is_none() {
            rows_per_part = self.layout(shape, dtype, None)?.2;
            None
        } else {
            texture
        };
        if let Some(bytes) = bytes
            && bytes.len_bytes() != (num_rows * row_bytes) as u64
        {
            return Err(WeftError::shape(
                "upload",
                format!(
                    "a {dtype} tensor of shape {shape:?} takes {} bytes, got {}",
                    num_rows * row_bytes,
                    bytes.len_bytes()
                ),
            ));
        }
        let mut parts = Vec::new();
        for first in (0..num_rows).step_by(rows_per_part) {
            let rows = first..(first + rows_per_part).min(num_rows);
            let len = (rows.len() * row_bytes) as u64;
            let window = bytes.map(|source| Window { source, start: (rows.start * row_bytes) as u64, len });
            let src = window.as_ref().map(|w| w as &dyn ByteSource);
            let storage = match (texture, interleave) {
                (Some(format), Some(unit)) => {
                    let len = (rows.len().div_ceil(INTERLEAVE) * INTERLEAVE * row_bytes) as u64;
                    self.texture(len, src, Some((row_bytes, unit)), format)?
                }
                (Some(format), None) => self.texture(len, src, None, format)?,
                (None, _) => {
                    let mut usage =
                        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
                    let mut size = len.next_multiple_of(4);
                    if kind == Kind::Activations {
                        // Room for a whole uniform window from any row (`TensorPart::window`).
                        usage |= wgpu::BufferUsages::UNIFORM;
                        size += X_WINDOW_BYTES;
                    }
                    self.ctx.creations.buffers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.ctx.creations.bytes.fetch_add(size, std::sync::atomic::Ordering::Relaxed);
                    let buffer = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("tensor"),
                        size,
                        usage,
                        mapped_at_creation: false,
                    });
                    if let Some(src) = src {
                        self.fill_buffer(&buffer, src)?;
                    }
                    PartStorage::Buffer(buffer)
                }
            };
            parts.push(TensorPart { storage, offset_bytes: 0, rows, interleave });
        }
        Ok(GpuTensor { shape: shape.to_vec(), dtype, row_bytes, parts })
    }

    /// A texture of `format` holding `len` bytes (zeros, or `src`), row after row of
    /// [`TEXTURE_WIDTH`] texels: rgba32uint for weights (raw bytes, read as uint texels; with
    /// `grouped` = (row bytes, block bytes), rows interleaved as [`interleave_rows`] does), or a
    /// KV cache's float format (read and written as storage textures).
    fn texture(
        &self,
        len: u64,
        src: Option<&dyn ByteSource>,
        grouped: Option<(usize, usize)>,
        format: wgpu::TextureFormat,
    ) -> Result<PartStorage> {
        let usage =
            wgpu::TextureUsages::STORAGE_BINDING | wgpu::TextureUsages::COPY_DST | wgpu::TextureUsages::COPY_SRC;
        let label = if format == wgpu::TextureFormat::Rgba32Uint { "weights" } else { "kv cache" };
        let row_bytes = texture_row_bytes(format);
        let height = len.div_ceil(row_bytes).max(1) as u32;
        self.ctx.creations.textures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.ctx.creations.bytes.fetch_add(u64::from(height) * row_bytes, std::sync::atomic::Ordering::Relaxed);
        let texture = self.ctx.device.create_texture(&wgpu::TextureDescriptor {
            label: Some(label),
            size: wgpu::Extent3d { width: TEXTURE_WIDTH, height, depth_or_array_layers: 1 },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format,
            usage,
            view_formats: &[],
        });
        match (src, grouped) {
            (Some(src), Some((weight_row, unit))) => self.write_grouped(&texture, src, weight_row, unit)?,
            (Some(src), None) => self.write_texture_source(&texture, src)?,
            (None, _) => {}
        }
        let view = texture.create_view(&Default::default());
        Ok(PartStorage::Texture(texture, view))
    }

    /// `src` into a new buffer, a slice of [`GpuOptions::upload_slice_bytes`](super::GpuOptions)
    /// at a time at increasing offsets, so the host never holds more of it than a slice:
    /// natively through the staging ring; in the browser through the queue, each slice read
    /// into one reused buffer of WebAssembly memory and copied from there into the browser's
    /// staging. (Not a mapping at creation: wgpu's web backend copies a written mapping whole
    /// into WebAssembly memory first, which doubled the heap's peak by the largest tensor while
    /// a model loaded.)
    fn fill_buffer(&self, buffer: &wgpu::Buffer, src: &dyn ByteSource) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        self.upload_source(super::staging::Destination::Buffer(buffer), src)?;
        #[cfg(target_arch = "wasm32")]
        for_each_slice(src, self.ctx.upload_slice_bytes as usize, &mut |at, bytes| {
            // Queue writes move whole 4-byte words (slices are whole words but the last); the
            // buffer is sized up to one.
            let whole = bytes.len() - bytes.len() % 4;
            if whole > 0 {
                self.ctx.queue.write_buffer(buffer, at, &bytes[..whole]);
            }
            if whole < bytes.len() {
                let mut last = [0u8; 4];
                last[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
                self.ctx.queue.write_buffer(buffer, at + whole as u64, &last);
            }
            self.ctx.staged_upload(bytes.len() as u64)
        })?;
        Ok(())
    }

    /// `src` into `texture` from its start, in order, a slice at a time (see
    /// [`fill_buffer`](Self::fill_buffer)).
    fn write_texture_source(&self, texture: &wgpu::Texture, src: &dyn ByteSource) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        return self.upload_source(super::staging::Destination::Texture(texture), src);
        #[cfg(target_arch = "wasm32")]
        for_each_slice(src, self.ctx.upload_slice_bytes as usize, &mut |at, bytes| {
            self.write_texture_bytes(texture, at, bytes)
        })
    }

    /// `src` into `dst` from its start through the staging ring, in pieces of a slice: each
    /// piece copied straight into staging memory where the source is in memory (a mapped file),
    /// else read into one reused buffer first; then released (a mapped file's pages dropped).
    #[cfg(not(target_arch = "wasm32"))]
    fn upload_source(&self, dst: super::staging::Destination<'_>, src: &dyn ByteSource) -> Result<()> {
        let piece = self.ctx.upload_slice_bytes.min(super::staging::SLOT_BYTES);
        let mut scratch = Vec::new();
        self.ctx.upload_with(dst, 0, src.len_bytes(), piece, &mut |range, out| {
            match src.in_memory() {
                Some(whole) => out.copy_from_slice(&whole[range.start as usize..range.end as usize]),
                None => {
                    // At most a slice: fits in usize.
                    scratch.resize((range.end - range.start) as usize, 0);
                    src.read_into(range.start, &mut scratch)?;
                    out.copy_from_slice(&scratch);
                }
            }
            src.release(range);
            Ok(())
        })
    }

    /// Whole rows `src` (`row_bytes` each) into `texture` in groups of [`INTERLEAVE`] rows
    /// ([`interleave_rows`]), as many whole groups at a time as a slice holds (at least one), so
    /// that a large tensor is never on the host twice, nor whole: natively straight into the
    /// staging ring's memory.
    fn write_grouped(
        &self,
        texture: &wgpu::Texture,
        src: &dyn ByteSource,
        row_bytes: usize,
        unit: usize,
    ) -> Result<()> {
        let group_bytes = INTERLEAVE * row_bytes;
        let slice = self.ctx.upload_slice_bytes as usize;
        #[cfg(not(target_arch = "wasm32"))]
        if group_bytes as u64 <= super::staging::SLOT_BYTES {
            // Output group g holds source rows 16g..16g + 16: the same byte range, interleaved.
            let groups = (slice.min(super::staging::SLOT_BYTES as usize) / group_bytes).max(1);
            let piece = (groups * group_bytes) as u64;
            let src_len = src.len_bytes();
            let len = src_len.div_ceil(group_bytes as u64) * group_bytes as u64;
            let mut scratch = Vec::new();
            return self.ctx.upload_with(
                super::staging::Destination::Texture(texture),
                0,
                len,
                piece,
                &mut |range, out| {
                    // The last group's rows end before its padding.
                    let rows = range.start..range.end.min(src_len);
                    let bytes = match src.in_memory() {
                        Some(whole) => &whole[rows.start as usize..rows.end as usize],
                        None => {
                            // At most a piece: fits in usize.
                            scratch.resize((rows.end - rows.start) as usize, 0);
                            src.read_into(rows.start, &mut scratch)?;
                            &scratch[..]
                        }
                    };
                    interleave_rows_into(bytes, row_bytes, unit, out);
                    src.release(rows);
                    Ok(())
                },
            );
        }
        let chunk = (slice.min(UPLOAD_CHUNK_BYTES) / group_bytes).max(1) * group_bytes;
        for_each_slice(src, chunk, &mut |at, rows| {
            self.write_texture_bytes(texture, at, &interleave_rows(rows, row_bytes, unit))
        })
    }

    /// `data` into `texture` from byte `at` on (a whole texel), through the staging ring.
    #[cfg(not(target_arch = "wasm32"))]
    fn write_texture_bytes(&self, texture: &wgpu::Texture, at: u64, data: &[u8]) -> Result<()> {
        self.ctx.upload_bytes(super::staging::Destination::Texture(texture), at, data)
    }

    /// Queue `data` into `texture` from byte `at` on (a whole texel) as the rectangles a texture
    /// write takes (the rest of a texel row, whole rows, the start of a row), a last partial
    /// texel padded with zeros: the browser's staging.
    #[cfg(target_arch = "wasm32")]
    fn write_texture_bytes(&self, texture: &wgpu::Texture, at: u64, data: &[u8]) -> Result<()> {
        let texel = u64::from(texture.format().block_copy_size(None).unwrap_or(16));
        let row = texture_row_bytes(texture.format());
        debug_assert!(at.is_multiple_of(texel), "texture writes start at a whole texel");
        // Only a last partial texel is copied, to pad it; the rest goes from `data` as it is.
        let (whole, tail) = data.split_at(data.len() - data.len() % texel as usize);
        let mut last = tail.to_vec();
        if !last.is_empty() {
            last.resize(texel as usize, 0);
        }
        for (mut at, mut rest) in [(at, whole), (at + whole.len() as u64, &last[..])] {
            while !rest.is_empty() {
                let x = at % row;
                let left = rest.len() as u64;
                let (bytes, width, height) = if x == 0 && left >= row {
                    let rows = left / row;
                    (rows * row, TEXTURE_WIDTH, rows as u32)
                } else {
                    let bytes = (row - x).min(left);
                    (bytes, (bytes / texel) as u32, 1)
                };
                self.ctx.queue.write_texture(
                    wgpu::TexelCopyTextureInfo {
                        texture,
                        mip_level: 0,
                        origin: wgpu::Origin3d { x: (x / texel) as u32, y: (at / row) as u32, z: 0 },
                        aspect: wgpu::TextureAspect::All,
                    },
                    &rest[..bytes as usize],
                    wgpu::TexelCopyBufferLayout {
                        offset: 0,
                        bytes_per_row: Some((bytes / u64::from(height)) as u32),
                        rows_per_image: Some(height),
                    },
                    wgpu::Extent3d { width, height, depth_or_array_layers: 1 },
                );
                at += bytes;
                rest = &rest[bytes as usize..];
            }
        }
        self.ctx.staged_upload((whole.len() + last.len()) as u64)
    }

    /// One layer's K or V cache, (slots, kv_heads, head_dim) of `dtype` (F32, or F16 for half
    /// the memory), zeroed or holding `values` (rounded to halves for F16): an rgba32float or
    /// rgba16float texture for CPU drivers' attention kernels, else a buffer.
    pub fn kv_cache(&self, shape: &[usize], dtype: DType, values: Option<&[f32]>) -> Result<GpuTensor> {
        let format = match dtype {
            DType::F32 => wgpu::TextureFormat::Rgba32Float,
            DType::F16 => wgpu::TextureFormat::Rgba16Float,
            other => {
                return Err(WeftError::Unsupported(format!("a KV cache holds f32 or f16 values, not {other}")));
            }
        };
        let kind = if self.ctx.kernel_family() == crate::gpu::KernelFamily::Cpu {
            Kind::KvTexture(format)
        } else {
            Kind::Buffer
        };
        let bytes = values.map(|v| crate::quant::quantize(dtype, v)).transpose()?;
        let tensor = self.create(shape, dtype, bytes.as_deref().as_ref().map(|b| b as &dyn ByteSource), kind)?;
        if tensor.parts().len() > 1 {
            return Err(WeftError::Unsupported(format!(
                "a KV cache layer of shape {shape:?} does not fit one binding of this device; use less KV memory"
            )));
        }
        Ok(tensor)
    }

    /// [`TensorFactory::activations`] holding `values`.
    pub fn upload_activations(&self, shape: &[usize], values: &[f32]) -> Result<GpuTensor> {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        self.create(shape, DType::F32, Some(&bytes), Kind::Activations)
    }
}

/// What a tensor is created as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Buffer,
    /// A buffer with uniform usage and a window's worth of room at the end.
    Activations,
    /// An rgba32uint texture (weights on CPU drivers).
    Texture,
    /// A float texture of this format (the KV cache on CPU drivers).
    KvTexture(wgpu::TextureFormat),
}

impl TensorFactory for GpuTensorFactory {
    fn upload(&self, shape: &[usize], dtype: DType, bytes: &[u8]) -> Result<GpuTensor> {
        self.create(shape, dtype, Some(&bytes), Kind::Buffer)
    }

    fn upload_weight(&self, shape: &[usize], dtype: DType, bytes: &[u8]) -> Result<GpuTensor> {
        self.upload_weight_from(shape, dtype, &bytes)
    }

    fn upload_weight_from(&self, shape: &[usize], dtype: DType, bytes: &dyn ByteSource) -> Result<GpuTensor> {
        let kind = if self.ctx.reads_textures() && dtype != DType::U32 { Kind::Texture } else { Kind::Buffer };
        self.create(shape, dtype, Some(bytes), kind)
    }

    fn finish_uploads(&self) -> Result<()> {
        self.ctx.finish_uploads()
    }

    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<GpuTensor> {
        // wgpu zero-initialises new buffers.
        self.create(shape, dtype, None, Kind::Buffer)
    }

    /// Buffers a matmul can also read through uniform windows (`shared/x_uniform.wgsl`),
    /// which CPU drivers load faster.
    fn activations(&self, shape: &[usize]) -> Result<GpuTensor> {
        self.create(shape, DType::F32, None, Kind::Activations)
    }

    fn download<'a>(&'a self, tensor: &'a GpuTensor) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(self.ctx.read_tensor(tensor))
    }
}

/// A tensor's bytes on their way back to the CPU: copied into `staging` by an encoder, then
/// mapped once the submission completes.
#[derive(Debug)]
pub(crate) struct Readback {
    staging: wgpu::Buffer,
    spans: Vec<Span>,
}

/// One part's bytes in a readback's staging buffer.
#[derive(Debug)]
struct Span {
    /// Bytes copied.
    len: u64,
    /// Bytes copied before the part's first row (or, interleaved, its first row's group).
    skip: u64,
    /// Rows wanted and their bytes each.
    rows: usize,
    row_bytes: usize,
    /// For an interleaved weight texture: its block size, and the first row's index in its group.
    interleave: Option<(usize, usize)>,
}

/// The bytes of `part`'s rows (whole groups of them where interleaved), widened to what a copy
/// can move: whole 4-byte words of a buffer, whole texel rows of a texture. (start, copied
/// length, where the rows or groups start).
fn copy_span(part: &TensorPart, row_bytes: usize) -> (u64, u64, u64) {
    let len = (part.rows.len() * row_bytes) as u64;
    match &part.storage {
        PartStorage::Buffer(buffer) => {
            let start = part.offset_bytes & !3;
            let end = (part.offset_bytes + len).next_multiple_of(4).min(buffer.size());
            (start, end - start, part.offset_bytes)
        }
        PartStorage::Texture(texture, _) => {
            let (from, to) = match part.interleave {
                Some(_) => {
                    let group = (INTERLEAVE * row_bytes) as u64;
                    (part.offset_bytes / group * group, (part.offset_bytes + len).div_ceil(group) * group)
                }
                None => (part.offset_bytes, part.offset_bytes + len),
            };
            let texel_row = texture_row_bytes(texture.format());
            let first = from / texel_row;
            let last = to.div_ceil(texel_row).max(first + 1);
            (first * texel_row, (last - first) * texel_row, from)
        }
    }
}

impl GpuContext {
    /// Staging bytes a readback of `tensor` needs.
    pub(crate) fn readback_bytes(&self, tensor: &GpuTensor) -> u64 {
        let spans = tensor.parts().iter().map(|p| copy_span(p, tensor.row_bytes()).1);
        spans.sum::<u64>().max(4)
    }

    /// What a readback of `tensor` copies, part by part (storage, first byte, bytes): equal
    /// spans encode equal copies.
    pub(crate) fn readback_spans(tensor: &GpuTensor) -> Vec<(PartStorage, u64, usize)> {
        tensor.parts().iter().map(|p| (p.storage.clone(), p.offset_bytes, p.rows.len() * tensor.row_bytes())).collect()
    }

    /// Record copies of every part of `tensor` into `staging` (at least
    /// [`readback_bytes`](Self::readback_bytes) long).
    pub(crate) fn encode_readback_into(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        tensor: &GpuTensor,
        staging: wgpu::Buffer,
    ) -> Readback {
        let mut spans = Vec::new();
        let mut at = 0;
        let row_bytes = tensor.row_bytes();
        for part in tensor.parts() {
            let (start, len, rows_at) = copy_span(part, row_bytes);
            match &part.storage {
                PartStorage::Buffer(buffer) => encoder.copy_buffer_to_buffer(buffer, start, &staging, at, len),
                PartStorage::Texture(texture, _) => {
                    let row_bytes = texture_row_bytes(texture.format());
                    encoder.copy_texture_to_buffer(
                        wgpu::TexelCopyTextureInfo {
                            texture,
                            mip_level: 0,
                            origin: wgpu::Origin3d { x: 0, y: (start / row_bytes) as u32, z: 0 },
                            aspect: wgpu::TextureAspect::All,
                        },
                        wgpu::TexelCopyBufferInfo {
                            buffer: &staging,
                            layout: wgpu::TexelCopyBufferLayout {
                                offset: at,
                                bytes_per_row: Some(row_bytes as u32),
                                rows_per_image: None,
                            },
                        },
                        wgpu::Extent3d {
                            width: TEXTURE_WIDTH,
                            height: (len / row_bytes) as u32,
                            depth_or_array_layers: 1,
                        },
                    )
                }
            }
            let first_row = (part.offset_bytes / row_bytes as u64) as usize;
            spans.push(Span {
                len,
                skip: rows_at - start,
                rows: part.rows.len(),
                row_bytes,
                interleave: part.interleave.map(|unit| (unit, first_row % INTERLEAVE)),
            });
            at += len;
        }
        Readback { staging, spans }
    }

    /// Map a submitted readback and return the tensor's bytes; the staging buffer is unmapped
    /// again, ready for the next readback.
    pub(crate) async fn finish_readback(&self, readback: Readback) -> Result<Vec<u8>> {
        self.finish_readback_with(readback, |_| {}).await
    }

    /// [`finish_readback`](Self::finish_readback), also showing `also` the whole mapped staging
    /// buffer (where other results were copied after the tensor).
    pub(crate) async fn finish_readback_with(&self, readback: Readback, also: impl FnOnce(&[u8])) -> Result<Vec<u8>> {
        let (sender, receiver) = futures::channel::oneshot::channel();
        readback.staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = sender.send(r);
        });
        self.settle(receiver)
            .await?
            .map_err(|_| WeftError::Readback("the device was lost before the copy finished".into()))?
            .map_err(|e| WeftError::Readback(e.to_string()))?;
        let view = readback.staging.get_mapped_range(..).map_err(|e| WeftError::Readback(e.to_string()))?;
        let mut out = Vec::with_capacity(readback.spans.iter().map(|s| s.rows * s.row_bytes).sum());
        let mut at = 0;
        for span in &readback.spans {
            let from = (at + span.skip) as usize;
            match span.interleave {
                Some((unit, first)) => {
                    out.extend(deinterleave_rows(&view[from..], span.row_bytes, unit, first, span.rows));
                }
                None => out.extend_from_slice(&view[from..from + span.rows * span.row_bytes]),
            }
            at += span.len;
        }
        also(&view);
        drop(view);
        readback.staging.unmap();
        Ok(out)
    }

    /// Copy a tensor back to the CPU in a submission of its own.
    pub(crate) async fn read_tensor(&self, tensor: &GpuTensor) -> Result<Vec<u8>> {
        let mut encoder = self.device.create_command_encoder(&Default::default());
        let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let staging = self.create_buffer("readback", self.readback_bytes(tensor), usage);
        let readback = self.encode_readback_into(&mut encoder, tensor, staging);
        self.submit_commands([encoder.finish()])?;
        self.finish_readback(readback).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group and 3 rows more, of 3 blocks of 2 bytes; byte = 6 · row + 2 · block + (0 or 1) + 1.
    const ROWS: usize = INTERLEAVE + 3;
    fn rows() -> Vec<u8> {
        (0..ROWS as u8).flat_map(|r| (0..6u8).map(move |b| 6 * r + b + 1)).collect()
    }

    #[test]
    fn groups_hold_each_block_of_their_rows_side_by_side() {
        let grouped = interleave_rows(&rows(), 6, 2);
        assert_eq!(grouped.len(), 2 * INTERLEAVE * 6, "two groups, the second padded");
        // Group 0: block 0 of each of its rows, then block 1 of each, ...
        assert_eq!(&grouped[..6], &[1, 2, 7, 8, 13, 14]);
        assert_eq!(&grouped[2 * INTERLEAVE..][..4], &[3, 4, 9, 10]);
        // Group 1 starts with block 0 of its 3 rows and zero rows after them.
        let g = (6 * INTERLEAVE + 1) as u8;
        let group1 = &grouped[INTERLEAVE * 6..];
        assert_eq!(&group1[..8], &[g, g + 1, g + 6, g + 7, g + 12, g + 13, 0, 0]);
    }

    #[test]
    fn any_run_of_rows_comes_back_in_order() {
        let src = rows();
        let grouped = interleave_rows(&src, 6, 2);
        for first in 0..ROWS {
            for n in 0..=ROWS - first {
                let group = first / INTERLEAVE * INTERLEAVE * 6;
                let back = deinterleave_rows(&grouped[group..], 6, 2, first % INTERLEAVE, n);
                assert_eq!(back, &src[first * 6..(first + n) * 6], "rows {first}..{}", first + n);
            }
        }
    }
}
