//! Every quantized format's CPU decoder (`quant::dequantize`, which the shaders match bit for
//! bit) against gguf-py's independent dequantizers, on random but valid blocks
//! (`tests/fixtures/quants/blocks.json`, written by `tools/make_quant_fixtures.py`). Both decode
//! in f32 with ggml's order of operations, so they must agree exactly; the one allowance is the
//! sign of a zero (numpy's `d * q - m` with q = 0 and m = 0 gives +0 where a product of a
//! negative scale gives -0 in either).

use weft::DType;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn every_format_decodes_as_gguf_py_does() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/quants/blocks.json")).unwrap();
    let fixtures: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut checked = Vec::new();
    for dtype in DType::WEIGHTS.into_iter().filter(|d| d.is_quantized()) {
        let Some(entry) = fixtures.get(dtype.name()) else {
            assert_eq!(dtype, DType::Q8_K, "{dtype} has no fixture; rerun tools/make_quant_fixtures.py");
            continue;
        };
        let bytes = unhex(entry["bytes"].as_str().unwrap());
        let want: Vec<f32> = unhex(entry["values_f32_le"].as_str().unwrap())
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let got = weft::quant::dequantize(dtype, &bytes).unwrap();
        assert_eq!(got.len(), want.len(), "{dtype}: element count");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g == w, "{dtype}: element {i} (block {}): weft {g} vs gguf-py {w}", i / dtype.block_elems());
        }
        checked.push(dtype.name());
    }
    let quantized = DType::WEIGHTS.iter().filter(|d| d.is_quantized()).count();
    assert_eq!(checked.len(), quantized - 1, "formats checked (all but Q8_K): {checked:?}");
}

/// BF16, which stays 16-bit on the GPU: weft decodes gguf-py's bytes to gguf-py's values, and
/// rounds the source values to gguf-py's bytes (nearest, ties to even), exactly.
#[test]
fn bf16_decodes_and_encodes_as_gguf_py_does() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/quants/blocks.json")).unwrap();
    let fixtures: serde_json::Value = serde_json::from_str(&text).unwrap();
    let entry = &fixtures["BF16"];
    let floats = |key: &str| -> Vec<f32> {
        unhex(entry[key].as_str().unwrap())
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let bytes = unhex(entry["bytes"].as_str().unwrap());
    let (want, source) = (floats("values_f32_le"), floats("source_f32_le"));
    let got = weft::quant::dequantize(DType::BF16, &bytes).unwrap();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g.to_bits() == w.to_bits(), "element {i}: weft {g} vs gguf-py {w}");
    }
    assert_eq!(weft::quant::quantize(DType::BF16, &source).unwrap(), bytes, "weft's rounding to BF16");
}
