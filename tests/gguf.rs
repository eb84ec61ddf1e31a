//! The GGUF reader's memory promise, measured: whatever the input, parsing allocates at most a
//! small constant factor of the file's length, and a mapped file is never copied.
//!
//! A counting global allocator records the peak of live bytes allocated by the current thread,
//! so tests running in parallel threads do not disturb each other's numbers.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use weft::model::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};

struct CountingAllocator;

thread_local! {
    static LIVE_BYTES: Cell<isize> = const { Cell::new(0) };
    static PEAK_BYTES: Cell<isize> = const { Cell::new(0) };
}

fn record(delta_bytes: isize) {
    // `try_with`: the thread's counters may be gone while the thread itself is being torn down.
    let _ = LIVE_BYTES.try_with(|live| {
        let now = live.get() + delta_bytes;
        live.set(now);
        let _ = PEAK_BYTES.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is forwarded to `System` unchanged; the counters only observe sizes.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            record(layout.size() as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        record(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_ptr = unsafe { System.realloc(ptr, layout, new_size) };
        if !new_ptr.is_null() {
            record(new_size as isize - layout.size() as isize);
        }
        new_ptr
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// The most bytes `f` held allocated at once on this thread, beyond what was live before it.
fn peak_bytes_during(f: impl FnOnce()) -> usize {
    let before = LIVE_BYTES.with(Cell::get);
    PEAK_BYTES.with(|peak| peak.set(before));
    f();
    (PEAK_BYTES.with(Cell::get) - before).max(0) as usize
}

/// What parsing `len_bytes` of file may allocate: an in-memory metadata value is 32 bytes and
/// takes at least one byte of the file; the rest (map nodes, tensor infos, one error message) is
/// smaller per file byte. The constant covers fixed costs such as the message of an error.
fn allowed_bytes(len_bytes: usize) -> usize {
    40 * len_bytes + 64 * 1024
}

fn assert_parse_within_bound(bytes: &[u8]) {
    let input = bytes.to_vec();
    let peak = peak_bytes_during(|| drop(GgufFile::from_bytes("t.gguf", input)));
    assert!(
        peak <= allowed_bytes(bytes.len()),
        "parsing {} bytes allocated {peak} bytes (the bound is {})",
        bytes.len(),
        allowed_bytes(bytes.len())
    );
}

fn header(tensor_count: u64, metadata_count: u64) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&tensor_count.to_le_bytes());
    out.extend_from_slice(&metadata_count.to_le_bytes());
    out
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A metadata entry holding an array header that claims `count` elements of `elem_type`.
fn array_entry(elem_type: u32, count: u64) -> Vec<u8> {
    let mut out = header(0, 1);
    put_string(&mut out, "arr");
    out.extend_from_slice(&9u32.to_le_bytes());
    out.extend_from_slice(&elem_type.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out
}

fn small_model() -> Vec<u8> {
    let tokens: Vec<MetaValue> = (0..50).map(|i| MetaValue::String(format!("tok{i}"))).collect();
    let scores: Vec<MetaValue> = (0..50).map(|i| MetaValue::F32(i as f32)).collect();
    GgufWriter::new()
        .metadata("general.architecture", MetaValue::String("llama".into()))
        .metadata("llama.block_count", MetaValue::U32(1))
        .metadata("tokenizer.ggml.tokens", MetaValue::Array(tokens))
        .metadata("tokenizer.ggml.scores", MetaValue::Array(scores))
        .tensor("token_embd.weight", &[32, 4], GgmlType::Q8_0, &[1; 4 * 34])
        .tensor("output_norm.weight", &[32], GgmlType::F32, &[0; 128])
        .to_bytes()
}

#[test]
fn hostile_headers_allocate_nothing_they_claim() {
    let mut cases = vec![header(u64::MAX, 0), header(0, u64::MAX), header(1 << 40, 1 << 40)];
    for (elem_type, count) in [(0, u64::MAX), (0, 1 << 32), (8, 1 << 40), (9, 1 << 40), (12, 1 << 30)] {
        let mut bytes = array_entry(elem_type, count);
        bytes.resize(bytes.len() + 4096, 0);
        cases.push(bytes);
    }
    let mut long_string = header(0, 1);
    long_string.extend_from_slice(&(1u64 << 50).to_le_bytes());
    long_string.resize(long_string.len() + 4096, b'a');
    cases.push(long_string);
    for bytes in &cases {
        assert!(GgufFile::from_bytes("t.gguf", bytes.clone()).is_err());
        assert_parse_within_bound(bytes);
    }
}

#[test]
fn the_largest_honest_array_stays_within_the_bound() {
    // Every byte after the header is one u8 element: the worst ratio of memory to file.
    let count = 100_000;
    let mut bytes = array_entry(0, count);
    bytes.resize(bytes.len() + count as usize, 7);
    let file = GgufFile::from_bytes("t.gguf", bytes.clone()).unwrap();
    assert_eq!(file.get_i64_array("arr").map(|a| a.len()), Some(count as usize));
    assert_parse_within_bound(&bytes);
}

#[test]
fn corrupted_files_stay_within_the_bound() {
    let valid = small_model();
    let file = GgufFile::from_bytes("t.gguf", valid.clone()).unwrap();
    assert_eq!(file.get_str_array("tokenizer.ggml.tokens").map(|t| t.len()), Some(50));
    assert_eq!(&*file.tensor_bytes(file.tensor("token_embd.weight").unwrap()).unwrap(), &[1; 4 * 34][..]);
    assert_parse_within_bound(&valid);
    for at in 0..valid.len() {
        for corrupt in [0x00, 0xFF, valid[at] ^ 0x40] {
            let mut bytes = valid.clone();
            bytes[at] = corrupt;
            assert_parse_within_bound(&bytes);
        }
        assert_parse_within_bound(&valid[..at]);
    }
}

#[test]
fn opening_the_real_model_does_not_copy_it() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!("skipping opening_the_real_model_does_not_copy_it: {} is absent", path.display());
        return;
    }
    let file_bytes = std::fs::metadata(&path).unwrap().len() as usize;
    let mut tensor_count = 0;
    let peak = peak_bytes_during(|| {
        let file = GgufFile::open(&path).unwrap();
        file.check_tensor_types().unwrap();
        tensor_count = file.tensors.len();
    });
    assert_eq!(tensor_count, 272);
    // The vocabulary and merges (about 100k short strings) dominate; the tensor data is mapped.
    assert!(peak < file_bytes / 8, "opening a {file_bytes}-byte file allocated {peak} bytes");
}
