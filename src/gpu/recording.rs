//! Recording dispatches and submitting them to the GPU as one command buffer.
//!
//! Kernel functions in `kernels/` only describe [`Dispatch`]es (pipeline, the resources to
//! bind, parameters, grid) and push them onto a [`Recording`]; [`GpuContext::submit`] is the
//! one place that encodes and submits. A recording is also an arena that outlives its
//! dispatches: every kernel's parameters go into one uniform buffer the recording owns (each
//! dispatch binds its slot with a dynamic offset), bind groups are cached by what they bind,
//! and the readback staging buffer is kept. An executor that clears and refills the same
//! recording every step over the same tensors therefore creates nothing once warm
//! ([`GpuContext::creations`] counts what is created).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use crate::error::{Result, WeftError};
use crate::gpu::GpuContext;
use crate::gpu::pipelines::{BindingKind, Pipeline, ShaderVariant, X_WINDOW_BYTES};
use crate::gpu::tensor::{PartStorage, Readback};

/// What a dispatch binds at one binding: plain handles, so a bind group can be looked up by
/// them (wgpu resources compare and hash by identity).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Resource {
    /// A storage buffer from this byte offset to its end (kernels take their extents from their
    /// parameters, so one binding serves every batch size).
    Buffer(wgpu::Buffer, u64),
    /// A weight texture.
    Texture(wgpu::TextureView),
    /// A uniform window of [`X_WINDOW_BYTES`] over a buffer; where it starts is the dispatch's
    /// dynamic offset.
    Window(wgpu::Buffer),
}

/// One compute dispatch, ready to encode.
#[derive(Debug)]
pub struct Dispatch {
    variant: ShaderVariant,
    pipeline: Pipeline,
    resources: Vec<Resource>,
    /// Byte offset of this dispatch's parameters in the recording's uniform buffer.
    params_offset: u32,
    /// Byte offset of the uniform activation window, for kernels that bind one.
    window_offset: Option<u32>,
    workgroups: [u32; 3],
}

/// What a recording keeps between uses.
#[derive(Debug, Default)]
struct Arena {
    params_buffer: Option<wgpu::Buffer>,
    /// The parameters in `params_buffer` are the recording's current ones.
    params_written: bool,
    bind_groups: HashMap<(ShaderVariant, Vec<Resource>), wgpu::BindGroup>,
    staging: Option<wgpu::Buffer>,
    /// Timestamps at the start and end of the pass, and the buffer they resolve into.
    timestamps: Option<(wgpu::QuerySet, wgpu::Buffer)>,
    /// The recording encoded again while the GPU ran its last submission, ready for the next
    /// one: a decode step shaped like the last submits it without encoding. Dropped whenever
    /// the dispatches change.
    ahead: Option<Ahead>,
}

/// A submission encoded ahead of time, and what it reads back.
#[derive(Debug)]
struct Ahead {
    result: Vec<(PartStorage, u64, usize)>,
    commands: wgpu::CommandBuffer,
    readback: Readback,
}

/// Host time of one submission, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SubmitTimes {
    /// Writing parameters, finding bind groups, encoding the passes.
    pub encode_s: f64,
    /// `queue.submit`.
    pub submit_s: f64,
    /// Waiting for the GPU (and the readback's mapping), `ahead_s` included.
    pub wait_s: f64,
    /// Encoding the same recording again while the GPU runs this submission, for the next
    /// (overlapped with the GPU: not on the step's critical path).
    pub ahead_s: f64,
    /// The GPU's time for the pass, where the adapter has timestamps.
    pub gpu_s: Option<f64>,
}

/// An ordered list of dispatches that run as one submission, and the arena they live in.
#[derive(Debug, Default)]
pub struct Recording {
    dispatches: Vec<Dispatch>,
    params: Vec<u8>,
    arena: Mutex<Arena>,
}

/// Bytes every dispatch's parameter slot binds (at least the largest `Params` struct).
const PARAMS_BINDING_BYTES: u64 = 256;

impl Recording {
    pub fn new() -> Self {
        Recording::default()
    }

    /// Forget the dispatches, keep the arena (parameter buffer, bind groups, staging buffer).
    pub fn clear(&mut self) {
        self.dispatches.clear();
        self.params.clear();
        let mut arena = self.arena();
        arena.params_written = false;
        arena.ahead = None;
    }

    pub fn len(&self) -> usize {
        self.dispatches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    /// The kernels recorded, in order (for logs, profiles and tests).
    pub fn kernels(&self) -> impl Iterator<Item = ShaderVariant> + '_ {
        self.dispatches.iter().map(|d| d.variant)
    }

    fn arena(&self) -> std::sync::MutexGuard<'_, Arena> {
        self.arena.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The grid for `len` independent items at `per_workgroup` items per workgroup, folded into a
/// second dimension past the 65535-workgroup limit (shaders rebuild the flat index from it).
pub(crate) fn flat_grid(len: usize, per_workgroup: usize) -> [u32; 3] {
    let groups = len.div_ceil(per_workgroup).max(1);
    let x = groups.min(65535);
    [x as u32, groups.div_ceil(x) as u32, 1]
}

impl GpuContext {
    /// Record a dispatch of `variant`: binding 0 is a uniform holding `params`, bindings 1.. are
    /// `resources` in order (then the IQ codebooks, for a decoder that reads them);
    /// `window_offset` places a [`Resource::Window`].
    pub(crate) fn dispatch(
        &self,
        rec: &mut Recording,
        variant: ShaderVariant,
        params: &[u8],
        mut resources: Vec<Resource>,
        window_offset: Option<u32>,
        workgroups: [u32; 3],
    ) -> Result<()> {
        let max = self.limits().max_compute_workgroups_per_dimension;
        if workgroups.iter().any(|&g| g > max) {
            return Err(WeftError::shape(
                "dispatch",
                format!("{variant} needs a grid of {workgroups:?} workgroups; this device allows {max} per dimension"),
            ));
        }
        debug_assert!(params.len() as u64 <= PARAMS_BINDING_BYTES);
        let pipeline = self.pipelines.get(&self.device, variant)?;
        if pipeline.codebooks {
            resources.push(Resource::Buffer(self.codebooks().clone(), 0));
        }
        let align = u64::from(self.limits().min_uniform_buffer_offset_alignment).max(4);
        let params_offset = (rec.params.len() as u64).next_multiple_of(align);
        rec.params.resize(params_offset as usize, 0);
        rec.params.extend_from_slice(params);
        let mut arena = rec.arena();
        arena.params_written = false;
        arena.ahead = None;
        drop(arena);
        let params_offset = u32::try_from(params_offset)
            .map_err(|_| WeftError::Unsupported("a recording's parameters outgrew 4 GiB".into()))?;
        rec.dispatches.push(Dispatch { variant, pipeline, resources, params_offset, window_offset, workgroups });
        Ok(())
    }

    /// Make sure the recording's parameter buffer holds its parameters, write them, and find
    /// (or make) every dispatch's bind group.
    fn prepare(&self, recording: &Recording) -> Result<Vec<wgpu::BindGroup>> {
        let mut arena = recording.arena();
        let needed = recording.params.len() as u64 + PARAMS_BINDING_BYTES;
        if arena.params_buffer.as_ref().is_none_or(|b| b.size() < needed) {
            // A new buffer invalidates every bind group that binds the old one.
            arena.bind_groups.clear();
            arena.params_written = false;
            let size = needed.max(64 << 10).next_power_of_two();
            arena.params_buffer = Some(self.create_buffer(
                "kernel parameters",
                size,
                wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            ));
        }
        let Arena { params_buffer, params_written, bind_groups, .. } = &mut *arena;
        let params_buffer = params_buffer.as_ref().expect("made above");
        // A recording submitted again unchanged (a decode step shaped like the last) keeps
        // its parameters on the GPU.
        if !recording.params.is_empty() && !*params_written {
            self.queue.write_buffer(params_buffer, 0, &recording.params);
            *params_written = true;
        }
        let mut out = Vec::with_capacity(recording.dispatches.len());
        for d in &recording.dispatches {
            let key = (d.variant, d.resources.clone());
            if let Some(group) = bind_groups.get(&key) {
                out.push(group.clone());
                continue;
            }
            if d.resources.len() + 1 != d.pipeline.kinds.len() {
                return Err(WeftError::shape(
                    "dispatch",
                    format!(
                        "{} binds {} resources, its shader declares {}",
                        d.variant,
                        d.resources.len() + 1,
                        d.pipeline.kinds.len()
                    ),
                ));
            }
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: params_buffer,
                    offset: 0,
                    size: wgpu::BufferSize::new(PARAMS_BINDING_BYTES),
                }),
            }];
            for (i, (r, kind)) in d.resources.iter().zip(&d.pipeline.kinds[1..]).enumerate() {
                let resource = match (r, kind) {
                    (Resource::Buffer(buffer, offset), BindingKind::StorageRead | BindingKind::StorageReadWrite) => {
                        wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer, offset: *offset, size: None })
                    }
                    (Resource::Texture(view), BindingKind::StorageTexture { .. }) => {
                        wgpu::BindingResource::TextureView(view)
                    }
                    (Resource::Window(buffer), BindingKind::Uniform) => {
                        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer,
                            offset: 0,
                            size: wgpu::BufferSize::new(X_WINDOW_BYTES),
                        })
                    }
                    (r, kind) => {
                        return Err(WeftError::shape(
                            "dispatch",
                            format!("{} binding {}: a {r:?} cannot be bound as {kind:?}", d.variant, i + 1),
                        ));
                    }
                };
                entries.push(wgpu::BindGroupEntry { binding: i as u32 + 1, resource });
            }
            self.creations.bind_groups.fetch_add(1, Ordering::Relaxed);
            let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("kernel bindings"),
                layout: &d.pipeline.layout,
                entries: &entries,
            });
            bind_groups.insert(key, group.clone());
            out.push(group);
        }
        Ok(out)
    }

    /// Encode `recording` into `encoder`: one compute pass, or (profiling) one pass per dispatch
    /// with timestamps written at 2i and 2i + 1 of `queries` taken as one sequence of sets of
    /// `QUERY_SET_MAX_QUERIES`.
    fn encode_into(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        recording: &Recording,
        groups: &[wgpu::BindGroup],
        queries: Option<&[wgpu::QuerySet]>,
    ) {
        self.encode_timed(encoder, recording, groups, queries, None)
    }

    /// [`encode_into`](Self::encode_into), with the whole pass's start and end written into
    /// `pass_queries` (unprofiled only).
    fn encode_timed(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        recording: &Recording,
        groups: &[wgpu::BindGroup],
        queries: Option<&[wgpu::QuerySet]>,
        pass_queries: Option<&wgpu::QuerySet>,
    ) {
        let set = |pass: &mut wgpu::ComputePass<'_>, d: &Dispatch, group: &wgpu::BindGroup| {
            pass.set_pipeline(&d.pipeline.pipeline);
            let offsets: Vec<u32> = std::iter::once(d.params_offset).chain(d.window_offset).collect();
            pass.set_bind_group(0, group, &offsets);
            pass.dispatch_workgroups(d.workgroups[0], d.workgroups[1], d.workgroups[2]);
        };
        match queries {
            None => {
                let timestamp_writes = pass_queries.map(|query_set| wgpu::ComputePassTimestampWrites {
                    query_set,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                });
                let mut pass = encoder
                    .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("weft step"), timestamp_writes });
                for (d, group) in recording.dispatches.iter().zip(groups) {
                    set(&mut pass, d, group);
                }
            }
            Some(sets) => {
                let per_set = (wgpu::QUERY_SET_MAX_QUERIES / 2) as usize;
                for (i, (d, group)) in recording.dispatches.iter().zip(groups).enumerate() {
                    let at = 2 * (i % per_set) as u32;
                    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some("weft step (profiled)"),
                        timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                            query_set: &sets[i / per_set],
                            beginning_of_pass_write_index: Some(at),
                            end_of_pass_write_index: Some(at + 1),
                        }),
                    });
                    set(&mut pass, d, group);
                }
            }
        }
    }

    /// Run a recording as one submission and wait for it; GPU validation errors come back as
    /// [`WeftError::Gpu`].
    pub async fn submit(&self, recording: &Recording) -> Result<()> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let groups = self.prepare(recording)?;
        let mut encoder = self.device.create_command_encoder(&Default::default());
        self.encode_into(&mut encoder, recording, &groups, None);
        self.submit_commands([encoder.finish()])?;
        if let Some(error) = self.settle(scope.pop()).await? {
            return Err(self.gpu_error(recording, error));
        }
        Ok(())
    }

    /// Run a recording and read `result` back, in one submission: the step's only readback. The
    /// staging buffer is the recording's own and is reused.
    pub async fn submit_and_read(&self, recording: &Recording, result: &crate::gpu::GpuTensor) -> Result<Vec<u8>> {
        Ok(self.submit_and_read_timed(recording, result).await?.0)
    }

    /// [`submit_and_read`](Self::submit_and_read), with where the host's time went.
    ///
    /// While the GPU runs the submission, the same recording is encoded again and kept: if the
    /// next call submits the recording unchanged (a decode step shaped like this one; its
    /// inputs and parameters are written into buffers, not into the commands), that command
    /// buffer goes to the queue as it is, and encoding leaves the step's critical path.
    pub async fn submit_and_read_timed(
        &self,
        recording: &Recording,
        result: &crate::gpu::GpuTensor,
    ) -> Result<(Vec<u8>, SubmitTimes)> {
        let started = web_time::Instant::now();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let spans = GpuContext::readback_spans(result);
        let ahead = recording.arena().ahead.take().filter(|a| a.result == spans);
        let Ahead { commands, readback, .. } = match ahead {
            Some(ahead) => ahead,
            None => self.encode_with_readback(recording, result, spans.clone())?,
        };
        let encoded = web_time::Instant::now();
        self.submit_commands([commands])?;
        let submitted = web_time::Instant::now();
        let next = self.encode_with_readback(recording, result, spans)?;
        let timestamps = recording.arena().timestamps.is_some();
        let ahead_s = submitted.elapsed().as_secs_f64();
        if let Some(error) = self.settle(scope.pop()).await? {
            return Err(self.gpu_error(recording, error));
        }
        let mut gpu_s = None;
        let result_bytes = self.readback_bytes(result).next_multiple_of(8);
        let bytes = self
            .finish_readback_with(readback, |view| {
                if timestamps {
                    let at = result_bytes as usize;
                    let ticks: [u64; 2] = bytemuck::pod_read_unaligned(&view[at..at + 16]);
                    let seconds =
                        ticks[1].saturating_sub(ticks[0]) as f64 * f64::from(self.queue.get_timestamp_period()) * 1e-9;
                    gpu_s = Some(seconds);
                }
            })
            .await?;
        recording.arena().ahead = Some(next);
        let times = SubmitTimes {
            encode_s: (encoded - started).as_secs_f64(),
            submit_s: (submitted - encoded).as_secs_f64(),
            wait_s: submitted.elapsed().as_secs_f64(),
            ahead_s,
            gpu_s,
        };
        Ok((bytes, times))
    }

    /// Make `recording`'s readback staging buffer (and its timestamp queries) big enough for a
    /// readback of `result` now, so that no warm step has to grow it: an executor calls this
    /// with the largest result its steps read.
    pub fn reserve_readback(&self, recording: &Recording, result: &crate::gpu::GpuTensor) {
        let result_bytes = self.readback_bytes(result).next_multiple_of(8);
        self.ensure_readback(&mut recording.arena(), result_bytes);
    }

    fn ensure_readback(&self, arena: &mut Arena, result_bytes: u64) {
        // The result, then the pass's two timestamps (8-byte aligned).
        let needed = result_bytes + 16;
        if arena.staging.as_ref().is_none_or(|s| s.size() < needed) {
            let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
            arena.staging = Some(self.create_buffer("readback", needed.next_power_of_two(), usage));
        }
        if arena.timestamps.is_none() && self.features().timestamp_query {
            let set = self.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("step timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            });
            let usage = wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC;
            arena.timestamps = Some((set, self.create_buffer("step timestamps", 16, usage)));
        }
    }

    /// Encode `recording` into a command buffer that then copies `result` (whose
    /// [`readback_spans`](GpuContext::readback_spans) are `spans`) and the pass's timestamps
    /// into the recording's staging buffer.
    fn encode_with_readback(
        &self,
        recording: &Recording,
        result: &crate::gpu::GpuTensor,
        spans: Vec<(PartStorage, u64, usize)>,
    ) -> Result<Ahead> {
        let groups = self.prepare(recording)?;
        let mut encoder = self.device.create_command_encoder(&Default::default());
        let result_bytes = self.readback_bytes(result).next_multiple_of(8);
        let (staging, timestamps) = {
            let mut arena = recording.arena();
            self.ensure_readback(&mut arena, result_bytes);
            (arena.staging.clone().expect("made above"), arena.timestamps.clone())
        };
        self.encode_timed(&mut encoder, recording, &groups, None, timestamps.as_ref().map(|(set, _)| set));
        if let Some((set, resolve)) = &timestamps {
            encoder.resolve_query_set(set, 0..2, resolve, 0);
            encoder.copy_buffer_to_buffer(resolve, 0, &staging, result_bytes, 16);
        }
        let readback = self.encode_readback_into(&mut encoder, result, staging);
        Ok(Ahead { result: spans, commands: encoder.finish(), readback })
    }

    /// Like [`submit`](Self::submit), and return each dispatch's GPU time in seconds, in
    /// order, where the adapter has timestamp queries (`None` otherwise). Each dispatch runs in
    /// its own pass, so the sum is a little above the step's unprofiled time.
    pub async fn submit_profiled(&self, recording: &Recording) -> Result<Option<Vec<(ShaderVariant, f64)>>> {
        if !self.features().timestamp_query || recording.is_empty() {
            self.submit(recording).await?;
            return Ok(None);
        }
        // One query set holds QUERY_SET_MAX_QUERIES timestamps; a long prefill step (thousands of
        // dispatches on CPU drivers) takes several.
        let count = 2 * recording.dispatches.len() as u32;
        let sets: Vec<wgpu::QuerySet> = (0..count.div_ceil(wgpu::QUERY_SET_MAX_QUERIES))
            .map(|i| {
                self.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("dispatch timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: (count - i * wgpu::QUERY_SET_MAX_QUERIES).min(wgpu::QUERY_SET_MAX_QUERIES),
                })
            })
            .collect();
        let bytes = 8 * u64::from(count);
        let resolve =
            self.create_buffer("timestamps", bytes, wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC);
        let readback = self.create_buffer(
            "timestamps readback",
            bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let groups = self.prepare(recording)?;
        let mut encoder = self.device.create_command_encoder(&Default::default());
        self.encode_into(&mut encoder, recording, &groups, Some(&sets));
        for (i, set) in sets.iter().enumerate() {
            let first = i as u32 * wgpu::QUERY_SET_MAX_QUERIES;
            let n = (count - first).min(wgpu::QUERY_SET_MAX_QUERIES);
            encoder.resolve_query_set(set, 0..n, &resolve, 8 * u64::from(first));
        }
        encoder.copy_buffer_to_buffer(&resolve, 0, &readback, 0, bytes);
        self.submit_commands([encoder.finish()])?;
        let (sender, receiver) = futures::channel::oneshot::channel();
        readback.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = sender.send(r);
        });
        if let Some(error) = self.settle(scope.pop()).await? {
            return Err(self.gpu_error(recording, error));
        }
        receiver
            .await
            .map_err(|_| WeftError::Readback("device lost while timing".into()))?
            .map_err(|e| WeftError::Readback(e.to_string()))?;
        let view = readback.get_mapped_range(..).map_err(|e| WeftError::Readback(e.to_string()))?;
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&view[..bytes as usize]);
        let period = f64::from(self.queue.get_timestamp_period()) * 1e-9;
        Ok(Some(
            recording
                .dispatches
                .iter()
                .zip(ticks.chunks(2))
                .map(|(d, t)| (d.variant, t[1].saturating_sub(t[0]) as f64 * period))
                .collect(),
        ))
    }

    /// Like [`submit`](Self::submit), and return the GPU time of the whole recording in
    /// seconds, where the adapter has timestamp queries.
    pub async fn submit_timed(&self, recording: &Recording) -> Result<Option<f64>> {
        Ok(self.submit_profiled(recording).await?.map(|times| times.iter().map(|(_, t)| t).sum()))
    }

    /// A failed submission, with the earlier unscoped error that usually explains it.
    fn gpu_error(&self, recording: &Recording, error: wgpu::Error) -> WeftError {
        let names: Vec<String> = recording.kernels().map(|v| v.to_string()).collect();
        let mut reason = error.to_string();
        if let Some(earlier) = self.take_uncaptured_error() {
            reason = format!("{reason}\ncaused by an earlier error: {earlier}");
        }
        WeftError::Gpu { context: format!("a submission of [{}]", names.join(", ")), reason }
    }
}
