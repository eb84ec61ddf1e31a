//! How fast the device moves memory: the bound a decode step, which reads every weight once,
//! cannot beat. `weft bench --bandwidth` reports it, and the device check divides a big model's
//! decode rate by it.

use web_time::Instant;

use super::GpuContext;
use crate::Result;

/// The copied buffer's size where the device allows it: large enough that a copy is bound by
/// memory, not by caches or launch cost, on every GPU weft targets.
const PROBE_BYTES: u64 = 256 << 20;
/// Each timed round lasts at least this long, so submission overhead stays a small share.
const ROUND_SECONDS: f64 = 0.05;
const ROUNDS: usize = 5;

impl GpuContext {
    /// Bytes per second a buffer-to-buffer copy moves, reads and writes both counted: the
    /// median of five rounds of back-to-back copies in one submission, after an untimed one
    /// that also sizes the rounds. Two buffers are made and dropped: call it before a model
    /// loads, not in a warm engine.
    pub async fn copy_bandwidth(&self) -> Result<f64> {
        let size = PROBE_BYTES.min(self.device_limits().max_buffer_size) / 4 * 4;
        let src = self.create_buffer("probe source", size, wgpu::BufferUsages::COPY_SRC);
        let dst = self.create_buffer("probe destination", size, wgpu::BufferUsages::COPY_DST);
        let first = self.timed_copies(&src, &dst, 1).await?;
        let copies = (ROUND_SECONDS / first.max(1e-6)).ceil().clamp(1.0, 256.0) as usize;
        let mut rates = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let seconds = self.timed_copies(&src, &dst, copies).await?;
            rates.push(2.0 * size as f64 * copies as f64 / seconds.max(1e-9));
        }
        rates.sort_by(f64::total_cmp);
        Ok(rates[ROUNDS / 2])
    }

    /// Seconds from submitting `copies` copies of `src` into `dst` until the GPU has done them.
    async fn timed_copies(&self, src: &wgpu::Buffer, dst: &wgpu::Buffer, copies: usize) -> Result<f64> {
        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("probe") });
        for _ in 0..copies {
            encoder.copy_buffer_to_buffer(src, 0, dst, 0, src.size());
        }
        let (done, finished) = futures::channel::oneshot::channel();
        let started = Instant::now();
        self.submit_commands([encoder.finish()])?;
        self.queue.on_submitted_work_done(move || {
            let _ = done.send(());
        });
        let _ = self.settle(finished).await?;
        Ok(started.elapsed().as_secs_f64())
    }
}
