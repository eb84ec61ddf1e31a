//! Stop strings matched across token boundaries, without ever letting a stop string (or the
//! start of one) reach the caller.
//!
//! Text arrives in deltas as tokens are decoded. The matcher releases text only once it can no
//! longer be the beginning of a stop string: it holds back the longest suffix of the pending
//! text that is a prefix of some stop string.

/// Streams text through, cutting it at the first stop string.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released (it might begin a stop string).
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), pending: String::new() }
    }

    /// Feed a text delta. Returns the text that is safe to release, and whether a stop string
    /// was found (everything from it on is dropped).
    pub fn push(&mut self, delta: &str) -> (String, bool) {
        self.pending.push_str(delta);
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let released = self.pending[..at].to_string();
            self.pending.clear();
            return (released, true);
        }
        let keep = self.held_back_len();
        let cut = self.pending.len() - keep;
        let released = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (released, false)
    }

    /// The end of the stream: whatever was held back is released.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Bytes at the end of `pending` that could still grow into a stop string.
    fn held_back_len(&self) -> usize {
        let p = &self.pending;
        self.stops
            .iter()
            .flat_map(|stop| {
                (1..stop.len().min(p.len() + 1))
                    .rev()
                    .filter(|&n| stop.is_char_boundary(n) && p.is_char_boundary(p.len() - n))
                    .find(|&n| p.ends_with(&stop[..n]))
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], deltas: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let mut out = String::new();
        for d in deltas {
            let (text, stopped) = m.push(d);
            out.push_str(&text);
            if stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn a_stop_split_over_tokens_is_found_and_never_leaks() {
        assert_eq!(run(&["\n\nUser:"], &["Hello", "\n", "\nUs", "er:", " more"]), ("Hello".into(), true));
        let mut m = StopMatcher::new(&["STOP".to_string()]);
        assert_eq!(m.push("abcST"), ("abc".into(), false)); // "ST" held back
        assert_eq!(m.push("OX"), ("STOX".into(), false)); // not a stop after all: released
    }

    #[test]
    fn earliest_stop_wins_and_text_without_stops_passes_whole() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
        assert_eq!(run(&["zzz"], &["one ", "two ", "z", "z"]), ("one two zz".into(), false));
        assert_eq!(run(&[], &["plain"]), ("plain".into(), false));
        assert_eq!(run(&[""], &["empty stops are ignored"]), ("empty stops are ignored".into(), false));
    }

    #[test]
    fn multibyte_text_is_never_cut_inside_a_character() {
        assert_eq!(run(&["é!"], &["café", "é", "!"]), ("café".into(), true));
        assert_eq!(run(&["日本"], &["こんにちは日", "本語"]), ("こんにちは".into(), true));
        assert_eq!(run(&["🙂x"], &["a🙂", "🙂y"]), ("a🙂🙂y".into(), false));
    }
}
