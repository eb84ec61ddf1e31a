//! llama.cpp's own tokenizer goldens against weft: each `ggml-vocab-NAME.gguf` (a vocabulary-only
//! GGUF) comes with `.gguf.inp` (texts separated by `\n__ggml_vocab_test__\n`) and `.gguf.out`
//! (one line of ids per text), written by llama.cpp's `tests/test-tokenizer-0` from the
//! reference Hugging Face tokenizer. weft builds its tokenizer from the GGUF's metadata alone and
//! must give exactly those ids for every text (no BOS/EOS added, as the goldens were made).
//!
//! One test per vocabulary whose `tokenizer.ggml.pre` (or SentencePiece model) weft claims.
//! The files come from the pinned llama-cpp-python source package (`cargo xtask fetch-vocabs`,
//! run by `cargo xtask test`) into models/ggml-vocab/, never git. Without them (and without
//! WEFT_REQUIRE_MODEL=1) each test skips with a notice. No GPU is needed.

use std::path::{Path, PathBuf};

use weft::model::gguf::GgufFile;
use weft::tokenizer::{HfTokenizer, Tokenizer};

/// What separates the texts of a `.inp` file (llama.cpp's `tests/test-tokenizer-0.cpp`).
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn vocab_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models").join("ggml-vocab")
}

/// The (text, ids) pairs of one vocabulary, split as llama.cpp splits them: the `.inp` file ends
/// with a separator, so no text follows the last one.
fn read_pairs(gguf: &Path) -> Vec<(String, Vec<u32>)> {
    let read = |ext: &str| {
        let path = gguf.with_extension(format!("gguf.{ext}"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let (inp, out) = (read("inp"), read("out"));
    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.split_once(SEPARATOR) {
            Some((text, after)) => {
                texts.push(text.to_owned());
                rest = after;
            }
            None => {
                texts.push(rest.to_owned());
                rest = "";
            }
        }
    }
    let ids: Vec<Vec<u32>> =
        out.lines().map(|line| line.split_whitespace().map(|id| id.parse().unwrap()).collect()).collect();
    assert_eq!(texts.len(), ids.len(), "{}: .inp and .out hold different numbers of tests", gguf.display());
    texts.into_iter().zip(ids).collect()
}

/// Runs every pair of `ggml-vocab-{name}.gguf`; fails listing each text whose ids differ.
fn check_vocab(name: &str) {
    let path = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
    if !path.exists() {
        assert!(
            std::env::var("WEFT_REQUIRE_MODEL").as_deref() != Ok("1"),
            "{} is missing: run cargo xtask fetch-vocabs",
            path.display()
        );
        return eprintln!("skipping: {} is missing (cargo xtask fetch-vocabs)", path.display());
    }
    let file = GgufFile::open(&path).unwrap();
    let tok = HfTokenizer::from_gguf_metadata_of(&file.metadata, file.name()).unwrap();
    let pairs = read_pairs(&path);
    let mut failures = Vec::new();
    for (text, want) in &pairs {
        let got = tok.encode(text, false).unwrap();
        if &got != want {
            failures.push(format!("  {text:?}\n    want {want:?}\n    got  {got:?}"));
        }
    }
    eprintln!("ggml-vocab-{name}: {}/{} pairs pass", pairs.len() - failures.len(), pairs.len());
    assert!(
        failures.is_empty(),
        "ggml-vocab-{name}: {} of {} texts differ:\n{}",
        failures.len(),
        pairs.len(),
        failures.join("\n")
    );
}

macro_rules! goldens {
    ($($test:ident => $name:literal,)*) => {$(
        #[test]
        fn $test() {
            check_vocab($name);
        }
    )*};
}

goldens! {
    gpt_2 => "gpt-2",
    llama_bpe => "llama-bpe",
    qwen2 => "qwen2",
    qwen35 => "qwen35",
    deepseek_llm => "deepseek-llm",
    deepseek_coder => "deepseek-coder",
    starcoder => "starcoder",
    refact => "refact",
    command_r => "command-r",
    falcon => "falcon",
    mpt => "mpt",
    llama_spm => "llama-spm",
    phi_3 => "phi-3",
    bert_bge => "bert-bge",
    gemma_4 => "gemma-4",
}
