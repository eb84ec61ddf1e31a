//! How many tokens one step may compute so that its GPU work stays within a time budget.
//!
//! A GPU whose submission runs too long is reset by its watchdog (Windows after 2 s; browsers'
//! GPU processes likewise), which loses the device and every request on it. One step is one
//! submission, so a long prompt must reach the GPU in chunks that each take well under that,
//! on the slowest adapter weft supports as on the fastest.
//!
//! The budget is a rate: tokens per second of GPU time, times the target seconds. It starts
//! from the executor's guess (the model's FLOPs per token against a cautious figure for the
//! adapter's class; without one, from the fewest tokens) and then follows the steps as
//! measured. A native CPU driver makes no guess and, unless the engine's config asks for a
//! budget, gets none: no watchdog watches it. A step slower than the rate drops
//! it at once; a faster one that filled its budget raises it halfway (in log terms), so the
//! budget grows over a few steps and shrinks in one. Steps that did not fill the budget say
//! little about it (a decode step of four tokens is bound by reading the weights) and only
//! count when they ran past the target.
//!
//! Pure logic, no GPU: the engine feeds it each step's tokens and measured seconds.

/// Seconds of GPU work one step aims at: half of the shortest watchdog's 2 s, less a margin
/// for steps that run slower than the one before (a longer context's attention).
pub const DEFAULT_STEP_SECONDS: f64 = 0.5;

/// The fewest tokens a step may hold, whatever the budget: a step must make progress, and
/// below this a step's fixed cost dominates.
pub const MIN_STEP_TOKENS: usize = 16;

#[derive(Clone, Debug, PartialEq)]
pub struct StepBudget {
    target_s: f64,
    /// Tokens per second of GPU time; `None` until guessed or measured (no limit).
    tokens_per_s: Option<f64>,
}

impl StepBudget {
    /// A budget of `target_s` seconds a step, starting from `guess` tokens per second (`None`:
    /// the fewest tokens until a step is measured).
    pub fn new(target_s: f64, guess: Option<f64>) -> Self {
        StepBudget { target_s, tokens_per_s: guess.filter(|r| r.is_finite() && *r > 0.0) }
    }

    /// The most tokens the next step may hold (at least [`MIN_STEP_TOKENS`], and only that
    /// while the rate is unknown); `usize::MAX` when the budget is off (a target of 0 or less).
    pub fn tokens(&self) -> usize {
        if self.target_s.is_nan() || self.target_s <= 0.0 {
            return usize::MAX;
        }
        self.tokens_per_s.map_or(MIN_STEP_TOKENS, |rate| ((rate * self.target_s) as usize).max(MIN_STEP_TOKENS))
    }

    /// A step of `tokens` took `seconds` of GPU time.
    pub fn observe(&mut self, tokens: usize, seconds: f64) {
        if tokens == 0 || seconds.is_nan() || seconds <= 0.0 || seconds.is_infinite() {
            return;
        }
        let measured = tokens as f64 / seconds;
        let limit = self.tokens();
        self.tokens_per_s = Some(match self.tokens_per_s {
            None => measured,
            Some(rate) if measured < rate => {
                // Slower than assumed: believe it, but a step under its budget's size only
                // when it also ran past the target (it may just be bound by weight reads).
                if tokens * 2 >= limit || seconds > self.target_s { measured } else { rate }
            }
            Some(rate) if tokens * 2 >= limit => (rate * measured).sqrt(),
            Some(rate) => rate,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_target_nothing_is_limited_and_without_a_rate_little_is_allowed() {
        assert_eq!(StepBudget::new(0.0, Some(1000.0)).tokens(), usize::MAX);
        assert_eq!(StepBudget::new(f64::NAN, Some(1000.0)).tokens(), usize::MAX);
        assert_eq!(StepBudget::new(0.5, None).tokens(), MIN_STEP_TOKENS);
        assert_eq!(StepBudget::new(0.5, Some(f64::NAN)).tokens(), MIN_STEP_TOKENS);
        assert_eq!(StepBudget::new(0.5, Some(1000.0)).tokens(), 500);
        assert_eq!(StepBudget::new(0.5, Some(1.0)).tokens(), MIN_STEP_TOKENS);
    }

    #[test]
    fn a_slow_step_shrinks_the_budget_at_once_and_fast_ones_grow_it_gradually() {
        let mut b = StepBudget::new(0.5, Some(1000.0));
        // 500 tokens took 2 s: 250 tokens/s, so the next step holds 125.
        b.observe(500, 2.0);
        assert_eq!(b.tokens(), 125);
        // A full step at 4000 tokens/s: halfway (geometric) to it.
        b.observe(125, 125.0 / 4000.0);
        assert_eq!(b.tokens(), 500);
        // The budget converges to what the device does in the target time.
        for _ in 0..20 {
            let t = b.tokens();
            b.observe(t, t as f64 / 4000.0);
        }
        assert!((1990..=2000).contains(&b.tokens()), "{}", b.tokens());
    }

    #[test]
    fn small_steps_count_only_when_they_run_past_the_target() {
        let mut b = StepBudget::new(0.5, Some(1000.0));
        // Four decode tokens in 40 ms (100 tokens/s, bound by weight reads): no change.
        b.observe(4, 0.04);
        assert_eq!(b.tokens(), 500);
        // Nor does a fast small step raise it.
        b.observe(4, 0.0001);
        assert_eq!(b.tokens(), 500);
        // But four tokens that took a whole second do lower it.
        b.observe(4, 1.0);
        assert_eq!(b.tokens(), MIN_STEP_TOKENS);
        // Nonsense measurements are ignored.
        let before = b.clone();
        b.observe(0, 1.0);
        b.observe(10, 0.0);
        b.observe(10, f64::NAN);
        assert_eq!(b, before);
    }

    #[test]
    fn the_first_measurement_sets_an_unknown_rate() {
        // 16 tokens in 16 ms: 1000 tokens/s, 500 in half a second.
        let mut b = StepBudget::new(0.5, None);
        b.observe(16, 0.016);
        assert_eq!(b.tokens(), 500);
    }
}
