//! The engine's numbers: counters, latency histograms and gauges. Rendering them (Prometheus
//! text) is the server's business; they are gathered here.

use std::collections::BTreeMap;

use crate::engine::request::FinishReason;
use crate::kv::{KvUsage, PrefixCacheStats};
use crate::step::StepTimings;

/// A latency histogram with fixed bucket bounds in seconds (cumulative counts, as Prometheus).
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// Upper bounds of the buckets, ascending; an implicit +Inf bucket follows.
    pub bounds: Vec<f64>,
    /// Observations at or below each bound.
    pub cumulative_counts: Vec<u64>,
    pub count: u64,
    pub sum: f64,
}

impl Histogram {
    pub fn latency() -> Self {
        let bounds = vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];
        Histogram { cumulative_counts: vec![0; bounds.len()], bounds, count: 0, sum: 0.0 }
    }

    /// Buckets for work that takes microseconds to milliseconds.
    pub fn fast() -> Self {
        let bounds = vec![0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1];
        Histogram { cumulative_counts: vec![0; bounds.len()], bounds, count: 0, sum: 0.0 }
    }

    pub fn observe(&mut self, seconds: f64) {
        self.count += 1;
        self.sum += seconds;
        for (bound, count) in self.bounds.iter().zip(&mut self.cumulative_counts) {
            if seconds <= *bound {
                *count += 1;
            }
        }
    }

    /// The smallest bucket bound holding at least fraction `q` of the observations.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        let need = (q * self.count as f64).ceil() as u64;
        self.bounds.iter().zip(&self.cumulative_counts).find(|(_, c)| **c >= need.max(1)).map(|(b, _)| *b)
    }
}

/// A snapshot of everything the engine counts.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineMetrics {
    pub requests_submitted: u64,
    pub requests_rejected: u64,
    pub requests_finished: BTreeMap<&'static str, u64>,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub steps: u64,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub end_to_end_latency: Histogram,
    pub queue_time: Histogram,
    /// Host time computing structured output's token masks, per step that had any.
    pub token_mask_time: Histogram,
    pub running: usize,
    pub waiting: usize,
    pub preemptions: u64,
    pub kv: KvUsage,
    pub prefix_cache: PrefixCacheStats,
    /// Speculative decoding: tokens drafted and verified, drafted tokens accepted, and
    /// sequence-steps that verified at least one draft.
    pub spec_drafted_tokens: u64,
    pub spec_accepted_tokens: u64,
    pub spec_verify_steps: u64,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        EngineMetrics {
            requests_submitted: 0,
            requests_rejected: 0,
            requests_finished: BTreeMap::new(),
            prompt_tokens: 0,
            generation_tokens: 0,
            steps: 0,
            time_to_first_token: Histogram::latency(),
            inter_token_latency: Histogram::latency(),
            end_to_end_latency: Histogram::latency(),
            queue_time: Histogram::latency(),
            token_mask_time: Histogram::fast(),
            running: 0,
            waiting: 0,
            preemptions: 0,
            kv: KvUsage::default(),
            prefix_cache: PrefixCacheStats::default(),
            spec_drafted_tokens: 0,
            spec_accepted_tokens: 0,
            spec_verify_steps: 0,
        }
    }
}

/// One engine step, as benchmarks and profiles see it.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRecord {
    pub num_seqs: usize,
    pub num_tokens: usize,
    pub num_logits: usize,
    pub timings: StepTimings,
}

/// Steps kept for [`ContinuousBatchEngine::take_step_records`](crate::engine::ContinuousBatchEngine::take_step_records)
/// at most; older ones are dropped.
pub const MAX_STEP_RECORDS: usize = 8192;

impl EngineMetrics {
    /// Accepted drafted tokens over drafted ones (0 before any draft).
    pub fn spec_acceptance_rate(&self) -> f64 {
        if self.spec_drafted_tokens == 0 {
            0.0
        } else {
            self.spec_accepted_tokens as f64 / self.spec_drafted_tokens as f64
        }
    }

    /// Tokens a verifying sequence gained per step on average: its accepted drafts plus the
    /// target's own token (0 before any draft).
    pub fn spec_mean_accepted_len(&self) -> f64 {
        if self.spec_verify_steps == 0 {
            0.0
        } else {
            (self.spec_accepted_tokens + self.spec_verify_steps) as f64 / self.spec_verify_steps as f64
        }
    }

    pub(crate) fn finished(&mut self, reason: FinishReason) {
        *self.requests_finished.entry(reason.as_str()).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_counts_cumulatively() {
        let mut h = Histogram::latency();
        for s in [0.002, 0.02, 0.02, 3.0] {
            h.observe(s);
        }
        assert_eq!(h.count, 4);
        assert!((h.sum - 3.042).abs() < 1e-12);
        assert_eq!(h.cumulative_counts[0], 0); // <= 1 ms
        assert_eq!(h.cumulative_counts[1], 1); // <= 5 ms
        assert_eq!(h.cumulative_counts[3], 3); // <= 25 ms
        assert_eq!(h.quantile_bound(0.5), Some(0.025));
        assert_eq!(h.quantile_bound(1.0), Some(5.0));
    }
}
