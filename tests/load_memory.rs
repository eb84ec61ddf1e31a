//! Loading a model holds a bounded amount of host memory whatever the model's size (issue 38
//! item 4): tensors go from the file to the GPU a slice at a time through a fixed staging ring,
//! each slice's file pages dropped once copied, so the host holds at most [`HOST_BOUND_BYTES`]
//! beyond the device's allocations, whatever the largest tensor (before slices, a whole tensor's
//! pages stayed until it was uploaded: 345 MiB for the 600 MB model, now 192 MiB).
//!
//! How it is measured: the peak resident set size of the load (`VmHWM` of /proc/self/status,
//! reset through /proc/self/clear_refs just before) less the bytes weft allocated in GPU buffers
//! and textures during it (`GpuContext::creations().bytes`). On lavapipe the device's memory is
//! this process's own, so the resident set includes the weights "on the GPU"; what is left after
//! taking them away is what the host holds beside them: the process's baseline (the binary, the
//! driver), the file's pages mapped while read, the staging ring and temporaries. Both figures are
//! printed. (On a discrete GPU the weights are not in the resident set at all, so the same
//! difference only overstates the host's share.)
//!
//! The model is written by `weft::model::synthetic`: Llama 3.2 1B's shape cut to 13 layers in
//! Q4_1 (about 600 MB, seconds to write and load), or with `WEFT_FULL=1` (`cargo xtask test
//! --full`) Llama 3.1 8B's shape in Q4_1, 5.0 GB: larger than 4 GiB, so no 32-bit offset or
//! whole-file buffer can hold it.

use weft::DType;
use weft::gpu::GpuOptions;
use weft::model::gguf::Metadata;
use weft::model::load::ModelFiles;
use weft::model::synthetic::{Shape, shape, write_gguf};

/// The host memory a load may hold beyond the device's allocations: less than the measured
/// figure plus the largest tensor, so a load that held a whole tensor again would fail.
const HOST_BOUND_BYTES: u64 = 300 << 20;

/// A field of /proc/self/status in bytes (it is given in kB).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field} in status"));
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

#[test]
fn loading_holds_bounded_host_memory() {
    if !cfg!(target_os = "linux") {
        eprintln!("skipped: the resident set is read from Linux's /proc");
        return;
    }
    let Some(ctx) = weft::gpu::open_or_skip(GpuOptions::default()).unwrap() else { return };
    let full = std::env::var("WEFT_FULL").as_deref() == Ok("1");
    let (model, dtype): (Shape, DType) = if full {
        (shape("llama-3.1-8b").unwrap(), DType::Q4_1)
    } else {
        (Shape { num_layers: 13, ..shape("llama-3.2-1b").unwrap() }, DType::Q4_1)
    };
    let tokenizer: Metadata =
        weft::model::tiny::tokenizer_metadata().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let dir = TempDir(std::env::temp_dir().join(format!("weft-load-memory-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join(format!("{}-{}.gguf", model.name, model.num_layers));
    let started = std::time::Instant::now();
    let file = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path).unwrap());
    let written = write_gguf(&model, dtype, &tokenizer, 5, file, &mut |_, _| {}).unwrap();
    let wrote_s = started.elapsed().as_secs_f64();

    let files = ModelFiles::open(&path).unwrap();
    let largest = files.largest_tensor_bytes();
    // Start the peak afresh: writing the file is not the load.
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let before_rss = status_bytes("VmRSS:");
    let before_device = ctx.creations().bytes;
    let started = std::time::Instant::now();
    // The resident set's file-backed and anonymous shares, sampled: what the peak was made of.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut most = (0, 0);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                most = (most.0.max(status_bytes("RssFile:")), most.1.max(status_bytes("RssAnon:")));
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            most
        })
    };
    let factory = weft::gpu::GpuTensorFactory::new(ctx.clone());
    let architecture = files.architecture(&factory, &mut |_, _| {}).unwrap();
    let loaded_s = started.elapsed().as_secs_f64();
    let peak = status_bytes("VmHWM:");
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (most_file, most_anon) = sampler.join().unwrap();
    let device = ctx.creations().bytes - before_device;
    drop(architecture);
    drop(files);

    let host = peak.saturating_sub(device);
    let bound = HOST_BOUND_BYTES;
    eprintln!(
        "load memory: {} ({:.0} MiB file, written in {wrote_s:.1} s, loaded in {loaded_s:.1} s): peak RSS \
         {:.0} MiB (before the load {:.0} MiB), GPU allocations {:.0} MiB, peak RSS less GPU allocations \
         {:.0} MiB; bound {:.0} MiB (the largest tensor {:.0} MiB); sampled peaks: file-backed {:.0} \
         MiB, anonymous {:.0} MiB",
        model.name,
        mib(written),
        mib(peak),
        mib(before_rss),
        mib(device),
        mib(host),
        mib(bound),
        mib(largest),
        mib(most_file),
        mib(most_anon),
    );
    assert!(device >= files_bytes_floor(written), "the GPU allocations ({device} bytes) cannot hold the weights");
    assert!(
        host <= bound,
        "loading held {:.0} MiB of host memory beside the GPU's, over {:.0} MiB",
        mib(host),
        mib(bound)
    );
}

/// A GGUF file in memory read as the browser reads one (`GgufFile::from_reader`), logging each
/// read's length, and failing every read that starts inside `fail_at`.
struct LoggedReader {
    bytes: Vec<u8>,
    reads: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    fail_at: std::ops::Range<u64>,
}

impl weft::model::gguf::ReadAt for LoggedReader {
    fn len_bytes(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        if self.fail_at.contains(&offset) {
            return Err("the stored file went away".into());
        }
        self.reads.lock().unwrap().push(buf.len());
        let start = offset as usize;
        buf.copy_from_slice(&self.bytes[start..start + buf.len()]);
        Ok(())
    }
}

/// Bytes per upload slice in the tests below: a few hundred, a multiple of 16 (as every slice
/// is) that is no multiple of a Q8_0 block (34 bytes) nor of the tiny model's rows, so slices
/// cut through blocks and rows, and through the seams of projections uploaded as one.
const SMALL_SLICE_BYTES: u64 = 992;

fn tiny_q8_gguf() -> Vec<u8> {
    let c = weft::model::tiny::tiny_config();
    weft::model::tiny::gguf_bytes(&c, &weft::model::tiny::random_weights(&c, 21, DType::Q8_0), DType::Q8_0)
}

/// The browser's loading path: a model read in slices of a few hundred bytes (each tensor read
/// and uploaded a slice at a time, never whole) serves the same greedy tokens as the same file
/// held in memory and uploaded a tensor at a time. Exact equality: the GPU's weights are the
/// same bytes either way, so the tokens are too.
#[test]
fn a_model_read_in_slices_serves_the_same_tokens_as_one_in_memory() {
    use weft::engine::request::{GenerationParams, InferenceRequest, Prompt};
    let Some(ctx) = weft::gpu::open_or_skip(GpuOptions::default()).unwrap() else { return };
    let small = GpuOptions { upload_slice_bytes: Some(SMALL_SLICE_BYTES), ..GpuOptions::default() };
    let Some(small_ctx) = weft::gpu::open_or_skip(small).unwrap() else { return };
    let bytes = tiny_q8_gguf();
    let largest = ModelFiles::from_gguf_bytes("tiny.gguf", bytes.clone()).unwrap().largest_tensor_bytes();
    assert!(largest > 4 * SMALL_SLICE_BYTES, "the largest tensor ({largest} bytes) is not several slices");
    let reads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader = Box::new(LoggedReader { bytes: bytes.clone(), reads: reads.clone(), fail_at: 0..0 });
    let request = || {
        let params = GenerationParams {
            sampling: weft::sampling::SamplingParams::greedy(),
            max_tokens: Some(12),
            ignore_eos: true,
            ..Default::default()
        };
        InferenceRequest::new(Prompt::Text("slices of a file".into()), params)
    };
    let tokens = |builder: weft::EngineBuilder, ctx: &std::sync::Arc<weft::gpu::GpuContext>| {
        let engine = builder.kv_memory_bytes(1 << 20).build_on(ctx.clone()).unwrap();
        let tokens = weft::rt::block_on(engine.infer(request())).unwrap().token_ids;
        engine.shutdown();
        tokens
    };
    let in_memory = tokens(weft::EngineBuilder::from_gguf_bytes("tiny.gguf", bytes.clone()).unwrap(), &ctx);
    let builder = weft::EngineBuilder::from_gguf_reader("tiny.gguf", reader).unwrap();
    // The headers are parsed (in windows of a MiB); every read from here on is a tensor's.
    let header_reads = reads.lock().unwrap().len();
    let read = tokens(builder, &small_ctx);
    assert_eq!(read, in_memory);
    assert_eq!(read.len(), 12);
    let reads = reads.lock().unwrap();
    let tensor_reads = &reads[header_reads..];
    let most = tensor_reads.iter().copied().max().unwrap();
    // A weight texture (the CPU family's) is written in whole groups of 16 rows, so a slice is
    // at least one group; a norm is read whole (one row).
    let gguf = weft::model::gguf::GgufFile::from_bytes("tiny.gguf", bytes.clone()).unwrap();
    let row_bytes = |t: &weft::model::gguf::TensorInfo| t.size_bytes() / t.dims.iter().skip(1).product::<u64>().max(1);
    let group = gguf.tensors.iter().map(|t| 16 * row_bytes(t)).max().unwrap();
    let allowed = SMALL_SLICE_BYTES.max(group);
    assert!(most as u64 <= allowed, "a tensor read of {most} bytes; slices are {SMALL_SLICE_BYTES}, a group {group}");
    eprintln!(
        "{} reads of a {}-byte file ({} of headers), the largest tensor read {most} bytes (largest tensor {largest})",
        reads.len(),
        bytes.len(),
        header_reads
    );
}

/// A read that fails partway through a tensor fails the load with an error that names the
/// file, the tensor and the bytes, and says why the read failed.
#[test]
fn a_read_failing_mid_tensor_names_the_tensor() {
    let small = GpuOptions { upload_slice_bytes: Some(SMALL_SLICE_BYTES), ..GpuOptions::default() };
    let Some(ctx) = weft::gpu::open_or_skip(small).unwrap() else { return };
    let bytes = tiny_q8_gguf();
    let gguf = weft::model::gguf::GgufFile::from_bytes("tiny.gguf", bytes.clone()).unwrap();
    let info = gguf.tensors.iter().max_by_key(|t| t.size_bytes()).unwrap();
    let start = gguf.data_offset() + info.offset;
    // The first slices of the tensor read; one halfway through fails.
    let fail_at = start + info.size_bytes() / 2..start + info.size_bytes();
    let reads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader = Box::new(LoggedReader { bytes: bytes.clone(), reads, fail_at });
    let err = weft::EngineBuilder::from_gguf_reader("tiny.gguf", reader)
        .unwrap()
        .kv_memory_bytes(1 << 20)
        .build_on(ctx)
        .err()
        .expect("a load whose reads fail must fail");
    let message = err.to_string();
    eprintln!("{message}");
    assert!(message.contains("tiny.gguf"), "the file is not named: {message}");
    assert!(message.contains(&format!("cannot read tensor {}", info.name)), "the tensor is not named: {message}");
    assert!(message.contains("the stored file went away"), "the reader's reason is lost: {message}");
}

/// A directory removed when the test ends, passed or not (the full model's file is 5.0 GB).
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The fewest device bytes a file's weights take: its bytes less the tokenizer's and headers'
/// (a few MiB at most).
fn files_bytes_floor(written: u64) -> u64 {
    written.saturating_sub(16 << 20)
}
