//! `LoraSlots`: which LoRA adapter sits in which slot of the executor's adapter pool. Each step,
//! the distinct adapters of its sequences get a slot: the one they hold, else a free one, else
//! the least recently used slot whose adapter is not in the step (its adapter is evicted and
//! loaded again when next needed). The step carries the loads; the executor writes them before
//! it runs the step.
//!
//! **Invariant:** a step never names more distinct adapters than there are slots (the scheduler
//! admits no more), so a slot is always found, and a slot in use by the step is never evicted.

use std::sync::Arc;

use crate::lora::LoraAdapter;
use crate::step::LoraLoad;

/// A resident adapter and the step that last used it.
#[derive(Debug)]
struct Resident {
    adapter: Arc<LoraAdapter>,
    last_used: u64,
}

/// The slots of the adapter pool, and their counters.
#[derive(Debug, Default)]
pub struct LoraSlots {
    slots: Vec<Option<Resident>>,
    clock: u64,
    /// Adapters written into a slot, and adapters evicted to make room, since the start.
    pub num_loads: u64,
    pub num_evictions: u64,
}

impl LoraSlots {
    pub fn new(num_slots: usize) -> Self {
        LoraSlots { slots: (0..num_slots).map(|_| None).collect(), ..Default::default() }
    }

    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// Adapters resident now.
    pub fn resident(&self) -> impl Iterator<Item = &Arc<LoraAdapter>> {
        self.slots.iter().flatten().map(|r| &r.adapter)
    }

    /// A slot for each of `adapters` (distinct, at most `num_slots`), in order, and the loads
    /// that put the missing ones in place; `None` when there are more adapters than slots.
    pub fn assign(&mut self, adapters: &[Arc<LoraAdapter>]) -> Option<(Vec<u32>, Vec<LoraLoad>)> {
        if adapters.len() > self.slots.len() {
            return None;
        }
        self.clock += 1;
        let in_step = |r: &Resident| adapters.iter().any(|a| a.id == r.adapter.id);
        let mut slots = Vec::with_capacity(adapters.len());
        let mut loads = Vec::new();
        for adapter in adapters {
            let held = self.slots.iter().position(|s| s.as_ref().is_some_and(|r| r.adapter.id == adapter.id));
            let slot = match held {
                Some(slot) => slot,
                None => {
                    let free = self.slots.iter().position(Option::is_none);
                    // Cannot fail: fewer adapters than slots, and this one holds none.
                    let slot = free.or_else(|| {
                        let idle = self.slots.iter().enumerate().filter_map(|(i, s)| s.as_ref().map(|r| (i, r)));
                        idle.filter(|(_, r)| !in_step(r)).min_by_key(|(_, r)| r.last_used).map(|(i, _)| i)
                    })?;
                    if self.slots[slot].is_some() {
                        self.num_evictions += 1;
                    }
                    self.num_loads += 1;
                    self.slots[slot] = Some(Resident { adapter: adapter.clone(), last_used: 0 });
                    loads.push(LoraLoad { slot: slot as u32, adapter: adapter.clone() });
                    slot
                }
            };
            if let Some(r) = &mut self.slots[slot] {
                r.last_used = self.clock;
            }
            slots.push(slot as u32);
        }
        Some((slots, loads))
    }

    /// Forget `adapter` (unloaded by the caller): its slot becomes free.
    pub fn remove(&mut self, adapter_id: u64) {
        for s in &mut self.slots {
            if s.as_ref().is_some_and(|r| r.adapter.id == adapter_id) {
                *s = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(name: &str) -> Arc<LoraAdapter> {
        Arc::new(LoraAdapter::for_tests(name))
    }

    #[test]
    fn the_least_recently_used_idle_adapter_is_evicted() {
        let (a, b, c) = (adapter("a"), adapter("b"), adapter("c"));
        let mut slots = LoraSlots::new(2);
        let (s, loads) = slots.assign(&[a.clone(), b.clone()]).unwrap();
        assert_eq!((s, loads.len()), (vec![0, 1], 2));
        let (s, loads) = slots.assign(std::slice::from_ref(&b)).unwrap();
        assert_eq!((s, loads.len()), (vec![1], 0), "resident: no load");
        // a was used least recently: c takes its slot.
        let (s, loads) = slots.assign(&[c.clone(), b.clone()]).unwrap();
        assert_eq!((s, loads), (vec![0, 1], vec![LoraLoad { slot: 0, adapter: c.clone() }]));
        // c is in the step, so a evicts b.
        let (s, _) = slots.assign(&[a.clone(), c.clone()]).unwrap();
        assert_eq!(s, vec![1, 0], "a evicts b, the one not in the step");
        assert_eq!((slots.num_loads, slots.num_evictions), (4, 2));
        assert!(slots.assign(&[a, b, c]).is_none(), "three adapters never fit two slots");
    }
}
