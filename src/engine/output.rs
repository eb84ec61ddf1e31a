//! Output processing: what happens to the tokens a request keeps from a step. Each live request
//! detokenizes them incrementally, matches stop tokens, stop strings and its length limit,
//! advances its structured-output constraint (a complete one ends the request; a thinking
//! model's starts after its end-of-reasoning token), and turns the result into one
//! [`StreamChunk`].
//!
//! **Invariant:** a request's text never contains a stop string or half a UTF-8 character, and
//! its last chunk (the one with a finish reason) carries the usage; nothing follows it.

use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use web_time::Instant;

use crate::constraint::{Advance, ConstraintState};
use crate::engine::request::{FinishReason, InferenceRequest, StreamChunk, TokenLogprob, Usage, normalize_embedding};
use crate::engine::stop::StopMatcher;
use crate::error::{Result, WeftError};
use crate::sampling::Sampled;
use crate::tokenizer::DecodeStream;

/// A live request's host-side state.
pub(crate) struct Live {
    pub request: InferenceRequest,
    /// Seed of the request's random stream (`SamplerRng::nth_uniform`).
    pub seed: u64,
    /// Generate at most this many tokens (the request's, or the engine's default).
    pub max_tokens: usize,
    pub decoder: DecodeStream,
    pub stops: StopMatcher,
    pub sender: mpsc::UnboundedSender<Result<StreamChunk>>,
    pub usage: Usage,
    pub submitted_at: Instant,
    pub scheduled_at: Option<Instant>,
    pub last_token_at: Option<Instant>,
    /// Structured output: the request's position in its grammar (shared with the step's mask
    /// computation, which runs beside the executor).
    pub constraint: Option<Arc<Mutex<ConstraintState>>>,
    /// A thinking model's end-of-reasoning token, until it is generated: the constraint
    /// starts with the token after it (`GenerationParams::constraint_after`). `None` once it
    /// came, or for a request whose constraint applies from the start.
    pub constraint_after: Option<u32>,
}

impl Live {
    /// Take the tokens the sequence kept from one step, in order, until one of them ends the
    /// request: decode them, match stops, and say whether the request is done. Tokens after the
    /// one that ends the request are dropped. Returns the chunk to send, how many tokens it
    /// took, and the finish reason if the request is done.
    pub fn accept(&mut self, run: &[Sampled], eos: &[u32]) -> (StreamChunk, usize, Option<FinishReason>) {
        let mut chunk = StreamChunk {
            text: String::new(),
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            finish_reason: None,
            usage: None,
            embedding: None,
        };
        let mut finish = None;
        for x in run {
            chunk.token_ids.push(x.token);
            finish = self.accept_one(x, eos, &mut chunk);
            if finish.is_some() {
                break;
            }
        }
        chunk.finish_reason = finish;
        chunk.usage = finish.map(|_| self.usage);
        let taken = chunk.token_ids.len();
        (chunk, taken, finish)
    }

    fn accept_one(&mut self, x: &Sampled, eos: &[u32], chunk: &mut StreamChunk) -> Option<FinishReason> {
        let params = &self.request.params;
        self.usage.completion_tokens += 1;
        if params.sampling.top_logprobs > 0 {
            chunk.logprobs.push(TokenLogprob { token: x.token, logprob: x.logprob, top: x.top_logprobs.clone() });
        }
        let mut finish = None;
        // The constraint's grammar is complete: the text ends here, whole.
        let mut complete = false;
        if !params.ignore_eos && eos.contains(&x.token) {
            finish = Some(FinishReason::Eos);
        } else if params.stop_token_ids.contains(&x.token) {
            finish = Some(FinishReason::Stop);
        } else {
            match self.decoder.step(x.token) {
                Ok(delta) => {
                    let (released, stopped) = self.stops.push(delta.as_deref().unwrap_or(""));
                    chunk.text.push_str(&released);
                    if stopped {
                        finish = Some(FinishReason::Stop);
                    }
                }
                Err(e) => {
                    let _ = self.sender.unbounded_send(Err(e));
                    finish = Some(FinishReason::Error);
                }
            }
            if finish.is_none() && self.constraint_after.is_some() {
                // Still reasoning: free, until the end marker, after which the constraint starts.
                if self.constraint_after == Some(x.token) {
                    self.constraint_after = None;
                }
            } else if finish.is_none()
                && let Some(constraint) = &self.constraint
            {
                match constraint.lock().unwrap_or_else(|p| p.into_inner()).advance(x.token) {
                    Ok(Advance::Continue) => {}
                    Ok(Advance::Done) => {
                        finish = Some(FinishReason::Stop);
                        complete = true;
                    }
                    Err(e) => {
                        let _ = self.sender.unbounded_send(Err(e));
                        finish = Some(FinishReason::Error);
                    }
                }
            }
            if finish.is_none() && self.usage.completion_tokens >= self.max_tokens {
                finish = Some(FinishReason::Length);
            }
        }
        if complete || matches!(finish, Some(FinishReason::Length | FinishReason::Eos)) {
            // The end of the text: release what the decoder and the stop matcher still hold.
            let rest = self.decoder.finish().ok().flatten().unwrap_or_default();
            let (released, stopped) = self.stops.push(&rest);
            chunk.text.push_str(&released);
            if stopped {
                finish = Some(FinishReason::Stop);
            } else {
                chunk.text.push_str(&self.stops.finish());
            }
        }
        finish
    }

    /// The last chunk of a request that ends without a token of its own (cancelled, failed).
    pub fn send_final(&self, reason: FinishReason, error: Option<WeftError>) {
        if let Some(e) = error {
            let _ = self.sender.unbounded_send(Err(e));
        }
        let _ = self.sender.unbounded_send(Ok(StreamChunk {
            text: String::new(),
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            finish_reason: Some(reason),
            usage: Some(self.usage),
            embedding: None,
        }));
    }

    /// The one chunk of an embedding request, from its pooled final hidden state.
    pub fn send_embedding(&self, hidden: &[f32]) {
        let dimensions = self.request.params.embedding.and_then(|e| e.dimensions);
        let _ = self.sender.unbounded_send(Ok(StreamChunk {
            text: String::new(),
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            finish_reason: Some(FinishReason::Stop),
            usage: Some(self.usage),
            embedding: Some(normalize_embedding(hidden, dimensions)),
        }));
    }
}
