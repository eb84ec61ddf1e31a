//! Submitting recordings: a recording submitted again unchanged reuses the command buffer
//! encoded ahead of time and still sees the inputs written since; a changed recording does
//! not; a profiled step may have more dispatches than one timestamp query set holds.

use weft::DType;
use weft::gpu::Recording;
use weft::gpu::kernels::elementwise::{add, scale};
use weft::tensor::TensorFactory;

use crate::common::*;

/// Exact: adds and power-of-two scales of small integers.
#[test]
fn a_resubmitted_recording_reads_its_new_inputs() {
    let Some(f) = gpu() else { return };
    let acc = f.zeros(&[4], DType::F32).unwrap();
    let delta = f.upload_f32(&[4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let mut rec = Recording::new();
    add(ctx(f), &mut rec, &acc, &delta).unwrap();
    let submit = |rec: &Recording| {
        let bytes = weft::rt::block_on(ctx(f).submit_and_read(rec, &acc)).unwrap();
        bytemuck::pod_collect_to_vec::<u8, f32>(&bytes)
    };
    assert_eq!(submit(&rec), [1.0, 2.0, 3.0, 4.0]);
    // The second and third submissions go out as encoded during the one before.
    f.write(&delta, bytemuck::cast_slice(&[10.0f32, 20.0, 30.0, 40.0])).unwrap();
    assert_eq!(submit(&rec), [11.0, 22.0, 33.0, 44.0]);
    f.write(&delta, bytemuck::cast_slice(&[0.5f32; 4])).unwrap();
    assert_eq!(submit(&rec), [11.5, 22.5, 33.5, 44.5]);
    // A changed recording is encoded afresh.
    scale(ctx(f), &mut rec, &acc, 2.0).unwrap();
    assert_eq!(submit(&rec), [24.0, 46.0, 68.0, 90.0]);
    rec.clear();
    scale(ctx(f), &mut rec, &acc, 0.5).unwrap();
    assert_eq!(submit(&rec), [12.0, 23.0, 34.0, 45.0]);
    // Reading back another tensor after the same recording: not the encoded-ahead copy.
    let bytes = weft::rt::block_on(ctx(f).submit_and_read(&rec, &delta)).unwrap();
    assert_eq!(bytemuck::pod_collect_to_vec::<u8, f32>(&bytes), [0.5; 4]);
}

/// More dispatches than one timestamp query set holds (4096 timestamps, two per dispatch).
#[test]
fn a_long_step_can_be_profiled() {
    let Some(f) = gpu() else { return };
    if !ctx(f).features().timestamp_query {
        return;
    }
    let x = f.upload_f32(&[3], &[1.0, -2.0, 3.0]).unwrap();
    let mut rec = Recording::new();
    let n = 2100;
    for i in 0..n {
        scale(ctx(f), &mut rec, &x, if i % 2 == 0 { 2.0 } else { 0.5 }).unwrap();
    }
    let times = weft::rt::block_on(ctx(f).submit_profiled(&rec)).unwrap().expect("timestamps");
    assert_eq!(times.len(), n);
    assert!(times.iter().all(|(v, t)| v.kernel == "scale" && t.is_finite() && *t >= 0.0));
    assert_eq!(read_f32(f, &x), [1.0, -2.0, 3.0]);
}
