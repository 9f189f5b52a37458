//! Residency of the mapped weights: prefault (`populate`), pin (`mlock`), or stream layer by
//! layer with a [`Streamer`] that the forward pass calls around each layer.
//!
//! A streamer keeps layers `0..pinned` resident (left in the page cache; locked only under
//! `--load mlock`) and, for the others, asks the kernel to read the next layer ahead
//! (`MADV_WILLNEED`, asynchronous readahead) while the current one computes, then unmaps the
//! layer just used (`MADV_DONTNEED`) and drops its page-cache pages (`POSIX_FADV_DONTNEED`) so a
//! cgroup's charge for them is returned at once. Every residency mode runs through one, so the
//! pressure governor can move layers between the two sets at any time. Cost: two system calls
//! per streamed layer per token (none while every layer is pinned); resident weights = pinned
//! layers + about two layers.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

/// What a streamed layer's pages become after use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Left mapped: under a cgroup limit, pages cached before we started (a warm cache) are
    /// charged to whoever read them and cost our limit nothing; unmapping them would only add a
    /// page fault per page per token (2 GiB warm 7B: 3.31 tok/s unmapping, llama.cpp 3.54).
    KeepMapped = 0,
    /// Unmapped (`MADV_DONTNEED`), left in the page cache: lowers RSS, which is what `--ram` and
    /// MemAvailable budgets count; the kernel reclaims the unmapped cache as needed.
    Unmap = 1,
    /// Unmapped and dropped from the page cache (`POSIX_FADV_DONTNEED`): what a cold read charged
    /// to our cgroup needs when usage nears the limit. Dropping a warm cache instead turns every
    /// streamed layer into a disk read (3 GiB warm 7B: 0.60 tok/s instead of 3.96).
    UnmapAndUncache = 2,
}

/// Called by the forward pass around every layer of every micro-batch.
pub trait LayerObserver: Send + Sync {
    fn before_layer(&self, il: usize);
    fn after_layer(&self, il: usize);
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// `[start, end)` of `map` widened to whole pages (for readahead and locking).
fn outer(map: &[u8], start: usize, end: usize) -> Option<(*mut libc::c_void, usize)> {
    let ps = page_size();
    let base = map.as_ptr() as usize;
    let end = end.min(map.len());
    if start >= end {
        return None;
    }
    let a = (base + start) & !(ps - 1);
    let b = base + end;
    Some((a as *mut libc::c_void, b - a))
}

/// `[start, end)` of `map` narrowed to whole pages (for dropping: never a neighbour's page).
fn inner(map: &[u8], start: usize, end: usize) -> Option<(*mut libc::c_void, usize)> {
    let ps = page_size();
    let base = map.as_ptr() as usize;
    let a = (base + start + ps - 1) & !(ps - 1);
    let b = (base + end.min(map.len())) & !(ps - 1);
    (a < b).then_some((a as *mut libc::c_void, b - a))
}

/// Reads every page of `map` in now (`MADV_WILLNEED`, then one read per page), so decoding never
/// waits on a page fault to the disk.
pub fn populate(map: &[u8]) {
    if let Some((p, n)) = outer(map, 0, map.len()) {
        // SAFETY: [p, p+n) lies within the mapping `map` borrows (page-aligned down inside the
        // same mapping, which starts on a page boundary); WILLNEED only schedules readahead.
        unsafe { libc::madvise(p, n, libc::MADV_WILLNEED) };
    }
    let ps = page_size();
    let mut sum = 0u8;
    for i in (0..map.len()).step_by(ps) {
        sum = sum.wrapping_add(map[i]);
    }
    std::hint::black_box(sum);
}

/// `RLIMIT_MEMLOCK` soft limit in bytes (`None` = unlimited).
pub fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the rlimit we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    if rc != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(r.rlim_cur)
}

fn has_ipc_lock() -> bool {
    // Root (or CAP_IPC_LOCK) is not bound by RLIMIT_MEMLOCK; checking effective uid covers the
    // common case, and mlock's own error covers the rest.
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Locks `[start, end)` of `map` in memory, failing with the numbers if `RLIMIT_MEMLOCK` is too
/// small or the kernel refuses.
pub fn lock_range(map: &[u8], start: usize, end: usize) -> Result<(), String> {
    let Some((p, n)) = outer(map, start, end) else {
        return Ok(());
    };
    if !has_ipc_lock() {
        if let Some(lim) = memlock_limit() {
            if (n as u64) > lim {
                return Err(format!(
                    "--load mlock needs to lock {} but RLIMIT_MEMLOCK is {}; raise it (`ulimit -l unlimited`, or LimitMEMLOCK= in a systemd unit) or use --load populate",
                    crate::fmt_bytes(n as u64),
                    crate::fmt_bytes(lim)
                ));
            }
        }
    }
    // SAFETY: [p, p+n) lies within the live mapping `map` borrows.
    let rc = unsafe { libc::mlock(p, n) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("mlock of {} failed: {e}; check `ulimit -l` and the memory limit, or use --load populate", crate::fmt_bytes(n as u64)));
    }
    Ok(())
}

/// Locks the whole mapping (`--load mlock`).
pub fn lock_all(map: &[u8]) -> Result<(), String> {
    lock_range(map, 0, map.len())
}

fn unlock_range(map: &[u8], start: usize, end: usize) {
    if let Some((p, n)) = outer(map, start, end) {
        // SAFETY: [p, p+n) lies within the live mapping; munlock of unlocked pages is harmless.
        unsafe { libc::munlock(p, n) };
    }
}

/// Streams layers `pinned..n_layer` through memory; layers below `pinned` stay resident
/// (locked if `lock`). [`Streamer::set_pinned`] moves the boundary either way (the KV cache
/// growing or shrinking); [`Streamer::demote`] also caps it, which is how the pressure governor
/// hands memory back for good.
pub struct Streamer {
    /// Base address and length of the file mapping (owned by the model, which outlives us).
    base: usize,
    len: usize,
    /// `[n_layer]` byte ranges in the file.
    layers: Vec<(usize, usize)>,
    pinned: AtomicUsize,
    /// Most layers that may be pinned again (lowered by memory pressure, never raised).
    cap: AtomicUsize,
    /// Serialises changes of `pinned` (the governor thread and the generating thread).
    change: Mutex<()>,
    lock: bool,
    file: File,
    /// What happens to a streamed layer's pages after use ([`Release`] as u8), set by the
    /// pressure governor from the room left under the limit.
    release: AtomicU8,
    /// Streamed-layer drops done (for logs and tests).
    pub drops: AtomicU64,
}

impl Streamer {
    /// `map` must be the mapping the forward pass reads and must outlive the streamer; `path` is
    /// the same file (opened again for `posix_fadvise`).
    pub fn new(
        map: &[u8],
        path: &Path,
        layers: Vec<(usize, usize)>,
        pinned: usize,
        lock: bool,
    ) -> Result<Streamer, String> {
        let file = File::open(path)
            .map_err(|e| format!("opening {} for streaming: {e}", path.display()))?;
        let pinned = pinned.min(layers.len());
        let s = Streamer {
            base: map.as_ptr() as usize,
            len: map.len(),
            cap: AtomicUsize::new(layers.len()),
            layers,
            pinned: AtomicUsize::new(pinned),
            change: Mutex::new(()),
            lock,
            file,
            release: AtomicU8::new(Release::UnmapAndUncache as u8),
            drops: AtomicU64::new(0),
        };
        if lock {
            for &(a, b) in &s.layers[..pinned] {
                lock_range(map, a, b)?;
            }
        }
        // Nothing of ours is cached yet: whatever the page cache holds of the streamed layers was
        // read by someone else, so only the mapping is dropped.
        for il in pinned..s.layers.len() {
            s.drop_layer_with(il, Release::Unmap);
        }
        Ok(s)
    }

    fn map(&self) -> &[u8] {
        // SAFETY: `base..base+len` is the model's file mapping, which the caller of `new`
        // guarantees outlives this streamer; we only compute addresses from it and read nothing.
        unsafe { std::slice::from_raw_parts(self.base as *const u8, self.len) }
    }

    pub fn pinned(&self) -> usize {
        self.pinned.load(Ordering::Relaxed)
    }

    pub fn n_layer(&self) -> usize {
        self.layers.len()
    }

    /// Bytes of layer `il` in the file.
    pub fn layer_bytes(&self, il: usize) -> u64 {
        self.layers.get(il).map_or(0, |&(a, b)| (b - a) as u64)
    }

    /// Keeps layers `0..k` resident from the next layer computed on, `k` at most the cap set by
    /// [`Streamer::demote`]. Fewer: layers `k..` stream and their pages are dropped now. More:
    /// layers are kept again (locked first when locking; a refused lock stops there). Returns the
    /// pinned count before and after.
    pub fn set_pinned(&self, k: usize) -> (usize, usize) {
        let _g = self.change.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.pinned();
        let k = k.min(self.cap.load(Ordering::Relaxed)).min(self.layers.len());
        if k < old {
            self.pinned.store(k, Ordering::Relaxed);
            for il in k..old {
                let (a, b) = self.layers[il];
                if self.lock {
                    unlock_range(self.map(), a, b);
                }
                self.drop_layer(il);
            }
        } else if k > old {
            let mut n = old;
            while n < k {
                let (a, b) = self.layers[n];
                if self.lock && lock_range(self.map(), a, b).is_err() {
                    break;
                }
                n += 1;
            }
            self.pinned.store(n, Ordering::Relaxed);
        }
        (old, self.pinned())
    }

    /// Stops keeping layers `k..` resident, and never pins more than `k` again: they stream from
    /// the next layer computed on. Returns the pinned count before and after.
    pub fn demote(&self, k: usize) -> (usize, usize) {
        self.cap.fetch_min(k, Ordering::Relaxed);
        self.set_pinned(k)
    }

    fn prefetch(&self, il: usize) {
        let (a, b) = self.layers[il];
        if let Some((p, n)) = outer(self.map(), a, b) {
            // SAFETY: within the live mapping; WILLNEED starts asynchronous readahead only.
            unsafe { libc::madvise(p, n, libc::MADV_WILLNEED) };
        }
    }

    /// Sets what happens to streamed layers after use. Switching to
    /// [`Release::UnmapAndUncache`] also releases every streamed layer now, since what was read
    /// before stays charged to us (the layer computing refaults what it still needs).
    pub fn set_release(&self, r: Release) {
        let old = self.release.swap(r as u8, Ordering::Relaxed);
        if r == Release::UnmapAndUncache && old != r as u8 {
            let _g = self.change.lock().unwrap_or_else(|p| p.into_inner());
            for il in self.pinned()..self.layers.len() {
                self.drop_layer_with(il, r);
            }
        }
    }

    /// Drops the clean cached pages of `p..p + n` (inside the mapping) that nothing maps.
    fn fadvise_dontneed(&self, p: *mut libc::c_void, n: usize) {
        let off = p as usize - self.base;
        // SAFETY: fadvise on a file descriptor we own; it only drops clean cached pages.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                off as libc::off_t,
                n as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            )
        };
    }

    fn drop_layer(&self, il: usize) {
        let r = match self.release.load(Ordering::Relaxed) {
            0 => Release::KeepMapped,
            1 => Release::Unmap,
            _ => Release::UnmapAndUncache,
        };
        self.drop_layer_with(il, r);
    }

    fn drop_layer_with(&self, il: usize, r: Release) {
        let (a, b) = self.layers[il];
        if r == Release::KeepMapped {
            return;
        }
        if let Some((p, n)) = inner(self.map(), a, b) {
            // SAFETY: within the live mapping, whole pages owned by this layer only. The mapping
            // is a private read-only file mapping: DONTNEED unmaps pages, and the next read
            // faults them in again from the file, so no data is lost.
            unsafe { libc::madvise(p, n, libc::MADV_DONTNEED) };
            if r == Release::UnmapAndUncache {
                self.fadvise_dontneed(p, n);
            }
            self.drops.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl LayerObserver for Streamer {
    fn before_layer(&self, il: usize) {
        let pinned = self.pinned();
        let n = self.layers.len();
        if pinned >= n {
            return;
        }
        // Read the next streamed layer ahead (after the last one, the first streamed layer of
        // the next token).
        let next = if il + 1 < n { il + 1 } else { pinned };
        if next >= pinned {
            self.prefetch(next);
        }
        if il == 0 && pinned == 0 {
            self.prefetch(0);
        }
    }

    fn after_layer(&self, il: usize) {
        if il >= self.pinned() {
            self.drop_layer(il);
        }
    }
}
