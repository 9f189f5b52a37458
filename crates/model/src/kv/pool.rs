//! The page pool KV blocks come from: one anonymous mapping reserved up front (`MAP_NORESERVE`,
//! so only pages a block has touched cost RSS), a warm free list reused first, and past a
//! high-water mark of warm blocks, freed blocks hand their whole pages back to the OS
//! (`MADV_DONTNEED`). Blocks are reference-counted so sequences can share a prefix.
//!
//! [`PagePool`] is the page ledger the KV blocks share with the LoRA adapter store
//! (`KvCache::share_pool`): once attached, a block taken from the free lists charges one page and
//! a block whose last owner lets go gives it back (one uncontended lock per block, never per
//! token or per read: block bytes are read and written through the mapping without it).

use crate::ModelError;

/// A block id; `NO_BLOCK` marks an empty block-table entry.
pub type BlockId = u32;
pub const NO_BLOCK: BlockId = u32::MAX;

/// Layout: `[capacity][block_bytes]` bytes in one private anonymous mapping.
pub struct BlockPool {
    /// Start of the mapping (null when `map_len` is 0 or the reservation failed).
    base: *mut u8,
    map_len: usize,
    block_bytes: usize,
    capacity: usize,
    /// Blocks `n_fresh..capacity` were never handed out (their pages were never touched).
    n_fresh: usize,
    /// Freed blocks whose pages are still committed (reused first, LIFO).
    warm: Vec<BlockId>,
    /// Freed blocks whose pages went back to the OS.
    cold: Vec<BlockId>,
    /// [capacity] owners of each block (0 = free).
    refs: Vec<u32>,
    /// Most warm blocks kept; beyond this, freed blocks are returned to the OS.
    warm_max: usize,
    page: usize,
    /// The shared ledger each held block is charged to (`None`: the KV cache alone).
    shared: Option<std::sync::Arc<PagePool>>,
}

// SAFETY: the pool owns its mapping exclusively; the bytes are only written through `&mut self`
// and read through `&self`, so the usual borrow rules make sharing across threads sound.
unsafe impl Send for BlockPool {}
unsafe impl Sync for BlockPool {}

impl BlockPool {
    /// Reserves address space for `capacity` blocks of `block_bytes` (no memory is committed).
    pub fn new(block_bytes: usize, capacity: usize, warm_max: usize) -> BlockPool {
        let map_len = block_bytes.saturating_mul(capacity);
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let mut base = std::ptr::null_mut();
        let mut capacity = capacity;
        if map_len > 0 {
            // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                // Every allocation will report the cache as full, with the sizes involved.
                capacity = 0;
            } else {
                base = p as *mut u8;
            }
        }
        BlockPool {
            base,
            map_len: if base.is_null() { 0 } else { map_len },
            block_bytes,
            capacity,
            n_fresh: 0,
            warm: Vec::new(),
            cold: Vec::new(),
            refs: vec![0; capacity],
            warm_max,
            page,
            shared: None,
        }
    }

    /// Charges every block held now and later to `shared` (pages of [`BlockPool::block_bytes`]).
    pub fn attach(&mut self, shared: std::sync::Arc<PagePool>) -> Result<(), PoolFull> {
        shared.alloc(Content::Kv, self.n_used())?;
        if let Some(old) = self.shared.replace(shared) {
            old.free(Content::Kv, self.n_used());
        }
        Ok(())
    }

    pub fn shared(&self) -> Option<&std::sync::Arc<PagePool>> {
        self.shared.as_ref()
    }

    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks owned by at least one sequence.
    pub fn n_used(&self) -> usize {
        self.n_fresh - self.warm.len() - self.cold.len()
    }

    /// Blocks whose pages may be resident (in use or warm).
    pub fn n_committed(&self) -> usize {
        self.n_fresh - self.cold.len()
    }

    pub fn refs(&self, id: BlockId) -> u32 {
        self.refs[id as usize]
    }

    /// Takes a free block (reference count 1). Its bytes are unspecified.
    pub fn alloc(&mut self) -> Result<BlockId, ModelError> {
        if let Some(shared) = &self.shared {
            shared.alloc(Content::Kv, 1).map_err(|e| ModelError::Unsupported(e.to_string()))?;
        }
        let id = if let Some(id) = self.warm.pop().or_else(|| self.cold.pop()) {
            id
        } else if self.n_fresh < self.capacity {
            self.n_fresh += 1;
            (self.n_fresh - 1) as BlockId
        } else {
            if let Some(shared) = &self.shared {
                shared.free(Content::Kv, 1);
            }
            return Err(ModelError::KvFull {
                blocks: self.capacity,
                block_bytes: self.block_bytes,
            });
        };
        self.refs[id as usize] = 1;
        Ok(id)
    }

    /// Adds an owner to `id` (a sequence sharing it).
    pub fn retain(&mut self, id: BlockId) {
        self.refs[id as usize] += 1;
    }

    /// Drops one owner of `id`; the last owner frees it.
    pub fn release(&mut self, id: BlockId) {
        let r = &mut self.refs[id as usize];
        debug_assert!(*r > 0, "block {id} released twice");
        *r = r.saturating_sub(1);
        if *r > 0 {
            return;
        }
        if let Some(shared) = &self.shared {
            shared.free(Content::Kv, 1);
        }
        if self.warm.len() < self.warm_max {
            self.warm.push(id);
            return;
        }
        // Return the whole pages inside this block to the OS.
        let start = id as usize * self.block_bytes;
        let lo = start.next_multiple_of(self.page);
        let hi = (start + self.block_bytes) / self.page * self.page;
        if hi > lo {
            // SAFETY: [lo, hi) lies inside the mapping and inside block `id`, which no sequence
            // owns any more; after MADV_DONTNEED a private anonymous page reads back as zeros.
            unsafe {
                libc::madvise(self.base.add(lo) as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED)
            };
        }
        self.cold.push(id);
    }

    pub fn block(&self, id: BlockId) -> &[u8] {
        let at = id as usize * self.block_bytes;
        &self.bytes()[at..at + self.block_bytes]
    }

    pub fn block_mut(&mut self, id: BlockId) -> &mut [u8] {
        let (at, n) = (id as usize * self.block_bytes, self.block_bytes);
        assert!(at + n <= self.map_len, "block {id} outside the pool");
        // SAFETY: the range is inside the mapping (asserted) and `&mut self` guarantees no other
        // reference into the mapping is alive.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(at), n) }
    }

    /// Copies block `from` into block `to` (copy-on-write of a shared block).
    pub fn copy(&mut self, from: BlockId, to: BlockId) {
        let n = self.block_bytes;
        let (a, b) = (from as usize * n, to as usize * n);
        assert!(a + n <= self.map_len && b + n <= self.map_len && from != to);
        // SAFETY: two distinct, non-overlapping block ranges inside the mapping; `&mut self`.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(a), self.base.add(b), n) };
    }

    /// The whole mapping: `[capacity][block_bytes]`.
    pub fn bytes(&self) -> &[u8] {
        if self.base.is_null() {
            return &[];
        }
        // SAFETY: the mapping is `map_len` readable bytes owned by `self`; writes need `&mut self`.
        unsafe { std::slice::from_raw_parts(self.base, self.map_len) }
    }
}

impl Drop for BlockPool {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.free(Content::Kv, self.n_used());
        }
        if !self.base.is_null() {
            // SAFETY: unmaps exactly the mapping created in `new`; no references outlive `self`.
            unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
        }
    }
}

/// What a page of the shared [`PagePool`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content {
    /// KV blocks of sequences and of the prefix cache.
    Kv = 0,
    /// LoRA adapter weights (`lora::store`).
    Adapter = 1,
}

/// Start evicting when the pool is this full (per mille)...
pub const EVICT_START_PERMILLE: usize = 900;
/// ...and stop once it is down to this.
pub const EVICT_STOP_PERMILLE: usize = 800;

/// One allocation in this many is timed for the latency histogram (reading the clock twice
/// would double the cost of an allocation).
pub const ALLOC_LATENCY_SAMPLE: u32 = 16;

/// Upper bounds (ns) of the allocation-latency histogram's buckets; the last bucket is open.
pub const ALLOC_LATENCY_BUCKETS_NS: [u64; 8] =
    [50, 100, 250, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];

/// Frees pool pages on request: the adapter store registers one so that the KV cache, short of
/// pages, can drop unpinned adapters. `free` may only drop memory (it runs on the allocating
/// thread, the scheduler's): it returns the pages given back.
pub trait Evictor: Send + Sync {
    fn free(&self, pages: usize) -> usize;
}

/// The page ledger KV blocks and adapter weights share (see `lora::store`'s module doc): one
/// capacity in pages of one size (the KV block's), pages charged by content while held and
/// given back when freed. Taking or returning pages locks one uncontended mutex (tens of ns);
/// it is done per KV block and per adapter load, never per token.
///
/// Pressure: past [`EVICT_START_PERMILLE`] of the capacity the pool asks for pages back until
/// [`EVICT_STOP_PERMILLE`] (hysteresis): [`PagePool::shed_wanted`] tells the KV cache how many
/// pages to shed from its prefix cache, and adapter stores demote unpinned adapters. Pages held
/// by running sequences are never asked for.
pub struct PagePool {
    page_bytes: usize,
    capacity: usize,
    /// Most pages adapters may hold (their share of the plan).
    adapter_limit: usize,
    ledger: std::sync::Mutex<Ledger>,
    evictions: [std::sync::atomic::AtomicU64; 2],
    latency: [std::sync::atomic::AtomicU64; ALLOC_LATENCY_BUCKETS_NS.len() + 1],
    /// Sum of the timed allocations' latencies, ns.
    latency_sum_ns: std::sync::atomic::AtomicU64,
    allocs: std::sync::atomic::AtomicU32,
    evictors: std::sync::Mutex<Vec<std::sync::Weak<dyn Evictor>>>,
}

#[derive(Default)]
struct Ledger {
    /// Pages held, by [`Content`].
    used: [usize; 2],
    /// Prefix-cache blocks no sequence holds (as last published by the KV cache).
    prefix_cached: usize,
    /// Between crossing the start mark and getting down to the stop mark.
    evicting: bool,
}

/// A snapshot of the pool, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub page_bytes: usize,
    pub capacity: usize,
    /// Pages held by KV blocks (prefix-cached ones included).
    pub kv: usize,
    /// Of `kv`, blocks held by the prefix cache alone.
    pub prefix_cached: usize,
    pub adapter: usize,
    /// Pages freed by eviction: `[kv (prefix cache), adapter]`.
    pub evictions: [u64; 2],
    /// Timed allocations (one in [`ALLOC_LATENCY_SAMPLE`]) per [`ALLOC_LATENCY_BUCKETS_NS`]
    /// bucket (the last: slower than all).
    pub alloc_latency: [u64; ALLOC_LATENCY_BUCKETS_NS.len() + 1],
    /// Sum of those allocations' latencies, ns (with the counts: a Prometheus histogram).
    pub alloc_latency_sum_ns: u64,
}

/// The pool had no room; the message says what holds it and what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pool full: {used} pages of {page_bytes} bytes in use by KV ({kv} pages, {prefix} of them prefix cache) and adapters ({adapter} pages), {wanted} more wanted for {what}; give it more memory or keep fewer adapters ready")]
pub struct PoolFull {
    pub used: usize,
    pub page_bytes: usize,
    pub kv: usize,
    pub prefix: usize,
    pub adapter: usize,
    pub wanted: usize,
    pub what: &'static str,
}

impl PagePool {
    /// A pool of `kv_pages + adapter_pages` pages of `page_bytes`, adapters holding at most
    /// `adapter_pages` of them (the planner's adapter share).
    pub fn new(
        page_bytes: usize,
        kv_pages: usize,
        adapter_pages: usize,
    ) -> std::sync::Arc<PagePool> {
        std::sync::Arc::new(PagePool {
            page_bytes: page_bytes.max(1),
            capacity: kv_pages.saturating_add(adapter_pages),
            adapter_limit: adapter_pages,
            ledger: std::sync::Mutex::new(Ledger::default()),
            evictions: Default::default(),
            latency: Default::default(),
            latency_sum_ns: Default::default(),
            allocs: Default::default(),
            evictors: std::sync::Mutex::new(Vec::new()),
        })
    }

    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Most pages adapters may hold.
    pub fn adapter_limit(&self) -> usize {
        self.adapter_limit
    }

    /// Pages needed for `bytes`.
    pub fn pages_for(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.page_bytes)
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        // A panic elsewhere while holding it leaves consistent counters: keep going.
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Charges `n` pages to `what`, or says what holds the pool.
    pub fn alloc(&self, what: Content, n: usize) -> Result<(), PoolFull> {
        let timed = self
            .allocs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .is_multiple_of(ALLOC_LATENCY_SAMPLE);
        let t = timed.then(std::time::Instant::now);
        let mut l = self.ledger();
        let used = l.used[0] + l.used[1];
        let limit = match what {
            Content::Kv => self.capacity,
            Content::Adapter => self.adapter_limit,
        };
        if used + n > self.capacity || l.used[what as usize] + n > limit {
            return Err(PoolFull {
                used,
                page_bytes: self.page_bytes,
                kv: l.used[0],
                prefix: l.prefix_cached,
                adapter: l.used[1],
                wanted: n,
                what: match what {
                    Content::Kv => "a KV block",
                    Content::Adapter => "an adapter",
                },
            });
        }
        l.used[what as usize] += n;
        if (used + n) * 1000 >= self.capacity * EVICT_START_PERMILLE {
            l.evicting = true;
        }
        drop(l);
        if let Some(t) = t {
            let ns = t.elapsed().as_nanos() as u64;
            let b = ALLOC_LATENCY_BUCKETS_NS.iter().position(|&hi| ns <= hi);
            self.latency[b.unwrap_or(ALLOC_LATENCY_BUCKETS_NS.len())]
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.latency_sum_ns.fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Gives back `n` pages held by `what`.
    pub fn free(&self, what: Content, n: usize) {
        let mut l = self.ledger();
        let u = &mut l.used[what as usize];
        debug_assert!(*u >= n, "{n} pages freed, {u} held");
        *u = u.saturating_sub(n);
        if (l.used[0] + l.used[1]) * 1000 <= self.capacity * EVICT_STOP_PERMILLE {
            l.evicting = false;
        }
    }

    /// Counts `n` pages of `what` freed by eviction.
    pub fn count_evicted(&self, what: Content, n: usize) {
        self.evictions[what as usize].fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Pages to give back now: while evicting (see the type's doc), down to the stop mark.
    pub fn shed_wanted(&self) -> usize {
        let l = self.ledger();
        if !l.evicting {
            return 0;
        }
        (l.used[0] + l.used[1]).saturating_sub(self.capacity * EVICT_STOP_PERMILLE / 1000)
    }

    /// Publishes how many KV blocks only the prefix cache holds (for stats and messages).
    pub fn set_prefix_cached(&self, n: usize) {
        self.ledger().prefix_cached = n;
    }

    /// Registers an evictor the KV side calls when it is short of pages.
    pub fn add_evictor(&self, e: std::sync::Weak<dyn Evictor>) {
        self.evictors.lock().unwrap_or_else(|e| e.into_inner()).push(e);
    }

    /// Asks the registered evictors for `pages`; returns the pages they freed.
    pub fn call_evictors(&self, pages: usize) -> usize {
        let evictors: Vec<_> = {
            let mut v = self.evictors.lock().unwrap_or_else(|e| e.into_inner());
            v.retain(|e| e.strong_count() > 0);
            v.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        let mut freed = 0;
        for e in evictors {
            if freed >= pages {
                break;
            }
            freed += e.free(pages - freed);
        }
        freed
    }

    pub fn stats(&self) -> PoolStats {
        use std::sync::atomic::Ordering::Relaxed;
        let l = self.ledger();
        PoolStats {
            page_bytes: self.page_bytes,
            capacity: self.capacity,
            kv: l.used[0],
            prefix_cached: l.prefix_cached,
            adapter: l.used[1],
            evictions: self.evictions.each_ref().map(|a| a.load(Relaxed)),
            alloc_latency: self.latency.each_ref().map(|a| a.load(Relaxed)),
            alloc_latency_sum_ns: self.latency_sum_ns.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_blocks_are_reused_and_shared_ones_live_until_the_last_owner() {
        let mut p = BlockPool::new(1000, 8, 2);
        let a = p.alloc().unwrap();
        p.block_mut(a).fill(7);
        p.retain(a);
        p.release(a);
        assert_eq!(p.n_used(), 1);
        assert_eq!(p.block(a)[999], 7);
        p.release(a);
        assert_eq!(p.n_used(), 0);
        assert_eq!(p.alloc().unwrap(), a);
    }

    #[test]
    fn a_full_pool_is_an_error_not_a_panic() {
        let mut p = BlockPool::new(64, 2, 0);
        p.alloc().unwrap();
        p.alloc().unwrap();
        let e = p.alloc().unwrap_err().to_string();
        assert!(e.contains("KV cache is full"), "{e}");
    }

    #[test]
    fn past_the_high_water_mark_pages_go_back_to_the_os() {
        let mut p = BlockPool::new(3 * 4096, 4, 0);
        let a = p.alloc().unwrap();
        p.block_mut(a).fill(1);
        p.release(a);
        assert_eq!(p.n_committed(), 0);
        let b = p.alloc().unwrap();
        assert_eq!(a, b);
        assert!(p.block(b).iter().all(|&x| x == 0), "released pages read back as zeros");
    }
}
