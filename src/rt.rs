//! The tiny runtime shim: the only place outside `gpu/` that knows which target it runs on.
//!
//! Library code is async and never blocks; a native caller that has no executor of its own
//! drives a future to completion with [`block_on`]. In the browser futures are spawned on the
//! page's event loop instead, so `block_on` does not exist there.

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

/// Run `job` in the background until it returns: natively on a thread of its own. The browser
/// build spawns on the page's event loop instead (arrives with the web crate).
#[cfg(not(target_arch = "wasm32"))]
pub fn spawn_background<F>(name: &str, job: F) -> crate::Result<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || block_on(job))
        .map(|_| ())
        .map_err(|e| crate::WeftError::Unsupported(format!("could not start the {name} thread: {e}")))
}

#[cfg(target_arch = "wasm32")]
pub fn spawn_background<F>(name: &str, _job: F) -> crate::Result<()>
where
    F: std::future::Future<Output = ()> + 'static,
{
    Err(crate::WeftError::Unsupported(format!("the {name} loop is not available in this build yet; drive requests with infer/infer_stream")))
}

/// A boxed stream, `Send` natively (see [`BoxFuture`]).
#[cfg(not(target_arch = "wasm32"))]
pub type BoxStream<'a, T> = futures::stream::BoxStream<'a, T>;
#[cfg(target_arch = "wasm32")]
pub type BoxStream<'a, T> = futures::stream::LocalBoxStream<'a, T>;
