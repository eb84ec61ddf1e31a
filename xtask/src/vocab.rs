//! `cargo xtask fetch-vocabs`: llama.cpp's tokenizer goldens (`ggml-vocab-NAME.gguf` with its
//! `.gguf.inp` / `.gguf.out` pairs) for tests/tokenizer_goldens.rs, taken from the pinned
//! llama-cpp-python source package, which vendors llama.cpp. The package is 77 MB; only the
//! named vocabularies (about 45 MB) are kept, under models/ggml-vocab/ (never git).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Result, root, run};

/// The source package: pip requirement, and the sha256 of the sdist it downloads (the trust:
/// a package of another hash is refused before anything is extracted).
const SDIST_REQUIREMENT: &str = "llama-cpp-python==0.3.36";
const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
/// Where the vocabularies sit inside the sdist.
const SDIST_DIR: &str = "llama_cpp_python-0.3.36/vendor/llama.cpp/models";

/// The vocabularies whose pre-tokenizer weft claims: tests/tokenizer_goldens.rs has one test
/// each (a unit test below keeps the two lists equal).
pub const VOCABS: &[&str] = &[
    "gpt-2",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "deepseek-llm",
    "deepseek-coder",
    "starcoder",
    "refact",
    "command-r",
    "falcon",
    "mpt",
    "llama-spm",
    "phi-3",
    "bert-bge",
    "gemma-4",
];

pub fn vocab_dir() -> PathBuf {
    root().join("models").join("ggml-vocab")
}

/// The three files of one vocabulary.
fn files_of(name: &str) -> [String; 3] {
    let gguf = format!("ggml-vocab-{name}.gguf");
    [format!("{gguf}.inp"), format!("{gguf}.out"), gguf]
}

/// Put every vocabulary of [`VOCABS`] in models/ggml-vocab/; does nothing when all are there.
pub fn fetch_vocabs() -> Result {
    let dir = vocab_dir();
    let wanted: Vec<String> = VOCABS.iter().flat_map(|name| files_of(name)).collect();
    if wanted.iter().all(|f| dir.join(f).exists()) {
        return Ok(());
    }
    eprintln!("xtask: fetching llama.cpp's tokenizer goldens ({SDIST_REQUIREMENT}, 77 MB) from PyPI");
    let tmp = std::env::temp_dir().join(format!("weft-fetch-vocabs-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let result = download_and_extract(&tmp, &dir, &wanted);
    let _ = std::fs::remove_dir_all(&tmp);
    result?;
    eprintln!("xtask: fetched {} vocabularies into {} (sdist sha256 verified)", VOCABS.len(), dir.display());
    Ok(())
}

fn download_and_extract(tmp: &Path, dir: &Path, wanted: &[String]) -> Result {
    let mut pip = Command::new("python3");
    // --no-binary: the source package, which vendors llama.cpp (wheels do not carry its models/).
    pip.args(["-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python", "--dest"])
        .arg(tmp)
        .arg(SDIST_REQUIREMENT);
    run(pip).map_err(|e| format!("{e}\n(the goldens come from PyPI; python3 with pip is needed)"))?;
    extract(tmp, dir, SDIST_SHA256, wanted)
}

/// `python3 -c EXTRACT_PY TMP OUT SHA256 FILE...`: check the one sdist under TMP against
/// SHA256, then copy `SDIST_DIR/FILE` for each FILE into OUT, each through a temporary name so
/// an interrupted run leaves no half file behind.
const EXTRACT_PY: &str = r#"import glob, hashlib, os, sys, tarfile
tmp, out, want, sdist_dir, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
found = glob.glob(tmp + '/*.tar.gz')
if len(found) != 1:
    sys.exit(f'expected one source package in {tmp}, found {found}')
digest = hashlib.sha256()
with open(found[0], 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
        digest.update(block)
if digest.hexdigest() != want:
    sys.exit(f'refusing {found[0]}: sha256 {digest.hexdigest()}, expected {want}')
os.makedirs(out, exist_ok=True)
with tarfile.open(found[0]) as tar:
    for name in files:
        member = tar.extractfile(sdist_dir + '/' + name)
        if member is None:
            sys.exit(f'{found[0]} holds no file {sdist_dir}/{name}')
        with open(os.path.join(out, name + '.part'), 'wb') as f:
            f.write(member.read())
        os.replace(os.path.join(out, name + '.part'), os.path.join(out, name))
"#;

fn extract(tmp: &Path, dir: &Path, sha256: &str, files: &[String]) -> Result {
    let mut cmd = Command::new("python3");
    cmd.args(["-c", EXTRACT_PY]).arg(tmp).arg(dir).arg(sha256).arg(SDIST_DIR).args(files);
    run(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each vocabulary fetched has its test, and each test's vocabulary is fetched.
    #[test]
    fn the_fetched_vocabularies_are_the_tested_ones() {
        let test = std::fs::read_to_string(root().join("tests/tokenizer_goldens.rs")).unwrap();
        let tested: Vec<&str> =
            test.lines().filter_map(|l| l.split_once("=> \"")).map(|(_, r)| r.trim_end_matches("\",")).collect();
        let mut fetched = VOCABS.to_vec();
        let mut tested_sorted = tested.clone();
        fetched.sort();
        tested_sorted.sort();
        assert_eq!(fetched, tested_sorted);
    }

    /// The sdist's hash is checked before anything is extracted; a mismatch extracts nothing.
    #[test]
    fn a_source_package_of_another_hash_is_refused() {
        let tmp = std::env::temp_dir().join(format!("weft-xtask-vocab-{}", std::process::id()));
        let out = tmp.join("out");
        std::fs::create_dir_all(&tmp).unwrap();
        let make = format!(
            "import io, sys, tarfile\n\
             t = tarfile.open(sys.argv[1] + '/p-1.0.tar.gz', 'w:gz')\n\
             data = b'golden'\n\
             info = tarfile.TarInfo('{SDIST_DIR}/ggml-vocab-x.gguf.inp'); info.size = len(data)\n\
             t.addfile(info, io.BytesIO(data)); t.close()\n"
        );
        assert!(Command::new("python3").args(["-c", &make]).arg(&tmp).status().unwrap().success());
        let file = vec!["ggml-vocab-x.gguf.inp".to_string()];
        let zeros = "0".repeat(64);
        assert!(extract(&tmp, &out, &zeros, &file).is_err());
        assert!(!out.join(&file[0]).exists(), "nothing is extracted from a refused package");
        let hash = Command::new("python3")
            .args(["-c", "import glob, hashlib, sys; print(hashlib.sha256(open(glob.glob(sys.argv[1] + '/*.tar.gz')[0], 'rb').read()).hexdigest())"])
            .arg(&tmp)
            .output()
            .unwrap();
        let hash = String::from_utf8(hash.stdout).unwrap();
        extract(&tmp, &out, hash.trim(), &file).unwrap();
        assert_eq!(std::fs::read(out.join(&file[0])).unwrap(), b"golden");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
