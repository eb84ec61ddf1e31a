//! `RecurrentStateManager`: which recurrent-state slot each live sequence of a state-space or
//! hybrid model holds. The counterpart of the KV blocks for Mamba-style layers: a slot is one
//! sequence's whole recurrent state (every recurrent layer's convolution window and SSM state),
//! fixed in size whatever the context length, so a sequence needs exactly one for its life.
//!
//! ```text
//!   slots:   [ 0: seq 7 ][ 1: free ][ 2: seq 3 ][ 3: free ]     num_slots fixed at construction
//!   slot s, recurrent layer l:  conv window (conv_kernel - 1, conv_channels)
//!                               SSM state   (num_heads, head_dim, state_size)
//! ```
//!
//! A slot is taken at admission and returned at finish, cancel and preemption; a preempted
//! sequence recomputes its state from its tokens when readmitted, as it does its KV. A slot's
//! old contents are never cleared here: the executor starts a sequence's state from zero at
//! position 0, so a reused slot needs no work.
//!
//! Beyond the live slots the pool has snapshot slots (ids `num_slots..`): copies of a state at
//! the end of a prompt's full blocks, which the prefix cache (`KvCacheManager`) owns beside the
//! KV blocks of the same prefix and evicts with them.
//!
//! Every slot is either used (by exactly one sequence) or free: `used + free == total` always.
//! **Invariant:** this module imports no wgpu, async runtime or web-sys: plain data, like the
//! KV manager beside it. No method panics; an unknown sequence id is a no-op.

use std::collections::HashMap;

use crate::kv::SeqId;

/// The shape of the executor's state pool: how many slots and how big each is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurrentStateConfig {
    /// Live slots: one per running sequence.
    pub num_slots: usize,
    /// Prefix-state snapshot slots after them (0: no prefix reuse for recurrent state).
    pub num_snapshot_slots: usize,
    /// Bytes of one slot over all recurrent layers (conv window plus SSM state, f32).
    pub slot_size_bytes: usize,
    /// The executor scans whole chunks of this many positions (aligned to multiples of it) in
    /// one go and the rest token by token, so the scheduler cuts a prefill only where that
    /// split stays the same (see `ContinuousBatchScheduler`); 1: anywhere.
    pub scan_chunk_tokens: usize,
}

impl RecurrentStateConfig {
    /// Bytes one sequence's state takes: per recurrent layer, a convolution window of
    /// `conv_kernel - 1` past inputs of `conv_channels` channels and an SSM state of
    /// `num_heads * head_dim * state_size`, in f32.
    pub fn slot_size_bytes(
        num_recurrent_layers: usize,
        conv_kernel: usize,
        conv_channels: usize,
        num_heads: usize,
        head_dim: usize,
        state_size: usize,
    ) -> usize {
        let conv = conv_kernel.saturating_sub(1) * conv_channels;
        let ssm = num_heads * head_dim * state_size;
        num_recurrent_layers * (conv + ssm) * 4
    }
}

/// Where the slots are; `total_slots == used_slots + free_slots`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateUsage {
    pub total_slots: usize,
    pub used_slots: usize,
    pub free_slots: usize,
    /// Bytes of one slot.
    pub slot_size_bytes: usize,
}

/// Recurrent-state slots of live sequences. See the module docs.
#[derive(Clone, Debug)]
pub struct RecurrentStateManager {
    config: RecurrentStateConfig,
    /// Slots no sequence holds; popped from the back.
    free_slots: Vec<u32>,
    seq_to_slot: HashMap<SeqId, u32>,
}

impl RecurrentStateManager {
    /// A pool of `config.num_slots` slots (capped at `u32::MAX`: slot ids are u32 on the GPU).
    pub fn new(config: RecurrentStateConfig) -> Self {
        let num_slots = config.num_slots.min(u32::MAX as usize);
        RecurrentStateManager {
            config: RecurrentStateConfig { num_slots, ..config },
            // Reversed so slots are handed out from 0 upwards.
            free_slots: (0..num_slots as u32).rev().collect(),
            seq_to_slot: HashMap::new(),
        }
    }

    pub fn config(&self) -> RecurrentStateConfig {
        self.config
    }

    /// The snapshot slots' ids, after the live ones.
    pub fn snapshot_slots(&self) -> std::ops::Range<u32> {
        let first = self.config.num_slots as u32;
        first..first.saturating_add(self.config.num_snapshot_slots.min(u32::MAX as usize) as u32)
    }

    /// Bytes of state one sequence needs.
    pub fn state_bytes_per_sequence(&self) -> usize {
        self.config.slot_size_bytes
    }

    pub fn usage(&self) -> StateUsage {
        let free_slots = self.free_slots.len();
        StateUsage {
            total_slots: self.config.num_slots,
            used_slots: self.config.num_slots - free_slots,
            free_slots,
            slot_size_bytes: self.config.slot_size_bytes,
        }
    }

    pub fn num_free_slots(&self) -> usize {
        self.free_slots.len()
    }

    /// Give `seq` a slot. `None`, with nothing changed, when every slot is taken or `seq`
    /// already holds one.
    pub fn take(&mut self, seq: SeqId) -> Option<u32> {
        if self.seq_to_slot.contains_key(&seq) {
            return None;
        }
        let slot = self.free_slots.pop()?;
        self.seq_to_slot.insert(seq, slot);
        Some(slot)
    }

    /// The slot `seq` holds, if any.
    pub fn slot(&self, seq: SeqId) -> Option<u32> {
        self.seq_to_slot.get(&seq).copied()
    }

    /// Return `seq`'s slot to the pool (finish, cancel, preemption). Unknown ids are a no-op.
    pub fn free(&mut self, seq: SeqId) {
        if let Some(slot) = self.seq_to_slot.remove(&seq) {
            self.free_slots.push(slot);
        }
    }

    /// Recount everything; panics on a broken invariant (tests only).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut seen = vec![false; self.config.num_slots];
        for &slot in self.free_slots.iter().chain(self.seq_to_slot.values()) {
            let slot = slot as usize;
            assert!(slot < seen.len(), "slot {slot} out of range");
            assert!(!seen[slot], "slot {slot} is free twice, held twice, or both");
            seen[slot] = true;
        }
        assert!(seen.iter().all(|&s| s), "a slot is neither free nor held");
        let u = self.usage();
        assert_eq!(u.used_slots + u.free_slots, u.total_slots);
        assert_eq!(u.used_slots, self.seq_to_slot.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager(num_slots: usize) -> RecurrentStateManager {
        RecurrentStateManager::new(RecurrentStateConfig {
            num_slots,
            num_snapshot_slots: 0,
            slot_size_bytes: 64,
            scan_chunk_tokens: 1,
        })
    }

    #[test]
    fn slots_are_taken_once_and_come_back() {
        let mut m = manager(2);
        assert_eq!(m.take(7), Some(0));
        assert_eq!(m.take(7), None, "a sequence holds one slot");
        assert_eq!(m.take(3), Some(1));
        assert_eq!(m.take(4), None, "all taken");
        assert_eq!(m.usage(), StateUsage { total_slots: 2, used_slots: 2, free_slots: 0, slot_size_bytes: 64 });
        m.free(7);
        m.free(7);
        m.free(99);
        assert_eq!(m.slot(7), None);
        assert_eq!(m.take(4), Some(0));
        assert_eq!(m.slot(4), Some(0));
        m.check_invariants();
    }

    #[test]
    fn slot_size_counts_conv_window_and_ssm_state() {
        // 2 layers, kernel 4 over 96 channels, 4 heads of 16 x 8.
        assert_eq!(RecurrentStateConfig::slot_size_bytes(2, 4, 96, 4, 16, 8), 2 * (3 * 96 + 4 * 16 * 8) * 4);
    }
}
