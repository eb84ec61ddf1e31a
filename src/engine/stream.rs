//! Streams and the engine loop: how callers wait for their chunks, and who runs the steps.
//!
//! With the background loop running (a thread natively, a task on the browser's event loop)
//! a stream only waits; without it, whoever polls a stream runs steps for everyone. The loop
//! sleeps on an async [`Wakeup`] rather than a condition variable, so the same code runs where
//! nothing may block.
//!
//! **Invariant:** dropping a stream cancels its request at the next step and wakes the loop so
//! that step comes even when nothing else is running.

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use futures::channel::mpsc;
use futures::{Stream, StreamExt};

use crate::engine::ContinuousBatchEngine;
use crate::engine::request::{
    EmbeddingParams, FinishReason, GenerationParams, InferenceRequest, InferenceResponse, Prompt, StreamChunk, Usage,
};
use crate::error::{Result, WeftError};
use crate::kv::SeqId;

/// An async wake-up signal for the background loop.
#[derive(Default)]
pub(crate) struct Wakeup {
    pending: AtomicBool,
    waker: futures::task::AtomicWaker,
}

impl Wakeup {
    pub fn wake(&self) {
        self.pending.store(true, Ordering::SeqCst);
        self.waker.wake();
    }

    /// Resolves at the next `wake` (at once if one came since the last wait).
    pub async fn wait(&self) {
        futures::future::poll_fn(|cx| {
            self.waker.register(cx.waker());
            if self.pending.swap(false, Ordering::SeqCst) { Poll::Ready(()) } else { Poll::Pending }
        })
        .await
    }
}

/// A stream's end of its request.
struct Subscription {
    engine: ContinuousBatchEngine,
    receiver: mpsc::UnboundedReceiver<Result<StreamChunk>>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.receiver.close();
        self.engine.wake();
    }
}

fn is_last(item: &Result<StreamChunk>) -> bool {
    matches!(item, Ok(c) if c.finish_reason.is_some())
}

impl ContinuousBatchEngine {
    /// Stream a request's chunks. Without a background loop, polling the stream runs steps
    /// (for every request, not only this one). Dropping the stream cancels the request.
    pub fn infer_stream(&self, request: InferenceRequest) -> Result<impl Stream<Item = Result<StreamChunk>> + use<>> {
        Ok(self.infer_stream_with_id(request)?.1)
    }

    /// [`infer_stream`](Self::infer_stream), also giving the request's id (for [`cancel`](Self::cancel)).
    pub fn infer_stream_with_id(
        &self,
        request: InferenceRequest,
    ) -> Result<(SeqId, impl Stream<Item = Result<StreamChunk>> + use<>)> {
        let (id, receiver) = self.submit(request)?;
        let sub = Subscription { engine: self.clone(), receiver };
        let stream = futures::stream::unfold((sub, false), |(mut sub, done)| async move {
            if done {
                return None;
            }
            loop {
                match sub.receiver.try_recv() {
                    Ok(item) => {
                        let last = is_last(&item);
                        return Some((item, (sub, last)));
                    }
                    Err(mpsc::TryRecvError::Closed) => return None,
                    Err(mpsc::TryRecvError::Empty) if sub.engine.loop_running() => {
                        let item = sub.receiver.next().await?;
                        let last = is_last(&item);
                        return Some((item, (sub, last)));
                    }
                    Err(mpsc::TryRecvError::Empty) => {
                        // Step errors reach each affected request through its channel.
                        let _ = sub.engine.step().await;
                    }
                }
            }
        });
        Ok((id, stream))
    }

    /// Run a request to completion.
    pub async fn infer(&self, request: InferenceRequest) -> Result<InferenceResponse> {
        collect_response(&mut Box::pin(self.infer_stream(request)?)).await
    }

    /// The embedding of `prompt` (L2-normalised, `params.dimensions` long when given) and its
    /// usage, with the LoRA adapter registered as `lora` (`None`: the base model). It runs in
    /// the engine's steps beside every other request.
    pub async fn embed(
        &self,
        prompt: Prompt,
        params: EmbeddingParams,
        lora: Option<&str>,
    ) -> Result<(Vec<f32>, Usage)> {
        let generation = GenerationParams { embedding: Some(params), ..Default::default() };
        let request = InferenceRequest { lora: lora.map(str::to_string), ..InferenceRequest::new(prompt, generation) };
        let mut stream = Box::pin(self.infer_stream(request)?);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            if let (Some(embedding), Some(usage)) = (chunk.embedding, chunk.usage) {
                return Ok((embedding, usage));
            }
        }
        Err(WeftError::Unavailable("the embedding request ended without its embedding (cancelled)".into()))
    }

    /// Start the background loop: from now on steps run by themselves and `infer` only waits.
    pub fn start_loop(&self) -> Result<()> {
        let running = &self.inner.loop_running;
        if running.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let engine = self.clone();
        let thread = crate::rt::spawn_background("weft-engine", async move {
            while !engine.is_shut_down() {
                let worked = engine.step().await.unwrap_or(true);
                if !worked {
                    engine.inner.wakeup.wait().await;
                }
            }
            engine.inner.loop_running.store(false, Ordering::SeqCst);
        })
        .inspect_err(|_| running.store(false, Ordering::SeqCst))?;
        *self.inner.loop_thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
        // A shutdown that came before the thread was stored found nothing to wait for.
        if self.is_shut_down() {
            let thread = self.inner.loop_thread.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(thread) = thread {
                thread.join();
            }
        }
        Ok(())
    }

    pub(crate) fn wake(&self) {
        self.inner.wakeup.wake();
    }
}

/// Gather a request's stream into one response (what [`ContinuousBatchEngine::infer`] returns).
pub async fn collect_response(
    stream: &mut (impl Stream<Item = Result<StreamChunk>> + Unpin),
) -> Result<InferenceResponse> {
    let mut response = InferenceResponse {
        text: String::new(),
        token_ids: Vec::new(),
        logprobs: Vec::new(),
        finish_reason: FinishReason::Cancelled,
        usage: Usage::default(),
    };
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        response.text.push_str(&chunk.text);
        response.token_ids.extend(&chunk.token_ids);
        response.logprobs.extend(chunk.logprobs);
        if let (Some(reason), Some(usage)) = (chunk.finish_reason, chunk.usage) {
            response.finish_reason = reason;
            response.usage = usage;
        }
    }
    Ok(response)
}
