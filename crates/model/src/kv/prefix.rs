//! Prefix cache: the full KV blocks of running and finished sequences, kept under a key that
//! names every token up to their end, so a new sequence whose tokens start the same way takes
//! them instead of computing them again.
//!
//! Keys are a hash chain over [`BLOCK_TOKENS`]-token blocks (the cache's own block size, so one
//! cached block is one pool block per layer and nothing is split or copied): block `i`'s key is
//! `H(key of block i-1, tokens of block i)`, with the *salt* before block 0: 0 for the bare
//! model, the adapter set's salt (`lora::store::salt`) otherwise, since KV computed under one
//! adapter set is not what another computes. An entry also keeps its salt, its parent's key and
//! its tokens and a lookup compares all three, so a hash collision is a miss, never another
//! prompt's or another adapter's KV. An entry holds one pool block per layer and one reference on each (the
//! pool's refcounts): a block lives while the cache or any sequence holds it. Sequences share
//! only full blocks and write only past them; a write into a shared block (after a truncation)
//! copies it first (`own_block`).
//!
//! Eviction: when the pool has no free block, the least-recently-used entry whose blocks no
//! sequence holds is dropped (its blocks go back to the pool) and the allocation is retried.
//! Only leaves are dropped (an entry counts its cached children), so chains shrink from the
//! leaves and no cached block is left unreachable; a lookup touches its chain from the end back
//! to the root. [`PrefixCache::clear`] drops every
//! entry (memory pressure sheds the cache before anything else).
//!
//! Sliding windows: a windowed layer frees blocks a query can no longer see, so such a block
//! cannot be shared with a sequence that still needs it, and a block computed under a window
//! is not what a fresh sequence would compute. The cache is therefore off for a context with any
//! windowed layer (gemma's local layers, `--window`): those run cold, as before.
//!
//! Disk tier ([`super::disk`], when attached): every block the cache takes is offered to it
//! (written through, on its own thread), and an evicted block not on disk yet is offered again.
//!
//! Cost: per entry its 32 tokens (128 bytes), 4 bytes per layer and two map slots; a lookup or
//! a registration hashes each block's tokens once.

use std::collections::{BTreeMap, HashMap};

pub use super::chain::chain_key;
use super::chain::BLOCK_TOKENS;
use super::disk::{BlockKey, DiskTier};
use super::pool::{BlockId, BlockPool};

struct Entry {
    salt: u64,
    parent: u64,
    tokens: [u32; BLOCK_TOKENS],
    /// [n_layer] one pool block per layer, each with one reference held by the cache.
    blocks: Box<[BlockId]>,
    /// Last use, for LRU order.
    tick: u64,
    /// Cached entries whose parent this is: only a leaf (0) is evicted, so a chain never loses
    /// a block its cached children need.
    children: u32,
}

/// Cached full blocks by chain key (see the module doc).
#[derive(Default)]
pub struct PrefixCache {
    /// False when the context has a windowed layer: nothing is cached.
    pub(super) on: bool,
    entries: HashMap<u64, Entry>,
    /// tick → key, oldest first.
    lru: BTreeMap<u64, u64>,
    tick: u64,
    /// The disk tier, if attached (`KvCache::attach_disk`).
    pub(super) disk: Option<DiskTier>,
}

impl PrefixCache {
    pub fn new(on: bool) -> PrefixCache {
        PrefixCache { on, ..PrefixCache::default() }
    }

    /// Entries held (each is one block per layer).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The blocks (per entry, per layer) of the longest chain cached under `salt` that `tokens`
    /// starts with, at most `max_blocks` long; each entry on it becomes the most recently used.
    pub fn lookup(
        &mut self,
        salt: u64,
        tokens: &[u32],
        max_blocks: usize,
    ) -> (Vec<&[BlockId]>, u64) {
        let (keys, key) = self.walk(salt, tokens, max_blocks);
        for &k in keys.iter().rev() {
            self.touch(k);
        }
        (keys.iter().map(|k| &self.entries[k].blocks[..]).collect(), key)
    }

    /// The number of leading whole blocks of `tokens` (at most `max_blocks`) cached in RAM under
    /// `salt`, without touching them.
    pub fn peek(&self, salt: u64, tokens: &[u32], max_blocks: usize) -> usize {
        self.walk(salt, tokens, max_blocks).0.len()
    }

    /// The keys of the longest chain cached under `salt` that `tokens` starts with (at most
    /// `max_blocks`), and the last one (`salt` for none).
    fn walk(&self, salt: u64, tokens: &[u32], max_blocks: usize) -> (Vec<u64>, u64) {
        let mut keys = Vec::new();
        let mut key = salt;
        for block in tokens.chunks_exact(BLOCK_TOKENS).take(max_blocks) {
            let k = chain_key(key, block);
            match self.entries.get(&k) {
                Some(e) if e.salt == salt && e.parent == key && e.tokens[..] == *block => {
                    keys.push(k);
                    key = k;
                }
                _ => break,
            }
        }
        (keys, key)
    }

    fn touch(&mut self, key: u64) {
        self.tick += 1;
        if let Some(e) = self.entries.get_mut(&key) {
            self.lru.remove(&e.tick);
            e.tick = self.tick;
            self.lru.insert(self.tick, key);
        }
    }

    /// True if `key` is cached.
    pub fn contains(&self, key: u64) -> bool {
        self.entries.contains_key(&key)
    }

    /// Caches `blocks` (one per layer) as the block after `parent` (`salt` for the first block)
    /// holding `tokens` under `salt`, taking a reference on each. Does nothing if the key is
    /// cached already.
    pub fn insert(
        &mut self,
        pool: &mut BlockPool,
        salt: u64,
        parent: u64,
        tokens: &[u32],
        blocks: &[BlockId],
    ) {
        let key = chain_key(parent, tokens);
        if self.entries.contains_key(&key) {
            return;
        }
        let Ok(tokens) = <[u32; BLOCK_TOKENS]>::try_from(tokens) else {
            return;
        };
        for &id in blocks {
            pool.retain(id);
        }
        self.tick += 1;
        self.lru.insert(self.tick, key);
        if let Some(p) = self.entries.get_mut(&parent) {
            p.children += 1;
        }
        if let Some(d) = &mut self.disk {
            let _ = spill(d, pool, BlockKey { seed: salt, parent, tokens }, blocks);
        }
        let e = Entry { salt, parent, tokens, blocks: blocks.into(), tick: self.tick, children: 0 };
        self.entries.insert(key, e);
    }

    /// Drops the least-recently-used leaf entry no sequence shares, returning its blocks to the
    /// pool. False when there is none.
    pub fn evict_one(&mut self, pool: &mut BlockPool) -> bool {
        let Some((&tick, &key)) = self.lru.iter().find(|(_, k)| {
            let e = &self.entries[*k];
            e.children == 0 && e.blocks.iter().all(|&id| pool.refs(id) == 1)
        }) else {
            return false;
        };
        self.lru.remove(&tick);
        if let Some(e) = self.entries.remove(&key) {
            if let Some(d) = &mut self.disk {
                let k = BlockKey { seed: e.salt, parent: e.parent, tokens: e.tokens };
                let _ = spill(d, pool, k, &e.blocks);
            }
            for &id in e.blocks.iter() {
                pool.release(id);
            }
            if let Some(p) = self.entries.get_mut(&e.parent) {
                p.children = p.children.saturating_sub(1);
            }
        }
        true
    }

    /// Offers every entry not on disk yet to the disk tier, if there is one and its queue is
    /// empty (so what is on disk is known): blocks skipped while the queue was full get
    /// another chance. Never waits.
    pub fn spill_all(&mut self, pool: &BlockPool) {
        let Some(d) = &mut self.disk else { return };
        if !d.writing() || d.stats().queued.load(std::sync::atomic::Ordering::Acquire) > 0 {
            return;
        }
        for e in self.entries.values() {
            let key = BlockKey { seed: e.salt, parent: e.parent, tokens: e.tokens };
            if !spill(d, pool, key, &e.blocks) {
                break;
            }
        }
    }

    /// Drops every entry; returns how many blocks went back to the pool (those no sequence
    /// shares).
    pub fn clear(&mut self, pool: &mut BlockPool) -> usize {
        let mut freed = 0;
        for (_, e) in self.entries.drain() {
            for &id in e.blocks.iter() {
                freed += usize::from(pool.refs(id) == 1);
                pool.release(id);
            }
        }
        self.lru.clear();
        freed
    }

    /// Blocks held by the cache alone (no sequence shares them): what eviction can free.
    pub fn n_cached_only(&self, pool: &BlockPool) -> usize {
        self.entries
            .values()
            .flat_map(|e| e.blocks.iter())
            .filter(|&&id| pool.refs(id) == 1)
            .count()
    }
}

/// Offers the block `key` (its pool blocks, one per layer) to the disk tier; false if it was
/// skipped.
fn spill(d: &mut DiskTier, pool: &BlockPool, key: BlockKey, blocks: &[BlockId]) -> bool {
    let size = pool.block_bytes();
    d.offer(key, |buf| {
        for (dst, &id) in buf.chunks_exact_mut(size).zip(blocks) {
            dst.copy_from_slice(pool.block(id));
        }
    })
}

/// A free block, evicting least-recently-used cached blocks while the pool has none. In a
/// shared [`super::pool::PagePool`] past its start mark, it then gives pages back down to the
/// stop mark: cached blocks first, then unpinned adapters (the pool's evictors); blocks of
/// running sequences are never taken.
pub fn alloc(pool: &mut BlockPool, cache: &mut PrefixCache) -> Result<BlockId, crate::ModelError> {
    let id = loop {
        match pool.alloc() {
            Ok(id) => break id,
            Err(e) => {
                if !cache.evict_one(pool) {
                    return Err(e);
                }
            }
        }
    };
    if let Some(shared) = pool.shared().cloned() {
        relieve(pool, cache, &shared);
    }
    Ok(id)
}

/// Gives back the pages `shared` wants (its hysteresis): cached blocks, then adapters.
fn relieve(pool: &mut BlockPool, cache: &mut PrefixCache, shared: &super::pool::PagePool) {
    let mut want = shared.shed_wanted();
    if want == 0 {
        return;
    }
    let before = pool.n_used();
    while want > 0 && cache.evict_one(pool) {
        want = shared.shed_wanted();
    }
    let freed = before - pool.n_used();
    shared.count_evicted(super::pool::Content::Kv, freed);
    shared.set_prefix_cached(cache.n_cached_only(pool));
    if want > 0 {
        shared.call_evictors(want);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(seed: u32) -> Vec<u32> {
        (0..BLOCK_TOKENS as u32).map(|i| seed * 1000 + i).collect()
    }

    #[test]
    fn a_chain_is_found_to_its_longest_match_and_leaves_are_evicted_first() {
        let mut pool = BlockPool::new(64, 4, 0);
        let mut c = PrefixCache::new(true);
        let (a, b) = (pool.alloc().unwrap(), pool.alloc().unwrap());
        let (t0, t1) = (toks(1), toks(2));
        c.insert(&mut pool, 0, 0, &t0, &[a]);
        c.insert(&mut pool, 0, chain_key(0, &t0), &t1, &[b]);
        // The sequence that computed them lets go: the cache alone holds them.
        pool.release(a);
        pool.release(b);
        assert_eq!(c.n_cached_only(&pool), 2);
        let prompt: Vec<u32> = t0.iter().chain(&t1).chain(&[7]).copied().collect();
        let (found, _) = c.lookup(0, &prompt, 2);
        assert_eq!(found, vec![&[a][..], &[b][..]]);
        let (found, _) = c.lookup(0, &prompt, 1);
        assert_eq!(found.len(), 1);
        // Another first block: no match at all, even where the second block's tokens agree.
        let other: Vec<u32> = toks(3).iter().chain(&t1).copied().collect();
        assert!(c.lookup(0, &other, 2).0.is_empty());
        assert!(c.evict_one(&mut pool));
        let (found, _) = c.lookup(0, &prompt, 2);
        assert_eq!(found, vec![&[a][..]], "the leaf went first");
        // Fill the pool: allocation evicts the rest.
        let ids: Vec<_> = (0..4).map(|_| alloc(&mut pool, &mut c).unwrap()).collect();
        assert_eq!(ids.len(), 4);
        assert!(c.is_empty());
        assert!(alloc(&mut pool, &mut c).is_err(), "nothing left to evict");
    }

    #[test]
    fn shared_blocks_are_not_evicted_and_clear_frees_only_unshared_ones() {
        let mut pool = BlockPool::new(64, 2, 0);
        let mut c = PrefixCache::new(true);
        let (a, b) = (pool.alloc().unwrap(), pool.alloc().unwrap());
        c.insert(&mut pool, 0, 0, &toks(1), &[a]);
        c.insert(&mut pool, 0, 0, &toks(2), &[b]);
        pool.release(b);
        // `a` is still held by its sequence: only `b` can go.
        assert!(c.evict_one(&mut pool));
        assert!(!c.evict_one(&mut pool));
        assert_eq!(c.len(), 1);
        assert_eq!(c.clear(&mut pool), 0, "a's sequence still holds it");
        assert_eq!(pool.refs(a), 1);
    }

    #[test]
    fn a_chain_cached_under_one_salt_misses_under_another() {
        let mut pool = BlockPool::new(64, 2, 0);
        let mut c = PrefixCache::new(true);
        let a = pool.alloc().unwrap();
        let t = toks(1);
        c.insert(&mut pool, 5, 5, &t, &[a]);
        let prompt: Vec<u32> = t.iter().chain(&[7]).copied().collect();
        assert!(c.lookup(0, &prompt, 1).0.is_empty());
        assert!(c.lookup(6, &prompt, 1).0.is_empty());
        assert_eq!(c.lookup(5, &prompt, 1).0, vec![&[a][..]]);
    }
}
