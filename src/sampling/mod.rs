//! Sampling on the host side: parameters, the per-request random stream, and what each step's
//! sampled rows need ([`SampleSpec`], made by a [`Sampler`]). The GPU half (penalties, the
//! token-mask slot, the sampling kernel and reading its rows back) is `model::sampler`.
//!
//! The sampler is a pure function of (logits, params, one uniform draw): the draw for a
//! request's `n`-th generated token is the `n`-th value of a stream seeded by the request, so a
//! seeded request gives the same tokens whatever else shares its batch, after a preemption, and
//! whether or not some of its tokens were drafted and verified several at a time.
//!
//! **Invariant:** imports nothing GPU-side (a tidy test checks).

use crate::error::{Result, WeftError};

/// Most top log-probabilities reported per token (OpenAI's limit; the GPU sampler's row holds
/// this many).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Most tokens one request may bias (OpenAI's limit). The GPU sampler uploads a request's
/// biases beside its penalty entries for every sampled row, so this bounds what a row adds to
/// the step's entry buffer, which the executor sizes for a full step of biased rows.
pub const MAX_LOGIT_BIAS: usize = 300;

/// The largest bias, up or down, a token may get (OpenAI's range): -100 bans a token in effect
/// (its weight falls by a factor of e^100), +100 forces it.
pub const MAX_BIAS: f32 = 100.0;

/// OpenAI's `logit_bias`: a value added to some tokens' logits before anything else looks at
/// them (penalties, structured output's masks, temperature, top-k/top-p/min-p and the
/// log-probabilities reported). Kept sorted by token, so the GPU sampler can merge it with a
/// row's penalty entries in one pass; cloning is a reference count, as every step's
/// [`SampleSpec`] carries the request's parameters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogitBias(std::sync::Arc<[(u32, f32)]>);

impl LogitBias {
    /// `(token, bias)` pairs in any order; a token given twice is kept twice, for
    /// [`SamplingParams::validate`] to refuse.
    pub fn new(pairs: impl IntoIterator<Item = (u32, f32)>) -> Self {
        let mut pairs: Vec<(u32, f32)> = pairs.into_iter().collect();
        pairs.sort_by_key(|&(token, _)| token);
        LogitBias(pairs.into())
    }

    /// The `(token, bias)` pairs, by token.
    pub fn pairs(&self) -> &[(u32, f32)] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first token at or past `vocab`, to refuse a request that names one.
    pub fn first_outside(&self, vocab: usize) -> Option<u32> {
        self.0.iter().map(|&(token, _)| token).find(|&t| t as usize >= vocab)
    }
}

/// How one request picks its next token.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 turns it off.
    pub top_k: u32,
    /// Keep the smallest set of most likely tokens holding this much probability; 1 turns it off.
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one; 0 turns it off.
    pub min_p: f32,
    /// Seed of the request's random stream; `None` draws a seed from the clock.
    pub seed: Option<u64>,
    /// Report this many top log-probabilities per generated token (at most 20).
    pub top_logprobs: usize,
    /// Divide positive logits (multiply negative ones) of every token already in the prompt or
    /// the output by this; 1 turns it off.
    pub repetition_penalty: f32,
    /// Subtract this from the logit of every token already generated; 0 turns it off.
    pub presence_penalty: f32,
    /// Subtract this times the number of times a token was generated; 0 turns it off.
    pub frequency_penalty: f32,
    /// Added to these tokens' logits first (at most [`MAX_LOGIT_BIAS`] tokens, each bias within
    /// ±[`MAX_BIAS`]); empty turns it off.
    pub logit_bias: LogitBias,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            top_logprobs: 0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: LogitBias::default(),
        }
    }
}

impl SamplingParams {
    /// Whether any penalty is on (the executor then runs the penalty kernel for this row).
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, ..Default::default() }
    }

    /// Reject values no sampler can honour, naming the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, why: String| Err(WeftError::invalid(field, why));
        if !(0.0..=2.0).contains(&self.temperature) {
            return bad("temperature", format!("{} (must be between 0 and 2; 0 means greedy)", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("{} (must be in (0, 1])", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("{} (must be in [0, 1])", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("repetition_penalty", format!("{} (must be > 0; 1 means none)", self.repetition_penalty));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return bad("presence_penalty", format!("{} (must be in [-2, 2])", self.presence_penalty));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return bad("frequency_penalty", format!("{} (must be in [-2, 2])", self.frequency_penalty));
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return bad("top_logprobs", format!("{} (must be between 0 and {MAX_TOP_LOGPROBS})", self.top_logprobs));
        }
        let bias = self.logit_bias.pairs();
        if bias.len() > MAX_LOGIT_BIAS {
            return bad("logit_bias", format!("{} tokens (at most {MAX_LOGIT_BIAS} may be biased)", bias.len()));
        }
        if let Some(&(token, b)) = bias.iter().find(|(_, b)| !(-MAX_BIAS..=MAX_BIAS).contains(b)) {
            return bad(
                "logit_bias",
                format!("{b} for token {token} (a bias must be between -{MAX_BIAS} and {MAX_BIAS})"),
            );
        }
        if let Some(w) = bias.windows(2).find(|w| w[0].0 == w[1].0) {
            return bad("logit_bias", format!("token {} is biased twice", w[0].0));
        }
        Ok(())
    }
}

/// A request's random stream (SplitMix64: tiny, fast and good enough to drive inverse-CDF
/// sampling). Its `n`-th value is also reachable directly ([`SamplerRng::nth_uniform`]), which
/// is how a generated token's draw is tied to its position rather than to the number of draws
/// made before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SamplerRng {
    state: u64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A 64-bit value as a uniform draw in [0, 1) with 24 bits, exactly representable in f32.
fn to_uniform(x: u64) -> f32 {
    (x >> 40) as f32 / (1u64 << 24) as f32
}

impl SamplerRng {
    pub fn new(seed: u64) -> Self {
        SamplerRng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix(self.state)
    }

    /// A draw in `0..bound` (0 when `bound` is 0); for tests that need reproducible choices.
    pub fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound.max(1) as u64) as usize
    }

    /// A uniform draw in [0, 1) with 24 bits, exactly representable in f32.
    pub fn next_uniform(&mut self) -> f32 {
        to_uniform(self.next_u64())
    }

    /// The `n`-th (from 0) value [`next_uniform`](Self::next_uniform) would give on a stream
    /// seeded with `seed`, without drawing the ones before it.
    pub fn nth_uniform(seed: u64, n: u64) -> f32 {
        to_uniform(mix(seed.wrapping_add(n.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA))))
    }
}

/// The (token, times generated) pairs the penalty kernel needs for one sequence: every distinct
/// token of `prompt` and `output`, with its count in `output`.
pub fn penalty_entries(prompt: &[u32], output: &[u32]) -> Vec<(u32, u32)> {
    let mut counts = std::collections::BTreeMap::new();
    for &t in prompt {
        counts.entry(t).or_insert(0u32);
    }
    for &t in output {
        *counts.entry(t).or_insert(0) += 1;
    }
    counts.into_iter().collect()
}

/// What one sampled logit row needs beyond the request's parameters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowDraw {
    /// The uniform draw that picks the token (inverse CDF).
    pub uniform: f32,
    /// With penalties on: the distinct tokens before this row's token and how often each was
    /// generated ([`penalty_entries`]); empty otherwise.
    pub penalty_entries: Vec<(u32, u32)>,
    /// Speculative decoding with a draft model and a sampled request: this row's part in the
    /// rejection-sampling rule; `None` for every other row.
    pub draft: Option<DraftRow>,
    /// Structured output: the tokens this row may pick; `None` allows every token.
    pub allowed: Option<TokenMask>,
}

/// A sampled row's part in speculative decoding with a draft model (the rejection-sampling
/// rule). Slots index the [`DraftStore`](crate::step::DraftStore) the draft and the target
/// share; the engine numbers them afresh each step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DraftRow {
    /// A draft model's row: sample as usual, and keep the distribution the token was drawn
    /// from (after the request's temperature and top-k/top-p/min-p filtering) in `slot`.
    Keep { slot: u32 },
    /// A target's row verifying drafted `token`, drawn from the distribution kept in `slot`:
    /// keep it with probability min(1, p/q) (tested with `accept_uniform`), else draw from the
    /// normalised max(0, p − q) with the row's own `uniform`.
    Verify { slot: u32, token: u32, accept_uniform: f32 },
}

/// A sampled row's allowed tokens: bit `t % 32` of word `t / 32` is token `t`, 1 = allowed
/// (vocab/32 words). The engine may hand one over still empty and fill it from another thread
/// while the step's forward pass is recorded; the GPU sampler waits for it only when it gets
/// to the mask (`model::sampler`). A filler that gives up must still [`set`](Self::set) it.
#[derive(Clone, Debug, Default)]
pub struct TokenMask(std::sync::Arc<std::sync::OnceLock<Vec<u32>>>);

impl TokenMask {
    /// A mask to be filled in later.
    pub fn pending() -> Self {
        Self::default()
    }

    /// A mask known now.
    pub fn ready(words: Vec<u32>) -> Self {
        let mask = Self::default();
        mask.set(words);
        mask
    }

    /// Fill the mask (the first fill wins).
    pub fn set(&self, words: Vec<u32>) {
        let _ = self.0.set(words);
    }

    /// The words, if filled.
    pub fn get(&self) -> Option<&[u32]> {
        self.0.get().map(Vec::as_slice)
    }

    /// The words, waiting until they are filled. Never blocks in the browser, where masks are
    /// computed before the step starts.
    pub fn wait(&self) -> &[u32] {
        self.0.wait()
    }

    /// Whether the mask allows `token` (false until filled).
    pub fn allows(&self, token: u32) -> bool {
        self.get().and_then(|w| w.get(token as usize / 32)).is_some_and(|w| w >> (token % 32) & 1 == 1)
    }
}

impl PartialEq for TokenMask {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

/// How to pick one step's tokens for one sequence: the request's parameters and one
/// [`RowDraw`] per sampled logit row (several when drafted tokens are verified).
#[derive(Clone, Debug, PartialEq)]
pub struct SampleSpec {
    pub params: SamplingParams,
    pub rows: Vec<RowDraw>,
}

/// The host half of sampling: what the GPU sampler needs for one sequence's sampled rows, from
/// the request's parameters and seed and its tokens so far. The engine holds one as
/// `Arc<dyn Sampler>`; the GPU does the rest (`model::sampler`).
pub trait Sampler: Send + Sync {
    /// Rows for the next `drafted.len() + 1` tokens after `prompt` and `output`: row `i` picks
    /// the token after `drafted[..i]`.
    fn prepare(
        &self,
        params: &SamplingParams,
        seed: u64,
        prompt: &[u32],
        output: &[u32],
        drafted: &[u32],
    ) -> SampleSpec;
}

/// The standard host half: the request's `n`-th generated token takes the `n`-th draw of its
/// stream; penalty entries when penalties are on.
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuSampler;

impl Sampler for GpuSampler {
    fn prepare(
        &self,
        params: &SamplingParams,
        seed: u64,
        prompt: &[u32],
        output: &[u32],
        drafted: &[u32],
    ) -> SampleSpec {
        let rows = (0..=drafted.len())
            .map(|i| {
                let position = (output.len() + i) as u64;
                let penalty_entries = if params.has_penalties() {
                    let history: Vec<u32> = output.iter().chain(&drafted[..i]).copied().collect();
                    penalty_entries(prompt, &history)
                } else {
                    Vec::new()
                };
                RowDraw {
                    uniform: SamplerRng::nth_uniform(seed, position),
                    penalty_entries,
                    draft: None,
                    allowed: None,
                }
            })
            .collect();
        SampleSpec { params: params.clone(), rows }
    }
}

/// One sampled token as the GPU reported it.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// log p(token) under the model's distribution after logit biases and penalties (before
    /// temperature and filtering), when the request asked for log-probabilities
    /// (`top_logprobs > 0`); else 0.0, as the sampler skips a pass over the vocabulary for rows
    /// that do not report them.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, best first.
    pub top_logprobs: Vec<(u32, f32)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_a_pure_function_of_the_seed() {
        let draws = |seed| {
            let mut rng = SamplerRng::new(seed);
            (0..100).map(|_| rng.next_uniform()).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        assert!(draws(1).iter().all(|u| (0.0..1.0).contains(u)));
        let mean = draws(3).iter().sum::<f32>() / 100.0;
        assert!((mean - 0.5).abs() < 0.1, "{mean}");
    }

    #[test]
    fn nth_uniform_is_the_streams_nth_value() {
        let mut rng = SamplerRng::new(99);
        for n in 0..50 {
            assert_eq!(SamplerRng::nth_uniform(99, n), rng.next_uniform());
        }
    }

    #[test]
    fn drafted_rows_draw_at_their_positions_and_see_the_drafts_before_them() {
        let params = SamplingParams { presence_penalty: 0.5, ..Default::default() };
        let spec = GpuSampler.prepare(&params, 7, &[1, 2], &[3], &[4, 3]);
        assert_eq!(spec.rows.len(), 3);
        for (i, row) in spec.rows.iter().enumerate() {
            assert_eq!(row.uniform, SamplerRng::nth_uniform(7, 1 + i as u64));
        }
        assert_eq!(spec.rows[0].penalty_entries, vec![(1, 0), (2, 0), (3, 1)]);
        assert_eq!(spec.rows[2].penalty_entries, vec![(1, 0), (2, 0), (3, 2), (4, 1)]);
        // The same position draws the same value whether or not it was drafted.
        let plain = GpuSampler.prepare(&params, 7, &[1, 2], &[3, 4], &[]);
        assert_eq!(plain.rows[0], spec.rows[1]);
    }

    #[test]
    fn a_logit_bias_is_kept_by_token() {
        let bias = LogitBias::new([(9, 1.0), (2, -5.0), (7, 0.5)]);
        assert_eq!(bias.pairs(), [(2, -5.0), (7, 0.5), (9, 1.0)]);
        assert_eq!(bias.first_outside(9), Some(9));
        assert_eq!(bias.first_outside(10), None);
        assert!(LogitBias::default().is_empty() && !bias.is_empty());
    }

    #[test]
    fn penalty_entries_cover_prompt_and_count_output() {
        assert_eq!(penalty_entries(&[5, 3, 5], &[3, 9, 3]), vec![(3, 2), (5, 0), (9, 1)]);
        assert!(penalty_entries(&[], &[]).is_empty());
    }

    #[test]
    fn invalid_values_name_their_field() {
        let check = |p: SamplingParams, field: &str| {
            let err = p.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        };
        check(SamplingParams { temperature: -1.0, ..Default::default() }, "temperature");
        check(SamplingParams { temperature: f32::NAN, ..Default::default() }, "temperature");
        check(SamplingParams { temperature: 1e9, ..Default::default() }, "temperature");
        check(SamplingParams { temperature: 2.01, ..Default::default() }, "temperature");
        check(SamplingParams { top_p: 0.0, ..Default::default() }, "top_p");
        check(SamplingParams { top_p: 1.5, ..Default::default() }, "top_p");
        check(SamplingParams { min_p: -0.1, ..Default::default() }, "min_p");
        check(SamplingParams { top_logprobs: 21, ..Default::default() }, "top_logprobs");
        check(SamplingParams { repetition_penalty: 0.0, ..Default::default() }, "repetition_penalty");
        check(SamplingParams { presence_penalty: 2.5, ..Default::default() }, "presence_penalty");
        check(SamplingParams { frequency_penalty: -3.0, ..Default::default() }, "frequency_penalty");
        let biased =
            |pairs: Vec<(u32, f32)>| SamplingParams { logit_bias: LogitBias::new(pairs), ..Default::default() };
        check(biased(vec![(3, 100.5)]), "logit_bias");
        check(biased(vec![(3, f32::NAN)]), "logit_bias");
        check(biased(vec![(3, 1.0), (9, 2.0), (3, -1.0)]), "token 3 is biased twice");
        check(biased((0..301).map(|t| (t, 1.0)).collect()), "301 tokens");
        assert!(biased((0..300).map(|t| (t, if t % 2 == 0 { 100.0 } else { -100.0 })).collect()).validate().is_ok());
        assert!(SamplingParams::greedy().validate().is_ok());
    }
}
