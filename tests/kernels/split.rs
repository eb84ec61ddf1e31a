//! Tensors larger than one storage binding: with bindings capped at 1 MiB, weights split over
//! several buffers, and upload/download, views, matmul and embedding still see one tensor.

use weft::DType;
use weft::gpu::Recording;
use weft::gpu::kernels::embedding::embedding;
use weft::gpu::kernels::matmul::matmul;
use weft::tensor::TensorFactory;

use crate::common::*;

#[test]
fn big_weights_split_and_still_multiply_and_gather() {
    let Some(f) = gpu_with_tiny_bindings() else { return };
    assert_eq!(f.context().max_binding_bytes(), 1 << 20);
    let cases = [(DType::F32, 700, 512, false), (DType::Q8_0, 2100, 512, false), (DType::Q4_1, 1800, 1024, false)];
    // Textures split at the same cap (lavapipe's family puts weights in textures).
    let textures = [(DType::Q8_0, 2100, 512, true), (DType::Q4_1, 1800, 1024, true)];
    for (dtype, n, k, texture) in cases.into_iter().chain(textures) {
        let (bytes, w) = weights(dtype, n * k, 77);
        let wt =
            if texture { f.upload_weight(&[n, k], dtype, &bytes) } else { f.upload(&[n, k], dtype, &bytes) }.unwrap();
        let in_texture = f.context().kernel_family() == weft::gpu::KernelFamily::Cpu && texture;
        assert!(wt.parts().iter().all(|p| p.in_texture() == in_texture));
        assert!(wt.parts().len() > 1, "{dtype} {n}x{k} should split");
        assert!(wt.parts().iter().all(|p| (p.num_rows() * wt.row_bytes()) as u64 <= 1 << 20));
        assert_eq!(weft::rt::block_on(f.download(&wt)).unwrap(), bytes, "{dtype} round trip");

        // A view spanning a part boundary reads back the right rows.
        let boundary = wt.parts()[0].rows.end;
        let view = wt.slice_rows(boundary - 3..boundary + 2).unwrap();
        let rb = wt.row_bytes();
        assert_eq!(weft::rt::block_on(f.download(&view)).unwrap(), bytes[(boundary - 3) * rb..(boundary + 2) * rb]);
        if in_texture {
            // Texture rows sit in groups of 16: a kernel cannot start reading mid-group.
            let x = f.upload_f32(&[1, k], &random(k, 79, 1.0)).unwrap();
            let y = f.zeros(&[1, view.shape()[0]], DType::F32).unwrap();
            let err = matmul(ctx(f), &mut Recording::new(), &x, &view, &y).unwrap_err();
            assert!(err.to_string().contains("multiple of 16"), "{err}");
        }

        let m = 3;
        let x = random(m * k, 78, 1.0);
        let xt = f.upload_f32(&[m, k], &x).unwrap();
        let yt = f.zeros(&[m, n], DType::F32).unwrap();
        let ids: Vec<u32> = vec![0, boundary as u32 - 1, boundary as u32, n as u32 - 1];
        let it = f.upload_u32(&[ids.len()], &ids).unwrap();
        let et = f.zeros(&[ids.len(), k], DType::F32).unwrap();
        let mut rec = Recording::new();
        matmul(ctx(f), &mut rec, &xt, &wt, &yt).unwrap();
        embedding(ctx(f), &mut rec, &wt, &it, &et).unwrap();
        assert_eq!(rec.len(), 2 * wt.parts().len(), "one dispatch per part and kernel");
        run(f, &rec);
        let want = weft::cpu::matmul(&x, &w, m, k, n);
        // Same bound as the matmul tests; |x|, |w| <= 1 so Σ|x·w| <= k.
        assert_close(&format!("split {dtype} matmul"), &read_f32(f, &yt), &want, |_| {
            2.0 * (k as f64 + 2.0) * U * k as f64
        });
        assert!(read_f32(f, &et) == weft::cpu::embedding(&w, k, &ids), "split {dtype} embedding");
    }
}

#[test]
fn activations_that_split_are_refused_with_advice() {
    let Some(f) = gpu_with_tiny_bindings() else { return };
    let x = f.zeros(&[600, 512], DType::F32).unwrap(); // 1.2 MB: two parts
    let w = f.zeros(&[8, 512], DType::F32).unwrap();
    let y = f.zeros(&[600, 8], DType::F32).unwrap();
    let err = matmul(ctx(f), &mut Recording::new(), &x, &w, &y).unwrap_err();
    assert!(err.to_string().contains("smaller batch"), "{err}");
}

#[test]
fn a_row_larger_than_a_binding_is_refused() {
    let Some(f) = gpu_with_tiny_bindings() else { return };
    let err = f.zeros(&[2, 300_000], DType::F32).unwrap_err();
    assert!(err.to_string().contains("more than the 1048576 bytes"), "{err}");
}

/// A prefix view (a narrower layer's activations in the widest layer's buffer) reads the
/// buffer's first elements with the new row width; one past the tensor, or of a tensor split
/// over several buffers, is refused.
#[test]
fn prefix_views_read_the_first_elements_and_refuse_what_does_not_fit() {
    let Some(f) = gpu_with_tiny_bindings() else { return };
    let values: Vec<f32> = (0..24).map(|v| v as f32).collect();
    let t = f.upload_f32(&[4, 6], &values).unwrap();
    let narrow = t.prefix(&[4, 3]).unwrap();
    assert_eq!((narrow.shape(), read_f32(f, &narrow)), (&[4, 3][..], values[..12].to_vec()));
    let err = t.prefix(&[5, 6]).unwrap_err();
    assert!(err.to_string().contains("does not fit the first elements"), "{err}");
    let split = f.zeros(&[600, 512], DType::F32).unwrap(); // 1.2 MB: two parts
    assert!(split.prefix(&[600, 256]).is_err());
}
