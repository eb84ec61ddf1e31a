//! `--model hf:OWNER/REPO[:QUANT]` against a local stand-in for the Hugging Face hub: the same
//! URLs and headers (the model API's listing; HEAD and GET of resolve URLs answered with a
//! redirect to storage carrying `X-Repo-Commit`, `X-Linked-Etag` and `X-Linked-Size`; ranges
//! served by the storage), serving tiny GGUF models, with `HF_ENDPOINT` pointed at it.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use weft::model::tiny;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const TOKEN: &str = "hf_test_token";

/// One file of a repository: the bytes the storage sends and the sha256 the hub lists (they
/// differ for a file corrupted on the way).
struct HubFile {
    name: String,
    served: Vec<u8>,
    sha256: String,
}

impl HubFile {
    fn new(name: &str, bytes: Vec<u8>) -> HubFile {
        HubFile { name: name.into(), sha256: sha256(&bytes), served: bytes }
    }
}

struct Repo {
    id: &'static str,
    files: Vec<HubFile>,
    /// Private: everything but a request with this token gets 401, as the hub answers.
    private: bool,
}

/// One request the server saw.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    range: Option<String>,
    auth: Option<String>,
}

struct Hub {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Cut the next storage GET off halfway through its body.
    cut_next: Arc<AtomicBool>,
}

impl Hub {
    /// The hub and its storage, on two ports (two origins, as the real ones are two hosts).
    fn start(repos: Vec<Repo>) -> Hub {
        let hub = TcpListener::bind("127.0.0.1:0").unwrap();
        let storage = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", hub.local_addr().unwrap());
        let storage_url = format!("http://{}", storage.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let cut_next = Arc::new(AtomicBool::new(false));
        let repos = Arc::new(repos);
        for listener in [hub, storage] {
            let (repos, log, cut, storage_url) = (repos.clone(), seen.clone(), cut_next.clone(), storage_url.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    answer(stream, &repos, &storage_url, &log, &cut);
                }
            });
        }
        Hub { url, seen, cut_next }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn storage_gets(&self) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.method == "GET" && s.path.starts_with("/storage/")).collect()
    }
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Answer one request (one per connection: every answer closes it).
fn answer(mut stream: TcpStream, repos: &[Repo], storage_url: &str, seen: &Mutex<Vec<Seen>>, cut_next: &AtomicBool) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let (mut range, mut auth) = (None, None);
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
            break;
        }
        if let Some((key, value)) = header.split_once(':') {
            match key.to_ascii_lowercase().as_str() {
                "range" => range = Some(value.trim().to_string()),
                "authorization" => auth = Some(value.trim().to_string()),
                _ => {}
            }
        }
    }
    seen.lock().unwrap().push(Seen {
        method: method.clone(),
        path: path.clone(),
        range: range.clone(),
        auth: auth.clone(),
    });
    let head = method == "HEAD";
    let authorized = |repo: &Repo| !repo.private || auth.as_deref() == Some(&format!("Bearer {TOKEN}"));
    let repo_named = |id: &str| repos.iter().find(|r| r.id == id);

    if let Some(rest) = path.strip_prefix("/api/models/") {
        let id = rest.strip_suffix("/revision/main").unwrap_or("");
        match repo_named(id) {
            Some(repo) if authorized(repo) => {
                let siblings: Vec<_> = repo.files.iter().map(|f| serde_json::json!({"rfilename": f.name})).collect();
                let body = serde_json::json!({"id": repo.id, "sha": COMMIT, "siblings": siblings}).to_string();
                respond(&mut stream, "200 OK", &[("Content-Type", "application/json".into())], body.as_bytes(), head);
            }
            Some(_) => respond(&mut stream, "401 Unauthorized", &[], b"{\"error\":\"Invalid credentials\"}", head),
            None => respond(&mut stream, "404 Not Found", &[], b"{\"error\":\"Repository not found\"}", head),
        }
    } else if let Some(etag) = path.strip_prefix("/storage/") {
        let Some(file) = repos.iter().flat_map(|r| &r.files).find(|f| f.sha256 == etag) else {
            return respond(&mut stream, "404 Not Found", &[], b"", head);
        };
        let total = file.served.len();
        let from: usize =
            range.as_deref().and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok()).unwrap_or(0);
        let body = &file.served[from.min(total)..];
        let mut headers = vec![("Content-Length", body.len().to_string())];
        let status = if range.is_some() {
            headers.push(("Content-Range", format!("bytes {from}-{}/{total}", total - 1)));
            "206 Partial Content"
        } else {
            "200 OK"
        };
        if !head && cut_next.swap(false, Ordering::SeqCst) {
            // The whole length announced, half of it sent, the connection gone.
            write_head(&mut stream, status, &headers);
            let _ = stream.write_all(&body[..body.len() / 2]);
            let _ = stream.flush();
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
        respond(&mut stream, status, &headers, body, head);
    } else {
        // /OWNER/REPO/resolve/REVISION/FILE
        let segments: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
        let found = match segments[..] {
            [owner, name, "resolve", _, file] => repo_named(&format!("{owner}/{name}"))
                .and_then(|repo| Some((repo, repo.files.iter().find(|f| f.name == file)?))),
            _ => None,
        };
        match found {
            Some((repo, file)) if authorized(repo) => {
                let headers = [
                    ("Location", format!("{storage_url}/storage/{}", file.sha256)),
                    ("X-Repo-Commit", COMMIT.to_string()),
                    ("X-Linked-Etag", format!("\"{}\"", file.sha256)),
                    ("X-Linked-Size", file.served.len().to_string()),
                    // The git id of the LFS pointer file, as the hub sends beside the linked one.
                    ("ETag", "\"0000000000000000000000000000000000000000\"".to_string()),
                    ("Content-Length", "0".to_string()),
                ];
                respond(&mut stream, "302 Found", &headers, b"", head);
            }
            Some(_) => respond(&mut stream, "401 Unauthorized", &[], b"", head),
            None => respond(&mut stream, "404 Not Found", &[], b"", head),
        }
    }
}

fn write_head(stream: &mut TcpStream, status: &str, headers: &[(&str, String)]) {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (key, value) in headers {
        head.push_str(&format!("{key}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
}

fn respond(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8], head: bool) {
    let mut headers = headers.to_vec();
    if !headers.iter().any(|(k, _)| *k == "Content-Length") {
        headers.push(("Content-Length", body.len().to_string()));
    }
    write_head(stream, status, &headers);
    if !head {
        let _ = stream.write_all(body);
    }
    let _ = stream.flush();
}

/// The tiny model (2 layers, hidden 64, Q8_0 matrices, a byte-level tokenizer).
fn tiny_q8_0() -> Vec<u8> {
    let config = tiny::tiny_config();
    tiny::gguf_bytes(&config, &tiny::random_weights(&config, 6, weft::DType::Q8_0), weft::DType::Q8_0)
}

/// A tiny model wide enough for Q4_K matrices, as a Q4_K_M file would hold.
fn tiny_q4_k() -> Vec<u8> {
    let config = weft::model::config::ModelConfig {
        hidden_size: 256,
        intermediate_size: 320,
        head_dim: 64,
        ..tiny::tiny_config()
    };
    tiny::gguf_bytes(&config, &tiny::random_weights(&config, 1, weft::DType::Q4_K), weft::DType::Q4_K)
}

/// A fresh, empty HF_HOME for one test.
fn hf_home(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-hub-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Run `weft args` with the hub at `endpoint` and the cache under `home`; `extra` adds to
/// (or, with an empty value, removes from) the environment.
fn weft(args: &[&str], endpoint: &str, home: &Path, extra: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weft"));
    command.args(args).env("HF_ENDPOINT", endpoint).env("HF_HOME", home);
    for var in ["HF_HUB_CACHE", "HF_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE"] {
        command.env_remove(var);
    }
    for (key, value) in extra {
        if value.is_empty() {
            command.env_remove(key);
        } else {
            command.env(key, value);
        }
    }
    let out = command.output().expect("the weft binary runs");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn repo_dir(home: &Path) -> PathBuf {
    home.join("hub/models--test--tiny-GGUF")
}

fn gpu_required() -> bool {
    std::env::var("WEFT_REQUIRE_GPU").as_deref() == Ok("1")
}

/// `weft pull` downloads into huggingface_hub's layout, resumes a transfer cut off halfway
/// (asking the storage for the rest with a range), sends the token to the hub and not to its
/// storage, and afterwards finds the file in the cache: no second download, none at all
/// offline or with the hub unreachable.
#[test]
fn pull_downloads_resumes_and_then_uses_the_cache() {
    let q8 = tiny_q8_0();
    let q4 = tiny_q4_k();
    let hub = Hub::start(vec![Repo {
        id: "test/tiny-GGUF",
        files: vec![
            HubFile::new("README.md", b"# tiny\n".to_vec()),
            HubFile::new("tiny-Q8_0.gguf", q8.clone()),
            HubFile::new("tiny-Q4_K_M.gguf", q4.clone()),
        ],
        private: true,
    }]);
    let home = hf_home("pull");
    let token = [("HF_TOKEN", TOKEN)];

    hub.cut_next.store(true, Ordering::SeqCst);
    let (ok, stdout, stderr) = weft(&["pull", "hf:test/tiny-GGUF:q8_0"], &hub.url, &home, &token);
    assert!(ok, "{stderr}");
    let snapshot = repo_dir(&home).join("snapshots").join(COMMIT).join("tiny-Q8_0.gguf");
    assert_eq!(stdout.trim(), snapshot.display().to_string());
    assert_eq!(std::fs::read(&snapshot).unwrap(), q8, "the snapshot holds the model's bytes");
    let blob = PathBuf::from("../../blobs").join(sha256(&q8));
    assert_eq!(std::fs::read_link(&snapshot).unwrap(), blob, "a relative link to the blob, as huggingface_hub makes");
    assert_eq!(std::fs::read_to_string(repo_dir(&home).join("refs/main")).unwrap(), COMMIT);
    let leftovers: Vec<_> = std::fs::read_dir(repo_dir(&home).join("blobs")).unwrap().flatten().collect();
    assert_eq!(leftovers.len(), 1, "only the blob, no .incomplete: {leftovers:?}");

    let gets = hub.storage_gets();
    assert_eq!(gets.len(), 2, "cut off, then resumed: {gets:?}");
    assert_eq!(gets[0].range, None);
    assert_eq!(gets[1].range, Some(format!("bytes={}-", q8.len() / 2)), "the rest only");
    assert!(stderr.contains("resuming"), "{stderr}");
    for seen in hub.seen() {
        let on_hub = !seen.path.starts_with("/storage/");
        assert_eq!(seen.auth.is_some(), on_hub, "the token goes to the hub alone: {seen:?}");
        if on_hub {
            assert_eq!(seen.auth.as_deref(), Some(&*format!("Bearer {TOKEN}")));
        }
    }

    // Cached: the hub is asked what main is, the file is not downloaded again.
    let before = hub.seen().len();
    let (ok, stdout, stderr) = weft(&["pull", "hf:test/tiny-GGUF:Q8_0"], &hub.url, &home, &token);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.trim(), snapshot.display().to_string());
    assert_eq!(hub.storage_gets().len(), 2, "no second download");
    assert!(hub.seen()[before..].iter().all(|s| s.method == "HEAD" || s.path.starts_with("/api/")));
    assert!(stderr.contains("is in the cache"), "{stderr}");

    // Offline, and with the hub unreachable: the cached snapshot, no request at all.
    let before = hub.seen().len();
    let (ok, stdout, stderr) = weft(&["pull", "hf:test/tiny-GGUF:Q8_0"], &hub.url, &home, &[("HF_HUB_OFFLINE", "1")]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.trim(), snapshot.display().to_string());
    let (ok, stdout, stderr) = weft(&["pull", "hf:test/tiny-GGUF:Q8_0"], "http://127.0.0.1:1", &home, &[]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.trim(), snapshot.display().to_string());
    assert!(stderr.contains("cannot reach http://127.0.0.1:1"), "{stderr}");
    assert_eq!(hub.seen().len(), before);
    // `info --model` takes the name too (and needs no GPU).
    let no_gpu = [("HF_HUB_OFFLINE", "1"), ("VK_ICD_FILENAMES", "/nonexistent"), ("WGPU_BACKEND", "vulkan")];
    let (ok, stdout, stderr) = weft(&["info", "--model", "hf:test/tiny-GGUF:Q8_0"], &hub.url, &home, &no_gpu);
    assert!(ok && stdout.contains("weft runs it: yes"), "{stdout}\n{stderr}");
    // A quant that is not cached, offline: says so and what to do.
    let (ok, _, stderr) = weft(&["pull", "hf:test/tiny-GGUF:Q4_K_M"], &hub.url, &home, &[("HF_HUB_OFFLINE", "1")]);
    assert!(!ok);
    assert!(stderr.contains("HF_HUB_OFFLINE is set") && stderr.contains("tiny-Q8_0.gguf"), "{stderr}");

    // Without a quant: Q4_K_M, and it says which file it took.
    let (ok, stdout, stderr) = weft(&["pull", "hf:test/tiny-GGUF"], &hub.url, &home, &token);
    assert!(ok, "{stderr}");
    assert!(stdout.trim().ends_with("tiny-Q4_K_M.gguf"), "{stdout}");
    assert!(stderr.contains("tiny-Q4_K_M.gguf (Q4_K_M, the default"), "{stderr}");
    assert_eq!(std::fs::read(stdout.trim()).unwrap(), q4);
    std::fs::remove_dir_all(&home).ok();
}

/// A file whose sha256 is not the one the hub lists is refused with a clear error and leaves
/// nothing in the cache that a later run would take for the model.
#[test]
fn a_corrupted_download_is_refused_and_not_cached() {
    let good = tiny_q8_0();
    let mut corrupted = good.clone();
    let middle = corrupted.len() / 2;
    corrupted[middle] ^= 0x40;
    let file = HubFile { name: "tiny-Q8_0.gguf".into(), served: corrupted, sha256: sha256(&good) };
    let hub = Hub::start(vec![Repo { id: "test/tiny-GGUF", files: vec![file], private: false }]);
    let home = hf_home("corrupted");

    let (ok, stdout, stderr) = weft(&["pull", "hf:test/tiny-GGUF"], &hub.url, &home, &[]);
    assert!(!ok, "{stdout}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(last.starts_with("error: hf:test/tiny-GGUF: the downloaded tiny-Q8_0.gguf has sha256"), "{stderr}");
    assert!(last.contains(&format!("but the hub lists {}", sha256(&good))), "{last}");
    assert!(last.contains("discarded") && last.contains("run the command again"), "{last}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let blobs: Vec<_> = std::fs::read_dir(repo_dir(&home).join("blobs")).unwrap().flatten().collect();
    assert!(blobs.is_empty(), "nothing kept: {blobs:?}");
    assert!(!repo_dir(&home).join("snapshots").exists());
    let (ok, _, stderr) = weft(&["pull", "hf:test/tiny-GGUF"], &hub.url, &home, &[("HF_HUB_OFFLINE", "1")]);
    assert!(!ok && stderr.contains("test/tiny-GGUF is not in the cache"), "{stderr}");
    std::fs::remove_dir_all(&home).ok();
}

/// What an interrupted run (of weft or huggingface_hub) left in `blobs/<sha256>.incomplete` is
/// kept: the next run asks only for the rest.
#[test]
fn a_partial_download_from_an_earlier_run_is_resumed() {
    let q8 = tiny_q8_0();
    let hub = Hub::start(vec![Repo {
        id: "test/tiny-GGUF",
        files: vec![HubFile::new("tiny-Q8_0.gguf", q8.clone())],
        private: false,
    }]);
    let home = hf_home("partial");
    let blobs = repo_dir(&home).join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let kept = q8.len() / 3;
    std::fs::write(blobs.join(format!("{}.incomplete", sha256(&q8))), &q8[..kept]).unwrap();

    let (ok, stdout, stderr) = weft(&["pull", "hf:test/tiny-GGUF"], &hub.url, &home, &[]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("tiny-Q8_0.gguf (the only GGUF file)"), "{stderr}");
    let gets = hub.storage_gets();
    assert_eq!(gets.len(), 1, "{gets:?}");
    assert_eq!(gets[0].range, Some(format!("bytes={kept}-")));
    assert_eq!(std::fs::read(stdout.trim()).unwrap(), q8);
    std::fs::remove_dir_all(&home).ok();
}

/// Every command that takes --model takes a name, and a name the hub refuses, or a quant the
/// repository lacks or has several of, is one line saying what is wrong and what to do.
#[test]
fn names_the_hub_refuses_are_clear_errors_in_every_command() {
    let hub = Hub::start(vec![
        Repo {
            id: "test/tiny-GGUF",
            files: vec![
                HubFile::new("tiny-Q4_K_M.gguf", b"a".to_vec()),
                HubFile::new("tiny-Q4_K_S.gguf", b"b".to_vec()),
            ],
            private: false,
        },
        Repo { id: "test/private", files: vec![], private: true },
    ]);
    let home = hf_home("refused");
    let cases: [(&str, &str); 5] = [
        ("hf:test/missing", "answered HTTP 404 for the repository: not found: check the name"),
        ("hf:test/private", "or it is private: check the name, or set HF_TOKEN"),
        (
            "hf:test/tiny-GGUF:Q8_0",
            "no GGUF files match \"Q8_0\"; the repository's GGUF files: tiny-Q4_K_M.gguf, tiny-Q4_K_S.gguf",
        ),
        ("hf:test/tiny-GGUF:q4_k", "\"q4_k\" matches several GGUF files: tiny-Q4_K_M.gguf, tiny-Q4_K_S.gguf"),
        ("hf:test", "expected hf:OWNER/REPO or hf:OWNER/REPO:QUANT"),
    ];
    let commands: [&[&str]; 5] =
        [&["generate", "--prompt", "hi"], &["chat"], &["serve", "--port", "0"], &["bench"], &["info"]];
    for command in commands {
        for (name, problem) in cases {
            let (ok, _, stderr) = weft(&[command, &["--model", name]].concat(), &hub.url, &home, &[]);
            assert!(!ok, "{command:?} {name}");
            let line = stderr.trim_end();
            assert!(!line.contains('\n'), "one line, got:\n{stderr}");
            assert!(line.contains(name) && line.contains(problem), "{command:?} {name}: {line}");
        }
    }
    let (ok, _, stderr) = weft(&["pull", "models/x.gguf"], &hub.url, &home, &[]);
    assert!(!ok && stderr.contains("weft pull takes a model name, hf:OWNER/REPO[:QUANT]"), "{stderr}");
    std::fs::remove_dir_all(&home).ok();
}

/// `weft generate --model hf:…` downloads the model and generates what the same file does
/// from a path.
#[test]
fn generate_runs_a_model_by_name() {
    let q8 = tiny_q8_0();
    let hub = Hub::start(vec![Repo {
        id: "test/tiny-GGUF",
        files: vec![HubFile::new("tiny-Q8_0.gguf", q8.clone())],
        private: false,
    }]);
    let home = hf_home("generate");
    let local = home.join("local.gguf");
    std::fs::write(&local, &q8).unwrap();
    let args = |model: &str| {
        ["generate", "--model", model, "--prompt", "hello", "--max-tokens", "8", "--temperature", "0"]
            .map(str::to_string)
            .to_vec()
    };
    let run = |model: &str| {
        let args = args(model);
        weft(&args.iter().map(String::as_str).collect::<Vec<_>>(), &hub.url, &home, &[])
    };
    let (ok, by_name, stderr) = run("hf:test/tiny-GGUF:Q8_0");
    if !ok && !gpu_required() && stderr.contains("no GPU adapter found") {
        return eprintln!("skipping: no GPU adapter");
    }
    assert!(ok, "{stderr}");
    assert_eq!(hub.storage_gets().len(), 1);
    let (ok, by_path, stderr) = run(local.to_str().unwrap());
    assert!(ok, "{stderr}");
    assert_eq!(by_name, by_path);
    std::fs::remove_dir_all(&home).ok();
}
