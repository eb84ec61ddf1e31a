//! Recording dispatches and submitting them to the GPU as one command buffer.
//!
//! Kernel functions in `kernels/` only build [`Dispatch`]es (pipeline + bind group + grid) and
//! push them onto a [`Recording`]; [`GpuContext::submit`] is the one place that encodes and
//! submits. A recording holds its bind groups, so submitting it again reruns the same work
//! without creating anything.

use wgpu::util::DeviceExt;

use crate::error::{Result, WeftError};
use crate::gpu::GpuContext;
use crate::gpu::pipelines::ShaderVariant;

/// One compute dispatch, ready to record.
#[derive(Debug)]
pub struct Dispatch {
    variant: ShaderVariant,
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    workgroups: [u32; 3],
}

/// An ordered list of dispatches that run as one submission.
#[derive(Debug, Default)]
pub struct Recording {
    dispatches: Vec<Dispatch>,
}

impl Recording {
    pub fn new() -> Self {
        Recording::default()
    }

    pub fn push(&mut self, dispatch: Dispatch) {
        self.dispatches.push(dispatch);
    }

    pub fn len(&self) -> usize {
        self.dispatches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    /// The kernels recorded, in order (for logs and tests).
    pub fn kernels(&self) -> impl Iterator<Item = ShaderVariant> + '_ {
        self.dispatches.iter().map(|d| d.variant)
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
    /// Build a dispatch of `variant`: binding 0 is a uniform holding `params`, bindings 1.. are
    /// `storage` in order.
    pub(crate) fn dispatch(
        &self,
        variant: ShaderVariant,
        params: &[u8],
        storage: &[wgpu::BindingResource<'_>],
        workgroups: [u32; 3],
    ) -> Result<Dispatch> {
        let max = self.limits().max_compute_workgroups_per_dimension;
        if workgroups.iter().any(|&g| g > max) {
            return Err(WeftError::shape(
                "dispatch",
                format!("{variant} needs a grid of {workgroups:?} workgroups; this device allows {max} per dimension"),
            ));
        }
        let pipeline = self.pipelines.get(&self.device, variant)?;
        let uniform = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: params,
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() }];
        entries.extend(
            storage
                .iter()
                .enumerate()
                .map(|(i, r)| wgpu::BindGroupEntry { binding: i as u32 + 1, resource: r.clone() }),
        );
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("kernel bindings"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        Ok(Dispatch { variant, pipeline, bind_group, workgroups })
    }

    fn encode(&self, recording: &Recording, timestamps: Option<&wgpu::QuerySet>) -> wgpu::CommandEncoder {
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("weft step"),
                timestamp_writes: timestamps.map(|query_set| wgpu::ComputePassTimestampWrites {
                    query_set,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                }),
            });
            for d in &recording.dispatches {
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, &d.bind_group, &[]);
                pass.dispatch_workgroups(d.workgroups[0], d.workgroups[1], d.workgroups[2]);
            }
        }
        encoder
    }

    /// Run a recording as one submission and wait for it; GPU validation errors come back as
    /// [`WeftError::Gpu`].
    pub async fn submit(&self, recording: &Recording) -> Result<()> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let encoder = self.encode(recording, None);
        self.queue.submit([encoder.finish()]);
        if let Some(error) = self.settle(scope.pop()).await? {
            return Err(self.gpu_error(recording, error));
        }
        Ok(())
    }

    /// Run a recording and read `result` back, in one submission: the step's only readback.
    pub async fn submit_and_read(&self, recording: &Recording, result: &crate::gpu::GpuTensor) -> Result<Vec<u8>> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut encoder = self.encode(recording, None);
        let readback = self.encode_readback(&mut encoder, result);
        self.queue.submit([encoder.finish()]);
        if let Some(error) = self.settle(scope.pop()).await? {
            return Err(self.gpu_error(recording, error));
        }
        self.finish_readback(readback).await
    }

    /// Like [`submit`](Self::submit), and return the GPU time between the start and the end of
    /// the pass in seconds, where the adapter has timestamp queries.
    pub async fn submit_timed(&self, recording: &Recording) -> Result<Option<f64>> {
        if !self.features().timestamp_query {
            self.submit(recording).await?;
            return Ok(None);
        }
        let queries = self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("pass timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let resolve = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let readback = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps readback"),
            size: 16,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut encoder = self.encode(recording, Some(&queries));
        encoder.resolve_query_set(&queries, 0..2, &resolve, 0);
        encoder.copy_buffer_to_buffer(&resolve, 0, &readback, 0, 16);
        self.queue.submit([encoder.finish()]);
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
        let ticks: [u64; 2] = bytemuck::pod_read_unaligned(&view[..16]);
        let ns = ticks[1].saturating_sub(ticks[0]) as f64 * f64::from(self.queue.get_timestamp_period());
        Ok(Some(ns * 1e-9))
    }
}

impl GpuContext {
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
