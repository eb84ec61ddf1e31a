//! Tokenizer tests against outside truth: the SmolLM2-135M-Instruct GGUF's vocabulary through
//! weft must give exactly the ids llama.cpp gives, decode back to the text, render the chat
//! template byte for byte as transformers does, and stream text without splitting characters.
//! The reference data is tests/fixtures/smollm2/tokenizer.json (tools/make_tokenizer_fixtures.py).
//!
//! Tests that need the model file skip with a notice when models/ does not have it
//! (`cargo xtask fetch-model`), or fail if `WEFT_REQUIRE_MODEL=1`. No GPU is needed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::Value as Json;
use weft::model::gguf::{MetaValue, Metadata};
use weft::tokenizer::{ChatMessage, ChatTemplate, DecodeStream, HfTokenizer, Tokenizer};

const MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
const FIXTURE: &str = "tests/fixtures/smollm2/tokenizer.json";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A GGUF metadata reader just for these tests (the header and key/values only), so the tests
/// do not lean on the model loader.
mod mini_gguf {
    use super::*;
    use std::io::{BufReader, Read};

    struct R<T: Read>(T);

    impl<T: Read> R<T> {
        fn bytes<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
            let mut b = [0u8; N];
            self.0.read_exact(&mut b)?;
            Ok(b)
        }
        fn u32(&mut self) -> std::io::Result<u32> {
            Ok(u32::from_le_bytes(self.bytes()?))
        }
        fn u64(&mut self) -> std::io::Result<u64> {
            Ok(u64::from_le_bytes(self.bytes()?))
        }
        fn string(&mut self) -> std::io::Result<String> {
            let n = self.u64()? as usize;
            let mut b = vec![0u8; n];
            self.0.read_exact(&mut b)?;
            String::from_utf8(b).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        }
        fn value(&mut self, ty: u32) -> std::io::Result<MetaValue> {
            Ok(match ty {
                0 => MetaValue::U8(self.bytes::<1>()?[0]),
                1 => MetaValue::I8(self.bytes::<1>()?[0] as i8),
                2 => MetaValue::U16(u16::from_le_bytes(self.bytes()?)),
                3 => MetaValue::I16(i16::from_le_bytes(self.bytes()?)),
                4 => MetaValue::U32(self.u32()?),
                5 => MetaValue::I32(i32::from_le_bytes(self.bytes()?)),
                6 => MetaValue::F32(f32::from_le_bytes(self.bytes()?)),
                7 => MetaValue::Bool(self.bytes::<1>()?[0] != 0),
                8 => MetaValue::String(self.string()?),
                9 => {
                    let elem = self.u32()?;
                    let n = self.u64()?;
                    let mut items = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        items.push(self.value(elem)?);
                    }
                    MetaValue::Array(items)
                }
                10 => MetaValue::U64(self.u64()?),
                11 => MetaValue::I64(i64::from_le_bytes(self.bytes()?)),
                12 => MetaValue::F64(f64::from_le_bytes(self.bytes()?)),
                other => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("unknown GGUF value type {other}"),
                    ));
                }
            })
        }
    }

    pub fn read_metadata(path: &Path) -> std::io::Result<Metadata> {
        let mut r = R(BufReader::new(std::fs::File::open(path)?));
        assert_eq!(&r.bytes::<4>()?, b"GGUF", "{} is not a GGUF file", path.display());
        let version = r.u32()?;
        assert!(version == 2 || version == 3, "GGUF version {version}");
        let _tensors = r.u64()?;
        let count = r.u64()?;
        let mut meta = Metadata::new();
        for _ in 0..count {
            let key = r.string()?;
            let ty = r.u32()?;
            meta.insert(key, r.value(ty)?);
        }
        Ok(meta)
    }
}

struct Loaded {
    meta: Metadata,
    tokenizer: Arc<HfTokenizer>,
    fixture: Json,
}

/// The model's metadata, its tokenizer and the fixture, or `None` (with a notice) without the model.
fn loaded() -> Option<&'static Loaded> {
    static LOADED: OnceLock<Option<Loaded>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let model = root().join(MODEL);
            if !model.is_file() {
                if std::env::var_os("WEFT_REQUIRE_MODEL").is_some_and(|v| v == "1") {
                    panic!("WEFT_REQUIRE_MODEL=1 but {} is absent (cargo xtask fetch-model)", model.display());
                }
                eprintln!("SKIPPED: {} is absent (cargo xtask fetch-model)", model.display());
                return None;
            }
            let meta = mini_gguf::read_metadata(&model).expect("reading the GGUF metadata");
            let tokenizer = HfTokenizer::from_gguf_metadata_of(&meta, MODEL).expect("building the tokenizer");
            let text = std::fs::read_to_string(root().join(FIXTURE)).expect("reading the fixture");
            let fixture: Json = serde_json::from_str(&text).expect("parsing the fixture");
            Some(Loaded { meta, tokenizer: Arc::new(tokenizer), fixture })
        })
        .as_ref()
}

fn ids_of(v: &Json) -> Vec<u32> {
    v.as_array().expect("ids array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn messages_of(v: &Json) -> Vec<ChatMessage> {
    v.as_array()
        .expect("messages")
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect()
}

fn cases(l: &Loaded) -> Vec<(String, Vec<u32>)> {
    l.fixture["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| (c["text"].as_str().unwrap().to_owned(), ids_of(&c["ids"])))
        .collect()
}

#[test]
fn fixture_is_big_and_varied_enough() {
    let Some(l) = loaded() else { return };
    let cases = cases(l);
    assert!(cases.len() >= 300, "only {} fixture strings", cases.len());
    assert!(cases.iter().any(|(t, _)| t.is_empty()), "the empty string is missing");
    assert!(l.fixture["chat"].as_array().unwrap().len() >= 3);
}

#[test]
fn vocabulary_facts_match_the_reference() {
    let Some(l) = loaded() else { return };
    let t = &*l.tokenizer;
    assert_eq!(t.vocab_size() as u64, l.fixture["vocab_size"].as_u64().unwrap());
    assert_eq!(t.bos_token_id().map(u64::from), l.fixture["bos_token_id"].as_u64());
    assert_eq!(t.eos_token_ids().first().map(|&x| x as u64), l.fixture["eos_token_id"].as_u64());
    // <|endoftext|> also ends generation, as in llama.cpp.
    assert!(t.eos_token_ids().contains(&0), "{:?}", t.eos_token_ids());
    assert!(!t.add_bos_token(), "SmolLM2's GGUF says add_bos_token = false");
    assert_eq!(t.token_to_piece(216).as_deref(), Some(" "));
    assert_eq!(t.token_to_piece(1).as_deref(), Some("<|im_start|>"));
    assert_eq!(t.token_to_piece(u32::MAX), None);
    // add_special_tokens adds nothing here (no BOS for this model).
    assert_eq!(t.encode("Hello", true).unwrap(), t.encode("Hello", false).unwrap());
}

#[test]
fn every_fixture_string_encodes_to_the_reference_ids() {
    let Some(l) = loaded() else { return };
    let cases = cases(l);
    let mut failures = Vec::new();
    for (text, want) in &cases {
        let got = l.tokenizer.encode(text, false).unwrap();
        if &got != want {
            failures.push(format!("{text:?}\n   want {want:?}\n   got  {got:?}"));
        }
    }
    eprintln!("{} of {} fixture strings encode exactly", cases.len() - failures.len(), cases.len());
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_fixture_string_decodes_back() {
    let Some(l) = loaded() else { return };
    let mut failures = Vec::new();
    for (text, ids) in cases(l) {
        let got = l.tokenizer.decode(&ids, false).unwrap();
        if got != text {
            failures.push(format!("{text:?} decoded as {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn special_tokens_are_skipped_on_request() {
    let Some(l) = loaded() else { return };
    let t = &*l.tokenizer;
    let ids = t.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(t.decode(&ids, true).unwrap(), "user\nHi");
    assert_eq!(t.decode(&ids, false).unwrap(), "<|im_start|>user\nHi<|im_end|>");
}

#[test]
fn chat_template_renders_as_transformers_does() {
    let Some(l) = loaded() else { return };
    let template = l.tokenizer.chat_template().expect("SmolLM2 has a chat template");
    for chat in l.fixture["chat"].as_array().unwrap() {
        let messages = messages_of(&chat["messages"]);
        let add = chat["add_generation_prompt"].as_bool().unwrap();
        let text = template.render(&messages, add).unwrap();
        assert_eq!(text, chat["text"].as_str().unwrap(), "render of {messages:?}");
        assert_eq!(l.tokenizer.encode(&text, false).unwrap(), ids_of(&chat["ids"]), "ids of {text:?}");
    }
}

#[test]
fn template_features_render_as_transformers_does() {
    let Some(l) = loaded() else { return };
    let bos = Some("<|im_start|>");
    let eos = Some("<|im_end|>");
    let cases = l.fixture["templates"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let template = ChatTemplate::new(case["template"].as_str().unwrap(), bos, eos).unwrap();
        let messages = messages_of(&case["messages"]);
        let add = case["add_generation_prompt"].as_bool().unwrap();
        let text = template.render(&messages, add).unwrap();
        assert_eq!(text, case["text"].as_str().unwrap(), "template {:?}, add_generation_prompt={add}", case["name"]);
    }
}

#[test]
fn a_template_that_raises_is_a_clear_error() {
    let Some(l) = loaded() else { return };
    let raising = &l.fixture["raising_template"];
    let template = ChatTemplate::new(raising["template"].as_str().unwrap(), None, None).unwrap();
    let err = template.render(&messages_of(&raising["messages"]), false).unwrap_err().to_string();
    let want = raising["error"].as_str().unwrap();
    assert!(err.contains(want), "{err:?} should carry transformers' message {want:?}");
    assert!(err.contains("refused"), "{err}");
}

/// Runs a DecodeStream over `ids`; checks the deltas against decode(all) and returns them.
fn stream(t: &Arc<HfTokenizer>, ids: &[u32], skip_special: bool) -> Vec<String> {
    let dyn_t: Arc<dyn Tokenizer> = t.clone();
    let mut s = DecodeStream::new(dyn_t, skip_special);
    let mut deltas = Vec::new();
    for &id in ids {
        if let Some(d) = s.step(id).unwrap() {
            deltas.push(d);
        }
    }
    if let Some(d) = s.finish().unwrap() {
        deltas.push(d);
    }
    let full = t.decode(ids, skip_special).unwrap();
    assert_eq!(deltas.concat(), full, "deltas {deltas:?}");
    if !full.contains('\u{FFFD}') {
        for d in &deltas {
            assert!(!d.contains('\u{FFFD}'), "a delta split a character: {deltas:?} of {full:?}");
        }
    }
    deltas
}

#[test]
fn decode_stream_deltas_concatenate_and_never_split_characters() {
    let Some(l) = loaded() else { return };
    let mut all = Vec::new();
    for (_, ids) in cases(l) {
        stream(&l.tokenizer, &ids, false);
        stream(&l.tokenizer, &ids, true);
        all.extend(ids);
    }
    for chat in l.fixture["chat"].as_array().unwrap() {
        stream(&l.tokenizer, &ids_of(&chat["ids"]), true);
    }
    // One long stream of everything: the window must stay small while the text grows.
    stream(&l.tokenizer, &all, false);
}

#[test]
fn decode_stream_holds_back_partial_characters() {
    let Some(l) = loaded() else { return };
    let t = &l.tokenizer;
    for text in ["👨‍👩‍👧‍👦 family", "你好，世界", "👍🏽 ok", "日本語のテキスト"] {
        let ids = t.encode(text, false).unwrap();
        assert!(ids.len() > text.chars().count() / 2, "{text:?} is not split into byte tokens: {ids:?}");
        let deltas = stream(t, &ids, false);
        // Some token of these texts is a fragment of a character, so the stream waited at least once.
        let pieces: Vec<_> = ids.iter().map(|&id| t.token_to_piece(id).unwrap()).collect();
        if pieces.iter().any(|p| p.contains('\u{FFFD}')) {
            assert!(deltas.len() < ids.len(), "{text:?}: {deltas:?}");
        }
    }
}

#[test]
fn decode_stream_with_context_and_bad_ids() {
    let Some(l) = loaded() else { return };
    let t: Arc<dyn Tokenizer> = l.tokenizer.clone();
    let prompt = t.encode("<|im_start|>assistant\n", false).unwrap();
    let answer = t.encode("Paris 🇫🇷 is lovely.", false).unwrap();
    let mut s = DecodeStream::with_context(t.clone(), true, &prompt).unwrap();
    let mut out = String::new();
    for &id in &answer {
        out.extend(s.step(id).unwrap());
    }
    out.extend(s.finish().unwrap());
    assert_eq!(out, "Paris 🇫🇷 is lovely.");

    let mut s = DecodeStream::new(t.clone(), false);
    assert_eq!(s.step(19556).unwrap().as_deref(), Some("Hello"));
    let err = s.step(1_000_000).unwrap_err().to_string();
    assert!(err.contains("1000000") && err.contains("49152"), "{err}");
    // The stream is still usable after a bad id.
    assert_eq!(s.step(905).unwrap().as_deref(), Some(" world"));
}

#[test]
fn out_of_range_token_id_is_an_error() {
    let Some(l) = loaded() else { return };
    let err = l.tokenizer.decode(&[1, 49152], false).unwrap_err().to_string();
    assert!(err.contains("49152") && err.contains("out of range"), "{err}");
    assert!(err.contains("SmolLM2"), "the error should name the file: {err}");
}

// ----- error paths on synthetic metadata (no model file needed) -----

fn s(v: &str) -> MetaValue {
    MetaValue::String(v.to_owned())
}

fn strs(v: &[&str]) -> MetaValue {
    MetaValue::Array(v.iter().map(|x| s(x)).collect())
}

/// A tiny byte-level BPE vocabulary: "a", "b", "ab", "Ġ", "Ġab", a control token.
fn tiny_gpt2() -> Metadata {
    let mut m = Metadata::new();
    m.insert("tokenizer.ggml.model".into(), s("gpt2"));
    m.insert("tokenizer.ggml.pre".into(), s("gpt2"));
    m.insert("tokenizer.ggml.tokens".into(), strs(&["<|end|>", "a", "b", "ab", "Ġ", "Ġab"]));
    m.insert(
        "tokenizer.ggml.token_type".into(),
        MetaValue::Array([3, 1, 1, 1, 1, 1].iter().map(|&t| MetaValue::I32(t)).collect()),
    );
    m.insert("tokenizer.ggml.merges".into(), strs(&["a b", "Ġ ab"]));
    m.insert("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(0));
    m
}

fn err_of(m: &Metadata) -> String {
    HfTokenizer::from_gguf_metadata(m).unwrap_err().to_string()
}

#[test]
fn tiny_gpt2_vocabulary_works() {
    let t = HfTokenizer::from_gguf_metadata(&tiny_gpt2()).unwrap();
    assert_eq!(t.encode("ab ab<|end|>", false).unwrap(), vec![3, 5, 0]);
    assert_eq!(t.decode(&[3, 5, 0], true).unwrap(), "ab ab");
    assert_eq!(t.eos_token_ids(), &[0]);
    assert_eq!(t.vocab_size(), 6);
}

/// A tiny WordPiece vocabulary as llama.cpp's converter writes it: a word's first piece with a
/// leading "▁", a continuation without "##", control tokens as they are.
fn tiny_bert() -> Metadata {
    let mut m = Metadata::new();
    m.insert("tokenizer.ggml.model".into(), s("bert"));
    m.insert("tokenizer.ggml.pre".into(), s("bert-bge"));
    m.insert(
        "tokenizer.ggml.tokens".into(),
        strs(&["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u{2581}word", "piece", "s", "\u{2581},", "\u{2581}cafe"]),
    );
    m.insert(
        "tokenizer.ggml.token_type".into(),
        MetaValue::Array([3, 3, 3, 3, 1, 1, 1, 1, 1].iter().map(|&t| MetaValue::I32(t)).collect()),
    );
    m.insert("tokenizer.ggml.unknown_token_id".into(), MetaValue::U32(1));
    m.insert("tokenizer.ggml.cls_token_id".into(), MetaValue::U32(2));
    m.insert("tokenizer.ggml.seperator_token_id".into(), MetaValue::U32(3));
    m
}

#[test]
fn tiny_wordpiece_vocabulary_works() {
    let t = HfTokenizer::from_gguf_metadata(&tiny_bert()).unwrap();
    // Lower-cased, accents stripped, punctuation split off, pieces longest first, [UNK] for a
    // word that cannot be pieced; [CLS] and [SEP] around the text with special tokens.
    assert_eq!(t.encode("WordPieces, Café xyz", true).unwrap(), vec![2, 4, 5, 6, 7, 8, 1, 3]);
    assert_eq!(t.encode("words", false).unwrap(), vec![4, 6]);
    assert_eq!(t.decode(&[2, 4, 5, 6, 7, 8, 3], true).unwrap(), "wordpieces, cafe");

    let mut m = tiny_bert();
    m.remove("tokenizer.ggml.unknown_token_id");
    assert!(err_of(&m).contains("unknown_token_id is missing"), "{}", err_of(&m));
}

#[test]
fn unknown_tokenizer_model_is_a_clear_error() {
    let mut m = tiny_gpt2();
    m.insert("tokenizer.ggml.model".into(), s("rwkv"));
    let err = err_of(&m);
    assert!(err.contains("\"rwkv\"") && err.contains("gpt2") && err.contains("llama"), "{err}");
}

#[test]
fn missing_pieces_are_clear_errors() {
    let mut m = tiny_gpt2();
    m.remove("tokenizer.ggml.tokens");
    let err = err_of(&m);
    assert!(err.contains("tokenizer.ggml.tokens is missing"), "{err}");

    let mut m = tiny_gpt2();
    m.remove("tokenizer.ggml.model");
    assert!(err_of(&m).contains("tokenizer.ggml.model is missing"));

    let mut m = tiny_gpt2();
    m.remove("tokenizer.ggml.merges");
    assert!(err_of(&m).contains("tokenizer.ggml.merges is missing"));

    // Gemma 4's SentencePiece-style BPE reads its merges from the file too.
    let mut m = tiny_gpt2();
    m.insert("tokenizer.ggml.model".into(), s("gemma4"));
    m.remove("tokenizer.ggml.merges");
    let err = err_of(&m);
    assert!(err.contains("tokenizer.ggml.merges is missing: a gemma4 vocabulary"), "{err}");

    let mut m = tiny_gpt2();
    m.insert("tokenizer.ggml.tokens".into(), MetaValue::U32(3));
    assert!(err_of(&m).contains("tokenizer.ggml.tokens should be an array"));

    let mut m = tiny_gpt2();
    m.insert("tokenizer.ggml.pre".into(), s("martian"));
    let err = err_of(&m);
    assert!(err.contains("\"martian\"") && err.contains("smollm"), "{err}");

    let mut m = tiny_gpt2();
    m.insert("tokenizer.ggml.merges".into(), strs(&["ab"]));
    assert!(err_of(&m).contains("not two tokens"));

    let mut m = tiny_gpt2();
    m.insert("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(true));
    assert!(err_of(&m).contains("bos_token_id is not set"));

    let mut m = tiny_gpt2();
    m.insert("tokenizer.chat_template".into(), s("{% for %}"));
    assert!(err_of(&m).contains("tokenizer.chat_template does not compile"));
}

#[test]
fn out_of_range_id_on_a_tiny_vocabulary() {
    let t = HfTokenizer::from_gguf_metadata(&tiny_gpt2()).unwrap();
    let err = t.decode(&[1, 6], false).unwrap_err().to_string();
    assert!(err.contains("token id 6 is out of range") && err.contains("6 tokens"), "{err}");
    assert!(err.contains("GGUF metadata"), "{err}");
}

/// A tiny SentencePiece vocabulary with scores and byte tokens.
fn tiny_llama() -> Metadata {
    let mut tokens = vec!["<unk>", "<s>", "</s>"];
    let bytes: Vec<String> = (0..=255u32).map(|b| format!("<0x{b:02X}>")).collect();
    tokens.extend(bytes.iter().map(String::as_str));
    let words = [
        "▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "llo", "hello", "▁hello", "▁w", "or", "▁wor", "ld",
        "▁world",
    ];
    tokens.extend(words);
    let mut types = vec![2, 3, 3];
    types.extend(std::iter::repeat_n(6, 256));
    types.extend(std::iter::repeat_n(1, words.len()));
    let mut scores = vec![0.0f32; 3 + 256];
    scores.extend((0..words.len()).map(|i| -(words.len() as f32) + i as f32)); // later words score higher
    let mut m = Metadata::new();
    m.insert("tokenizer.ggml.model".into(), s("llama"));
    m.insert("tokenizer.ggml.tokens".into(), strs(&tokens));
    m.insert("tokenizer.ggml.token_type".into(), MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()));
    m.insert("tokenizer.ggml.scores".into(), MetaValue::Array(scores.into_iter().map(MetaValue::F32).collect()));
    m.insert("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(1));
    m.insert("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(2));
    m.insert("tokenizer.ggml.unknown_token_id".into(), MetaValue::U32(0));
    m
}

#[test]
fn tiny_sentencepiece_vocabulary_works() {
    let t = HfTokenizer::from_gguf_metadata(&tiny_llama()).unwrap();
    let id = |s: &str| t.token_to_id(s).unwrap();
    // A prefix space, ▁ for spaces, BOS by default, merges by score.
    assert_eq!(t.encode("hello world", true).unwrap(), vec![1, id("▁hello"), id("▁world")]);
    assert_eq!(t.decode(&t.encode("hello world", true).unwrap(), true).unwrap(), "hello world");
    // A character outside the vocabulary falls back to its UTF-8 bytes.
    let ids = t.encode("hé", false).unwrap();
    assert_eq!(ids, vec![id("▁"), id("h"), id("<0xC3>"), id("<0xA9>")]);
    assert_eq!(t.decode(&ids, false).unwrap(), "hé");
    // Streaming waits for the second byte of é.
    let dyn_t: Arc<dyn Tokenizer> = Arc::new(t);
    let mut s = DecodeStream::new(dyn_t, false);
    let deltas: Vec<_> = ids.iter().map(|&i| s.step(i).unwrap()).collect();
    assert_eq!(deltas, vec![None, Some("h".to_owned()), None, Some("é".to_owned())]);
}

#[test]
fn scores_are_required_for_sentencepiece() {
    let mut m = tiny_llama();
    m.remove("tokenizer.ggml.scores");
    assert!(err_of(&m).contains("tokenizer.ggml.scores is missing"));
}

#[test]
fn from_file_reads_a_tokenizer_json_and_config() {
    let dir = std::env::temp_dir().join(format!("weft-tokenizer-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Write the tiny vocabulary out as a tokenizer.json through the tokenizers crate.
    let t = HfTokenizer::from_gguf_metadata(&tiny_gpt2()).unwrap();
    let json_path: PathBuf = dir.join("tokenizer.json");
    t.inner().save(&json_path, false).unwrap();
    let config = dir.join("tokenizer_config.json");
    std::fs::write(
        &config,
        r#"{"eos_token": {"content": "<|end|>"},
            "chat_template": "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"}"#,
    )
    .unwrap();
    let t = HfTokenizer::from_file(&json_path, Some(&config)).unwrap();
    assert_eq!(t.eos_token_ids(), &[0]);
    assert_eq!(t.encode("ab ab", true).unwrap(), vec![3, 5]);
    let text = t.chat_template().unwrap().render(&[ChatMessage::user("ab")], true).unwrap();
    assert_eq!(text, "ab<|end|>");

    let err = HfTokenizer::from_file(&dir.join("missing.json"), None).unwrap_err().to_string();
    assert!(err.contains("missing.json") && err.contains("cannot read"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn chat_template_helpers() {
    let t = ChatTemplate::new(
        "{{ strftime_now('%Y') | length }} {{ 'abc'.startswith('a') }} {{ ' x '.strip() }}|{{ [1, 2] | tojson }}",
        None,
        None,
    )
    .unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "4 True x|[1, 2]");

    let err = ChatTemplate::new("{{ raise_exception('no system messages') }}", None, None)
        .unwrap()
        .render(&[], false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no system messages"), "{err}");

    let err = ChatTemplate::new("{% if %}", None, None).unwrap_err().to_string();
    assert!(err.contains("does not parse"), "{err}");

    // An error while rendering (not a raise) names what went wrong.
    let err = ChatTemplate::new("{{ messages[0].content.nope() }}", None, None)
        .unwrap()
        .render(&[ChatMessage::user("x")], false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rendering the chat template failed"), "{err}");
}

#[test]
fn the_metadata_reader_agrees_with_the_fixture() {
    // Guards the test-local GGUF reader: the key facts the tokenizer reads.
    let Some(l) = loaded() else { return };
    assert_eq!(l.meta.get("tokenizer.ggml.model"), Some(&s("gpt2")));
    assert_eq!(l.meta.get("tokenizer.ggml.pre"), Some(&s("smollm")));
}

#[test]
fn every_known_pre_tokenizer_builds_and_splits() {
    // Each family's regexes compile on the pure-Rust regex backend and split plain text alike.
    for pre in [
        "default",
        "gpt2",
        "gpt-2",
        "llama3",
        "llama-bpe",
        "qwen2",
        "qwen35",
        "deepseek-llm",
        "deepseek-coder",
        "smollm",
        "starcoder",
        "falcon",
        "tekken",
        "gpt-4o",
        "llama4",
        "dbrx",
        "chatglm-bpe",
        "stablelm2",
    ] {
        let mut m = tiny_gpt2();
        m.insert("tokenizer.ggml.pre".into(), s(pre));
        m.insert("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(0));
        let t = HfTokenizer::from_gguf_metadata(&m).unwrap_or_else(|e| panic!("{pre}: {e}"));
        let ids = t.encode("ab ab<|end|>", false).unwrap();
        assert_eq!(ids, vec![3, 5, 0], "{pre}");
        // Llama 3 and Tekken vocabularies put BOS in front by default, as llama.cpp does.
        let with_bos = t.encode("ab", true).unwrap();
        assert_eq!(with_bos.first() == Some(&0), matches!(pre, "llama3" | "llama-bpe" | "tekken"), "{pre}");
    }
}

#[test]
fn long_text_encodes_quickly_and_round_trips() {
    let Some(l) = loaded() else { return };
    let mut text = String::new();
    for (t, _) in cases(l) {
        text.push_str(&t);
        text.push('\n');
    }
    let text = text.repeat(8);
    let start = std::time::Instant::now();
    let ids = l.tokenizer.encode(&text, false).unwrap();
    let took = start.elapsed();
    eprintln!("encoded {} bytes into {} tokens in {took:?}", text.len(), ids.len());
    assert_eq!(l.tokenizer.decode(&ids, false).unwrap(), text);
    assert!(took.as_secs() < 10, "encoding {} bytes took {took:?}", text.len());
}

#[test]
fn a_saved_tokenizer_json_of_the_model_reads_back_identically() {
    // HfTokenizer::from_file on a full-size vocabulary: the GGUF tokenizer saved as a
    // tokenizer.json (regex splits included) with a tokenizer_config.json beside it.
    let Some(l) = loaded() else { return };
    let dir = std::env::temp_dir().join(format!("weft-tokenizer-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json_path = dir.join("tokenizer.json");
    l.tokenizer.inner().save(&json_path, false).unwrap();
    let template = match l.meta.get("tokenizer.chat_template") {
        Some(MetaValue::String(t)) => t.clone(),
        other => panic!("chat template: {other:?}"),
    };
    let config = serde_json::json!({
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>", "special": true},
        "add_bos_token": false,
        "chat_template": template,
    });
    let config_path = dir.join("tokenizer_config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let t = HfTokenizer::from_file(&json_path, Some(&config_path)).unwrap();
    std::fs::remove_dir_all(&dir).ok();

    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.bos_token_id(), Some(1));
    assert_eq!(t.eos_token_ids(), l.tokenizer.eos_token_ids());
    for (text, ids) in cases(l) {
        assert_eq!(t.encode(&text, false).unwrap(), ids, "{text:?}");
    }
    for chat in l.fixture["chat"].as_array().unwrap() {
        let text = t.chat_template().unwrap().render(&messages_of(&chat["messages"]), true).unwrap();
        assert_eq!(text, chat["text"].as_str().unwrap());
    }
}
