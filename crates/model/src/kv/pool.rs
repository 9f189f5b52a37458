//! The page pool KV blocks come from: one anonymous mapping reserved up front (`MAP_NORESERVE`,
//! so only pages a block has touched cost RSS), a warm free list reused first, and past a
//! high-water mark of warm blocks, freed blocks hand their whole pages back to the OS
//! (`MADV_DONTNEED`). Blocks are reference-counted so sequences can share a prefix.

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
        }
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
        let id = if let Some(id) = self.warm.pop().or_else(|| self.cold.pop()) {
            id
        } else if self.n_fresh < self.capacity {
            self.n_fresh += 1;
            (self.n_fresh - 1) as BlockId
        } else {
            return Err(ModelError::Unsupported(format!(
                "the KV cache is full: all {} blocks of {} bytes are in use; use a larger --ctx, fewer sequences or a --window",
                self.capacity, self.block_bytes
            )));
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
        if !self.base.is_null() {
            // SAFETY: unmaps exactly the mapping created in `new`; no references outlive `self`.
            unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
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
