//! `KvCacheManager`: which KV blocks each live sequence owns, and the prefix cache of full,
//! computed blocks that later sequences may share. Modelled on vLLM v1's `kv_cache_manager.py`
//! and `block_pool.py`.
//!
//! ```text
//!   block_size = 4           full, computed blocks             partial (never cached)
//!   seq 7 tokens:      [ 5 9 2 7 | 1 1 3 8 | 4 0 6 6 ] [ 2 9 _ _ ]
//!   block table:       [    3    |    8    |   11    ] [   0     ]
//!   hash chain:          h0 = H(ROOT, 5 9 2 7)
//!                        h1 = H(h0, 1 1 3 8)   h2 = H(h1, 4 0 6 6)
//! ```
//!
//! Every block is in exactly one of three states, so `used + cached + free == total` always:
//! - **used**: held by at least one live sequence; its reference count is the number of block
//!   tables holding it.
//! - **cached**: held by no sequence but registered in the prefix cache (a full block whose KV is
//!   computed); evictable, least recently used first.
//! - **free**: on the free list (never used, or released without a cache entry).
//!
//! **Invariant:** this module imports no wgpu, async runtime or web-sys: it is bookkeeping over
//! block ids, unit-tested alone (a tidy test in `engine::scheduler` checks the imports).
//! **Invariant:** block tables only grow while a sequence lives: a block id handed to a
//! sequence stays at its index until the sequence is freed, so the executor may keep using a
//! table it was given ("allocated block IDs won't change", block_pool.py). The one exception is
//! [`KvCacheManager::shrink`], between steps, which drops trailing blocks that held nothing but
//! rejected drafted tokens.
//! **Invariant:** a block with a reference count above zero is never evicted or handed out again.
//! **Invariant:** a prefix-cache hit is exact, not merely probable: besides the hash, a cached
//! block stores its tokens and the identity (id and generation) of the cached block before it,
//! and a lookup compares both, so two different prefixes never share a block even if their
//! hashes collide.
//! **Invariant:** the cache is keyed by a prefix key besides the tokens (the LoRA adapter a
//! sequence runs, 0 for the base model): the same prompt under two keys never shares a block.
//! The key starts the hash chain and is stored and compared in every entry.
//! **Invariant:** a recurrent-state snapshot slot (prefix reuse for state-space layers) is free,
//! pending for exactly one sequence (taken when its chunk reaching the end of its prompt's full
//! blocks is scheduled), or attached to exactly one cache entry, and goes back to the free list
//! when that entry is evicted; a sequence restores a snapshot only together with the KV blocks
//! of the same prefix.
//! No method panics on any input; an unknown sequence id is a no-op (or an empty answer).

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

/// A sequence (request) id, chosen by the caller.
pub type SeqId = u64;

/// Prefix-cache counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Blocks found in the cache at admission.
    pub hits: u64,
    /// Blocks looked up at admission and not found.
    pub misses: u64,
    /// Cached blocks dropped to make room for new allocations.
    pub evictions: u64,
    /// Blocks now held only by the cache (evictable).
    pub cached_blocks: usize,
    /// Tokens of the sequences looked up at admission, all of them (vLLM's prefix-cache queries).
    pub queried_tokens: u64,
    /// Admissions of recurrent sequences that restored a prefix-state snapshot.
    pub state_hits: u64,
    /// Admissions of recurrent sequences that found none and start from zero.
    pub state_misses: u64,
}

/// Where the pool's blocks are; `total_blocks == used_blocks + cached_blocks + free_blocks`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvUsage {
    pub total_blocks: usize,
    /// Referenced by at least one live sequence.
    pub used_blocks: usize,
    /// Held only by the prefix cache; evictable.
    pub cached_blocks: usize,
    /// Never used, or released without a cache entry.
    pub free_blocks: usize,
}

/// The parent hash of a sequence's first block.
const ROOT_HASH: u64 = 0x6b76_5f72_6f6f_7421;

/// `H(parent_hash, tokens)`. `DefaultHasher::new()` is keyed with fixed zeros, so the hashes
/// are the same for every manager in a process (they are never persisted).
fn hash_block_tokens(parent_hash: u64, tokens: &[u32]) -> u64 {
    let mut hasher = DefaultHasher::new();
    parent_hash.hash(&mut hasher);
    tokens.hash(&mut hasher);
    hasher.finish()
}

/// One incarnation of a block: its id and how many times it had been handed out fresh. A stale
/// reference (the block was since evicted or freed and reused) no longer matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BlockRef {
    block_id: u32,
    generation: u64,
}

/// What the prefix cache knows about a registered block.
#[derive(Clone, Debug)]
struct CacheEntry {
    hash: u64,
    /// The prefix key of the sequences that may share it.
    key: u64,
    /// The cached block holding the previous `block_size` tokens; `None` for a first block.
    parent: Option<BlockRef>,
    /// (block_size,) the token ids whose K/V the block holds.
    tokens: Box<[u32]>,
    /// The recurrent-state snapshot taken at the end of this block, if any.
    snapshot: Option<u32>,
}

#[derive(Clone, Debug, Default)]
struct Block {
    /// Number of live block tables holding this block.
    ref_count: u32,
    /// Bumped every time the block is handed out fresh (from the free list or by eviction).
    generation: u64,
    /// `Some` while the block is findable in the prefix cache.
    entry: Option<CacheEntry>,
    /// Logical time the block was last freed or hit; orders eviction.
    last_used: u64,
}

/// A live sequence's blocks and how far its hash chain has been registered.
#[derive(Clone, Debug, Default)]
struct SeqBlocks {
    /// (num_blocks,) append-only.
    block_ids: Vec<u32>,
    /// The prefix key its blocks are cached under.
    key: u64,
    /// Leading blocks already taken from the cache or passed through `mark_computed`.
    num_hashed_blocks: usize,
    /// Hash and cached block of the last hashed block: the parent of the next one. When the
    /// sequence computed a block someone had already cached, this names that other block.
    chain: Option<(u64, BlockRef)>,
    /// The cached block the chain goes through was evicted: nothing later is findable anyway.
    chain_broken: bool,
    /// A snapshot slot receiving the state at the end of block `.0`, attached to that block's
    /// cache entry when the block is registered.
    pending_snapshot: Option<(usize, u32)>,
}

/// Paged KV blocks with reference counts and a prefix cache. See the module docs.
#[derive(Clone, Debug)]
pub struct KvCacheManager {
    block_size: usize,
    enable_prefix_cache: bool,
    /// (num_blocks,)
    blocks: Vec<Block>,
    /// Blocks with no owner and no cache entry; popped from the back.
    free_block_ids: Vec<u32>,
    /// Cache-only blocks as (last_used, block_id): the first is the least recently used.
    evictable: BTreeSet<(u64, u32)>,
    /// Hash -> registered blocks with that hash (more than one only on a collision).
    hash_to_block_ids: HashMap<u64, Vec<u32>>,
    seq_to_blocks: HashMap<SeqId, SeqBlocks>,
    /// Logical clock for `Block::last_used`.
    clock: u64,
    stats: PrefixCacheStats,
    /// The block hash; a seam so tests can force collisions.
    hasher: fn(u64, &[u32]) -> u64,
    /// Recurrent-state snapshot slots no entry or sequence holds.
    free_snapshot_slots: Vec<u32>,
}

impl KvCacheManager {
    /// A pool of `num_blocks` blocks of `block_size` tokens (a `block_size` of 0 is taken as 1).
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_cache: bool) -> Self {
        // Block ids are u32 on the GPU side; a pool beyond that could not be addressed anyway.
        let num_blocks = num_blocks.min(u32::MAX as usize);
        KvCacheManager {
            block_size: block_size.max(1),
            enable_prefix_cache,
            blocks: vec![Block::default(); num_blocks],
            // Reversed so blocks are handed out from 0 upwards.
            free_block_ids: (0..num_blocks as u32).rev().collect(),
            evictable: BTreeSet::new(),
            hash_to_block_ids: HashMap::new(),
            seq_to_blocks: HashMap::new(),
            clock: 0,
            stats: PrefixCacheStats::default(),
            hasher: hash_block_tokens,
            free_snapshot_slots: Vec::new(),
        }
    }

    /// Keep recurrent-state snapshots in `slots` beside the cached blocks (before any sequence
    /// is admitted): the prefix cache then serves recurrent models too.
    pub fn set_state_snapshot_slots(&mut self, slots: impl IntoIterator<Item = u32>) {
        self.free_snapshot_slots = slots.into_iter().collect();
        // Handed out from the lowest id.
        self.free_snapshot_slots.reverse();
    }

    /// Stop finding and registering cached blocks (before any sequence is admitted; a model
    /// whose recurrent state a KV hit cannot restore asks for this).
    pub fn disable_prefix_cache(&mut self) {
        self.enable_prefix_cache = false;
    }

    pub fn prefix_cache_enabled(&self) -> bool {
        self.enable_prefix_cache
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn usage(&self) -> KvUsage {
        let total_blocks = self.blocks.len();
        let cached_blocks = self.evictable.len();
        let free_blocks = self.free_block_ids.len();
        KvUsage { total_blocks, used_blocks: total_blocks - cached_blocks - free_blocks, cached_blocks, free_blocks }
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        PrefixCacheStats { cached_blocks: self.evictable.len(), ..self.stats }
    }

    /// Blocks a new allocation could get right now (free + evictable cached).
    pub fn num_available_blocks(&self) -> usize {
        self.free_block_ids.len() + self.evictable.len()
    }

    /// Admit `seq`, whose known tokens are `tokens`: reuse the longest run of cached full blocks
    /// matching the token prefix, then allocate fresh blocks for the rest of `tokens`.
    ///
    /// The reuse is capped at [`max_cached_blocks`](Self::max_cached_blocks): at least one token
    /// must be computed, or the step would produce no logit to sample from.
    ///
    /// Returns the number of tokens already computed (a multiple of `block_size`), or `None`,
    /// with nothing changed, when the blocks are not available or `seq` is already live.
    pub fn allocate(&mut self, seq: SeqId, tokens: &[u32]) -> Option<usize> {
        self.allocate_keyed(seq, tokens, 0)
    }

    /// [`allocate`](Self::allocate) sharing cached blocks only with sequences of the same prefix
    /// `key` (a LoRA adapter's id; 0, the base model, is what `allocate` uses).
    pub fn allocate_keyed(&mut self, seq: SeqId, tokens: &[u32], key: u64) -> Option<usize> {
        self.allocate_inner(seq, tokens, false, key).map(|(num_cached_tokens, _)| num_cached_tokens)
    }

    /// [`allocate`](Self::allocate) for a sequence with recurrent state: the reused run of cached
    /// blocks ends at the last one holding a state snapshot (a KV hit past it could not skip
    /// the recurrent layers' work), and that snapshot is returned with the number of computed
    /// tokens; `(0, None)` without one.
    pub fn allocate_restoring(&mut self, seq: SeqId, tokens: &[u32]) -> Option<(usize, Option<u32>)> {
        self.allocate_inner(seq, tokens, true, 0)
    }

    fn allocate_inner(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        restoring: bool,
        key: u64,
    ) -> Option<(usize, Option<u32>)> {
        if self.seq_to_blocks.contains_key(&seq) {
            return None;
        }
        let num_blocks = tokens.len().div_ceil(self.block_size);
        let max_cached_blocks = self.max_cached_blocks(tokens.len());
        let (mut hit_block_ids, mut chain) = if self.enable_prefix_cache {
            self.find_cached_prefix(tokens, max_cached_blocks, key)
        } else {
            (Vec::new(), None)
        };
        let mut snapshot = None;
        if restoring {
            let entry = |b: u32| self.blocks[b as usize].entry.as_ref();
            let last = hit_block_ids.iter().rposition(|&b| entry(b).is_some_and(|e| e.snapshot.is_some()));
            hit_block_ids.truncate(last.map_or(0, |i| i + 1));
            chain = hit_block_ids.last().and_then(|&b| {
                let e = entry(b)?;
                snapshot = e.snapshot;
                Some((e.hash, BlockRef { block_id: b, generation: self.blocks[b as usize].generation }))
            });
        }
        let num_new_blocks = num_blocks - hit_block_ids.len();
        // Hit blocks that sit in the evictable set are about to be taken, so they cannot also be
        // evicted to make room for this allocation.
        let num_hits_evictable = hit_block_ids.iter().filter(|&&b| self.blocks[b as usize].ref_count == 0).count();
        if num_new_blocks > self.num_available_blocks() - num_hits_evictable {
            return None;
        }

        // Committed: from here on nothing fails.
        if self.enable_prefix_cache {
            self.stats.queried_tokens += tokens.len() as u64;
            self.stats.hits += hit_block_ids.len() as u64;
            self.stats.misses += (max_cached_blocks - hit_block_ids.len()) as u64;
            if restoring {
                if snapshot.is_some() {
                    self.stats.state_hits += 1;
                } else {
                    self.stats.state_misses += 1;
                }
            }
        }
        for &block_id in &hit_block_ids {
            self.clock += 1;
            let block = &mut self.blocks[block_id as usize];
            if block.ref_count == 0 {
                self.evictable.remove(&(block.last_used, block_id));
            }
            block.ref_count += 1;
            block.last_used = self.clock;
        }
        let num_hashed_blocks = hit_block_ids.len();
        let mut block_ids = hit_block_ids;
        for _ in 0..num_new_blocks {
            // Cannot fail: availability was checked above.
            let Some(block_id) = self.take_fresh_block() else { break };
            block_ids.push(block_id);
        }
        self.seq_to_blocks.insert(
            seq,
            SeqBlocks { block_ids, key, num_hashed_blocks, chain, chain_broken: false, pending_snapshot: None },
        );
        Some((num_hashed_blocks * self.block_size, snapshot))
    }

    /// Give back `seq`'s pending snapshot slot, if any: the step meant to fill it may not have
    /// run (its output was never applied), so its contents cannot be trusted.
    pub fn cancel_snapshot(&mut self, seq: SeqId) {
        if let Some((_, slot)) = self.seq_to_blocks.get_mut(&seq).and_then(|s| s.pending_snapshot.take()) {
            self.free_snapshot_slots.push(slot);
        }
    }

    /// A snapshot slot for the state `seq` will have at the end of its block `block_index` (the
    /// step computing up to there writes it), attached to that block's cache entry once the
    /// block is registered. A free slot, else the one of the least recently used cache-only
    /// block holding a snapshot (the block itself stays cached). `None` when the cache is off,
    /// no slot can be had, `seq` is unknown or already has one pending.
    pub fn reserve_snapshot(&mut self, seq: SeqId, block_index: usize) -> Option<u32> {
        if !self.enable_prefix_cache || self.seq_to_blocks.get(&seq).is_none_or(|s| s.pending_snapshot.is_some()) {
            return None;
        }
        let slot = match self.free_snapshot_slots.pop() {
            Some(slot) => slot,
            None => {
                let blocks = &mut self.blocks;
                let (_, victim) = self
                    .evictable
                    .iter()
                    .copied()
                    .find(|&(_, b)| blocks[b as usize].entry.as_ref().is_some_and(|e| e.snapshot.is_some()))?;
                blocks[victim as usize].entry.as_mut()?.snapshot.take()?
            }
        };
        if let Some(s) = self.seq_to_blocks.get_mut(&seq) {
            s.pending_snapshot = Some((block_index, slot));
        }
        Some(slot)
    }

    /// Make sure `seq` has blocks for `num_tokens` tokens in total (decode growth, or a longer
    /// prefill). New blocks are appended; existing ones never move. All or nothing: false, with
    /// nothing changed, if the blocks ran out or `seq` is unknown. Asking for fewer tokens than
    /// the sequence already has room for is a no-op that succeeds.
    pub fn grow(&mut self, seq: SeqId, num_tokens: usize) -> bool {
        let Some(num_blocks_now) = self.seq_to_blocks.get(&seq).map(|s| s.block_ids.len()) else { return false };
        let num_blocks = num_tokens.div_ceil(self.block_size);
        if num_blocks <= num_blocks_now {
            return true;
        }
        let num_new_blocks = num_blocks - num_blocks_now;
        if num_new_blocks > self.num_available_blocks() {
            return false;
        }
        let mut new_block_ids = Vec::with_capacity(num_new_blocks);
        for _ in 0..num_new_blocks {
            let Some(block_id) = self.take_fresh_block() else { break };
            new_block_ids.push(block_id);
        }
        if let Some(s) = self.seq_to_blocks.get_mut(&seq) {
            s.block_ids.extend(new_block_ids);
        }
        true
    }

    /// Release `seq`'s trailing blocks beyond those `num_tokens` tokens need (after drafted
    /// tokens were rejected). The released blocks were never full of computed tokens, so they
    /// hold no cache entry and go back to the free list. Unknown `seq`, or nothing to release:
    /// a no-op.
    pub fn shrink(&mut self, seq: SeqId, num_tokens: usize) {
        let num_blocks = num_tokens.div_ceil(self.block_size);
        let Some(s) = self.seq_to_blocks.get_mut(&seq) else { return };
        if s.block_ids.len() <= num_blocks.max(s.num_hashed_blocks) {
            return;
        }
        let released = s.block_ids.split_off(num_blocks.max(s.num_hashed_blocks));
        self.release(&released);
    }

    /// `seq`'s first `num_computed` tokens (of `tokens`, its full token list) now have their K/V
    /// in the cache: every newly full block gets its hash and becomes findable by later
    /// sequences. Blocks already registered keep their hash. When another sequence has already
    /// cached an identical block, that one stays the findable copy and this sequence's block
    /// simply returns to the free list when released.
    pub fn mark_computed(&mut self, seq: SeqId, tokens: &[u32], num_computed: usize) {
        if !self.enable_prefix_cache {
            return;
        }
        // Taken out and put back so the block pool can be borrowed mutably meanwhile.
        let Some(mut s) = self.seq_to_blocks.remove(&seq) else { return };
        let num_full_blocks = (num_computed.min(tokens.len()) / self.block_size).min(s.block_ids.len());
        while s.num_hashed_blocks < num_full_blocks && !s.chain_broken {
            let index = s.num_hashed_blocks;
            let block_tokens = &tokens[index * self.block_size..(index + 1) * self.block_size];
            let parent = s.chain.map(|(_, r)| r);
            if parent.is_some_and(|r| !self.is_live_entry(r)) {
                // The parent was evicted: no lookup can walk to anything registered below it.
                s.chain_broken = true;
                break;
            }
            let parent_hash = s.chain.map_or_else(|| self.root_hash(s.key), |(h, _)| h);
            let own_id = s.block_ids[index];
            let own = &self.blocks[own_id as usize];
            let (hash, canonical) = if let Some(entry) = &own.entry {
                // Registered already (a prefix hit); keep its hash.
                (entry.hash, own_id)
            } else {
                let hash = (self.hasher)(parent_hash, block_tokens);
                match self.find_entry(hash, parent, block_tokens, s.key) {
                    Some(other_id) => (hash, other_id),
                    None => {
                        let entry =
                            CacheEntry { hash, key: s.key, parent, tokens: block_tokens.into(), snapshot: None };
                        self.blocks[own_id as usize].entry = Some(entry);
                        self.hash_to_block_ids.entry(hash).or_default().push(own_id);
                        (hash, own_id)
                    }
                }
            };
            if let Some((_, slot)) = s.pending_snapshot.take_if(|(i, _)| *i == index) {
                // The snapshot belongs with the findable copy of the block; a copy that has one
                // already keeps it.
                match self.blocks[canonical as usize].entry.as_mut() {
                    Some(entry) if entry.snapshot.is_none() => entry.snapshot = Some(slot),
                    _ => self.free_snapshot_slots.push(slot),
                }
            }
            let generation = self.blocks[canonical as usize].generation;
            s.chain = Some((hash, BlockRef { block_id: canonical, generation }));
            s.num_hashed_blocks += 1;
        }
        if s.chain_broken || s.pending_snapshot.is_some_and(|(i, _)| i < s.num_hashed_blocks) {
            // Its block will never be registered by this sequence.
            if let Some((_, slot)) = s.pending_snapshot.take() {
                self.free_snapshot_slots.push(slot);
            }
        }
        self.seq_to_blocks.insert(seq, s);
    }

    /// `seq`'s block table (block ids in token order); empty for an unknown sequence.
    pub fn block_table(&self, seq: SeqId) -> &[u32] {
        self.seq_to_blocks.get(&seq).map_or(&[], |s| s.block_ids.as_slice())
    }

    /// Release `seq`'s blocks. A block nobody holds any more stays in the prefix cache if it is
    /// registered there (and the cache is on), else returns to the free list. Unknown: no-op.
    pub fn free(&mut self, seq: SeqId) {
        let Some(s) = self.seq_to_blocks.remove(&seq) else { return };
        if let Some((_, slot)) = s.pending_snapshot {
            self.free_snapshot_slots.push(slot);
        }
        self.release(&s.block_ids);
    }

    /// Drop one reference to each of `block_ids`. A block nobody holds any more stays in the
    /// prefix cache if it is registered there, else returns to the free list. Tail first, so a
    /// sequence's last blocks get the oldest timestamps and are evicted before its prefix,
    /// which is what other sequences share (block_pool.py does the same).
    fn release(&mut self, block_ids: &[u32]) {
        for &block_id in block_ids.iter().rev() {
            self.clock += 1;
            let block = &mut self.blocks[block_id as usize];
            block.ref_count = block.ref_count.saturating_sub(1);
            if block.ref_count > 0 {
                continue;
            }
            block.last_used = self.clock;
            if block.entry.is_some() && self.enable_prefix_cache {
                self.evictable.insert((block.last_used, block_id));
            } else {
                self.free_block_ids.push(block_id);
            }
        }
    }

    /// How many full blocks of `tokens`' prefix [`allocate`](Self::allocate) would take from
    /// the cache now (nothing is taken).
    pub fn num_cached_blocks(&self, tokens: &[u32]) -> usize {
        self.num_cached_blocks_keyed(tokens, 0)
    }

    /// [`num_cached_blocks`](Self::num_cached_blocks) under prefix key `key`.
    pub fn num_cached_blocks_keyed(&self, tokens: &[u32], key: u64) -> usize {
        if !self.enable_prefix_cache {
            return 0;
        }
        self.find_cached_prefix(tokens, self.max_cached_blocks(tokens.len()), key).0.len()
    }

    /// The parent hash of a first block under prefix key `key`.
    fn root_hash(&self, key: u64) -> u64 {
        if key == 0 { ROOT_HASH } else { (self.hasher)(ROOT_HASH, &[key as u32, (key >> 32) as u32]) }
    }

    /// The most full blocks a sequence of `num_tokens` can take from the cache: at least its
    /// last token is always computed, so that the step yields its logits.
    pub fn max_cached_blocks(&self, num_tokens: usize) -> usize {
        num_tokens.saturating_sub(1) / self.block_size
    }

    /// The longest run of cached blocks matching `tokens` block by block, at most
    /// `max_cached_blocks`, with the chain state after the last one.
    fn find_cached_prefix(
        &self,
        tokens: &[u32],
        max_cached_blocks: usize,
        key: u64,
    ) -> (Vec<u32>, Option<(u64, BlockRef)>) {
        let mut hit_block_ids = Vec::new();
        let mut chain: Option<(u64, BlockRef)> = None;
        for block_tokens in tokens.chunks_exact(self.block_size).take(max_cached_blocks) {
            let parent_hash = chain.map_or_else(|| self.root_hash(key), |(h, _)| h);
            let hash = (self.hasher)(parent_hash, block_tokens);
            let Some(block_id) = self.find_entry(hash, chain.map(|(_, r)| r), block_tokens, key) else { break };
            hit_block_ids.push(block_id);
            chain = Some((hash, BlockRef { block_id, generation: self.blocks[block_id as usize].generation }));
        }
        (hit_block_ids, chain)
    }

    /// The registered block with this hash whose parent and tokens are exactly these. Comparing
    /// them is what makes a hash collision harmless.
    fn find_entry(&self, hash: u64, parent: Option<BlockRef>, tokens: &[u32], key: u64) -> Option<u32> {
        let candidates = self.hash_to_block_ids.get(&hash)?;
        candidates.iter().copied().find(|&block_id| {
            let entry = self.blocks[block_id as usize].entry.as_ref();
            entry.is_some_and(|e| e.key == key && e.parent == parent && *e.tokens == *tokens)
        })
    }

    /// Whether `r` still names a registered block in the same incarnation.
    fn is_live_entry(&self, r: BlockRef) -> bool {
        self.blocks.get(r.block_id as usize).is_some_and(|b| b.generation == r.generation && b.entry.is_some())
    }

    /// A block for a new owner (reference count 1): from the free list, else by evicting the
    /// least recently used cache-only block. `None` when neither has one.
    fn take_fresh_block(&mut self) -> Option<u32> {
        let block_id = match self.free_block_ids.pop() {
            Some(block_id) => block_id,
            None => {
                let (_, block_id) = self.evictable.pop_first()?;
                self.unregister(block_id);
                self.stats.evictions += 1;
                block_id
            }
        };
        let block = &mut self.blocks[block_id as usize];
        block.generation += 1;
        block.ref_count = 1;
        Some(block_id)
    }

    /// Drop `block_id`'s cache entry (its hash is no longer findable).
    fn unregister(&mut self, block_id: u32) {
        let Some(entry) = self.blocks[block_id as usize].entry.take() else { return };
        if let Some(slot) = entry.snapshot {
            self.free_snapshot_slots.push(slot);
        }
        if let Some(ids) = self.hash_to_block_ids.get_mut(&entry.hash) {
            ids.retain(|&b| b != block_id);
            if ids.is_empty() {
                self.hash_to_block_ids.remove(&entry.hash);
            }
        }
    }
}

#[cfg(test)]
impl KvCacheManager {
    /// The same manager with `hasher` as its block hash (to force collisions).
    fn with_hasher(mut self, hasher: fn(u64, &[u32]) -> u64) -> Self {
        self.hasher = hasher;
        self
    }

    /// Recount everything from scratch and compare with the incremental bookkeeping.
    pub(crate) fn check_invariants(&self) {
        let num_blocks = self.blocks.len();
        let mut ref_counts = vec![0u32; num_blocks];
        for (seq, s) in &self.seq_to_blocks {
            let mut seen = std::collections::HashSet::new();
            for &b in &s.block_ids {
                assert!(seen.insert(b), "seq {seq} holds block {b} twice");
                ref_counts[b as usize] += 1;
            }
            assert!(s.num_hashed_blocks <= s.block_ids.len());
        }
        let mut on_free_list = vec![false; num_blocks];
        for &b in &self.free_block_ids {
            assert!(!on_free_list[b as usize], "block {b} twice on the free list");
            on_free_list[b as usize] = true;
        }
        let mut num_used = 0;
        for (b, block) in self.blocks.iter().enumerate() {
            assert_eq!(block.ref_count, ref_counts[b], "block {b}'s reference count");
            let evictable = self.evictable.contains(&(block.last_used, b as u32));
            match (block.ref_count > 0, on_free_list[b], evictable) {
                (true, false, false) => num_used += 1,
                (false, true, false) => assert!(block.entry.is_none(), "free block {b} has a cache entry"),
                (false, false, true) => assert!(block.entry.is_some(), "evictable block {b} has no cache entry"),
                state => panic!("block {b} is in states (used, free, evictable) = {state:?}"),
            }
            if let Some(e) = &block.entry {
                assert!(self.enable_prefix_cache, "an entry with the cache off");
                assert_eq!(
                    self.hash_to_block_ids.get(&e.hash).map(|ids| ids.iter().filter(|&&x| x == b as u32).count()),
                    Some(1)
                );
                assert_eq!(e.tokens.len(), self.block_size);
            }
        }
        assert_eq!(self.evictable.len() + self.free_block_ids.len() + num_used, num_blocks);
        // Every snapshot slot is free, pending for one sequence, or in one entry.
        let mut snapshot_slots: Vec<u32> = self.free_snapshot_slots.clone();
        snapshot_slots.extend(self.seq_to_blocks.values().filter_map(|s| s.pending_snapshot.map(|(_, slot)| slot)));
        snapshot_slots.extend(self.blocks.iter().filter_map(|b| b.entry.as_ref().and_then(|e| e.snapshot)));
        let num_snapshot_slots = snapshot_slots.len();
        snapshot_slots.sort_unstable();
        snapshot_slots.dedup();
        assert_eq!(snapshot_slots.len(), num_snapshot_slots, "a snapshot slot held twice");
        let usage = self.usage();
        let expected = KvUsage {
            total_blocks: num_blocks,
            used_blocks: num_used,
            cached_blocks: self.evictable.len(),
            free_blocks: self.free_block_ids.len(),
        };
        assert_eq!(usage, expected);
        for (hash, ids) in &self.hash_to_block_ids {
            assert!(!ids.is_empty());
            for &b in ids {
                assert_eq!(self.blocks[b as usize].entry.as_ref().map(|e| e.hash), Some(*hash));
            }
            // No two findable copies of the same block.
            for (i, &a) in ids.iter().enumerate() {
                for &b in &ids[i + 1..] {
                    let (ea, eb) = (
                        self.blocks[a as usize].entry.as_ref().unwrap(),
                        self.blocks[b as usize].entry.as_ref().unwrap(),
                    );
                    assert!(
                        !(ea.parent == eb.parent && ea.tokens == eb.tokens),
                        "blocks {a} and {b} are the same cached block"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::sampling::SamplerRng as Rng;

    fn seq_tokens(start: u32, num_tokens: usize) -> Vec<u32> {
        (start..start + num_tokens as u32).collect()
    }

    #[test]
    fn allocation_is_all_or_nothing() {
        let mut kv = KvCacheManager::new(4, 4, true);
        assert_eq!(kv.allocate(1, &seq_tokens(0, 10)), Some(0));
        assert_eq!(kv.block_table(1), &[0, 1, 2]);
        // Two more blocks needed, one free: refused, nothing taken.
        assert_eq!(kv.allocate(2, &seq_tokens(100, 5)), None);
        assert_eq!(kv.usage(), KvUsage { total_blocks: 4, used_blocks: 3, cached_blocks: 0, free_blocks: 1 });
        assert!(kv.block_table(2).is_empty());
        assert!(!kv.grow(1, 17));
        assert_eq!(kv.block_table(1).len(), 3);
        assert!(kv.grow(1, 16));
        assert_eq!(kv.block_table(1), &[0, 1, 2, 3]);
        // Shrinking is a harmless no-op.
        assert!(kv.grow(1, 1));
        assert_eq!(kv.block_table(1).len(), 4);
        assert_eq!(kv.num_available_blocks(), 0);
        kv.check_invariants();
        // An already-live sequence is refused rather than silently re-allocated.
        assert_eq!(kv.allocate(1, &seq_tokens(0, 1)), None);
    }

    #[test]
    fn a_prefix_is_shared_only_under_its_own_key() {
        let mut kv = KvCacheManager::new(16, 4, true);
        let a = seq_tokens(0, 14);
        assert_eq!(kv.allocate_keyed(1, &a, 7), Some(0));
        kv.mark_computed(1, &a, a.len());
        assert_eq!(kv.num_cached_blocks(&a), 0, "the base model does not see adapter 7's blocks");
        assert_eq!(kv.allocate(2, &a), Some(0));
        kv.mark_computed(2, &a, a.len());
        assert_eq!(kv.allocate_keyed(3, &a, 8), Some(0), "nor does adapter 8");
        assert_eq!(kv.allocate_keyed(4, &a, 7), Some(12), "adapter 7 does");
        assert_eq!(kv.block_table(4)[..3], kv.block_table(1)[..3]);
        assert!(kv.block_table(2).iter().all(|b| !kv.block_table(1).contains(b)));
        assert_eq!(kv.num_cached_blocks_keyed(&a, 0), 3);
        kv.check_invariants();
    }

    #[test]
    fn free_returns_blocks_and_tables_are_append_only() {
        let mut kv = KvCacheManager::new(8, 4, false);
        kv.allocate(1, &seq_tokens(0, 3)).unwrap();
        let before = kv.block_table(1).to_vec();
        assert!(kv.grow(1, 9));
        assert_eq!(&kv.block_table(1)[..before.len()], before.as_slice());
        kv.free(1);
        assert_eq!(kv.usage(), KvUsage { total_blocks: 8, used_blocks: 0, cached_blocks: 0, free_blocks: 8 });
        kv.check_invariants();
    }

    #[test]
    fn shared_prefix_is_reused_with_reference_counts() {
        let mut kv = KvCacheManager::new(16, 4, true);
        let a = seq_tokens(0, 14); // 3 full blocks + 2 tokens
        assert_eq!(kv.allocate(1, &a), Some(0));
        kv.mark_computed(1, &a, a.len());
        let mut b = a[..12].to_vec();
        b.extend([99, 98, 97]);
        // b's first 3 blocks are a's.
        assert_eq!(kv.allocate(2, &b), Some(12));
        assert_eq!(kv.block_table(2)[..3], kv.block_table(1)[..3]);
        assert_ne!(kv.block_table(2)[3], kv.block_table(1)[3]);
        // Seq 1 looked up 3 blocks and found none; seq 2 found all 3.
        assert_eq!(
            kv.prefix_cache_stats(),
            PrefixCacheStats { hits: 3, misses: 3, queried_tokens: 14 + 15, ..Default::default() }
        );
        let shared = kv.block_table(1)[..3].to_vec();
        for &block_id in &shared {
            assert_eq!(kv.blocks[block_id as usize].ref_count, 2);
        }
        kv.check_invariants();
        // Freeing one holder keeps the shared blocks used; freeing both caches them.
        kv.free(1);
        assert_eq!(kv.usage(), KvUsage { total_blocks: 16, used_blocks: 4, cached_blocks: 0, free_blocks: 12 });
        kv.free(2);
        assert_eq!(kv.usage(), KvUsage { total_blocks: 16, used_blocks: 0, cached_blocks: 3, free_blocks: 13 });
        kv.check_invariants();
        // A third sequence with the same prefix hits blocks that are cache-only now.
        assert_eq!(kv.allocate(3, &a), Some(12));
        assert_eq!(kv.block_table(3)[..3], shared[..]);
        assert_eq!(kv.usage().cached_blocks, 0);
        kv.check_invariants();
    }

    #[test]
    fn at_least_one_token_is_left_to_compute() {
        let mut kv = KvCacheManager::new(16, 4, true);
        let a = seq_tokens(0, 8); // exactly 2 full blocks
        kv.allocate(1, &a).unwrap();
        kv.mark_computed(1, &a, 8);
        kv.free(1);
        // The same 8 tokens: only the first block may be reused, so the 8th token is computed.
        assert_eq!(kv.allocate(2, &a), Some(4));
        assert_eq!(kv.prefix_cache_stats().hits, 1);
        // 9 tokens: both blocks reused.
        let mut longer = a.clone();
        longer.push(50);
        assert_eq!(kv.allocate(3, &longer), Some(8));
        // A single token never hits.
        assert_eq!(kv.allocate(4, &a[..1]), Some(0));
        // Nor does nothing at all, which needs no block.
        assert_eq!(kv.allocate(5, &[]), Some(0));
        assert!(kv.block_table(5).is_empty());
        kv.check_invariants();
    }

    #[test]
    fn identical_blocks_at_different_prefixes_do_not_match() {
        let mut kv = KvCacheManager::new(16, 2, true);
        let a = vec![1, 2, 7, 7, 0];
        kv.allocate(1, &a).unwrap();
        kv.mark_computed(1, &a, 4);
        // The second block's tokens (7, 7) are equal but the first differs.
        assert_eq!(kv.allocate(2, &[3, 4, 7, 7, 0]), Some(0));
        assert_eq!(
            kv.prefix_cache_stats(),
            PrefixCacheStats { hits: 0, misses: 4, queried_tokens: 10, ..Default::default() }
        );
        kv.check_invariants();
    }

    #[test]
    fn eviction_is_least_recently_used_and_drops_the_hash() {
        // 4 blocks of 2 tokens.
        let mut kv = KvCacheManager::new(4, 2, true);
        let a = vec![1, 1, 1, 2, 9];
        let b = vec![5, 5, 9];
        kv.allocate(1, &a).unwrap(); // blocks 0, 1, 2
        kv.mark_computed(1, &a, 5); // caches [1,1] and [1,2]
        kv.free(1); // frees tail first: 2 (free list), 1 then 0 (evictable, 1 older)
        kv.allocate(2, &b).unwrap();
        kv.mark_computed(2, &b, 3);
        kv.free(2);
        // Cache holds a0 (block 0), a1 (block 1), b0; free list holds the rest.
        let usage = kv.usage();
        assert_eq!((usage.cached_blocks, usage.free_blocks), (3, 1));
        // Take 3 blocks: one from the free list, then evict the two least recently used: a's
        // tail block first, then a's first block (b's block was freed last).
        let c = vec![8, 8, 8, 8, 8, 8];
        kv.allocate(3, &c).unwrap();
        assert_eq!(kv.prefix_cache_stats().evictions, 2);
        kv.free(3);
        assert_eq!(kv.allocate(4, &a), Some(0), "a's blocks were evicted, so they no longer hit");
        kv.free(4);
        assert_eq!(kv.allocate(5, &b), Some(2), "b's block survived");
        kv.check_invariants();
    }

    #[test]
    fn a_sequences_tail_is_evicted_before_its_prefix() {
        let mut kv = KvCacheManager::new(3, 2, true);
        let a = vec![1, 1, 2, 2, 3];
        kv.allocate(1, &a).unwrap();
        kv.mark_computed(1, &a, 4);
        kv.free(1);
        // One free block and one eviction: a's second block goes, its first stays findable.
        kv.allocate(2, &[9, 9, 9, 9]).unwrap();
        assert_eq!(kv.prefix_cache_stats().evictions, 1);
        kv.free(2);
        assert_eq!(kv.allocate(3, &a), Some(2));
        kv.check_invariants();
    }

    #[test]
    fn a_hit_refreshes_recency() {
        let mut kv = KvCacheManager::new(3, 2, true);
        let a = vec![1, 1, 0];
        let b = vec![2, 2, 0];
        for (seq, tokens) in [(1, &a), (2, &b)] {
            kv.allocate(seq, tokens).unwrap();
            kv.mark_computed(seq, tokens, 2);
            kv.free(seq);
        }
        // a was freed before b, but a hit on a makes b the least recently used.
        kv.allocate(3, &a).unwrap();
        kv.free(3);
        // Two blocks: the free one, and the evicted least recently used (b's).
        kv.allocate(4, &[7, 7, 7, 7]).unwrap();
        assert_eq!(kv.prefix_cache_stats().evictions, 1);
        kv.free(4);
        assert_eq!(kv.allocate(5, &b), Some(0));
        kv.free(5);
        assert_eq!(kv.allocate(6, &a), Some(2));
        kv.check_invariants();
    }

    #[test]
    fn cached_blocks_in_use_are_never_evicted() {
        let mut kv = KvCacheManager::new(3, 2, true);
        let a = vec![1, 1, 2, 2, 3];
        kv.allocate(1, &a).unwrap();
        kv.mark_computed(1, &a, 4);
        // Pool is full; a live sequence's cached blocks may not be taken.
        assert_eq!(kv.allocate(2, &[4, 4, 4]), None);
        assert_eq!(kv.prefix_cache_stats().evictions, 0);
        kv.free(1);
        // 2 hit blocks (cache-only now) + 2 new: counting the hit blocks as room for the new
        // ones would evict them from under the sequence.
        let mut longer = a[..4].to_vec();
        longer.extend([5, 5, 6]);
        assert_eq!(kv.allocate(2, &longer), None);
        assert_eq!(kv.prefix_cache_stats().evictions, 0);
        assert_eq!(kv.allocate(2, &a), Some(4));
        kv.check_invariants();
    }

    #[test]
    fn disabled_cache_never_hits() {
        let mut kv = KvCacheManager::new(8, 2, false);
        let a = vec![1, 2, 3, 4, 5];
        kv.allocate(1, &a).unwrap();
        kv.mark_computed(1, &a, 5);
        kv.free(1);
        assert_eq!(kv.usage().free_blocks, 8);
        assert_eq!(kv.allocate(2, &a), Some(0));
        assert_eq!(kv.prefix_cache_stats(), PrefixCacheStats::default());
        kv.check_invariants();
    }

    #[test]
    fn a_duplicate_block_is_not_registered_twice() {
        let mut kv = KvCacheManager::new(8, 2, true);
        let a = vec![1, 2, 3, 4, 5];
        // Both admitted before either computed anything: no hits, separate blocks.
        kv.allocate(1, &a).unwrap();
        kv.allocate(2, &a).unwrap();
        kv.mark_computed(1, &a, 4);
        kv.mark_computed(2, &a, 4);
        kv.check_invariants();
        kv.free(2);
        kv.free(1);
        // seq 2's copies went back to the free list; seq 1's are the cached ones.
        assert_eq!(kv.usage().cached_blocks, 2);
        assert_eq!(kv.allocate(3, &a), Some(4));
        kv.check_invariants();
    }

    #[test]
    fn a_chain_continues_through_another_sequences_copy() {
        let mut kv = KvCacheManager::new(8, 2, true);
        let a = vec![1, 2, 3];
        let b = vec![1, 2, 5, 6, 7];
        kv.allocate(1, &a).unwrap();
        kv.allocate(2, &b).unwrap();
        kv.mark_computed(1, &a, 2); // caches [1,2] in seq 1's block
        kv.mark_computed(2, &b, 4); // [1,2] is a duplicate; [5,6] chains onto seq 1's block
        kv.free(1);
        kv.free(2);
        assert_eq!(kv.allocate(3, &b), Some(4));
        kv.check_invariants();
    }

    #[test]
    fn forced_hash_collisions_never_share_wrong_blocks() {
        // Every block hashes alike: only the token and parent comparison tells them apart.
        let mut kv = KvCacheManager::new(16, 2, true).with_hasher(|_, _| 42);
        let a = vec![1, 2, 3, 4, 0];
        let b = vec![1, 2, 9, 9, 0];
        let c = vec![7, 7, 3, 4, 0];
        for (seq, tokens) in [(1, &a), (2, &b), (3, &c)] {
            kv.allocate(seq, tokens).unwrap();
            kv.mark_computed(seq, tokens, 4);
        }
        assert_eq!(kv.hash_to_block_ids[&42].len(), 5, "a0, a1, b1, c0, c1 (b0 is a's)");
        kv.check_invariants();
        for seq in 1..=3 {
            kv.free(seq);
        }
        assert_eq!(kv.allocate(4, &b), Some(4));
        assert_eq!(kv.allocate(5, &c), Some(4));
        assert_eq!(kv.allocate(6, &[7, 7, 1, 2, 0]), Some(2), "[1,2] after [7,7] is not a's first block");
        assert_eq!(kv.block_table(5)[0], kv.block_table(6)[0]);
        assert_ne!(kv.block_table(4)[1], kv.block_table(6)[1]);
        kv.check_invariants();
    }

    #[test]
    fn unknown_ids_and_double_frees_are_harmless() {
        let mut kv = KvCacheManager::new(4, 2, true);
        kv.free(9);
        assert!(!kv.grow(9, 4));
        kv.mark_computed(9, &[1, 2, 3], 3);
        assert!(kv.block_table(9).is_empty());
        kv.allocate(1, &[1, 2, 3]).unwrap();
        kv.mark_computed(1, &[1, 2, 3], 100); // more than known: capped
        kv.mark_computed(1, &[1], 3); // fewer tokens than claimed: capped
        kv.free(1);
        kv.free(1);
        assert_eq!(kv.usage().used_blocks, 0);
        let empty = KvCacheManager::new(0, 0, true);
        assert_eq!(empty.block_size(), 1);
        let mut empty = empty;
        assert_eq!(empty.allocate(1, &[1]), None);
        kv.check_invariants();
        empty.check_invariants();
    }

    /// A few thousand random operations; after each, recount everything, and check that two
    /// sequences share a block only at the same index and with identical tokens up to its end.
    fn random_ops(seed: u64, hasher: Option<fn(u64, &[u32]) -> u64>) {
        let block_size = 3;
        let mut kv = KvCacheManager::new(24, block_size, true);
        if let Some(h) = hasher {
            kv = kv.with_hasher(h);
        }
        let mut rng = Rng::new(seed);
        // A few shared prefixes over a tiny vocabulary, so blocks repeat often.
        let prefixes: Vec<Vec<u32>> =
            (0..4).map(|_| (0..rng.below(12)).map(|_| rng.below(3) as u32).collect()).collect();
        // seq -> (tokens, num_computed)
        let mut live: HashMap<SeqId, (Vec<u32>, usize)> = HashMap::new();
        let mut next_seq: SeqId = 0;
        let mut num_hits_seen = 0;
        for _ in 0..4000 {
            match rng.below(10) {
                0..=2 => {
                    let mut tokens = prefixes[rng.below(prefixes.len())].clone();
                    tokens.extend((0..rng.below(8)).map(|_| rng.below(3) as u32));
                    let seq = next_seq;
                    next_seq += 1;
                    let before = kv.usage();
                    match kv.allocate(seq, &tokens) {
                        Some(num_cached) => {
                            assert_eq!(num_cached % block_size, 0);
                            assert!(num_cached < tokens.len().max(1));
                            num_hits_seen += num_cached;
                            live.insert(seq, (tokens, num_cached));
                        }
                        None => assert_eq!(kv.usage(), before, "a refused allocation changed nothing"),
                    }
                }
                3..=4 => {
                    // Decode: one more token, computed after growing.
                    let Some(&seq) = live.keys().nth(rng.below(live.len())) else { continue };
                    let (tokens, num_computed) = live.get_mut(&seq).unwrap();
                    if kv.grow(seq, tokens.len() + 1) {
                        tokens.push(rng.below(3) as u32);
                    }
                    *num_computed = (*num_computed + rng.below(4)).min(tokens.len());
                    kv.mark_computed(seq, tokens, *num_computed);
                }
                5..=6 => {
                    let Some(&seq) = live.keys().nth(rng.below(live.len())) else { continue };
                    let (tokens, num_computed) = live.get_mut(&seq).unwrap();
                    *num_computed = (*num_computed + rng.below(6)).min(tokens.len());
                    kv.mark_computed(seq, tokens, *num_computed);
                }
                7..=8 => {
                    let Some(&seq) = live.keys().nth(rng.below(live.len())) else { continue };
                    kv.free(seq);
                    live.remove(&seq);
                }
                _ => {
                    // Unknown ids and double frees.
                    kv.free(next_seq + 1000);
                    assert!(!kv.grow(next_seq + 1000, 5));
                    kv.free(rng.below(next_seq as usize + 1) as SeqId);
                    live.retain(|seq, _| kv.seq_to_blocks.contains_key(seq));
                }
            }
            kv.check_invariants();
            for (seq, (tokens, _)) in &live {
                assert_eq!(
                    kv.block_table(*seq).len(),
                    tokens.len().div_ceil(block_size),
                    "seq {seq}'s table covers its tokens"
                );
            }
            // block -> (index, the tokens up to the block's end) of its first holder.
            let mut block_to_prefix: HashMap<u32, (usize, &[u32])> = HashMap::new();
            for (seq, (tokens, _)) in &live {
                for (index, &b) in kv.block_table(*seq).iter().enumerate() {
                    let end = ((index + 1) * block_size).min(tokens.len());
                    if let Some(&(other_index, other_prefix)) = block_to_prefix.get(&b) {
                        assert_eq!(index, other_index, "block {b} shared at different positions");
                        assert_eq!(&tokens[..end], other_prefix, "block {b} shared by different prefixes");
                    } else {
                        block_to_prefix.insert(b, (index, &tokens[..end]));
                    }
                }
            }
        }
        assert!(num_hits_seen > 0, "the random workload exercised the prefix cache");
        assert!(kv.prefix_cache_stats().evictions > 0, "and eviction");
    }

    #[test]
    fn random_operations_keep_the_invariants() {
        for seed in 0..4 {
            random_ops(seed, None);
        }
    }

    #[test]
    fn random_operations_with_every_hash_colliding() {
        random_ops(7, Some(|_, tokens| tokens.len() as u64));
    }
}
