//! A sequence's prefix restored from the prefix cache's disk tier without blocking the thread
//! that owns the cache: [`KvCache::prefix_adopt_start`] takes the RAM cache's longest match and,
//! when the next block may be on disk, asks the tier's reader thread for the rest of the chain;
//! [`KvCache::prefix_restore_poll`] (between steps) copies each block that has arrived into
//! fresh pool blocks, on the sequence's tables and into the RAM cache, and ends the restore at
//! its last block, at the first one missing or damaged, when no pool block is free or past the
//! deadline. Until then [`KvCache::prefix_restoring`] is true and the sequence must not be
//! stepped; other sequences step as usual. [`KvCache::prefix_adopt`] does the same and waits.
//!
//! Cost: per restore in flight its chain's keys (136 bytes a block); per block one copy of its
//! bytes on the owner's thread. Blocks come in chain order, so what has arrived is always a
//! whole prefix.

use std::time::{Duration, Instant};

use super::chain::BLOCK_TOKENS;
use super::disk::{BlockKey, Pending};
use super::{prefix, KvCache, SeqId, SeqKv};

impl KvCache {
    /// The positions [`KvCache::prefix_adopt_start`] would start a sequence of `tokens` on
    /// from the RAM cache under `salt`, without adopting or touching anything.
    pub fn prefix_peek(&self, tokens: &[u32], salt: u64) -> usize {
        if !self.prefix.on {
            return 0;
        }
        let max_blocks = tokens.len().saturating_sub(1) / BLOCK_TOKENS;
        self.prefix.peek(self.prefix_salt(salt), tokens, max_blocks) * BLOCK_TOKENS
    }

    /// Starts `seq` (emptied first) on the longest prefix of `tokens` cached in RAM under
    /// `salt` (the adapter set's, `lora::store::salt`; 0 for the bare model), leaving at least
    /// the last token to compute (its logits are needed), and asks the disk tier for the
    /// blocks past it when the next one may be there. Returns the positions held now, a
    /// multiple of [`BLOCK_TOKENS`]; while [`KvCache::prefix_restoring`] says so, more arrive
    /// through [`KvCache::prefix_restore_poll`] and [`KvCache::seq_len`] gives the total.
    pub fn prefix_adopt_start(&mut self, seq: SeqId, tokens: &[u32], salt: u64) -> usize {
        if seq >= self.seqs.len() {
            return 0;
        }
        self.seq_clear(seq);
        if !self.prefix.on {
            return 0;
        }
        let max_blocks = tokens.len().saturating_sub(1) / BLOCK_TOKENS;
        let staged_layer = if self.k_type.k_per_channel() {
            BLOCK_TOKENS * self.n_head_kv * self.head_dim
        } else {
            0
        };
        let mut s = SeqKv::new(self.n_layer, staged_layer);
        let salt = self.prefix_salt(salt);
        let (found, chain) = self.prefix.lookup(salt, tokens, max_blocks);
        for blocks in &found {
            for (table, &id) in s.tables.iter_mut().zip(blocks.iter()) {
                self.pool.retain(id);
                table.push(id);
            }
        }
        let n = found.len();
        s.registered = n;
        s.len = n * BLOCK_TOKENS;
        s.chain = chain;
        s.salt = salt;
        let pending = self.disk_request(tokens, salt, n, chain, max_blocks);
        if n == 0 && pending.is_none() {
            return 0;
        }
        self.seqs[seq] = Some(s);
        self.restores[seq] = pending;
        n * BLOCK_TOKENS
    }

    /// The restore of blocks `n..max_blocks` of `tokens` past the chain key `chain` (under
    /// `seed`), if there is a disk tier, the next block may be on it and the reader takes the
    /// request; a miss is counted otherwise.
    fn disk_request(
        &mut self,
        tokens: &[u32],
        seed: u64,
        n: usize,
        chain: u64,
        max_blocks: usize,
    ) -> Option<Pending> {
        let disk = self.prefix.disk.as_mut().filter(|_| n < max_blocks)?;
        let mut keys = Vec::with_capacity(max_blocks - n);
        let mut parent = chain;
        for block in tokens[n * BLOCK_TOKENS..].chunks_exact(BLOCK_TOKENS).take(max_blocks - n) {
            let tokens = <[u32; BLOCK_TOKENS]>::try_from(block).ok()?;
            let key = BlockKey { seed, parent, tokens };
            parent = key.key();
            keys.push(key);
        }
        let ticket = keys.first().filter(|k| disk.may_hold(k.key())).and_then(|_| {
            let deadline = Instant::now() + disk.read_deadline();
            disk.request(keys.clone()).map(|t| (t, deadline))
        });
        let Some((ticket, deadline)) = ticket else {
            disk.stats().misses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return None;
        };
        Some(Pending { ticket, keys, got: 0, deadline })
    }

    /// True while `seq`'s prefix is being read from disk: it must not be stepped.
    pub fn prefix_restoring(&self, seq: SeqId) -> bool {
        self.restores.get(seq).is_some_and(Option::is_some)
    }

    /// True while any sequence's prefix is being read from disk.
    pub fn prefix_restores(&self) -> bool {
        self.restores.iter().any(Option::is_some)
    }

    /// Takes in the blocks read from disk so far for every restore in flight (waiting up to
    /// `wait` for the first when there is none yet) and ends the restores that are complete,
    /// cut short or past their deadline.
    pub fn prefix_restore_poll(&mut self, wait: Duration) {
        if !self.prefix_restores() {
            return;
        }
        let mut wait = wait;
        while let Some(a) = self.prefix.disk.as_mut().and_then(|d| d.arrival(wait)) {
            wait = Duration::ZERO;
            let seq =
                self.restores.iter().position(|p| p.as_ref().is_some_and(|p| p.ticket.id == a.id));
            match (seq, a.data) {
                (Some(seq), Some(data)) => {
                    let whole = self.restore_block(seq, &data);
                    if let Some(d) = self.prefix.disk.as_mut() {
                        d.recycle(data);
                    }
                    if !whole {
                        self.restore_end(seq);
                    }
                }
                (Some(seq), None) => self.restore_end(seq),
                // A restore ended already (its sequence cleared, or past its deadline).
                (None, Some(data)) => {
                    if let Some(d) = self.prefix.disk.as_mut() {
                        d.recycle(data);
                    }
                }
                (None, None) => {}
            }
        }
        let now = Instant::now();
        for seq in 0..self.restores.len() {
            if self.restores[seq].as_ref().is_some_and(|p| now >= p.deadline) {
                self.restore_end(seq);
            }
        }
    }

    /// Puts the next block of `seq`'s restore (`data`: `[n_layer][block_bytes]`) in fresh pool
    /// blocks on its tables and in the RAM cache. False when the restore must end: its last
    /// block is in, or the pool has no room.
    fn restore_block(&mut self, seq: SeqId, data: &[u8]) -> bool {
        let Some(p) = self.restores[seq].as_mut() else { return false };
        let Some(&key) = p.keys.get(p.got) else { return false };
        let size = self.pool.block_bytes();
        let mut ids = Vec::with_capacity(self.n_layer);
        for _ in 0..self.n_layer {
            match prefix::alloc(&mut self.pool, &mut self.prefix) {
                Ok(id) => ids.push(id),
                Err(_) => break,
            }
        }
        if ids.len() < self.n_layer || data.len() != size * self.n_layer {
            for &id in &ids {
                self.pool.release(id);
            }
            return false;
        }
        for (src, &id) in data.chunks_exact(size).zip(&ids) {
            self.pool.block_mut(id).copy_from_slice(src);
        }
        let Some(Some(s)) = self.seqs.get_mut(seq) else {
            for &id in &ids {
                self.pool.release(id);
            }
            return false;
        };
        for (table, &id) in s.tables.iter_mut().zip(&ids) {
            table.push(id);
        }
        self.prefix.insert(&mut self.pool, key.seed, key.parent, &key.tokens, &ids);
        s.registered += 1;
        s.len += BLOCK_TOKENS;
        s.chain = key.key();
        p.got += 1;
        p.got < p.keys.len()
    }

    /// Ends `seq`'s restore (cancelling the reads left): it runs from what arrived, or, with
    /// nothing held, starts empty.
    fn restore_end(&mut self, seq: SeqId) {
        let Some(p) = self.restores[seq].take() else { return };
        if p.got == 0 {
            if let Some(d) = &self.prefix.disk {
                d.stats().misses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if self.seqs[seq].as_ref().is_some_and(|s| s.len == 0) {
            self.seqs[seq] = None;
        }
    }

    /// [`KvCache::prefix_adopt_start`], then waits for the restore (if any) to end: the
    /// positions held. For a caller with one sequence (`run`, `chat`, tests); a scheduler polls.
    pub fn prefix_adopt(&mut self, seq: SeqId, tokens: &[u32], salt: u64) -> usize {
        self.prefix_adopt_start(seq, tokens, salt);
        while self.prefix_restoring(seq) {
            self.prefix_restore_poll(Duration::from_millis(10));
        }
        self.seq_len(seq)
    }
}
