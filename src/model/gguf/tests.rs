//! The reader against hand-made and hostile files, the writer round trip, and the real model.

use super::writer::{put_string, put_value, value_type_id};
use super::*;
use crate::quant::{DType, quantize};
use crate::sampling::SamplerRng as Rng;
use crate::{Result, WeftError};

/// `len` reproducible random bytes.
fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

/// Every read a [`LoggedReader`] was asked for: (offset, length).
type ReadLog = std::sync::Arc<std::sync::Mutex<Vec<(u64, usize)>>>;

/// A file read through [`ReadAt`] as the browser reads one: every read is logged, and a read
/// that touches byte `fail_at` fails.
struct LoggedReader {
    bytes: Vec<u8>,
    reads: ReadLog,
    fail_at: Option<u64>,
}

impl LoggedReader {
    fn boxed(bytes: Vec<u8>, fail_at: Option<u64>) -> (Box<dyn ReadAt>, ReadLog) {
        let reads = std::sync::Arc::default();
        (Box::new(LoggedReader { bytes, reads: std::sync::Arc::clone(&reads), fail_at }), reads)
    }
}

impl ReadAt for LoggedReader {
    fn len_bytes(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::result::Result<(), String> {
        self.reads.lock().unwrap().push((offset, buf.len()));
        let range = offset as usize..offset as usize + buf.len();
        if self.fail_at.is_some_and(|at| range.contains(&(at as usize))) {
            return Err("the disk is on fire".into());
        }
        buf.copy_from_slice(&self.bytes[range]);
        Ok(())
    }
}

/// Parses `bytes` held in memory, and checks that reading them in slices through a [`ReadAt`]
/// comes to the same: the same error text, or the same layout and every tensor's bytes.
fn parse(bytes: Vec<u8>) -> Result<GgufFile> {
    let read = GgufFile::from_reader("test.gguf", LoggedReader::boxed(bytes.clone(), None).0);
    let owned = GgufFile::from_bytes("test.gguf", bytes);
    match (&owned, &read) {
        (Ok(a), Ok(b)) => {
            assert_eq!((a.version, a.alignment, a.data_offset), (b.version, b.alignment, b.data_offset));
            assert_eq!((&a.metadata, &a.tensors), (&b.metadata, &b.tensors));
            for info in &a.tensors {
                assert_eq!(a.tensor_bytes(info).unwrap(), b.tensor_bytes(info).unwrap(), "{}", info.name);
            }
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("in memory: {owned:?}; through a reader: {read:?}"),
    }
    owned
}

/// The one-line detail of a parse that must fail.
fn parse_err(bytes: Vec<u8>) -> String {
    match parse(bytes) {
        Ok(file) => panic!("expected an error, parsed {file:?}"),
        Err(WeftError::Model { file, detail }) => {
            assert_eq!(file, "test.gguf");
            assert!(!detail.contains('\n'), "multi-line message: {detail}");
            detail
        }
        Err(other) => panic!("expected a Model error, got {other:?}"),
    }
}

fn header(version: u32, tensor_count: u64, metadata_count: u64) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&tensor_count.to_le_bytes());
    out.extend_from_slice(&metadata_count.to_le_bytes());
    out
}

fn put_entry(out: &mut Vec<u8>, key: &str, value: &MetaValue) {
    put_string(out, key);
    out.extend_from_slice(&value_type_id(value).to_le_bytes());
    put_value(out, value);
}

fn put_tensor_info(out: &mut Vec<u8>, name: &str, dims: &[u64], type_id: u32, offset: u64) {
    put_string(out, name);
    out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        out.extend_from_slice(&d.to_le_bytes());
    }
    out.extend_from_slice(&type_id.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
}

/// A hand-made v3 file, for layouts the writer will not produce: the given metadata and tensor
/// infos, padding to 32 bytes, then `data_bytes` zero bytes of data.
fn raw_file(metadata: &[(&str, MetaValue)], infos: &[(&str, &[u64], u32, u64)], data_bytes: usize) -> Vec<u8> {
    let mut out = header(3, infos.len() as u64, metadata.len() as u64);
    for (key, value) in metadata {
        put_entry(&mut out, key, value);
    }
    for &(name, dims, type_id, offset) in infos {
        put_tensor_info(&mut out, name, dims, type_id, offset);
    }
    out.resize(out.len().next_multiple_of(32) + data_bytes, 0);
    out
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A small valid file whose last tensor ends exactly at the end of the file.
fn small_file() -> Vec<u8> {
    let values: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 7.0).collect();
    GgufWriter::new()
        .metadata("general.architecture", MetaValue::String("llama".into()))
        .metadata("llama.block_count", MetaValue::U32(2))
        .metadata("llama.rope.freq_base", MetaValue::F32(10000.0))
        .metadata("tokenizer.ggml.tokens", MetaValue::Array(vec![MetaValue::String("a".into()); 3]))
        .metadata("nested", MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::I16(-2)])]))
        .tensor("a", &[4, 2], GgmlType::F32, &f32_bytes(&values[..8]))
        .tensor("b", &[32], GgmlType::Q8_0, &quantize(DType::Q8_0, &values[..32]).unwrap())
        .tensor("c", &[32, 2], GgmlType::Q4_1, &quantize(DType::Q4_1, &values).unwrap())
        .to_bytes()
}

/// Whatever parsed must keep the reader's promise: every tensor's bytes are its whole data.
fn check_parsed(bytes: Vec<u8>) {
    if let Ok(file) = parse(bytes) {
        for info in &file.tensors {
            assert_eq!(file.tensor_bytes(info).unwrap().len() as u64, info.size_bytes(), "{}", info.name);
        }
    }
}

#[test]
fn a_file_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GgufFile>();
}

#[test]
fn ggml_types_have_ids_names_and_block_layouts() {
    for id in 0..64 {
        assert_eq!(GgmlType::from_u32(id).id(), id);
    }
    assert_eq!(GgmlType::from_u32(0), GgmlType::F32);
    assert_eq!(GgmlType::from_u32(8), GgmlType::Q8_0);
    assert_eq!(GgmlType::from_u32(14), GgmlType::Q6_K);
    assert_eq!(GgmlType::from_u32(30), GgmlType::BF16);
    assert_eq!(GgmlType::from_u32(4), GgmlType::Unknown(4), "Q4_2 was retired");
    assert_eq!(GgmlType::Q6_K.name(), "Q6_K");
    assert_eq!(GgmlType::IQ2_XXS.name(), "IQ2_XXS");
    assert_eq!(GgmlType::Unknown(99).name(), "unknown ggml type 99");
    assert_eq!(GgmlType::Q6_K.block_elems(), Some(256));
    assert_eq!(GgmlType::Q6_K.block_bytes(), Some(210));
    assert_eq!(GgmlType::Q4_K.block_bytes(), Some(144));
    assert_eq!(GgmlType::Q8_0.block_bytes(), Some(34));
    assert_eq!(GgmlType::Unknown(99).block_bytes(), None);
    // The types weft computes with agree with quant.rs.
    for dtype in DType::WEIGHTS {
        let ggml = GgmlType::from_u32(match dtype {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::BF16 => 30,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q2_K => 10,
            DType::Q3_K => 11,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::Q8_K => 15,
            DType::IQ4_NL => 20,
            DType::IQ4_XS => 23,
            DType::MXFP4 => 39,
            DType::IQ2_XS => 17,
            DType::IQ3_XXS => 18,
            DType::IQ3_S => 21,
            DType::IQ2_S => 22,
            DType::U32 => unreachable!("not a weight"),
        });
        assert_eq!(ggml.name(), dtype.name());
        assert_eq!(ggml.block_elems(), Some(dtype.block_elems() as u64));
        assert_eq!(ggml.block_bytes(), Some(dtype.block_bytes() as u64));
    }
}

#[test]
fn tensor_info_shape_size_and_dtype() {
    let info = TensorInfo { name: "w".into(), dims: vec![576, 1536], ggml_type: GgmlType::Q4_1, offset: 0 };
    assert_eq!(info.shape(), vec![1536, 576]);
    assert_eq!(info.num_elems(), 576 * 1536);
    assert_eq!(info.size_bytes(), 576 / 32 * 20 * 1536);
    assert_eq!(info.dtype().unwrap(), DType::Q4_1);
    let bf16 = TensorInfo { ggml_type: GgmlType::BF16, ..info.clone() };
    assert_eq!(bf16.dtype().unwrap(), DType::BF16);
    assert_eq!(bf16.size_bytes(), 576 * 1536 * 2);
    let iq2 = TensorInfo { name: "blk.0.ffn_down.weight".into(), ggml_type: GgmlType::IQ2_XXS, ..info.clone() };
    match iq2.dtype() {
        Err(WeftError::Model { detail, .. }) => assert_eq!(
            detail,
            "tensor blk.0.ffn_down.weight is IQ2_XXS; weft supports F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS, MXFP4, IQ2_XS, IQ3_XXS, IQ3_S, IQ2_S"
        ),
        other => panic!("{other:?}"),
    }
    let scalar = TensorInfo { dims: vec![], ggml_type: GgmlType::F32, ..info.clone() };
    assert_eq!((scalar.num_elems(), scalar.size_bytes(), scalar.shape()), (1, 4, vec![]));
    let overflowing = TensorInfo { dims: vec![u64::MAX, 2], ..info.clone() };
    assert_eq!((overflowing.num_elems(), overflowing.size_bytes()), (u64::MAX, 0));
    let unknown = TensorInfo { ggml_type: GgmlType::Unknown(77), ..info };
    assert_eq!(unknown.size_bytes(), 0);
}

#[test]
fn every_metadata_type_round_trips() {
    let values = [
        ("u8", MetaValue::U8(200)),
        ("i8", MetaValue::I8(-100)),
        ("u16", MetaValue::U16(60000)),
        ("i16", MetaValue::I16(-30000)),
        ("u32", MetaValue::U32(4_000_000_000)),
        ("i32", MetaValue::I32(-2_000_000_000)),
        ("u64", MetaValue::U64(u64::MAX)),
        ("i64", MetaValue::I64(i64::MIN)),
        ("f32", MetaValue::F32(-1.5e-5)),
        ("f64", MetaValue::F64(std::f64::consts::PI)),
        ("true", MetaValue::Bool(true)),
        ("false", MetaValue::Bool(false)),
        ("string", MetaValue::String("héllo, wörld ✓".into())),
        ("empty string", MetaValue::String(String::new())),
        ("empty array", MetaValue::Array(vec![])),
        ("strings", MetaValue::Array(vec![MetaValue::String("x".into()), MetaValue::String("".into())])),
        ("f32s", MetaValue::Array(vec![MetaValue::F32(0.5), MetaValue::F32(-2.0)])),
        ("i32s", MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(-3)])),
        ("u64s", MetaValue::Array(vec![MetaValue::U64(7)])),
        ("bools", MetaValue::Array(vec![MetaValue::Bool(true), MetaValue::Bool(false)])),
        (
            "nested",
            MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::U8(1), MetaValue::U8(2)]),
                MetaValue::Array(vec![MetaValue::String("in".into())]),
                MetaValue::Array(vec![]),
            ]),
        ),
    ];
    let mut writer = GgufWriter::new();
    for (key, value) in &values {
        writer.metadata(key, value.clone());
    }
    writer.metadata("general.architecture", MetaValue::String("llama".into()));
    let file = parse(writer.to_bytes()).unwrap();
    assert_eq!(file.version, 3);
    assert_eq!(file.alignment, 32);
    assert!(file.tensors.is_empty());
    assert_eq!(file.metadata.len(), values.len() + 1);
    for (key, value) in &values {
        assert_eq!(file.get(key), Some(value), "{key}");
    }

    assert_eq!(file.architecture(), Some("llama"));
    assert_eq!(file.get_str("string"), Some("héllo, wörld ✓"));
    assert_eq!(file.get_str("u8"), None);
    assert_eq!(file.get_u64("u8"), Some(200));
    assert_eq!(file.get_u64("u64"), Some(u64::MAX));
    assert_eq!(file.get_u64("i8"), None, "negative");
    assert_eq!(file.get_u64("f32"), None);
    assert_eq!(file.get_u64("missing"), None);
    assert_eq!(file.get_f64("f64"), Some(std::f64::consts::PI));
    assert_eq!(file.get_f64("f32"), Some(-1.5e-5f32 as f64));
    assert_eq!(file.get_f64("i32"), Some(-2e9));
    assert_eq!(file.get_f64("string"), None);
    assert_eq!(file.get_bool("true"), Some(true));
    assert_eq!(file.get_bool("u8"), None);
    assert_eq!(file.get_str_array("strings"), Some(vec!["x", ""]));
    assert_eq!(file.get_str_array("f32s"), None);
    assert_eq!(file.get_str_array("empty array"), Some(vec![]));
    assert_eq!(file.get_f32_array("f32s"), Some(vec![0.5, -2.0]));
    assert_eq!(file.get_f32_array("i32s"), Some(vec![1.0, -3.0]));
    assert_eq!(file.get_f32_array("strings"), None);
    assert_eq!(file.get_i64_array("i32s"), Some(vec![1, -3]));
    assert_eq!(file.get_i64_array("u64s"), Some(vec![7]));
    assert_eq!(file.get_i64_array("f32s"), None);
    assert_eq!(file.get_i64_array("u8"), None, "not an array");
}

#[test]
fn writer_replaces_a_repeated_key() {
    let bytes =
        GgufWriter::new().metadata("k", MetaValue::U8(1)).metadata("k", MetaValue::String("two".into())).to_bytes();
    let file = parse(bytes).unwrap();
    assert_eq!(file.metadata.len(), 1);
    assert_eq!(file.get_str("k"), Some("two"));
}

#[test]
#[should_panic(expected = "mixes element types")]
fn writer_refuses_mixed_arrays() {
    GgufWriter::new().metadata("k", MetaValue::Array(vec![MetaValue::U8(1), MetaValue::I8(1)]));
}

#[test]
#[should_panic(expected = "takes 34 bytes, not 33")]
fn writer_refuses_data_of_the_wrong_size() {
    GgufWriter::new().tensor("t", &[32], GgmlType::Q8_0, &[0; 33]);
}

#[test]
fn tensors_of_several_types_round_trip() {
    let values: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0).collect();
    let f16: Vec<u8> = values[..96].iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
    let bf16: Vec<u8> = values[..10].iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
    let iq2: Vec<u8> = (0..132).map(|i| (i * 7) as u8).collect();
    let tensors: Vec<(&str, Vec<u64>, GgmlType, Vec<u8>)> = vec![
        ("f32", vec![3], GgmlType::F32, f32_bytes(&values[..3])),
        ("f16", vec![32, 3], GgmlType::F16, f16),
        ("q8_0", vec![64, 2], GgmlType::Q8_0, quantize(DType::Q8_0, &values[..128]).unwrap()),
        ("q4_0", vec![32, 2, 2], GgmlType::Q4_0, quantize(DType::Q4_0, &values[..128]).unwrap()),
        ("q4_1", vec![256], GgmlType::Q4_1, quantize(DType::Q4_1, &values).unwrap()),
        ("bf16", vec![5, 2], GgmlType::BF16, bf16),
        ("blk.0.ffn_down.weight", vec![256, 2], GgmlType::IQ2_XXS, iq2),
    ];
    for alignment in [None, Some(1u32), Some(8), Some(64), Some(4096)] {
        let mut writer = GgufWriter::new();
        if let Some(a) = alignment {
            writer.metadata("general.alignment", MetaValue::U32(a));
        }
        for (name, dims, ggml_type, data) in &tensors {
            writer.tensor(name, dims, *ggml_type, data);
        }
        let file = parse(writer.to_bytes()).unwrap();
        let alignment = alignment.map_or(32, u64::from);
        assert_eq!(file.alignment, alignment);
        assert_eq!(file.data_offset % alignment, 0);
        assert_eq!(file.tensors.len(), tensors.len());
        for (info, (name, dims, ggml_type, data)) in file.tensors.iter().zip(&tensors) {
            assert_eq!((&info.name, &info.dims, info.ggml_type), (&name.to_string(), dims, *ggml_type));
            assert_eq!(info.offset % alignment, 0);
            assert_eq!(file.tensor(name), Some(info));
            assert_eq!(&*file.tensor_bytes(info).unwrap(), data.as_slice(), "{name}");
        }
        assert_eq!(file.tensor("q4_0").unwrap().shape(), vec![2, 2, 32]);
        assert_eq!(file.tensor("bf16").unwrap().dtype().unwrap(), DType::BF16);
        assert_eq!(file.tensor("missing"), None);
        match file.check_tensor_types() {
            Err(WeftError::Model { file, detail }) => {
                assert_eq!(file, "test.gguf");
                assert_eq!(
                    detail,
                    "tensor blk.0.ffn_down.weight is IQ2_XXS; weft supports F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS, MXFP4, IQ2_XS, IQ3_XXS, IQ3_S, IQ2_S"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn supported_types_pass_the_type_check() {
    let bytes = GgufWriter::new()
        .tensor("a", &[2], GgmlType::F32, &[0; 8])
        .tensor("b", &[2], GgmlType::BF16, &[0; 4])
        .to_bytes();
    parse(bytes).unwrap().check_tensor_types().unwrap();
}

#[test]
fn version_2_files_are_read() {
    let mut bytes = small_file();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let file = parse(bytes).unwrap();
    assert_eq!(file.version, 2);
    assert_eq!(file.tensors.len(), 3);
}

#[test]
fn bad_magic_and_short_files_are_rejected() {
    assert_eq!(parse_err(vec![]), "not a GGUF file (0 bytes, too short for the magic)");
    assert_eq!(parse_err(b"GGU".to_vec()), "not a GGUF file (3 bytes, too short for the magic)");
    assert_eq!(parse_err(b"\x7fELF and more".to_vec()), "not a GGUF file (bad magic 0x7f454c46)");
    let detail = parse_err(b"GGUF\x03\x00".to_vec());
    assert_eq!(detail, "truncated: the 24-byte header ends past the end of the file");
    let detail = parse_err(header(3, 0, 0)[..20].to_vec());
    assert!(detail.starts_with("truncated: the 24-byte header"), "{detail}");
}

#[test]
fn unsupported_versions_are_rejected() {
    assert_eq!(parse_err(header(1, 0, 0)), "GGUF version 1 is not supported (2 and 3 are)");
    assert_eq!(parse_err(header(4, 0, 0)), "GGUF version 4 is not supported (2 and 3 are)");
    assert_eq!(parse_err(header(3u32.swap_bytes(), 0, 0)), "big-endian GGUF files are not supported");
}

#[test]
fn empty_file_with_only_a_header_is_valid() {
    let file = parse(header(3, 0, 0)).unwrap();
    assert!(file.metadata.is_empty() && file.tensors.is_empty());
    file.check_tensor_types().unwrap();
}

#[test]
fn absurd_counts_and_lengths_are_rejected_before_allocating() {
    let detail = parse_err(header(3, 0, u64::MAX));
    assert!(detail.contains("claims 18446744073709551615 metadata entries"), "{detail}");
    let detail = parse_err(header(3, u64::MAX, 0));
    assert!(detail.contains("claims 18446744073709551615 tensors"), "{detail}");
    // A metadata count that passes the header check but not the entries that follow.
    let mut bytes = header(3, 0, 2);
    put_entry(&mut bytes, "a", &MetaValue::U64(1));
    bytes.resize(bytes.len() + 13, 0xFF);
    assert!(parse_err(bytes).starts_with("truncated: metadata entry 2 of 2"));

    // A key of u64::MAX bytes.
    let mut bytes = header(3, 0, 1);
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    bytes.extend_from_slice(&[0; 16]);
    assert_eq!(parse_err(bytes), "truncated: metadata entry 1 of 1 ends past the end of the file");

    // A string value of u64::MAX bytes.
    let mut bytes = header(3, 0, 1);
    put_string(&mut bytes, "s");
    bytes.extend_from_slice(&8u32.to_le_bytes());
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(parse_err(bytes), "truncated: the value of metadata key s ends past the end of the file");

    // Arrays whose counts cannot fit in what is left.
    for (elem_type, count) in [(0u32, 17u64), (0, u64::MAX), (10, 3), (8, 3), (9, 2)] {
        let mut bytes = header(3, 0, 1);
        put_string(&mut bytes, "arr");
        bytes.extend_from_slice(&9u32.to_le_bytes());
        bytes.extend_from_slice(&elem_type.to_le_bytes());
        bytes.extend_from_slice(&count.to_le_bytes());
        bytes.extend_from_slice(&[0; 16]);
        let detail = parse_err(bytes);
        assert!(
            detail.starts_with(&format!("array of {count} elements of type {elem_type} for key arr cannot fit")),
            "{detail}"
        );
    }

    // A tensor name of u64::MAX bytes.
    let mut bytes = header(3, 2, 0);
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    bytes.extend_from_slice(&[0; 48]);
    assert_eq!(parse_err(bytes), "truncated: tensor info 1 of 2 ends past the end of the file");
}

#[test]
fn unknown_metadata_types_are_rejected() {
    let mut bytes = header(3, 0, 1);
    put_string(&mut bytes, "foo");
    bytes.extend_from_slice(&13u32.to_le_bytes());
    bytes.extend_from_slice(&[0; 8]);
    assert_eq!(parse_err(bytes), "unknown metadata value type 13 for key foo");

    let mut bytes = header(3, 0, 1);
    put_string(&mut bytes, "foo");
    bytes.extend_from_slice(&9u32.to_le_bytes());
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&[0; 8]);
    assert_eq!(parse_err(bytes), "unknown metadata value type 4294967295 in the array for key foo");
}

#[test]
fn array_nesting_is_capped() {
    fn nested(depth: usize) -> MetaValue {
        (0..depth).fold(MetaValue::U8(7), |inner, _| MetaValue::Array(vec![inner]))
    }
    let at_cap = GgufWriter::new().metadata("deep", nested(MAX_ARRAY_DEPTH)).to_bytes();
    assert_eq!(parse(at_cap).unwrap().get("deep"), Some(&nested(MAX_ARRAY_DEPTH)));
    let past_cap = GgufWriter::new().metadata("deep", nested(MAX_ARRAY_DEPTH + 1)).to_bytes();
    assert_eq!(parse_err(past_cap), "arrays nested more than 8 deep for key deep");

    // Deep enough to overflow the stack if the reader recursed without a cap.
    let depth = 1_000_000;
    let mut bytes = header(3, 0, 1);
    put_string(&mut bytes, "deep");
    bytes.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..depth {
        bytes.extend_from_slice(&9u32.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
    }
    assert_eq!(parse_err(bytes), "arrays nested more than 8 deep for key deep");
}

#[test]
fn bad_alignments_are_rejected() {
    for value in [MetaValue::U32(0), MetaValue::U32(3), MetaValue::U32(48), MetaValue::I32(-32)] {
        let bytes = GgufWriter::new().metadata("general.alignment", value.clone()).to_bytes();
        assert_eq!(parse_err(bytes), format!("general.alignment is {value:?}, not a power of two"));
    }
    let bytes = GgufWriter::new().metadata("general.alignment", MetaValue::String("32".into())).to_bytes();
    assert_eq!(parse_err(bytes), "general.alignment is a string, not a power of two");
    // A power of two too large for any data section.
    let bytes = raw_file(&[("general.alignment", MetaValue::U64(1 << 63))], &[], 0);
    let file = parse(bytes).unwrap();
    assert_eq!(file.alignment, 1 << 63);
    let bytes = raw_file(&[("general.alignment", MetaValue::U64(1 << 63))], &[("t", &[1], 0, 0)], 4);
    assert!(parse_err(bytes).contains("end past the end of the file"));
}

#[test]
fn duplicates_are_rejected() {
    let bytes = raw_file(&[("k", MetaValue::U8(1)), ("k", MetaValue::U8(2))], &[], 0);
    assert_eq!(parse_err(bytes), "duplicate metadata key k");
    let bytes = raw_file(&[], &[("t", &[1], 0, 0), ("t", &[1], 0, 32)], 64);
    assert_eq!(parse_err(bytes), "duplicate tensor name t");
}

#[test]
fn invalid_utf8_is_rejected() {
    let mut bytes = header(3, 0, 1);
    bytes.extend_from_slice(&2u64.to_le_bytes());
    bytes.extend_from_slice(&[0xC3, 0x28]);
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.push(0);
    let detail = parse_err(bytes);
    assert!(detail.starts_with("the string at byte 24 is not valid UTF-8"), "{detail}");
    let mut bytes = header(3, 0, 1);
    put_string(&mut bytes, "k");
    bytes.extend_from_slice(&8u32.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.push(0xFF);
    let detail = parse_err(bytes);
    assert!(detail.starts_with("the string at byte 37 is not valid UTF-8"), "{detail}");
    assert!(detail.ends_with(", in the value of key k"), "{detail}");
}

#[test]
fn bad_tensor_infos_are_rejected() {
    let cases: [(&[u64], u32, u64, usize, &str); 8] = [
        (
            &[4],
            0,
            0,
            15,
            "tensor t: 16 bytes at data offset 0 end past the end of the file (79 bytes, data section at 64)",
        ),
        (&[4], 0, 1 << 40, 16, "end past the end of the file"),
        (&[4], 0, u64::MAX - 31, 16, "end past the end of the file"),
        (&[4], 0, 8, 64, "tensor t has offset 8, not a multiple of the alignment 32"),
        (
            &[1 << 32, 1 << 32, 1 << 32],
            0,
            0,
            16,
            "tensor t has dims [4294967296, 4294967296, 4294967296], whose product overflows",
        ),
        (&[1, 1, 1, 1, 1], 0, 0, 16, "tensor t has 5 dimensions (ggml allows at most 4)"),
        (&[16], 2, 0, 64, "tensor t has rows of 16 elements, not a whole number of Q4_0 blocks of 32"),
        (&[4], 99, 0, 64, "tensor t has unknown ggml type 99"),
    ];
    for (dims, type_id, offset, data_bytes, expected) in cases {
        let detail = parse_err(raw_file(&[], &[("t", dims, type_id, offset)], data_bytes));
        assert!(detail.contains(expected), "{detail} does not contain {expected}");
    }
    // The product of the dims fits, the byte size does not.
    let detail = parse_err(raw_file(&[], &[("t", &[1 << 62, 2], 0, 0)], 16));
    assert!(detail.contains("whose product overflows"), "{detail}");
    // Rows of zero elements make the product 0, but the row count still overflows.
    let detail = parse_err(raw_file(&[], &[("t", &[0, 1 << 40, 1 << 40], 0, 0)], 16));
    assert!(detail.contains("whose product overflows"), "{detail}");
    // Empty tensors are fine.
    let file = parse(raw_file(&[], &[("t", &[0, 1 << 40], 0, 0)], 0)).unwrap();
    assert_eq!(&*file.tensor_bytes(&file.tensors[0]).unwrap(), &[] as &[u8]);
}

#[test]
fn overlapping_tensors_are_rejected() {
    let detail = parse_err(raw_file(&[], &[("a", &[16], 0, 0), ("b", &[8], 0, 32)], 96));
    assert_eq!(detail, "the data of tensors a and b overlap");
    let detail = parse_err(raw_file(&[], &[("b", &[8], 0, 0), ("a", &[8], 0, 0)], 96));
    assert!(detail.ends_with("overlap"), "{detail}");
    // Touching is not overlapping, and the order in the file need not be the order of the data.
    let file = parse(raw_file(&[], &[("b", &[8], 0, 32), ("a", &[8], 0, 0)], 64)).unwrap();
    assert_eq!(file.tensor_bytes(file.tensor("b").unwrap()).unwrap().len(), 32);
}

#[test]
fn truncated_tensor_infos_name_their_index() {
    let bytes = raw_file(&[], &[("a", &[8], 0, 0), ("b", &[8], 0, 32), ("c", &[8], 0, 64)], 0);
    // Cut inside the third info (the padding is up to 31 bytes, the info 41 bytes).
    let mut cut = header(3, 3, 0);
    put_tensor_info(&mut cut, "a", &[8], 0, 0);
    put_tensor_info(&mut cut, "b", &[8], 0, 32);
    let cut_len = cut.len() + 10;
    assert_eq!(parse_err(bytes[..cut_len].to_vec()), "truncated: tensor info 3 of 3 ends past the end of the file");
}

#[test]
fn long_or_multiline_names_are_quoted_on_one_line() {
    let name = format!("line\nbreak{}", "x".repeat(500));
    let detail = parse_err(raw_file(&[], &[(name.as_str(), &[4], 99, 0)], 16));
    assert!(detail.starts_with("tensor line\\nbreakxxx"), "{detail}");
    assert!(detail.len() < 200, "{detail}");
}

#[test]
fn fuzz_random_bytes_never_panic() {
    let mut rng = Rng::new(0x5EED);
    let valid = small_file();
    for i in 0..3000 {
        let len = rng.below(400);
        let mut bytes = random_bytes(&mut rng, len);
        match i % 4 {
            // Past the magic and version, into the counts and the metadata.
            0 => {
                let mut prefixed = header(3, rng.below(5) as u64, rng.below(5) as u64);
                prefixed.append(&mut bytes);
                bytes = prefixed;
            }
            // A valid beginning followed by garbage.
            1 => {
                let mut prefixed = valid[..rng.below(valid.len())].to_vec();
                prefixed.append(&mut bytes);
                bytes = prefixed;
            }
            // A valid file with a few bytes overwritten.
            2 => {
                bytes = valid.clone();
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(bytes.len());
                    bytes[at] = rng.next_u64() as u8;
                }
            }
            _ => {}
        }
        check_parsed(bytes);
    }
}

#[test]
fn fuzz_every_truncation_fails() {
    let valid = small_file();
    check_parsed(valid.clone());
    for len in 0..valid.len() {
        assert!(parse(valid[..len].to_vec()).is_err(), "a truncation to {len} bytes parsed");
    }
}

#[test]
fn fuzz_single_byte_corruptions_never_panic() {
    let valid = small_file();
    for at in 0..valid.len() {
        let original = valid[at];
        for corrupt in [original ^ 0xFF, original ^ 0x80, original.wrapping_add(1), 0, 0xFF] {
            let mut bytes = valid.clone();
            bytes[at] = corrupt;
            check_parsed(bytes);
        }
    }
}

/// A file with metadata longer than a reader's window and a tensor longer than one: (the file,
/// the big tensor's name).
fn file_past_a_window() -> (Vec<u8>, &'static str) {
    // About two windows of strings, so the metadata is read across window boundaries.
    let tokens: Vec<MetaValue> = (0..120_000).map(|i| MetaValue::String(format!("token{i}"))).collect();
    let big: Vec<f32> = (0..(WINDOW_BYTES * 2 / 4)).map(|i| i as f32).collect();
    let bytes = GgufWriter::new()
        .metadata("general.architecture", MetaValue::String("llama".into()))
        .metadata("tokenizer.ggml.tokens", MetaValue::Array(tokens))
        .tensor("small", &[32], GgmlType::F32, &f32_bytes(&[0.5; 32]))
        .tensor("big", &[big.len() as u64], GgmlType::F32, &f32_bytes(&big))
        .to_bytes();
    (bytes, "big")
}

#[test]
fn a_reader_is_read_in_windows_then_a_tensor_at_a_time() {
    let (bytes, big) = file_past_a_window();
    // The same layout and bytes as in memory (`parse` compares them).
    parse(bytes.clone()).unwrap();
    let (reader, reads) = LoggedReader::boxed(bytes.clone(), None);
    let file = GgufFile::from_reader("test.gguf", reader).unwrap();
    let parsing: Vec<(u64, usize)> = std::mem::take(&mut *reads.lock().unwrap());
    assert!(parsing.len() >= 2, "the metadata spans windows: {parsing:?}");
    assert!(parsing.iter().all(|&(_, len)| len <= WINDOW_BYTES), "{parsing:?}");
    // Only up to the window holding the data section's start, not the tensors after it.
    let read_bytes: usize = parsing.iter().map(|&(_, len)| len).sum();
    assert!((read_bytes as u64) < file.data_offset + WINDOW_BYTES as u64, "{read_bytes} bytes read to parse");
    assert!(read_bytes < bytes.len(), "parsing read the whole file");

    // A tensor is one read of exactly its data, into memory of its own.
    let info = file.tensor(big).unwrap();
    let data = file.tensor_bytes(info).unwrap();
    assert!(matches!(data, std::borrow::Cow::Owned(_)));
    assert_eq!(*reads.lock().unwrap(), [(file.data_offset + info.offset, info.size_bytes() as usize)]);
    let start = (file.data_offset + info.offset) as usize;
    assert_eq!(&*data, &bytes[start..start + data.len()]);
}

#[test]
fn reader_failures_name_the_file_the_bytes_and_the_reason() {
    let (bytes, big) = file_past_a_window();
    let data_offset = parse(bytes.clone()).unwrap().data_offset;
    // In the metadata's second window: parsing fails, saying where and why.
    let at = WINDOW_BYTES as u64 + 10;
    let err = GgufFile::from_reader("test.gguf", LoggedReader::boxed(bytes.clone(), Some(at)).0).unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("test.gguf: cannot read "), "{text}");
    assert!(text.contains("the disk is on fire"), "{text}");
    // In the big tensor's data: the file opens, and reading that tensor fails, naming it.
    let file =
        GgufFile::from_reader("test.gguf", LoggedReader::boxed(bytes.clone(), Some(bytes.len() as u64 - 1)).0).unwrap();
    assert!(file.data_offset == data_offset);
    let info = file.tensor(big).unwrap();
    let start = file.data_offset + info.offset;
    let end = start + info.size_bytes();
    let err = file.tensor_bytes(info).unwrap_err().to_string();
    assert_eq!(err, format!("test.gguf: cannot read tensor big (bytes {start}..{end}): the disk is on fire"));
    assert!(file.tensor_bytes(file.tensor("small").unwrap()).is_ok());
    // An info from another file, whose data lies past this one's end.
    let foreign = TensorInfo { offset: 1 << 40, ..info.clone() };
    for f in [&file, &parse(bytes).unwrap()] {
        let err = f.tensor_bytes(&foreign).unwrap_err().to_string();
        assert_eq!(err, "test.gguf: tensor big lies outside the file");
    }
}

#[test]
fn open_maps_the_same_file_from_bytes_reads() {
    let dir = std::env::temp_dir().join(format!("weft-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("small.gguf");
    std::fs::write(&path, small_file()).unwrap();
    let mapped = GgufFile::open(&path).unwrap();
    let owned = parse(small_file()).unwrap();
    assert_eq!(mapped.name(), path.display().to_string());
    assert_eq!((&mapped.metadata, &mapped.tensors), (&owned.metadata, &owned.tensors));
    for info in &mapped.tensors {
        assert_eq!(mapped.tensor_bytes(info).unwrap(), owned.tensor_bytes(info).unwrap());
    }

    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let err = GgufFile::open(&empty).unwrap_err().to_string();
    assert_eq!(err, format!("{}: not a GGUF file (0 bytes, too short for the magic)", empty.display()));
    let missing = dir.join("missing.gguf");
    let err = GgufFile::open(&missing).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}: cannot open", missing.display())), "{err}");
    assert!(GgufFile::open(&dir).is_err(), "a directory");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reads_the_real_model_file() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!("skipping reads_the_real_model_file: {} is absent", path.display());
        return;
    }
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.version, 3);
    assert_eq!(file.architecture(), Some("llama"));
    assert_eq!(file.tensors.len(), 272);
    assert_eq!(file.get_str("tokenizer.ggml.pre"), Some("smollm"));
    assert_eq!(file.get_str("tokenizer.ggml.model"), Some("gpt2"));
    assert_eq!(file.get_u64("llama.block_count"), Some(30));
    assert_eq!(file.get_u64("llama.embedding_length"), Some(576));
    assert_eq!(file.get_f64("llama.rope.freq_base"), Some(100000.0));
    assert_eq!(file.get_str_array("tokenizer.ggml.tokens").map(|t| t.len()), Some(49152));
    assert_eq!(file.get_i64_array("tokenizer.ggml.token_type").map(|t| t.len()), Some(49152));
    assert_eq!(file.get_bool("tokenizer.ggml.add_bos_token"), Some(false));
    file.check_tensor_types().unwrap();

    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(embd.shape(), vec![49152, 576]);
    assert_eq!(embd.dtype().unwrap(), DType::Q8_0);
    assert_eq!(file.tensor_bytes(embd).unwrap().len() as u64, 49152 * 576 / 32 * 34);
    let down = file.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!((down.ggml_type, down.shape()), (GgmlType::Q4_1, vec![576, 1536]));

    let file_bytes = std::fs::metadata(&path).unwrap().len();
    let last = file.tensors.iter().max_by_key(|t| t.offset).unwrap();
    let last_end = file.data_offset + last.offset + last.size_bytes();
    assert!(last_end <= file_bytes, "{} ends at {last_end}, past {file_bytes}", last.name);
    assert_eq!(file.tensor_bytes(last).unwrap().len() as u64, last.size_bytes());
}
