//! The staging ring: natively, bytes bound for GPU buffers and textures (weights, above all)
//! travel through [`SLOTS`] mappable buffers of [`SLOT_BYTES`] each, so an upload holds that
//! much staging memory whatever the model's size.
//!
//! Why not wgpu's own staging: a buffer mapped at creation that the host cannot map (a storage
//! buffer) gets a staging copy wgpu keeps until a submission carries it and a poll sees it done,
//! and `Queue::write_texture` / `write_buffer` copy into staging memory kept the same way, in
//! memory wgpu allocates per write. Flushing that every 16 MiB did not bound a load: an
//! 8B-shaped model's load held 1200 MiB on the host beside its weights (measured by
//! `tests/load_memory.rs`: 681 MiB of it the model file's pages, which the loader now drops
//! after each matrix, and about 400 MiB more anonymous memory than the ring's load holds, which
//! was not traced further). The ring allocates nothing after its first use, and a slot is
//! reused only once the GPU has copied out of it: the same load holds 487 MiB.
//!
//! Each piece is written into a mapped slot, unmapped, copied by its own submission into the
//! destination, and the slot asked to map again; taking a slot whose copy is still in flight
//! waits for that submission alone. A piece longer than a slot is split, so one tensor larger than
//! the whole ring streams through it. [`GpuContext::finish_uploads`](crate::gpu::GpuContext::finish_uploads) waits for the copies and
//! frees the ring (the next upload makes it again).
//!
//! In the browser, where nothing may block for a map, buffers and textures are written through
//! the queue: the browser's own staging (outside WebAssembly memory).
//!
//! **Invariant:** a slot is written only while mapped, and mapped again only after its copy's
//! submission; the ring's bytes are not counted in [`GpuContext::creations`]'s bytes (they are
//! not the model's).

use std::sync::{Arc, Mutex};

use crate::error::{Result, WeftError};
use crate::gpu::GpuContext;

/// Staging buffers in the ring: enough that the host fills one while the GPU copies others.
pub(crate) const SLOTS: usize = 4;

/// Bytes of one staging buffer: a multiple of every copy's alignment (texels of 16 bytes,
/// texture rows of 128 KiB).
pub(crate) const SLOT_BYTES: u64 = 16 << 20;

/// Where an upload's bytes go.
#[derive(Clone, Copy)]
pub(crate) enum Destination<'a> {
    Buffer(&'a wgpu::Buffer),
    /// A texture [`TEXTURE_WIDTH`](super::TEXTURE_WIDTH) texels wide, holding bytes in order.
    Texture(&'a wgpu::Texture),
}

/// What writes one piece of an upload: the bytes of a range (relative to the upload's start)
/// into the slot's mapped memory. Its error (a read of the file that failed) ends the upload.
pub(crate) type Fill<'a> = dyn FnMut(std::ops::Range<u64>, &mut wgpu::WriteOnly<'_, [u8]>) -> Result<()> + 'a;

/// The outcome of a slot's request to map, once the device reports it.
type MapOutcome = Arc<Mutex<Option<std::result::Result<(), wgpu::BufferAsyncError>>>>;

enum SlotState {
    /// Mapped for writing.
    Mapped,
    /// Its copy is in `submission`; `mapped` fills in when the slot is mapped again.
    InFlight { submission: wgpu::SubmissionIndex, mapped: MapOutcome },
}

struct Slot {
    buffer: wgpu::Buffer,
    state: SlotState,
}

/// The staging buffers and the one to use next.
pub(crate) struct Ring {
    slots: Vec<Slot>,
    next: usize,
}

fn gpu_error(reason: impl std::fmt::Display) -> WeftError {
    WeftError::Gpu { context: "uploading".into(), reason: reason.to_string() }
}

impl Ring {
    fn new(ctx: &GpuContext) -> Ring {
        let slots = (0..SLOTS)
            .map(|_| {
                ctx.creations.buffers.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("staging"),
                    size: SLOT_BYTES,
                    usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                    // A mappable buffer mapped at creation is its own memory: no staging of its own.
                    mapped_at_creation: true,
                });
                Slot { buffer, state: SlotState::Mapped }
            })
            .collect();
        Ring { slots, next: 0 }
    }

    /// The next slot, mapped: waits for its last copy where that is still in flight.
    fn take(&mut self, ctx: &GpuContext) -> Result<usize> {
        let index = self.next;
        self.next = (self.next + 1) % self.slots.len();
        let slot = &mut self.slots[index];
        if let SlotState::InFlight { submission, mapped } = &slot.state {
            let mut wait = Some(submission.clone());
            loop {
                if let Some(outcome) = mapped.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    outcome.map_err(gpu_error)?;
                    break;
                }
                ctx.check_lost()?;
                // The map completes with the copy's submission; any later poll finds it.
                let poll = wgpu::PollType::Wait { submission_index: wait.take(), timeout: None };
                ctx.device.poll(poll).map_err(gpu_error)?;
            }
            slot.state = SlotState::Mapped;
        }
        Ok(index)
    }

    /// Fill `len` bytes of `dst` from byte `at` on (for a texture, a whole texel) in pieces of
    /// at most `piece` bytes: `fill(range, out)` writes the bytes of `range` (relative to `at`)
    /// into `out`.
    fn upload(
        &mut self,
        ctx: &GpuContext,
        dst: Destination<'_>,
        at: u64,
        len: u64,
        piece: u64,
        fill: &mut Fill<'_>,
    ) -> Result<()> {
        let align = match dst {
            Destination::Buffer(_) => wgpu::COPY_BUFFER_ALIGNMENT,
            Destination::Texture(t) => u64::from(t.format().block_copy_size(None).unwrap_or(16)),
        };
        if !at.is_multiple_of(align) || !piece.is_multiple_of(align) || piece == 0 || piece > SLOT_BYTES {
            return Err(gpu_error(format!(
                "an upload at byte {at} in pieces of {piece} bytes does not align to {align}"
            )));
        }
        let mut done = 0;
        while done < len {
            let take = piece.min(len - done);
            let index = self.take(ctx)?;
            let slot = &mut self.slots[index];
            // A last partial word or texel goes padded with zeros (the destination has room).
            let padded = take.next_multiple_of(align);
            {
                let mut view = slot.buffer.slice(..padded).get_mapped_range_mut().map_err(gpu_error)?;
                // On an error the slot stays mapped (it was never unmapped), ready for the next upload.
                fill(done..done + take, &mut view.slice(..take as usize))?;
                view.slice(take as usize..).fill(0);
            }
            slot.buffer.unmap();
            let mut encoder =
                ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("upload") });
            match dst {
                Destination::Buffer(buffer) => {
                    encoder.copy_buffer_to_buffer(&slot.buffer, 0, buffer, at + done, padded)
                }
                Destination::Texture(texture) => {
                    copy_to_texture(&mut encoder, &slot.buffer, texture, at + done, padded)
                }
            }
            ctx.check_lost()?;
            let submission = ctx.queue.submit([encoder.finish()]);
            let mapped: MapOutcome = Arc::default();
            let sink = mapped.clone();
            slot.buffer.map_async(wgpu::MapMode::Write, .., move |outcome| {
                *sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
            });
            slot.state = SlotState::InFlight { submission, mapped };
            done += take;
        }
        Ok(())
    }
}

/// Record the copy of `len` bytes (whole texels) at the start of `staging` into `texture` from
/// byte `at` on, as the rectangles a texture copy takes: the rest of a texel row, whole rows,
/// the start of a row.
fn copy_to_texture(
    encoder: &mut wgpu::CommandEncoder,
    staging: &wgpu::Buffer,
    texture: &wgpu::Texture,
    at: u64,
    len: u64,
) {
    let texel = u64::from(texture.format().block_copy_size(None).unwrap_or(16));
    let row = u64::from(texture.width()) * texel;
    let (mut at, mut offset) = (at, 0u64);
    while offset < len {
        let x = at % row;
        let left = len - offset;
        let (bytes, width, height) = if x == 0 && left >= row {
            let rows = left / row;
            (rows * row, texture.width(), rows as u32)
        } else {
            let bytes = (row - x).min(left);
            (bytes, (bytes / texel) as u32, 1)
        };
        encoder.copy_buffer_to_texture(
            wgpu::TexelCopyBufferInfo {
                buffer: staging,
                layout: wgpu::TexelCopyBufferLayout {
                    offset,
                    // Only a copy of several rows needs its stride (a multiple of 256 bytes: a
                    // whole texture row is).
                    bytes_per_row: (height > 1).then_some(row as u32),
                    rows_per_image: None,
                },
            },
            wgpu::TexelCopyTextureInfo {
                texture,
                mip_level: 0,
                origin: wgpu::Origin3d { x: (x / texel) as u32, y: (at / row) as u32, z: 0 },
                aspect: wgpu::TextureAspect::All,
            },
            wgpu::Extent3d { width, height, depth_or_array_layers: 1 },
        );
        at += bytes;
        offset += bytes;
    }
}

impl GpuContext {
    /// Copy `data` into `dst` from byte `at` on through the staging ring (made on first use).
    pub(crate) fn upload_bytes(&self, dst: Destination<'_>, at: u64, data: &[u8]) -> Result<()> {
        self.upload_with(dst, at, data.len() as u64, SLOT_BYTES, &mut |range, out| {
            out.copy_from_slice(&data[range.start as usize..range.end as usize]);
            Ok(())
        })
    }

    /// Fill `len` bytes of `dst` from byte `at` on through the staging ring, `fill` writing
    /// each piece of at most `piece` bytes (a multiple of the destination's alignment, at most
    /// [`SLOT_BYTES`]) straight into staging memory.
    pub(crate) fn upload_with(
        &self,
        dst: Destination<'_>,
        at: u64,
        len: u64,
        piece: u64,
        fill: &mut Fill<'_>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let mut ring = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        ring.get_or_insert_with(|| Ring::new(self)).upload(self, dst, at, len, piece, fill)
    }

    /// Wait for the uploads in flight and free the staging ring.
    pub(crate) fn release_staging(&self) -> Result<()> {
        let Some(ring) = self.staging.lock().unwrap_or_else(|p| p.into_inner()).take() else { return Ok(()) };
        self.check_lost()?;
        self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(gpu_error)?;
        drop(ring);
        Ok(())
    }
}
