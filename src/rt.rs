//! The tiny runtime shim: the only place outside `gpu/` that knows which target it runs on.
//!
//! Library code is async and never blocks; a native caller that has no executor of its own
//! drives a future to completion with [`block_on`]. In the browser futures are spawned on the
//! page's event loop instead, so `block_on` does not exist there.
//!
//! [`run_beside`] is the one place work runs in parallel with the caller: a step's
//! structured-output masks, computed on a thread of their own natively while the executor
//! records the forward pass; in the browser (one thread) they are computed first.

/// Run a future to completion on the current thread (native only).
#[cfg(not(target_arch = "wasm32"))]
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    pollster::block_on(future)
}

/// A boxed future that is `Send` natively; in the browser nothing crosses threads, and wgpu's
/// futures there are not `Send`.
#[cfg(not(target_arch = "wasm32"))]
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;
#[cfg(target_arch = "wasm32")]
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + 'a>>;

/// Work started by [`spawn_background`]: natively its thread, which [`join`](Self::join) waits
/// for; in the browser nothing (a task on the event loop cannot be waited for, nor needs to be:
/// the page outlives it).
pub struct Background {
    #[cfg(not(target_arch = "wasm32"))]
    thread: std::thread::JoinHandle<()>,
}

impl Background {
    /// Wait until the work has returned and dropped what it held, unless the caller is that
    /// work itself (which would wait forever).
    pub fn join(self) {
        #[cfg(not(target_arch = "wasm32"))]
        if self.thread.thread().id() != std::thread::current().id() {
            let _ = self.thread.join();
        }
    }
}

/// Run `job` in the background until it returns: natively on a thread of its own; in the
/// browser as a task on the page's (or worker's) event loop.
#[cfg(not(target_arch = "wasm32"))]
pub fn spawn_background<F>(name: &str, job: F) -> crate::Result<Background>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || block_on(job))
        .map(|thread| Background { thread })
        .map_err(|e| crate::WeftError::Unsupported(format!("could not start the {name} thread: {e}")))
}

#[cfg(target_arch = "wasm32")]
pub fn spawn_background<F>(_name: &str, job: F) -> crate::Result<Background>
where
    F: std::future::Future<Output = ()> + 'static,
{
    wasm_bindgen_futures::spawn_local(job);
    Ok(Background {})
}

/// Work started beside the caller by [`run_beside`]; [`join`](Beside::join) waits for its result.
pub struct Beside<T> {
    /// The thread running the job, or the job's result when it ran in place.
    #[cfg(not(target_arch = "wasm32"))]
    inner: Result<std::thread::JoinHandle<Option<T>>, Option<T>>,
    #[cfg(target_arch = "wasm32")]
    done: Option<T>,
}

/// Start `job` beside the caller: natively on a thread of its own (so it overlaps with what
/// the caller does next; where no thread can be had, in place), in the browser at once,
/// before returning (a tab's worker has one thread).
#[cfg(not(target_arch = "wasm32"))]
pub fn run_beside<T, F>(name: &str, job: F) -> Beside<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    use std::sync::{Arc, Mutex};
    // Whichever side runs the job takes it from the slot: the thread, or this function when
    // the thread could not start (the closure holding the thread's share is then dropped).
    let slot = Arc::new(Mutex::new(Some(job)));
    let theirs = slot.clone();
    let take = |slot: &Mutex<Option<F>>| slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    match std::thread::Builder::new().name(name.into()).spawn(move || take(&theirs).map(|job| job())) {
        Ok(handle) => Beside { inner: Ok(handle) },
        Err(_) => Beside { inner: Err(take(&slot).map(|job| job())) },
    }
}

#[cfg(target_arch = "wasm32")]
pub fn run_beside<T, F>(_name: &str, job: F) -> Beside<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    Beside { done: Some(job()) }
}

impl<T> Beside<T> {
    /// The job's result; `None` if it panicked.
    pub fn join(self) -> Option<T> {
        #[cfg(not(target_arch = "wasm32"))]
        return match self.inner {
            Ok(handle) => handle.join().ok().flatten(),
            Err(done) => done,
        };
        #[cfg(target_arch = "wasm32")]
        self.done
    }
}

/// `Send` natively, nothing in the browser: for callbacks the caller hands over (a JavaScript
/// function cannot cross threads, and there it never needs to).
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSend: Send {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send> MaybeSend for T {}
#[cfg(target_arch = "wasm32")]
pub trait MaybeSend {}
#[cfg(target_arch = "wasm32")]
impl<T> MaybeSend for T {}

/// `Sync` natively, nothing in the browser (see [`MaybeSend`]).
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSync: Sync {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Sync> MaybeSync for T {}
#[cfg(target_arch = "wasm32")]
pub trait MaybeSync {}
#[cfg(target_arch = "wasm32")]
impl<T> MaybeSync for T {}

/// A boxed progress callback, `Send` natively (see [`MaybeSend`]).
#[cfg(not(target_arch = "wasm32"))]
pub type BoxProgress = Box<dyn FnMut(usize, usize) + Send>;
#[cfg(target_arch = "wasm32")]
pub type BoxProgress = Box<dyn FnMut(usize, usize)>;

/// A boxed stream, `Send` natively (see [`BoxFuture`]).
#[cfg(not(target_arch = "wasm32"))]
pub type BoxStream<'a, T> = futures::stream::BoxStream<'a, T>;
#[cfg(target_arch = "wasm32")]
pub type BoxStream<'a, T> = futures::stream::LocalBoxStream<'a, T>;

/// A file's bytes: memory-mapped natively; in the browser there is no file system, and models
/// arrive as bytes instead.
pub struct MappedFile {
    #[cfg(not(target_arch = "wasm32"))]
    map: memmap2::Mmap,
}

impl std::ops::Deref for MappedFile {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        #[cfg(not(target_arch = "wasm32"))]
        return &self.map;
        #[cfg(target_arch = "wasm32")]
        unreachable!("map_file never succeeds in the browser")
    }
}

impl MappedFile {
    /// Take the file's pages out of this process's resident memory. A loader calls this as it
    /// goes, once the bytes it read are on the GPU: otherwise a whole model would stay resident
    /// twice at the end of loading, once as file pages and once as GPU memory (which on a CPU
    /// driver is host memory too). The page cache keeps the pages, so reading them again costs
    /// a minor fault, not a disk read.
    pub fn release_pages(&self) {
        #[cfg(all(unix, not(target_arch = "wasm32")))]
        // SAFETY: the mapping is read-only and shared (`Mmap::map`); MADV_DONTNEED only drops this
        // process's page-table entries, and the next read faults the same bytes back in from the
        // file, so a borrow of the mapping never sees other contents. (The advice is unsafe in
        // memmap2 for private writable mappings, whose changes it would discard.)
        let _ = unsafe { self.map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
    }

    /// [`release_pages`](Self::release_pages) of the pages holding bytes `offset..offset + len`
    /// alone (the pages at either end may hold bytes beside them; those are read back if asked
    /// for again): a tensor read a slice at a time drops each slice's pages once uploaded.
    pub fn release_range(&self, offset: usize, len: usize) {
        #[cfg(all(unix, not(target_arch = "wasm32")))]
        if offset.checked_add(len).is_some_and(|end| end <= self.map.len()) {
            // SAFETY: as in `release_pages`: a read-only shared mapping, whose dropped pages the
            // next read faults back in with the same bytes.
            let _ = unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
        }
        #[cfg(not(all(unix, not(target_arch = "wasm32"))))]
        let _ = (offset, len);
    }
}

/// Map `path` read-only into memory.
pub fn map_file(path: &std::path::Path) -> std::io::Result<MappedFile> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let file = std::fs::File::open(path)?;
        // SAFETY: the mapping is read-only and lives as long as the MappedFile. Another process
        // truncating or rewriting the file while it is mapped could change or fault the bytes
        // under us; like every mmap-based model loader, we accept that for not copying the file.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        Ok(MappedFile { map })
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = path;
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "the browser has no file system; load the model from bytes",
        ))
    }
}
