//! Sampling parameters, the per-request random stream, and the data exchanged with the GPU
//! sampler (`gpu::kernels::sample`).
//!
//! The sampler is a pure function of (logits, params, one uniform draw): the draw comes from a
//! per-request generator seeded by the request, so a seeded request gives the same tokens
//! whatever else shares its batch, and a preempted request resumes its stream where it stopped.

use crate::error::{Result, WeftError};
use crate::gpu::kernels::sample::{MAX_TOP_LOGPROBS, OUT_PER_ROW, SETTINGS_PER_ROW};
use crate::model::executor::SampleSpec;

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
        let bad = |field: &str, why: String| Err(WeftError::Unsupported(format!("invalid {field}: {why}")));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature", format!("{} (must be a finite number >= 0; 0 means greedy)", self.temperature));
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
            return bad("top_logprobs", format!("{} (at most {MAX_TOP_LOGPROBS})", self.top_logprobs));
        }
        Ok(())
    }
}

/// A request's random stream (SplitMix64: tiny, fast and good enough to drive inverse-CDF
/// sampling; one draw per generated token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SamplerRng {
    state: u64,
}

impl SamplerRng {
    pub fn new(seed: u64) -> Self {
        SamplerRng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A draw in `0..bound` (0 when `bound` is 0); for tests that need reproducible choices.
    pub fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound.max(1) as u64) as usize
    }

    /// A uniform draw in [0, 1) with 24 bits, exactly representable in f32.
    pub fn next_uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// The GPU sampler's settings row for one sequence.
pub fn settings_row(params: &SamplingParams, uniform: f32) -> [u32; SETTINGS_PER_ROW] {
    [
        params.temperature.to_bits(),
        params.top_k,
        params.top_p.to_bits(),
        params.min_p.to_bits(),
        uniform.to_bits(),
        params.top_logprobs as u32,
        0,
        0,
    ]
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

/// The host half of sampling: what the GPU sampler needs for one sequence's next token, from
/// the request's parameters, its random stream and its tokens so far. The engine holds one as
/// `Arc<dyn Sampler>`; the GPU does the rest (`gpu::kernels::{penalize, sample}`).
pub trait Sampler: Send + Sync {
    fn prepare(&self, params: &SamplingParams, rng: &mut SamplerRng, prompt: &[u32], output: &[u32]) -> SampleSpec;
}

/// The standard host half: one uniform draw per token, penalty entries when penalties are on.
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuSampler;

impl Sampler for GpuSampler {
    fn prepare(&self, params: &SamplingParams, rng: &mut SamplerRng, prompt: &[u32], output: &[u32]) -> SampleSpec {
        let penalty_entries = if params.has_penalties() { penalty_entries(prompt, output) } else { Vec::new() };
        SampleSpec { params: params.clone(), uniform: rng.next_uniform(), penalty_entries }
    }
}

/// One sampled token as the GPU reported it.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// log p(token) under the model's raw distribution (before temperature and filtering).
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, best first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Decode one row of the sampler's output.
pub fn read_sampled(row: &[u32], top_logprobs: usize) -> Sampled {
    debug_assert_eq!(row.len(), OUT_PER_ROW);
    Sampled {
        token: row[0],
        logprob: f32::from_bits(row[1]),
        top_logprobs: (0..top_logprobs.min(MAX_TOP_LOGPROBS))
            .map(|n| (row[2 + 2 * n], f32::from_bits(row[3 + 2 * n])))
            .collect(),
    }
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
        check(SamplingParams { top_p: 0.0, ..Default::default() }, "top_p");
        check(SamplingParams { top_p: 1.5, ..Default::default() }, "top_p");
        check(SamplingParams { min_p: -0.1, ..Default::default() }, "min_p");
        check(SamplingParams { top_logprobs: 21, ..Default::default() }, "top_logprobs");
        check(SamplingParams { repetition_penalty: 0.0, ..Default::default() }, "repetition_penalty");
        check(SamplingParams { presence_penalty: 2.5, ..Default::default() }, "presence_penalty");
        check(SamplingParams { frequency_penalty: -3.0, ..Default::default() }, "frequency_penalty");
        assert!(SamplingParams::greedy().validate().is_ok());
    }
}
