//! Residency of the mapped weights: prefault (`populate`), pin (`mlock`), or stream layer by
//! layer with a [`Streamer`] that the forward pass calls around each layer.
//!
//! A streamer keeps layers `0..pinned` resident (left in the page cache; locked only under
//! `--load mlock`) and, for the others, has [`READERS`] threads fault the next layer in (each a
//! contiguous part, one read per page) while the current one computes, then unmaps the layer
//! just used (`MADV_DONTNEED`) and, near a cgroup limit, drops its page-cache pages
//! (`POSIX_FADV_DONTNEED`) so the charge is returned at once. Every residency mode runs through
//! one, so the pressure governor can move layers between the two sets at any time. Cost: one or
//! two system calls per streamed layer per token on the computing thread (none while every layer
//! is pinned); resident weights = pinned layers + two layers.
//!
//! Why reader threads and not `MADV_WILLNEED`: the kernel reads at most one readahead window
//! (`read_ahead_kb`, 8 MiB here) per `WILLNEED` call and ignores the rest of the range, so one
//! call on a 140 MB layer read 8 MB and the computing threads' own faults read the rest, two
//! synchronous streams. Tried on the 7B shape in 2 GiB, cold (session 4): a thread issuing
//! `WILLNEED` a MiB at a time over the whole next layer, 0.26–0.29 tok/s against 0.40 for the
//! faults alone (same bytes read); 2 reader threads faulting their parts 0.50–0.54, 4 readers
//! 0.54–0.57. This virtual disk serves several parallel synchronous streams best (`dd`: one
//! stream 0.5–0.6 GB/s, two 1.2–1.4, eight 1.4–1.5).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

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

/// Reads every page of `map` in now, [`READERS`] threads each faulting a contiguous part (see
/// the module notes for why not `MADV_WILLNEED`), so decoding never waits on the disk.
pub fn populate(map: &[u8]) {
    let part = map.len().div_ceil(READERS).max(1);
    std::thread::scope(|sc| {
        for lo in (0..map.len()).step_by(part) {
            let hi = (lo + part).min(map.len());
            let read = move || touch_pages(map, lo, hi, || false);
            // No thread to be had: read this part here instead.
            if std::thread::Builder::new().spawn_scoped(sc, read).is_err() {
                read();
            }
        }
    });
}

/// Reads one byte of every page of `map[lo..hi]` (a page fault each where not resident), asking
/// `stop()` every MiB whether to go on.
fn touch_pages(map: &[u8], lo: usize, hi: usize, stop: impl Fn() -> bool) {
    let ps = page_size();
    let mut sum = 0u8;
    for off in (lo..hi.min(map.len())).step_by(ps) {
        if (off - lo) % (1 << 20) < ps && stop() {
            break;
        }
        // A volatile read so the fault cannot be optimised away.
        // SAFETY: `off` < `map.len()`.
        sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(map.as_ptr().add(off)) });
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
    /// The file mapping (owned by the model, which outlives us).
    span: Span,
    /// `[n_layer]` byte ranges in the file.
    layers: Arc<[(usize, usize)]>,
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
    readers: Readers,
}

/// Threads reading the next streamed layer in (see the module notes).
pub const READERS: usize = 4;

/// The reader threads, started at the first streamed layer.
struct Readers {
    shared: Arc<ReadShared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// What the readers are asked to read, and where the compute is.
struct ReadShared {
    /// The layer to read, a request number (bumped per new layer), and shutdown.
    job: Mutex<(usize, u64, bool)>,
    wake: Condvar,
    /// The layer the forward pass is computing (`NONE` before the first).
    current: AtomicUsize,
    /// Layers `0..pinned` stay resident ([`Streamer::pinned`] reads it here).
    pinned: AtomicUsize,
    n_layer: usize,
}

const NONE: usize = usize::MAX;

impl ReadShared {
    fn new(n_layer: usize, pinned: usize) -> ReadShared {
        ReadShared {
            job: Mutex::new((NONE, 0, false)),
            wake: Condvar::new(),
            current: AtomicUsize::new(NONE),
            pinned: AtomicUsize::new(pinned),
            n_layer,
        }
    }

    /// The layer computed after `il` that streams (after the last layer, the first streamed).
    fn next_after(&self, il: usize) -> usize {
        if il + 1 < self.n_layer {
            il + 1
        } else {
            self.pinned.load(Ordering::Relaxed)
        }
    }

    /// Whether reading layer `x` still helps: it streams and is the layer computing or the next.
    /// Anything further ahead would overrun the two streamed layers the plan budgets for, and a
    /// layer already computed has been dropped (reading it again would be wasted).
    fn wanted(&self, x: usize) -> bool {
        let pinned = self.pinned.load(Ordering::Relaxed);
        x >= pinned
            && match self.current.load(Ordering::Relaxed) {
                NONE => x == pinned,
                c => x == c || x == self.next_after(c),
            }
    }

    /// Reader `i` of [`READERS`]: waits for a layer, faults its `i`-th part in page by page
    /// (checking every MiB that the layer is still wanted), and waits again.
    fn run(&self, i: usize, span: Span, layers: &[(usize, usize)]) {
        let mut seen = 0u64;
        loop {
            let il = {
                let mut j = self.job.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if j.2 {
                        return;
                    }
                    if j.1 != seen {
                        seen = j.1;
                        break j.0;
                    }
                    j = self.wake.wait(j).unwrap_or_else(|p| p.into_inner());
                }
            };
            let (a, b) = layers[il];
            let part = (b - a).div_ceil(READERS);
            let lo = a + i * part;
            touch_pages(span.map(), lo, (lo + part).min(b), || !self.wanted(il));
        }
    }
}

impl Readers {
    /// Asks the readers for layer `il` (starting them the first time). If the threads cannot be
    /// started the computing threads fault the layer in themselves, only slower.
    fn request(&self, il: usize, span: Span, layers: &Arc<[(usize, usize)]>) {
        {
            let mut t = self.threads.lock().unwrap_or_else(|p| p.into_inner());
            if t.is_empty() {
                for i in 0..READERS {
                    let (shared, layers) = (self.shared.clone(), layers.clone());
                    match std::thread::Builder::new()
                        .name(format!("snug-reader-{i}"))
                        .spawn(move || shared.run(i, span, &layers))
                    {
                        Ok(h) => t.push(h),
                        Err(_) => break,
                    }
                }
            }
        }
        let mut j = self.shared.job.lock().unwrap_or_else(|p| p.into_inner());
        j.0 = il;
        j.1 += 1;
        self.shared.wake.notify_all();
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        self.shared.job.lock().unwrap_or_else(|p| p.into_inner()).2 = true;
        self.shared.wake.notify_all();
        for t in self.threads.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = t.join();
        }
    }
}

/// Address and length of the model's file mapping, which outlives the streamer and its readers.
#[derive(Clone, Copy)]
struct Span {
    base: usize,
    len: usize,
}

impl Span {
    fn map(&self) -> &[u8] {
        // SAFETY: `base..base+len` is the model's file mapping, which the caller of
        // `Streamer::new` guarantees outlives the streamer (whose drop joins the reader threads).
        unsafe { std::slice::from_raw_parts(self.base as *const u8, self.len) }
    }
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
        let readers = Readers {
            shared: Arc::new(ReadShared::new(layers.len(), pinned)),
            threads: Mutex::new(Vec::new()),
        };
        let s = Streamer {
            span: Span {
                base: map.as_ptr() as usize,
                len: map.len(),
            },
            readers,
            cap: AtomicUsize::new(layers.len()),
            layers: layers.into(),
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
        if pinned < s.layers.len() {
            s.readers.request(pinned, s.span, &s.layers);
        }
        Ok(s)
    }

    fn map(&self) -> &[u8] {
        self.span.map()
    }

    pub fn pinned(&self) -> usize {
        self.readers.shared.pinned.load(Ordering::Relaxed)
    }

    fn store_pinned(&self, k: usize) {
        self.readers.shared.pinned.store(k, Ordering::Relaxed);
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
            self.store_pinned(k);
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
            self.store_pinned(n);
        }
        (old, self.pinned())
    }

    /// Stops keeping layers `k..` resident, and never pins more than `k` again: they stream from
    /// the next layer computed on. Returns the pinned count before and after.
    pub fn demote(&self, k: usize) -> (usize, usize) {
        self.cap.fetch_min(k, Ordering::Relaxed);
        self.set_pinned(k)
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
        let off = p as usize - self.span.base;
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
        let shared = &self.readers.shared;
        shared.current.store(il, Ordering::Relaxed);
        if self.pinned() >= self.layers.len() {
            return;
        }
        // Read the next streamed layer ahead (after the last one, the first streamed layer of
        // the next token).
        let next = shared.next_after(il);
        if next >= self.pinned() {
            self.readers.request(next, self.span, &self.layers);
        }
    }

    fn after_layer(&self, il: usize) {
        if il >= self.pinned() {
            self.drop_layer(il);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_want_only_the_computing_and_the_next_streamed_layer() {
        let s = ReadShared::new(6, 2);
        // Before the first layer computes: the first streamed layer only.
        assert!(s.wanted(2) && !s.wanted(3) && !s.wanted(0));
        s.current.store(3, Ordering::Relaxed);
        assert!(s.wanted(3) && s.wanted(4));
        assert!(!s.wanted(2) && !s.wanted(5) && !s.wanted(1));
        // The last layer wraps to the first streamed layer of the next token.
        s.current.store(5, Ordering::Relaxed);
        assert_eq!(s.next_after(5), 2);
        assert!(s.wanted(5) && s.wanted(2) && !s.wanted(3));
        // Pinned layers are never read, even as the "next" layer.
        s.current.store(0, Ordering::Relaxed);
        assert!(!s.wanted(0) && !s.wanted(1));
        s.pinned.store(6, Ordering::Relaxed);
        assert!((0..6).all(|x| !s.wanted(x)));
    }

    #[test]
    fn readers_start_with_the_first_streamed_layer_and_stop_on_drop() {
        let path = std::env::temp_dir().join(format!("snug-readers-{}.bin", std::process::id()));
        let layer = 256 * 1024;
        std::fs::write(&path, vec![7u8; 6 * layer]).unwrap();
        let file = File::open(&path).unwrap();
        // SAFETY: a fresh read-only shared mapping of a file we just wrote, unmapped below after
        // the streamer (and its reader threads) are gone.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                6 * layer,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the mapping above, live until munmap.
        let map = unsafe { std::slice::from_raw_parts(p as *const u8, 6 * layer) };
        let layers = (0..6).map(|i| (i * layer, (i + 1) * layer)).collect();
        let s = Streamer::new(map, &path, layers, 2, false).unwrap();
        assert_eq!(s.readers.threads.lock().unwrap().len(), READERS);
        for il in 0..6 {
            s.before_layer(il);
            assert_eq!(map[il * layer + 5], 7, "streamed data reads back");
            s.after_layer(il);
        }
        assert_eq!(s.drops.load(Ordering::Relaxed), 4 + 4, "4 at start, 4 after use");
        drop(s);
        // SAFETY: the streamer that used the mapping is dropped and its threads joined.
        unsafe { libc::munmap(p, 6 * layer) };
        let _ = std::fs::remove_file(&path);
    }
}
