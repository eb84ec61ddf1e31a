//! Models by name: `--model hf:OWNER/REPO[:QUANT]` is a GGUF file of a Hugging Face hub
//! repository, downloaded once into the hub's local cache and read from there afterwards.
//!
//! The cache is `huggingface_hub`'s own layout (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`): `models--OWNER--REPO/blobs/<etag>` holds the bytes,
//! `snapshots/<commit>/<file>` links to them and `refs/main` names the commit, so a model that
//! Python tools or llama.cpp's users fetched is not fetched again, and the other way round.
//! A transfer lands in `blobs/<etag>.incomplete` (the name `huggingface_hub` resumes from too)
//! and becomes the blob only once its size and, for LFS files, its sha256 match what the hub
//! said in the resolve URL's headers. `HF_ENDPOINT` (a mirror), `HF_TOKEN` (or the token
//! `huggingface-cli login` saved) and `HF_HUB_OFFLINE` mean what they mean to `huggingface_hub`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use weft::{Result, WeftError};

/// Where names resolve unless `HF_ENDPOINT` says otherwise.
const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The quantization taken when a name gives none, as llama.cpp's `-hf` does: a common middle
/// ground between size and quality that most GGUF repositories publish.
const DEFAULT_QUANT: &str = "Q4_K_M";

/// The branch a name follows (`refs/main` in the cache).
const REVISION: &str = "main";

/// Attempts in a row that may end without a byte more before a download gives up (its
/// `.incomplete` file stays, and the next run resumes it).
const TRIES: u32 = 5;

/// Redirects followed at most: the hub sends a renamed repository to its new name and a large
/// file to its storage, seldom more than two hops.
const MAX_REDIRECTS: usize = 10;

/// A parsed `hf:OWNER/REPO[:QUANT]`.
#[derive(Debug, PartialEq)]
pub struct ModelName {
    /// `OWNER/REPO`.
    pub repo: String,
    /// Picks the GGUF file whose name contains it, ignoring case.
    pub quant: Option<String>,
}

impl ModelName {
    /// The name in `arg`, or `None` when `arg` is not an `hf:` name (a local path then).
    pub fn parse(arg: &str) -> Option<Result<ModelName>> {
        let rest = arg.strip_prefix("hf:")?;
        let (repo, quant) = match rest.split_once(':') {
            Some((repo, quant)) => (repo, Some(quant)),
            None => (rest, None),
        };
        let part_ok = |p: &str| {
            !p.is_empty() && p != "." && p != ".." && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        let repo_ok = repo.split_once('/').is_some_and(|(owner, name)| part_ok(owner) && part_ok(name));
        if !repo_ok || quant.is_some_and(str::is_empty) {
            return Some(Err(WeftError::model(
                arg,
                "not a model name: expected hf:OWNER/REPO or hf:OWNER/REPO:QUANT (e.g. \
                 hf:bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M)",
            )));
        }
        Some(Ok(ModelName { repo: repo.to_string(), quant: quant.map(str::to_string) }))
    }

    fn error(&self, detail: impl Into<String>) -> WeftError {
        WeftError::model(self.to_string(), detail)
    }
}

impl std::fmt::Display for ModelName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hf:{}", self.repo)?;
        match &self.quant {
            Some(quant) => write!(f, ":{quant}"),
            None => Ok(()),
        }
    }
}

/// `model` itself, or for an `hf:` name the local file it names (downloaded when missing).
pub fn local_path(model: PathBuf) -> Result<PathBuf> {
    match model.to_str().and_then(ModelName::parse) {
        None => Ok(model),
        Some(name) => Hub::from_env()?.model_file(&name?),
    }
}

/// `weft pull`: fetch the named model into the cache and print its local path on stdout.
pub fn pull(model: &str) -> Result<()> {
    let Some(name) = ModelName::parse(model) else {
        return Err(WeftError::model(
            model,
            "weft pull takes a model name, hf:OWNER/REPO[:QUANT] (e.g. hf:bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M)",
        ));
    };
    let path = Hub::from_env()?.model_file(&name?)?;
    println!("{}", path.display());
    Ok(())
}

/// The hub and the cache as the environment sets them.
struct Hub {
    endpoint: String,
    token: Option<String>,
    cache: PathBuf,
    offline: bool,
    agent: ureq::Agent,
}

/// Why a request to the hub failed: the network (worth retrying, or falling back to the
/// cache), or an answer that retrying will not change.
enum Net {
    Unreachable(String),
    Refused(WeftError),
}

/// What the hub says about one file of a repository.
struct FileMeta {
    /// The file's path in the repository, `/`-separated.
    file: String,
    /// The resolve URL to download it from.
    url: String,
    commit: String,
    /// The sha256 of an LFS file, the git blob id of a small one; the blob's name in the cache.
    etag: String,
    size_bytes: u64,
}

/// Which redirects a request follows: all for a download (the hub hands large files to its
/// storage), for metadata only those before the hub's answer about the file (a renamed
/// repository's), since the headers that describe it are on the redirect to storage.
#[derive(Clone, Copy, PartialEq)]
enum Follow {
    All,
    ToFileMetadata,
}

impl Hub {
    fn from_env() -> Result<Hub> {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.trim().is_empty());
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let endpoint = endpoint.trim().trim_end_matches('/').to_string();
        if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
            return Err(WeftError::Unsupported(format!(
                "HF_ENDPOINT={endpoint:?} is not an http:// or https:// URL; unset it to use the Hugging Face hub"
            )));
        }
        // huggingface_hub's defaults: $HF_HOME, else $XDG_CACHE_HOME/huggingface, else
        // ~/.cache/huggingface.
        let user_cache = || {
            let user_home = var("HOME").or_else(|| var("USERPROFILE"));
            var("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| user_home.map(|h| Path::new(&h).join(".cache")))
        };
        let home =
            var("HF_HOME").map(PathBuf::from).or_else(|| Some(user_cache()?.join("huggingface"))).ok_or_else(|| {
                WeftError::Unsupported("no cache directory for hf: models: set HF_HOME to a writable directory".into())
            })?;
        let cache = var("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| home.join("hub"));
        let token_file = var("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| home.join("token"));
        let token = var("HF_TOKEN")
            .or_else(|| fs::read_to_string(token_file).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let offline =
            var("HF_HUB_OFFLINE").is_some_and(|v| ["1", "on", "yes", "true"].contains(&v.to_lowercase().as_str()));
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            // Redirects are followed by `request`, which decides where the token may go.
            .max_redirects(0)
            .user_agent(concat!("weft/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(Duration::from_secs(30)))
            // A stalled transfer errors and resumes instead of hanging for ever.
            .timeout_per_read(Some(Duration::from_secs(60)))
            .build()
            .new_agent();
        Ok(Hub { endpoint, token, cache, offline, agent })
    }

    /// `models--OWNER--REPO` under the cache.
    fn repo_dir(&self, name: &ModelName) -> PathBuf {
        self.cache.join(format!("models--{}", name.repo.replace('/', "--")))
    }

    /// The local file `name` stands for: the file the hub lists now, downloaded when its blob
    /// is not cached; the cached snapshot when offline or when the hub cannot be reached.
    fn model_file(&self, name: &ModelName) -> Result<PathBuf> {
        if self.offline {
            return self.cached(name).map_err(|why| {
                name.error(format!("HF_HUB_OFFLINE is set and {why}; unset HF_HUB_OFFLINE to download it"))
            });
        }
        let unreachable = |why: String| {
            let path = self.cached(name).map_err(|cached| {
                name.error(format!(
                    "cannot reach {} ({why}), and {cached}; check the network (or HF_ENDPOINT) and try again",
                    self.endpoint
                ))
            })?;
            tracing::warn!("{name}: cannot reach {} ({why}); using the cached {}", self.endpoint, path.display());
            Ok(path)
        };
        let (commit, files) = match self.listing(name) {
            Ok(listing) => listing,
            Err(Net::Unreachable(why)) => return unreachable(why),
            Err(Net::Refused(e)) => return Err(e),
        };
        let (file, why) = pick(name, &files, false).map_err(|detail| name.error(detail))?;
        tracing::info!("{name}: {file} ({why})");
        let meta = match self.metadata(name, &commit, &file) {
            Ok(meta) => meta,
            Err(Net::Unreachable(why)) => return unreachable(why),
            Err(Net::Refused(e)) => return Err(e),
        };
        let repo_dir = self.repo_dir(name);
        let blob = repo_dir.join("blobs").join(&meta.etag);
        if blob.exists() {
            tracing::info!("{name}: {file} is in the cache ({})", self.cache.display());
        } else {
            self.download(name, &meta, &blob)?;
        }
        let snapshot = repo_dir.join("snapshots").join(&meta.commit).join(&meta.file);
        let io = |what: &str, path: &Path, e: io::Error| name.error(format!("{what} {}: {e}", path.display()));
        link(&blob, &snapshot, &meta).map_err(|e| io("linking", &snapshot, e))?;
        let reference = repo_dir.join("refs").join(REVISION);
        if fs::read_to_string(&reference).ok().as_deref() != Some(meta.commit.as_str()) {
            fs::create_dir_all(repo_dir.join("refs")).map_err(|e| io("creating", &repo_dir, e))?;
            fs::write(&reference, &meta.commit).map_err(|e| io("writing", &reference, e))?;
        }
        Ok(snapshot)
    }

    /// The cached file `name` stands for, from the snapshot `refs/main` names; `Err` says why
    /// there is none.
    fn cached(&self, name: &ModelName) -> std::result::Result<PathBuf, String> {
        let repo_dir = self.repo_dir(name);
        let commit = fs::read_to_string(repo_dir.join("refs").join(REVISION))
            .map_err(|_| format!("{} is not in the cache ({})", name.repo, self.cache.display()))?;
        let snapshot = repo_dir.join("snapshots").join(commit.trim());
        let mut files = Vec::new();
        files_under(&snapshot, "", &mut files);
        let (file, why) = pick(name, &files, true)?;
        tracing::info!("{name}: {file} from the cache ({why})");
        Ok(snapshot.join(file))
    }

    /// The commit `main` is at and the repository's files, from the hub's model API.
    fn listing(&self, name: &ModelName) -> std::result::Result<(String, Vec<String>), Net> {
        let url = format!("{}/api/models/{}/revision/{REVISION}", self.endpoint, name.repo);
        let response = self.request(false, &url, None, Follow::All)?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err(Net::Refused(self.refusal(name, status, "the repository")));
        }
        let body = response
            .into_body()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| Net::Unreachable(e.to_string()))?;
        let not_a_hub = |what: &str| {
            Net::Refused(name.error(format!(
                "the listing {url} answered has no {what}: is HF_ENDPOINT={} a Hugging Face hub?",
                self.endpoint
            )))
        };
        let json: serde_json::Value = serde_json::from_str(&body).map_err(|_| not_a_hub("JSON"))?;
        let commit = json["sha"].as_str().filter(|c| is_plain(c)).ok_or_else(|| not_a_hub("commit (sha)"))?;
        let siblings = json["siblings"].as_array().ok_or_else(|| not_a_hub("file list (siblings)"))?;
        let files = siblings.iter().filter_map(|s| s["rfilename"].as_str().map(str::to_string)).collect();
        Ok((commit.to_string(), files))
    }

    /// The size, etag and commit of `file`, from the headers of the hub's answer to a HEAD of
    /// its resolve URL (`X-Linked-*` for LFS files, whose answer redirects to storage).
    fn metadata(&self, name: &ModelName, commit: &str, file: &str) -> std::result::Result<FileMeta, Net> {
        let url = format!("{}/{}/resolve/{commit}/{}", self.endpoint, name.repo, encode_path(file));
        let response = self.request(true, &url, None, Follow::ToFileMetadata)?;
        let status = response.status().as_u16();
        if !(200..400).contains(&status) {
            return Err(Net::Refused(self.refusal(name, status, file)));
        }
        let header = |key: &str| response.headers().get(key).and_then(|v| v.to_str().ok()).map(str::trim);
        let missing = |what: &str| {
            Net::Refused(name.error(format!(
                "the hub's answer for {file} has no {what} header: is HF_ENDPOINT={} a Hugging Face hub?",
                self.endpoint
            )))
        };
        let etag = header("x-linked-etag").or_else(|| header("etag")).ok_or_else(|| missing("ETag"))?;
        let etag = etag.trim_start_matches("W/").trim_matches('"');
        let size = header("x-linked-size").or_else(|| header("content-length"));
        let size_bytes = size.and_then(|s| s.parse().ok()).ok_or_else(|| missing("X-Linked-Size"))?;
        let commit = header("x-repo-commit").unwrap_or(commit);
        // Both become file names in the cache.
        if !is_plain(etag) || !is_plain(commit) {
            return Err(Net::Refused(name.error(format!(
                "the hub's answer for {file} has an etag ({etag:?}) or commit ({commit:?}) that is not a plain name"
            ))));
        }
        let (etag, commit) = (etag.to_string(), commit.to_string());
        Ok(FileMeta { file: file.to_string(), url, commit, etag, size_bytes })
    }

    /// Download `meta`'s file into `blob`: resumed from an `.incomplete` file an earlier try
    /// left, retried when the connection breaks, and moved into place only once its size and
    /// sha256 are the hub's. One process at a time per blob: a second waits on the lock file
    /// (`.locks/`, as `huggingface_hub` locks it) and then finds the blob there.
    fn download(&self, name: &ModelName, meta: &FileMeta, blob: &Path) -> Result<()> {
        let repo_dir = self.repo_dir(name);
        let locks = self.cache.join(".locks").join(repo_dir.file_name().unwrap_or_default());
        let io = |what: &str, path: &Path, e: io::Error| name.error(format!("{what} {}: {e}", path.display()));
        for dir in [&locks, &repo_dir.join("blobs")] {
            fs::create_dir_all(dir).map_err(|e| io("creating", dir, e))?;
        }
        let lock_path = locks.join(format!("{}.lock", meta.etag));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io("opening", &lock_path, e))?;
        if lock.try_lock().is_err() {
            tracing::info!("{name}: waiting for another download of {} to finish", meta.file);
            lock.lock().map_err(|e| io("locking", &lock_path, e))?;
        }
        if blob.exists() {
            return Ok(());
        }
        let partial = blob.with_file_name(format!("{}.incomplete", meta.etag));
        let mut out = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&partial)
            .map_err(|e| io("opening", &partial, e))?;
        let mut sink = Sink { out: &mut out, sha256: Sha256::new(), done_bytes: 0 };
        sink.resume(meta.size_bytes).map_err(|e| io("reading", &partial, e))?;
        if sink.done_bytes > 0 {
            tracing::info!("{name}: resuming {} at {} of {} bytes", meta.file, sink.done_bytes, meta.size_bytes);
        }
        let mut progress = crate::progress::downloading(meta.file.clone(), meta.size_bytes);
        let mut failures = 0;
        while sink.done_bytes < meta.size_bytes {
            let before = sink.done_bytes;
            let why = match self.transfer(name, meta, &mut sink, &mut progress) {
                Ok(()) if sink.done_bytes < meta.size_bytes => "the connection closed early".to_string(),
                Ok(()) => break,
                Err(Net::Refused(e)) => return Err(e),
                Err(Net::Unreachable(why)) => why,
            };
            failures = if sink.done_bytes > before { 1 } else { failures + 1 };
            if failures >= TRIES {
                return Err(name.error(format!(
                    "downloading {} stopped at {} of {} bytes ({why}); run the command again to resume",
                    meta.file, sink.done_bytes, meta.size_bytes
                )));
            }
            tracing::warn!(
                "{name}: {} at {} of {} bytes: {why}; resuming",
                meta.file,
                sink.done_bytes,
                meta.size_bytes
            );
            std::thread::sleep(Duration::from_millis(500 * failures as u64));
        }
        let sha256: String = sink.sha256.finalize().iter().map(|b| format!("{b:02x}")).collect();
        let lfs = meta.etag.len() == 64 && meta.etag.chars().all(|c| c.is_ascii_hexdigit());
        if lfs && sha256 != meta.etag.to_ascii_lowercase() {
            drop(out);
            let _ = fs::remove_file(&partial);
            return Err(name.error(format!(
                "the downloaded {} has sha256 {sha256}, but the hub lists {}: it was corrupted on the way and is \
                 discarded (nothing was cached); run the command again to download it anew",
                meta.file, meta.etag
            )));
        }
        out.sync_all().map_err(|e| io("writing", &partial, e))?;
        drop(out);
        fs::rename(&partial, blob).map_err(|e| io("moving into place", blob, e))?;
        Ok(())
    }

    /// One GET of `meta`'s file from `sink.done_bytes` on, into `sink`; `Ok` when the body
    /// ended (the caller checks whether it was all there).
    fn transfer(
        &self,
        name: &ModelName,
        meta: &FileMeta,
        sink: &mut Sink,
        progress: &mut impl FnMut(u64),
    ) -> std::result::Result<(), Net> {
        let from = sink.done_bytes;
        let response = self.request(false, &meta.url, (from > 0).then_some(from), Follow::All)?;
        let status = response.status().as_u16();
        let range_start = response
            .headers()
            .get("content-range")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes ")?.split('-').next()?.parse::<u64>().ok());
        let disk = |e: io::Error| Net::Refused(name.error(format!("writing {}: {e}", meta.file)));
        match status {
            206 if range_start == Some(from) => {}
            // The whole file (a server that ignores ranges): start over.
            200 => sink.restart().map_err(disk)?,
            206 | 416 => {
                sink.restart().map_err(disk)?;
                return Err(Net::Unreachable(format!("the server answered range {from}- with {status}")));
            }
            _ => return Err(Net::Refused(self.refusal(name, status, &meta.file))),
        }
        let mut body = response.into_body().into_reader();
        let mut buffer = vec![0u8; 1 << 18];
        loop {
            let read = match body.read(&mut buffer) {
                Ok(0) => return Ok(()),
                Ok(read) => read,
                Err(e) => return Err(Net::Unreachable(e.to_string())),
            };
            if sink.done_bytes + read as u64 > meta.size_bytes {
                sink.restart().map_err(disk)?;
                return Err(Net::Refused(name.error(format!(
                    "the server sent more of {} than the {} bytes the hub lists; nothing was cached",
                    meta.file, meta.size_bytes
                ))));
            }
            sink.write(&buffer[..read]).map_err(disk)?;
            progress(sink.done_bytes);
        }
    }

    /// Send a GET (or a HEAD) for `url`, following redirects by hand so that the token goes
    /// to the hub alone, never to the storage it redirects to.
    fn request(
        &self,
        head: bool,
        url: &str,
        range_from: Option<u64>,
        follow: Follow,
    ) -> std::result::Result<ureq::http::Response<ureq::Body>, Net> {
        let mut url = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let mut request = if head { self.agent.head(&url) } else { self.agent.get(&url) };
            if let Some(token) = &self.token
                && origin(&url) == origin(&self.endpoint)
            {
                request = request.header("Authorization", format!("Bearer {token}"));
            }
            if let Some(from) = range_from {
                request = request.header("Range", format!("bytes={from}-"));
            }
            let response = request.call().map_err(|e| Net::Unreachable(e.to_string()))?;
            let location = response.headers().get("location").and_then(|v| v.to_str().ok());
            let (true, Some(location)) = (response.status().is_redirection(), location) else {
                return Ok(response);
            };
            if follow == Follow::ToFileMetadata && response.headers().contains_key("x-repo-commit") {
                return Ok(response);
            }
            url = join(&url, location);
        }
        Err(Net::Unreachable(format!("more than {MAX_REDIRECTS} redirects from {url}")))
    }

    /// What an HTTP error status from the hub means, and what to do about it.
    fn refusal(&self, name: &ModelName, status: u16, what: &str) -> WeftError {
        let page = format!("{}/{}", self.endpoint, name.repo);
        let detail = match status {
            401 if self.token.is_some() => {
                "no such repository, or the token (HF_TOKEN or the saved login) may not read it".to_string()
            }
            401 => "no such repository, or it is private: check the name, or set HF_TOKEN to a token that may read it"
                .to_string(),
            403 => format!(
                "access refused: the repository is gated; accept its terms at {page} and set HF_TOKEN to a token \
                 of that account"
            ),
            404 => "not found: check the name".to_string(),
            429 => "too many requests: wait a minute and try again (a token in HF_TOKEN raises the limit)".into(),
            _ => "try again later".to_string(),
        };
        name.error(format!("the hub at {} answered HTTP {status} for {what}: {detail}", self.endpoint))
    }
}

/// A download's `.incomplete` file with the sha256 and length of what it holds so far.
struct Sink<'a> {
    out: &'a mut File,
    sha256: Sha256,
    done_bytes: u64,
}

impl Sink<'_> {
    /// Take in what an earlier try left in the file (dropped when longer than the whole).
    fn resume(&mut self, size_bytes: u64) -> io::Result<()> {
        if self.out.metadata()?.len() > size_bytes {
            return self.restart();
        }
        self.out.rewind()?;
        let mut buffer = vec![0u8; 1 << 20];
        loop {
            let read = self.out.read(&mut buffer)?;
            if read == 0 {
                return Ok(());
            }
            self.sha256.update(&buffer[..read]);
            self.done_bytes += read as u64;
        }
    }

    fn restart(&mut self) -> io::Result<()> {
        self.out.set_len(0)?;
        self.out.rewind()?;
        self.sha256 = Sha256::new();
        self.done_bytes = 0;
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.sha256.update(bytes);
        self.done_bytes += bytes.len() as u64;
        Ok(())
    }
}

/// Link `snapshot` to `blob`: a relative symlink where the system has them (what
/// `huggingface_hub` makes, so the cache moves as a whole), a hard link or a copy elsewhere.
fn link(blob: &Path, snapshot: &Path, meta: &FileMeta) -> io::Result<()> {
    if let Some(dir) = snapshot.parent() {
        fs::create_dir_all(dir)?;
    }
    #[cfg(unix)]
    {
        // From snapshots/<commit>/<dirs…>/ up to the repository's folder.
        let depth = meta.file.split('/').count() + 1;
        let target = Path::new(&"../".repeat(depth)).join("blobs").join(blob.file_name().unwrap_or_default());
        if fs::read_link(snapshot).is_ok_and(|t| t == target) {
            return Ok(());
        }
        if fs::symlink_metadata(snapshot).is_ok() {
            fs::remove_file(snapshot)?;
        }
        std::os::unix::fs::symlink(target, snapshot)
    }
    #[cfg(not(unix))]
    {
        if fs::metadata(snapshot).is_ok_and(|m| m.len() == meta.size_bytes) {
            return Ok(());
        }
        let _ = fs::remove_file(snapshot);
        fs::hard_link(blob, snapshot).or_else(|_| fs::copy(blob, snapshot).map(|_| ()))
    }
}

/// The files under `dir` (following links to blobs that exist), as `/`-separated paths
/// relative to it, after `prefix`.
fn files_under(dir: &Path, prefix: &str, files: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
        match fs::metadata(entry.path()) {
            Ok(m) if m.is_dir() => files_under(&entry.path(), &format!("{name}/"), files),
            Ok(_) => files.push(name),
            Err(_) => {}
        }
    }
}

/// The GGUF file of `files` that `name` asks for and why it is that one; `Err` says what
/// went wrong and lists the choices.
fn pick(name: &ModelName, files: &[String], cached: bool) -> std::result::Result<(String, String), String> {
    let mut ggufs: Vec<&str> = files
        .iter()
        .map(String::as_str)
        // Vision projectors are GGUF files too, but not models weft can run on their own.
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf") && !f.to_ascii_lowercase().contains("mmproj"))
        .collect();
    ggufs.sort_unstable();
    let which = if cached { "cached GGUF files" } else { "GGUF files" };
    let listed = |files: &[&str]| files.join(", ");
    if ggufs.is_empty() {
        let hint = if cached {
            String::new()
        } else {
            format!(
                " (its files: {}); weft fetches GGUF models by name: pass another repository, or download this one \
                 yourself and pass its directory",
                listed(&files.iter().map(String::as_str).collect::<Vec<_>>())
            )
        };
        return Err(format!("{} has no {which}{hint}", name.repo));
    }
    let (file, why) = match &name.quant {
        Some(quant) => match &matching(&ggufs, quant)[..] {
            [] => return Err(format!("no {which} match {quant:?}; the repository's {which}: {}", listed(&ggufs))),
            [file] => (*file, format!("the GGUF file matching {quant}")),
            several => match one_split(several) {
                Some(first) => (first, String::new()),
                None => {
                    return Err(format!(
                        "{quant:?} matches several {which}: {}; name one more exactly (hf:{}:NAME, any part of the \
                         file name)",
                        listed(several),
                        name.repo
                    ));
                }
            },
        },
        None => match (&matching(&ggufs, DEFAULT_QUANT)[..], &ggufs[..]) {
            ([file], _) => (*file, format!("{DEFAULT_QUANT}, the default; another with hf:{}:QUANT", name.repo)),
            (several, _) if several.len() > 1 && one_split(several).is_some() => (several[0], String::new()),
            (_, [only]) => (*only, if cached { "the only cached GGUF file" } else { "the only GGUF file" }.to_string()),
            (_, all) => (
                all[0],
                format!(
                    "no {DEFAULT_QUANT} among the {which}, so the first; another with hf:{}:QUANT, from: {}",
                    name.repo,
                    listed(all)
                ),
            ),
        },
    };
    if let Some((_, parts)) = split_part(file) {
        return Err(format!(
            "{file} is one of {parts} parts of a split GGUF, which weft does not read; join them with llama.cpp's \
             `llama-gguf-split --merge` and pass the joined file to --model"
        ));
    }
    Ok((file.to_string(), why))
}

/// The GGUF files whose names contain `quant` (ignoring case); of several, those where it is
/// a whole tag (`Q4_0` matches `x.Q4_0.gguf`, not `x.Q4_0_4_4.gguf`) when there are any.
fn matching<'a>(ggufs: &[&'a str], quant: &str) -> Vec<&'a str> {
    let quant = quant.to_ascii_lowercase();
    let all: Vec<&str> = ggufs.iter().copied().filter(|f| f.to_ascii_lowercase().contains(&quant)).collect();
    let whole = |file: &&str| {
        let lower = file.to_ascii_lowercase();
        lower.match_indices(&quant).any(|(at, _)| {
            let before = lower[..at].chars().next_back();
            let after = lower[at + quant.len()..].chars().next();
            !before.is_some_and(|c| c.is_ascii_alphanumeric())
                && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    };
    let whole_tags: Vec<&str> = all.iter().copied().filter(whole).collect();
    if all.len() > 1 && !whole_tags.is_empty() { whole_tags } else { all }
}

/// The first of `files` when they are all parts of one split GGUF.
fn one_split<'a>(files: &[&'a str]) -> Option<&'a str> {
    let stem = |f: &str| split_part(f).map(|_| f[..f.len() - "-00001-of-00002.gguf".len()].to_string());
    let first = stem(files[0])?;
    files.iter().all(|f| stem(f).as_ref() == Some(&first)).then_some(files[0])
}

/// `Some((part, parts))` for llama.cpp's split file names, `…-00001-of-00003.gguf`.
fn split_part(file: &str) -> Option<(u32, u32)> {
    let stem = file.get(..file.len().checked_sub(".gguf".len())?)?;
    let tail = stem.get(stem.len().checked_sub("-00001-of-00002".len())?..)?;
    let (part, parts) = tail.strip_prefix('-')?.split_once("-of-")?;
    let digits = |s: &str| (s.len() == 5 && s.chars().all(|c| c.is_ascii_digit())).then(|| s.parse().ok()).flatten();
    Some((digits(part)?, digits(parts)?))
}

/// A name safe to use as one path component.
fn is_plain(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
}

/// `file` with each `/`-separated segment percent-encoded for a URL.
fn encode_path(file: &str) -> String {
    let mut out = String::with_capacity(file.len());
    for byte in file.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// `scheme://host[:port]` of an absolute URL.
fn origin(url: &str) -> &str {
    let host = url.find("://").map_or(0, |i| i + 3);
    url[host..].find('/').map_or(url, |i| &url[..host + i])
}

/// `location` (from a redirect of `base`) as an absolute URL.
fn join(base: &str, location: &str) -> String {
    if location.contains("://") {
        location.to_string()
    } else if let Some(rest) = location.strip_prefix("//") {
        let scheme = base.split("://").next().unwrap_or("https");
        format!("{scheme}://{rest}")
    } else if location.starts_with('/') {
        format!("{}{location}", origin(base))
    } else {
        let dir = base.split(['?', '#']).next().unwrap_or(base);
        format!("{}/{location}", dir.rsplit_once('/').map_or(dir, |(dir, _)| dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(arg: &str) -> ModelName {
        ModelName::parse(arg).expect("an hf: name").expect("a valid name")
    }

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_parse_and_bad_ones_say_the_form() {
        assert_eq!(name("hf:a/b"), ModelName { repo: "a/b".into(), quant: None });
        assert_eq!(name("hf:a-1/b.c_d:q4_k_m"), ModelName { repo: "a-1/b.c_d".into(), quant: Some("q4_k_m".into()) });
        assert!(ModelName::parse("models/x.gguf").is_none());
        for bad in ["hf:", "hf:a", "hf:a/b/c", "hf:a/", "hf:/b", "hf:a/b:", "hf:../b", "hf:a b/c"] {
            let err = ModelName::parse(bad).unwrap().unwrap_err().to_string();
            assert!(err.contains("expected hf:OWNER/REPO"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_quant_picks_its_file_ignoring_case_and_prefers_whole_tags() {
        let repo = files(&["README.md", "m-Q4_0.gguf", "m-Q4_0_4_4.gguf", "m-Q4_K_M.gguf", "m-Q4_K_S.gguf"]);
        assert_eq!(pick(&name("hf:o/r:q4_k_m"), &repo, false).unwrap().0, "m-Q4_K_M.gguf");
        assert_eq!(pick(&name("hf:o/r:Q4_0"), &repo, false).unwrap().0, "m-Q4_0.gguf");
        let ambiguous = pick(&name("hf:o/r:Q4_K"), &repo, false).unwrap_err();
        assert!(ambiguous.contains("matches several GGUF files: m-Q4_K_M.gguf, m-Q4_K_S.gguf"), "{ambiguous}");
        let missing = pick(&name("hf:o/r:Q8_0"), &repo, false).unwrap_err();
        assert!(missing.contains("no GGUF files match \"Q8_0\"") && missing.contains("m-Q4_K_S.gguf"), "{missing}");
    }

    #[test]
    fn without_a_quant_q4_k_m_then_the_only_then_the_first() {
        let (file, why) =
            pick(&name("hf:o/r"), &files(&["b-Q8_0.gguf", "b-Q4_K_M.gguf", "mmproj-f16.gguf"]), false).unwrap();
        assert_eq!(file, "b-Q4_K_M.gguf");
        assert!(why.contains("default"), "{why}");
        assert_eq!(pick(&name("hf:o/r"), &files(&["x.gguf", "mmproj.gguf"]), false).unwrap().0, "x.gguf");
        let (file, why) = pick(&name("hf:o/r"), &files(&["z-Q8_0.gguf", "a-Q2_K.gguf"]), false).unwrap();
        assert_eq!(file, "a-Q2_K.gguf");
        assert!(why.contains("the first") && why.contains("z-Q8_0.gguf"), "{why}");
        let none = pick(&name("hf:o/r"), &files(&["model.safetensors", "config.json"]), false).unwrap_err();
        assert!(none.contains("has no GGUF files") && none.contains("model.safetensors"), "{none}");
    }

    #[test]
    fn split_ggufs_are_refused_with_how_to_join_them() {
        let repo = files(&["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf", "m-Q4_0.gguf"]);
        let err = pick(&name("hf:o/r:Q8_0"), &repo, false).unwrap_err();
        assert!(err.contains("one of 2 parts of a split GGUF") && err.contains("--merge"), "{err}");
        assert_eq!(split_part("a-00003-of-00010.gguf"), Some((3, 10)));
        assert_eq!(split_part("a-Q4_0.gguf"), None);
    }

    #[test]
    fn redirects_resolve_against_the_url_they_answer() {
        assert_eq!(origin("http://127.0.0.1:8/a/b"), "http://127.0.0.1:8");
        assert_eq!(origin("https://h"), "https://h");
        assert_eq!(join("http://h:1/a/b?x=1", "/c/d"), "http://h:1/c/d");
        assert_eq!(join("http://h:1/a/b", "c"), "http://h:1/a/c");
        assert_eq!(join("https://h/a", "//cdn/x"), "https://cdn/x");
        assert_eq!(join("https://h/a", "http://cdn/x"), "http://cdn/x");
        assert_eq!(encode_path("dir/a b+c.gguf"), "dir/a%20b%2Bc.gguf");
    }
}
