//! The tensor factory seam: what makes tensors and reads them back, as the engine's seed
//! constructors take it (`Arc<dyn TensorFactory>`). It lives outside `gpu/` so that code which
//! only passes a factory along (the engine) never imports the GPU module; the wgpu
//! implementation is `gpu::GpuTensorFactory`.

use crate::error::{Result, WeftError};
use crate::gpu::GpuTensor;
use crate::quant::DType;
use crate::rt::BoxFuture;

/// A tensor's bytes, read a slice at a time: a tensor of a file read through `gguf::ReadAt`
/// (the browser's), several tensors uploaded as one ([`Joined`]), or bytes in memory.
pub trait ByteSource {
    /// Bytes in all.
    fn len_bytes(&self) -> u64;

    /// All the bytes, where they are in memory already (a mapped or owned file, a slice):
    /// copied from there, not read.
    fn in_memory(&self) -> Option<&[u8]> {
        None
    }

    /// Fill `out` with the bytes from `offset` on; the caller keeps the range inside
    /// [`len_bytes`](Self::len_bytes). A failed read is an error naming what was read.
    fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<()>;

    /// The bytes of `range` are on their way to the GPU: a source that maps a file may drop
    /// their pages now rather than after the whole tensor.
    fn release(&self, _range: std::ops::Range<u64>) {}

    /// All the bytes in one buffer of their own (what a slice-by-slice upload avoids).
    fn read_all(&self) -> Result<Vec<u8>> {
        if let Some(whole) = self.in_memory() {
            return Ok(whole.to_vec());
        }
        let len = usize::try_from(self.len_bytes()).map_err(|_| {
            WeftError::Unsupported(format!("{} bytes do not fit this machine's memory", self.len_bytes()))
        })?;
        let mut out = Vec::new();
        out.try_reserve_exact(len)
            .map_err(|_| WeftError::Unsupported(format!("{len} bytes do not fit this machine's memory")))?;
        out.resize(len, 0);
        self.read_into(0, &mut out)?;
        Ok(out)
    }
}

impl ByteSource for &[u8] {
    fn len_bytes(&self) -> u64 {
        self.len() as u64
    }

    fn in_memory(&self) -> Option<&[u8]> {
        Some(self)
    }

    fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        // Inside the slice (the caller's promise), so offsets fit in usize.
        let start = offset as usize;
        out.copy_from_slice(&self[start..start + out.len()]);
        Ok(())
    }
}

/// Sources read one after the other as one: the row blocks of projections fused into one
/// matrix (q, k and v), each still read a slice at a time.
pub struct Joined<'a>(pub Vec<&'a dyn ByteSource>);

impl ByteSource for Joined<'_> {
    fn len_bytes(&self) -> u64 {
        self.0.iter().map(|s| s.len_bytes()).sum()
    }

    fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let (mut at, mut done) = (offset, 0usize);
        for source in &self.0 {
            let len = source.len_bytes();
            if done == out.len() {
                break;
            }
            if at >= len {
                at -= len;
                continue;
            }
            // At most `out.len()` bytes, so it fits in usize.
            let take = ((len - at) as usize).min(out.len() - done);
            source.read_into(at, &mut out[done..done + take])?;
            done += take;
            at = 0;
        }
        Ok(())
    }

    fn release(&self, range: std::ops::Range<u64>) {
        let mut start = 0;
        for source in &self.0 {
            let end = start + source.len_bytes();
            let (from, to) = (range.start.max(start), range.end.min(end));
            if from < to {
                source.release(from - start..to - start);
            }
            start = end;
        }
    }
}

/// The bytes `start..start + len` of `source`, as a source of their own: one part of a tensor
/// split over several bindings.
pub struct Window<'a> {
    pub source: &'a dyn ByteSource,
    pub start: u64,
    pub len: u64,
}

impl ByteSource for Window<'_> {
    fn len_bytes(&self) -> u64 {
        self.len
    }

    fn in_memory(&self) -> Option<&[u8]> {
        // Inside the source's bytes, so inside a slice.
        self.source.in_memory().map(|whole| &whole[self.start as usize..(self.start + self.len) as usize])
    }

    fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.source.read_into(self.start + offset, out)
    }

    fn release(&self, range: std::ops::Range<u64>) {
        self.source.release(self.start + range.start..self.start + range.end)
    }
}

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

    /// [`upload_weight`](Self::upload_weight) of bytes read a slice at a time from `bytes`
    /// (a file read through `gguf::ReadAt`): the GPU factory never holds more than one slice of
    /// them on the host. This default reads them whole first.
    fn upload_weight_from(&self, shape: &[usize], dtype: DType, bytes: &dyn ByteSource) -> Result<GpuTensor> {
        match bytes.in_memory() {
            Some(whole) => self.upload_weight(shape, dtype, whole),
            None => self.upload_weight(shape, dtype, &bytes.read_all()?),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every range read from sources joined and windowed, across their seams, comes back as
    /// the same range of the bytes laid end to end.
    #[test]
    fn joined_and_windowed_sources_read_any_range() {
        let all: Vec<u8> = (0..=255u8).cycle().take(300).collect();
        let (a, b, c): (&[u8], &[u8], &[u8]) = (&all[..7], &all[7..7], &all[7..]);
        let joined = Joined(vec![&a, &b, &c]);
        assert_eq!(joined.len_bytes(), 300);
        assert_eq!(joined.read_all().unwrap(), all);
        let window = Window { source: &joined, start: 5, len: 290 };
        for start in 0..290u64 {
            for len in [0, 1, 2, 3, 17, 290 - start as usize] {
                let len = len.min(290 - start as usize);
                let mut out = vec![0u8; len];
                window.read_into(start, &mut out).unwrap();
                assert_eq!(out, &all[5 + start as usize..][..len], "bytes {start}.. of {len}");
            }
        }
        assert_eq!(window.in_memory(), None, "joined sources are not one slice");
        let whole = Window { source: &c, start: 3, len: 4 };
        assert_eq!(whole.in_memory(), Some(&all[10..14]));
    }
}
