//! Which rows of a step's recurrent sequences the token-by-token scan (`ssm_scan`) takes and
//! which the chunked SSD scan (`ssd_scan`) takes, as the tables those kernels read.
//!
//! Chunks are aligned to absolute positions: chunk `c` of a sequence is positions
//! `c·Q .. (c + 1)·Q`, and the chunked scan takes exactly the chunks that lie wholly inside a
//! step's rows of the sequence. The rows before the first such chunk (a head) and after the
//! last (a tail, and every decode row) are scanned token by token, in that order:
//!
//! ```text
//!   positions   s0        a=⌈s0/Q⌉Q                  b=⌊s1/Q⌋Q      s1
//!               |  head   |  chunk  |  chunk  |  chunk  |   tail   |
//!               ssm_scan    ssd_scan (one run of chunks)  ssm_scan
//! ```
//!
//! **Invariant:** a row's treatment depends only on its absolute position and on where the
//! sequence's steps start and end. The scheduler cuts a recurrent prefill only at multiples of
//! Q, inside a head, at snapshot boundaries or where the known tokens end (see
//! `ContinuousBatchScheduler`), so the chunks, hence the bits, of a sequence do not depend on
//! the token budget or on the rest of its batch. Plain data: no GPU here.

use crate::gpu::kernels::ssm::{NO_SLOT, SEQ_STATE_COLS};

/// The tables of one step's scans (each `SEQ_STATE_COLS` wide, as `SeqStates`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanPlan {
    /// Heads, scanned token by token before the chunks: (first row, rows, own slot, start
    /// position, slot read from, snapshot slot written).
    pub before: Vec<u32>,
    /// The first row of every chunk of `rows_per_chunk` rows.
    pub chunks: Vec<u32>,
    /// Runs of consecutive chunks of one sequence: (first chunk, chunks, own slot, start
    /// position, slot read from, snapshot slot written).
    pub runs: Vec<u32>,
    /// Everything scanned token by token after the chunks: tails, decodes, and sequences whose
    /// rows hold no whole chunk.
    pub after: Vec<u32>,
}

impl ScanPlan {
    /// The plan for `seq_states`, the step's per-sequence table (first row, rows, own slot,
    /// start position, slot read from, snapshot slot written) in `SEQ_STATE_COLS`-wide rows,
    /// with chunks of `rows_per_chunk` rows; `None` (or fewer than 2) scans everything token by
    /// token.
    pub fn of(seq_states: &[u32], rows_per_chunk: Option<usize>) -> ScanPlan {
        let mut plan = ScanPlan::default();
        let q = rows_per_chunk.filter(|&q| q >= 2).map(|q| q as u32);
        for seq in seq_states.chunks_exact(SEQ_STATE_COLS) {
            let &[first_row, num_rows, slot, s0, read, save] = seq else { unreachable!("chunks_exact") };
            let s1 = s0 + num_rows;
            let Some(q) = q else {
                plan.after.extend_from_slice(seq);
                continue;
            };
            let (a, b) = (s0.div_ceil(q) * q, s1 / q * q);
            if b <= a {
                plan.after.extend_from_slice(seq);
                continue;
            }
            let (head, tail) = (a > s0, b < s1);
            if head {
                plan.before.extend([first_row, a - s0, slot, s0, read, NO_SLOT]);
            }
            let first_chunk = (plan.chunks.len()) as u32;
            let chunk_row = first_row + (a - s0);
            plan.chunks.extend((0..(b - a) / q).map(|c| chunk_row + c * q));
            let (start, from) = if head { (a, slot) } else { (s0, read) };
            plan.runs.extend([first_chunk, (b - a) / q, slot, start, from, if tail { NO_SLOT } else { save }]);
            if tail {
                plan.after.extend([first_row + (b - s0), s1 - b, slot, b, slot, save]);
            }
        }
        plan
    }

    /// (heads, chunks, runs, token-by-token sequences after): what decides the dispatches.
    pub fn shape(&self) -> (usize, usize, usize, usize) {
        let rows = |t: &[u32]| t.len() / SEQ_STATE_COLS;
        (rows(&self.before), self.chunks.len(), rows(&self.runs), rows(&self.after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const X: u32 = NO_SLOT;

    #[test]
    fn without_chunks_everything_is_scanned_token_by_token() {
        let table = [0, 5, 1, 0, 1, X, 5, 1, 2, 9, 2, X];
        for q in [None, Some(1), Some(8)] {
            let plan = ScanPlan::of(&table, q);
            assert_eq!(plan, ScanPlan { after: table.to_vec(), ..Default::default() }, "{q:?}");
        }
    }

    #[test]
    fn whole_chunks_go_to_the_chunked_scan_heads_and_tails_around_them() {
        // Sequence A: positions 0..10 from zero, restoring nothing, saving to 9: chunks 0..4 and
        // 4..8, tail 8..10 (which saves). Sequence B: positions 6..17 in slot 2, restored from
        // 7: head 6..8 (reads 7), chunks 8..12 and 12..16 (read the own slot), tail 16..17.
        // Sequence C: a decode at 20.
        let table = [0, 10, 1, 0, 1, 9, 10, 11, 2, 6, 7, X, 21, 1, 3, 20, 3, X];
        let plan = ScanPlan::of(&table, Some(4));
        assert_eq!(plan.before, vec![10, 2, 2, 6, 7, X]);
        assert_eq!(plan.chunks, vec![0, 4, 12, 16]);
        assert_eq!(plan.runs, vec![0, 2, 1, 0, 1, X, 2, 2, 2, 8, 2, X]);
        assert_eq!(plan.after, vec![8, 2, 1, 8, 1, 9, 20, 1, 2, 16, 2, X, 21, 1, 3, 20, 3, X]);
        assert_eq!(plan.shape(), (1, 4, 2, 3));
    }

    #[test]
    fn a_run_that_ends_the_rows_saves_the_snapshot() {
        // Positions 4..12 restored from slot 5 and saved to 6: chunks 4..8 and 8..12, nothing
        // around them.
        let plan = ScanPlan::of(&[3, 8, 0, 4, 5, 6], Some(4));
        assert_eq!(plan, ScanPlan { chunks: vec![3, 7], runs: vec![0, 2, 0, 4, 5, 6], ..Default::default() });
    }

    /// The chunks of a prompt do not depend on where its steps are cut, as long as the cuts
    /// fall on chunk boundaries or inside a head: every position lands in the same chunk or in
    /// token-by-token rows either way.
    #[test]
    fn cuts_on_chunk_boundaries_keep_every_chunk() {
        let treatment = |cuts: &[u32]| {
            let mut chunked = Vec::new();
            for w in cuts.windows(2) {
                let plan = ScanPlan::of(&[0, w[1] - w[0], 0, w[0], 0, X], Some(4));
                chunked.extend(plan.chunks.iter().map(|&row| row + w[0]));
            }
            chunked
        };
        let one_pass = treatment(&[3, 23]);
        assert_eq!(one_pass, vec![4, 8, 12, 16]);
        assert_eq!(treatment(&[3, 4, 12, 16, 22, 23]), one_pass);
        assert_eq!(treatment(&[3, 4, 8, 20, 23]), one_pass);
        // A cut inside a chunk loses it.
        assert_ne!(treatment(&[3, 10, 23]), one_pass);
    }
}
