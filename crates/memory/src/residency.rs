//! Residency of the mapped weights: prefault (`populate`), pin (`mlock`), or stream with a
//! [`Streamer`] that the forward pass calls around each stage (a block of rows of one of a
//! layer's matrix groups, [`crate::stages`]).
//!
//! A streamer keeps layers `0..pinned` resident (left in the page cache; locked only under
//! `--load mlock`). For the others, [`READERS`] threads fault the stages in ahead of the compute,
//! in compute order (one read per page), claiming a stage at a time while what they have asked
//! for, counted from the stage computing, stays within the window (the biggest stage plus a
//! read-ahead); each stage is unmapped as soon as its matmul is done (`MADV_DONTNEED`) and, near
//! a cgroup limit, dropped from the page cache (`POSIX_FADV_DONTNEED`) so the charge is returned
//! at once. Streamed weights resident = the window, instead of the two whole layers (computing,
//! read ahead) of a layer-by-layer streamer: on the 7B shape in 2 GiB that is two more layers
//! pinned (10 of 28) and 2.52 GB read a token instead of 2.81. Every residency mode runs through
//! a streamer, so the pressure governor can move layers between the two sets at any time. Cost:
//! a few atomic operations per stage on the computing thread while every layer is pinned; two
//! system calls and a wake-up of the readers per streamed stage.
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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// What a streamed stage's pages become after use.
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

/// One layer's matrices as the forward pass reads them: per stage ([`crate::stages`]), in
/// compute order, the byte ranges in the file. Every layer has as many stages.
pub type LayerStages = Vec<Vec<(usize, usize)>>;

/// Called by the forward pass around every stage of every layer of every micro-batch.
pub trait LayerObserver: Send + Sync {
    fn before_stage(&self, il: usize, st: usize);
    fn after_stage(&self, il: usize, st: usize);
    /// Whether layer `il`'s stages are dropped after use now (the forward pass then computes
    /// it stage by stage, so that only a stage of it is held at once).
    fn streams(&self, il: usize) -> bool;
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
/// `stop()` before each page whether to go on.
fn touch_pages(map: &[u8], lo: usize, hi: usize, stop: impl Fn() -> bool) {
    let ps = page_size();
    let mut sum = 0u8;
    for off in (lo..hi.min(map.len())).step_by(ps) {
        if stop() {
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
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
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

/// Streams layers `pinned..n_layer` through memory a stage at a time; layers below `pinned`
/// stay resident (locked if `lock`). [`READERS`] threads fault the streamed stages in ahead of
/// the compute, in compute order, as long as what they hold from the stage computing on stays
/// within the window; each streamed stage is dropped as soon as its matmul is done.
/// [`Streamer::set_pinned`] moves the boundary either way (the KV cache growing or shrinking);
/// [`Streamer::demote`] also caps it, which is how the pressure governor hands memory back for
/// good.
pub struct Streamer {
    /// The file mapping (owned by the model, which outlives us).
    span: Span,
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Whether the reader threads were started (they are, at the first streamed stage).
    started: AtomicBool,
    /// Most layers that may be pinned again (lowered by memory pressure, never raised).
    cap: AtomicUsize,
    /// Serialises changes of `pinned` (the governor thread and the generating thread).
    change: Mutex<()>,
    lock: bool,
    file: File,
    /// What happens to a streamed stage's pages after use ([`Release`] as u8), set by the
    /// pressure governor from the room left under the limit.
    release: AtomicU8,
    /// Streamed-stage drops done (for logs and tests).
    pub drops: AtomicU64,
}

/// Threads reading streamed stages in (see the module notes). Measured on the 7B shape in
/// 2 GiB, cold, 24 tokens, two rounds: 4 readers claiming 16 MiB 0.54–0.56 tok/s (1.35–1.39 GB/s
/// from the disk), 8 × 8 MiB 0.57–0.58, 12 × 4 MiB 0.59–0.60, 8 × 4 MiB 0.59–0.65 (1.47–1.58
/// GB/s), 16 × 2 MiB 0.62–0.65; a 112 MiB window instead of 80: no faster.
pub const READERS: usize = 8;

/// Bytes a reader claims at a time: two huge-page folios, what one read fault brings in.
const CHUNK: u64 = 4 << 20;

/// Page-cache folios are at most one huge page (x86-64 and arm64 with 4 KiB pages).
const FOLIO: usize = 2 << 20;

/// Ranges of one stage closer than this are merged: what lies between (norms and biases, read
/// once at load) is dropped with them.
const MERGE_GAP: usize = 64 << 10;

/// The stages, the pinned count and where the compute is; shared with the reader threads.
struct Shared {
    /// `[n_layer][per]` stages, each stage's ranges sorted and merged.
    layers: Vec<LayerStages>,
    /// Stages per layer.
    per: usize,
    /// `[n_layer][per]` bytes of each stage.
    bytes: Vec<Vec<u64>>,
    /// Layers `0..pinned` stay resident ([`Streamer::pinned`] reads it here).
    pinned: AtomicUsize,
    /// Ticket of the stage computing (or next to compute once one is done): stages are numbered
    /// in compute order across passes, `pass × n_layer × per + il × per + st`.
    computing: AtomicU64,
    /// Most streamed bytes the readers may have asked for from the stage computing on.
    window: u64,
    /// The readers' cursor and stop flag; they wait on `wake` for the compute to move on.
    state: Mutex<ReadState>,
    /// Per reader, the ticket whose pages it is touching (`u64::MAX`: none). A stage is dropped
    /// only once no reader is in it, so no page of it is faulted back in after the drop.
    busy: [AtomicU64; READERS],
    wake: Condvar,
}

impl Shared {
    fn new(layers: Vec<LayerStages>, pinned: usize, window: u64) -> Shared {
        let per = layers.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let layers: Vec<LayerStages> = layers
            .into_iter()
            .map(|mut l| {
                l.resize(per, Vec::new());
                l.into_iter().map(merged).collect()
            })
            .collect();
        let bytes: Vec<Vec<u64>> = layers
            .iter()
            .map(|l| l.iter().map(|st| st.iter().map(|&(a, b)| (b - a) as u64).sum()).collect())
            .collect();
        let biggest = bytes.iter().flatten().copied().max().unwrap_or(0);
        Shared {
            pinned: AtomicUsize::new(pinned.min(layers.len())),
            layers,
            per,
            bytes,
            computing: AtomicU64::new(0),
            // The readers must be able to hold the stage computing.
            window: window.max(biggest),
            state: Mutex::new(ReadState { t: 0, off: 0, stop: false }),
            busy: std::array::from_fn(|_| AtomicU64::new(u64::MAX)),
            wake: Condvar::new(),
        }
    }

    /// Stages in one pass.
    fn n(&self) -> u64 {
        (self.layers.len() * self.per).max(1) as u64
    }

    /// Layer and stage of ticket `t`.
    fn at(&self, t: u64) -> (usize, usize) {
        let l = (t % self.n()) as usize;
        (l / self.per, l % self.per)
    }

    /// The first ticket at or after `from` that is stage `st` of layer `il`.
    fn ticket(&self, from: u64, il: usize, st: usize) -> u64 {
        let (n, local) = (self.n(), (il * self.per + st) as u64);
        from + (local + n - from % n) % n
    }

    fn streams(&self, il: usize) -> bool {
        il >= self.pinned.load(Ordering::Relaxed)
    }

    /// Bytes the readers read for ticket `t` (none when its layer is pinned).
    fn streamed(&self, t: u64) -> u64 {
        let (il, st) = self.at(t);
        if self.streams(il) {
            self.bytes[il][st]
        } else {
            0
        }
    }

    /// Hands out the next chunk to read, in compute order: ticket and byte range within its
    /// stage (counted over the stage's ranges in order). `None` when the next chunk would take
    /// the bytes read from the stage computing on past the window, or reach a whole pass
    /// ahead (the stage computing again): wait for the compute to move on.
    fn claim(&self, st: &mut ReadState) -> Option<(u64, u64, u64)> {
        let c = self.computing.load(Ordering::Acquire);
        if st.t < c {
            (st.t, st.off) = (c, 0);
        }
        let mut ahead: u64 = (c..st.t).map(|x| self.streamed(x)).sum();
        while st.t < c + self.n() {
            let b = self.streamed(st.t);
            if st.off < b {
                // No sliver under half a chunk left at a stage's end.
                let hi = if b - st.off < CHUNK * 3 / 2 { b } else { st.off + CHUNK };
                if ahead + hi > self.window {
                    return None;
                }
                let lo = std::mem::replace(&mut st.off, hi);
                return Some((st.t, lo, hi));
            }
            ahead += b;
            (st.t, st.off) = (st.t + 1, 0);
        }
        None
    }

    /// A reader: reads the chunks it claims until stopped.
    fn run(&self, i: usize, span: Span) {
        loop {
            let (t, lo, hi) = {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if st.stop {
                        return;
                    }
                    if let Some(c) = self.claim(&mut st) {
                        break c;
                    }
                    st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            // Busy first, then the compute position (in `read`): a stage finished in between
            // is seen by one of the two sides (see `Streamer::after_stage`).
            self.busy[i].store(t, Ordering::SeqCst);
            self.read(span.map(), t, lo, hi);
            self.busy[i].store(u64::MAX, Ordering::SeqCst);
        }
    }

    /// Faults in bytes `lo..hi` of ticket `t`'s stage, page by page, until done or the compute
    /// has finished the stage.
    fn read(&self, map: &[u8], t: u64, lo: u64, hi: u64) {
        let (il, st) = self.at(t);
        let mut off = 0u64;
        for &(a, b) in &self.layers[il][st] {
            let len = (b - a) as u64;
            let (s, e) = (lo.max(off), hi.min(off + len));
            if s < e {
                let (s, e) = (a + (s - off) as usize, a + (e - off) as usize);
                touch_pages(map, s, e, || self.computing.load(Ordering::SeqCst) > t);
            }
            off += len;
        }
    }

    /// What dropping stage `st` of layer `il` releases: its ranges, each end widened to the
    /// edge of the folio it falls in when the rest of that folio holds no weights still to be
    /// used this pass (only stages computed before it that stream, or the stage itself). The page
    /// cache never evicts a folio only partly inside a drop, so a folio shared by two stages goes
    /// with whichever is dropped second.
    fn drop_ranges(&self, il: usize, st: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let order = il * self.per + st;
        // Whether `[lo, hi)` holds nothing of a stage computed after this one or kept resident.
        let free = move |lo: usize, hi: usize| {
            self.layers.iter().enumerate().all(|(l, stages)| {
                stages.iter().enumerate().all(|(s, ranges)| {
                    let done = l * self.per + s < order && self.streams(l);
                    done || (l, s) == (il, st) || ranges.iter().all(|&(a, b)| b <= lo || hi <= a)
                })
            })
        };
        self.layers[il][st].iter().map(move |&(a, b)| {
            let (fa, fb) = (a / FOLIO * FOLIO, b.div_ceil(FOLIO) * FOLIO);
            (if free(fa, a) { fa } else { a }, if free(b, fb) { fb } else { b })
        })
    }

    /// The layer's whole byte span (for locking and dropping a layer at once).
    fn layer_span(&self, il: usize) -> (usize, usize) {
        let rs = self.layers[il].iter().flatten();
        let a = rs.clone().map(|r| r.0).min().unwrap_or(0);
        (a, rs.map(|r| r.1).max().unwrap_or(a))
    }
}

/// Where the readers are: the next chunk starts `off` bytes into ticket `t`'s stage.
struct ReadState {
    t: u64,
    off: u64,
    stop: bool,
}

/// `ranges` sorted, with those closer than [`MERGE_GAP`] merged.
fn merged(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1 + MERGE_GAP => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
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
    /// the same file (opened again for `posix_fadvise`). `window`: most streamed bytes read
    /// ahead from the stage computing on (at least the biggest stage).
    pub fn new(
        map: &[u8],
        path: &Path,
        layers: Vec<LayerStages>,
        pinned: usize,
        lock: bool,
        window: u64,
    ) -> Result<Streamer, String> {
        let file = File::open(path)
            .map_err(|e| format!("opening {} for streaming: {e}", path.display()))?;
        let n_layer = layers.len();
        let s = Streamer {
            span: Span { base: map.as_ptr() as usize, len: map.len() },
            shared: Arc::new(Shared::new(layers, pinned, window)),
            threads: Mutex::new(Vec::new()),
            started: AtomicBool::new(false),
            cap: AtomicUsize::new(n_layer),
            change: Mutex::new(()),
            lock,
            file,
            release: AtomicU8::new(Release::UnmapAndUncache as u8),
            drops: AtomicU64::new(0),
        };
        let pinned = s.pinned();
        if lock {
            for il in 0..pinned {
                let (a, b) = s.shared.layer_span(il);
                lock_range(map, a, b)?;
            }
        }
        // Nothing of ours is cached yet: whatever the page cache holds of the streamed layers was
        // read by someone else, so only the mapping is dropped.
        for il in pinned..n_layer {
            s.drop_layer_with(il, Release::Unmap);
        }
        Ok(s)
    }

    fn map(&self) -> &[u8] {
        self.span.map()
    }

    pub fn pinned(&self) -> usize {
        self.shared.pinned.load(Ordering::Relaxed)
    }

    pub fn n_layer(&self) -> usize {
        self.shared.layers.len()
    }

    /// Keeps layers `0..k` resident from the next stage computed on, `k` at most the cap set by
    /// [`Streamer::demote`]. Fewer: layers `k..` stream and their pages are dropped now. More:
    /// layers are kept again (locked first when locking; a refused lock stops there). Returns the
    /// pinned count before and after.
    pub fn set_pinned(&self, k: usize) -> (usize, usize) {
        let _g = self.change.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.pinned();
        let k = k.min(self.cap.load(Ordering::Relaxed)).min(self.n_layer());
        if k < old {
            self.shared.pinned.store(k, Ordering::Relaxed);
            for il in k..old {
                if self.lock {
                    let (a, b) = self.shared.layer_span(il);
                    unlock_range(self.map(), a, b);
                }
                self.drop_layer(il);
            }
        } else if k > old {
            let mut n = old;
            while n < k {
                let (a, b) = self.shared.layer_span(n);
                if self.lock && lock_range(self.map(), a, b).is_err() {
                    break;
                }
                n += 1;
            }
            self.shared.pinned.store(n, Ordering::Relaxed);
        }
        self.notify();
        (old, self.pinned())
    }

    /// Stops keeping layers `k..` resident, and never pins more than `k` again: they stream from
    /// the next stage computed on. Returns the pinned count before and after.
    pub fn demote(&self, k: usize) -> (usize, usize) {
        self.cap.fetch_min(k, Ordering::Relaxed);
        self.set_pinned(k)
    }

    /// Sets what happens to streamed stages after use. Switching to
    /// [`Release::UnmapAndUncache`] also releases every streamed layer now, since what was read
    /// before stays charged to us (the stage computing refaults what it still needs).
    pub fn set_release(&self, r: Release) {
        let old = self.release.swap(r as u8, Ordering::Relaxed);
        if r == Release::UnmapAndUncache && old != r as u8 {
            let _g = self.change.lock().unwrap_or_else(|p| p.into_inner());
            for il in self.pinned()..self.n_layer() {
                self.drop_layer_with(il, r);
            }
        }
    }

    fn release(&self) -> Release {
        match self.release.load(Ordering::Relaxed) {
            0 => Release::KeepMapped,
            1 => Release::Unmap,
            _ => Release::UnmapAndUncache,
        }
    }

    /// Wakes the readers to look at the compute position and the pinned count again.
    fn notify(&self) {
        if self.started.load(Ordering::Relaxed) {
            let _g = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.notify_all();
        }
    }

    /// Starts the reader threads (once). If they cannot be started the computing threads fault
    /// the streamed stages in themselves, only slower.
    fn start_readers(&self) {
        if self.started.swap(true, Ordering::Relaxed) {
            return;
        }
        let mut t = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        for i in 0..READERS {
            let (shared, span) = (self.shared.clone(), self.span);
            match std::thread::Builder::new()
                .name(format!("snug-reader-{i}"))
                .spawn(move || shared.run(i, span))
            {
                Ok(h) => t.push(h),
                Err(_) => break,
            }
        }
    }

    /// Unmaps `[a, b)` (whole pages inside it) and with [`Release::UnmapAndUncache`] drops its
    /// clean cached pages that nothing maps.
    fn drop_range(&self, a: usize, b: usize, r: Release) {
        let Some((p, n)) = inner(self.map(), a, b) else {
            return;
        };
        // SAFETY: within the live mapping, whole pages of streamed weights only. The mapping
        // is a private read-only file mapping: DONTNEED unmaps pages, and the next read faults
        // them in again from the file, so no data is lost.
        unsafe { libc::madvise(p, n, libc::MADV_DONTNEED) };
        if r == Release::UnmapAndUncache {
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
    }

    fn drop_stage(&self, il: usize, st: usize) {
        let r = self.release();
        if r == Release::KeepMapped {
            return;
        }
        for (a, b) in self.shared.drop_ranges(il, st) {
            self.drop_range(a, b, r);
        }
        self.drops.fetch_add(1, Ordering::Relaxed);
    }

    fn drop_layer(&self, il: usize) {
        self.drop_layer_with(il, self.release());
    }

    fn drop_layer_with(&self, il: usize, r: Release) {
        if r == Release::KeepMapped {
            return;
        }
        let (a, b) = self.shared.layer_span(il);
        self.drop_range(a, b, r);
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
}

impl LayerObserver for Streamer {
    fn streams(&self, il: usize) -> bool {
        // Kept mapped (a warm cache charged elsewhere), a streamed layer costs no more held whole,
        // and one matmul per group is cheaper than one per block.
        self.shared.streams(il) && self.release() != Release::KeepMapped
    }

    fn before_stage(&self, il: usize, st: usize) {
        let sh = &self.shared;
        let t = sh.ticket(sh.computing.load(Ordering::Relaxed), il, st);
        sh.computing.store(t, Ordering::Release);
        if self.pinned() < self.n_layer() {
            self.start_readers();
            self.notify();
        }
    }

    fn after_stage(&self, il: usize, st: usize) {
        let sh = &self.shared;
        let t = sh.ticket(sh.computing.load(Ordering::Relaxed), il, st);
        // The readers may now read as far past the next stage as the window allows.
        sh.computing.store(t + 1, Ordering::SeqCst);
        if sh.streams(il) {
            // A reader still in this stage stops before its next page; wait for that, so the
            // drop is not undone by a fault (the pages are all resident: the compute used them).
            while sh.busy.iter().any(|b| b.load(Ordering::SeqCst) == t) {
                std::thread::yield_now();
            }
            self.drop_stage(il, st);
        }
        self.notify();
    }
}

impl Drop for Streamer {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        self.shared.wake.notify_all();
        for t in self.threads.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: usize = 1 << 20;
    /// Stages per layer in these tests.
    const STAGES: usize = 4;

    /// One claim.
    const C: usize = CHUNK as usize;

    /// `n` layers of stages of 1 MiB, one claim, three and two laid out back to back (plus a
    /// 16 KiB norm between layers), the first stage in two ranges 16 KiB apart (q/k/v with
    /// biases between).
    fn layers(n: usize) -> Vec<LayerStages> {
        let mut off = 0;
        (0..n)
            .map(|_| {
                let mut take = |len: usize| {
                    let r = (off, off + len);
                    off += len;
                    r
                };
                let q = take(M / 2);
                take(16 << 10);
                let kv = take(M / 2);
                let o = take(C);
                let gate_up = take(3 * C);
                let down = take(2 * C);
                take(16 << 10);
                vec![vec![q, kv], vec![o], vec![gate_up], vec![down]]
            })
            .collect()
    }

    #[test]
    fn tickets_follow_compute_order_across_passes() {
        let s = Shared::new(layers(3), 1, 0);
        assert_eq!(s.n(), 12);
        assert_eq!(s.ticket(0, 0, 0), 0);
        assert_eq!(s.ticket(5, 1, 1), 5);
        assert_eq!(s.ticket(6, 1, 1), 17, "a stage already passed is next pass's");
        assert_eq!(s.at(17), (1, 1));
        // Ranges of a stage closer than the merge gap are one.
        assert_eq!(s.layers[0][0], vec![(0, M + (16 << 10))]);
        assert_eq!(s.window, 3 * C as u64, "never below the biggest stage");
    }

    /// Every chunk the readers may claim now, in order.
    fn claims(s: &Shared, st: &mut ReadState) -> Vec<(u64, u64, u64)> {
        std::iter::from_fn(|| s.claim(st)).collect()
    }

    #[test]
    fn readers_claim_chunks_in_compute_order_inside_the_window() {
        let s = Shared::new(layers(4), 2, 6 * C as u64);
        let mut st = ReadState { t: 0, off: 0, stop: false };
        let (q, c) = ((M + (16 << 10)) as u64, C as u64);
        // Compute on layer 0 (pinned): the readers start at layer 2, the first streamed, and
        // stop where the next claim would pass the window (1 MiB + 5 claims taken).
        assert_eq!(
            claims(&s, &mut st),
            vec![(8, 0, q), (9, 0, c), (10, 0, c), (10, c, 2 * c), (10, 2 * c, 3 * c), (11, 0, c)]
        );
        // The first stage done: room for one more claim; the second: for layer 3's first stage.
        s.computing.store(9, Ordering::Relaxed);
        assert_eq!(claims(&s, &mut st), vec![(11, c, 2 * c)]);
        s.computing.store(10, Ordering::Relaxed);
        assert_eq!(claims(&s, &mut st), vec![(12, 0, q)]);
        // Compute past where the readers are (on layer 3's down): they skip to it, and the
        // window wraps past the pinned layers to the next pass's layer 2.
        s.computing.store(15, Ordering::Relaxed);
        assert_eq!(
            claims(&s, &mut st),
            vec![(15, 0, c), (15, c, 2 * c), (24, 0, q), (25, 0, c), (26, 0, c), (26, c, 2 * c)]
        );
        // Never a whole pass ahead, even with room: one streamed layer.
        let s = Shared::new(layers(2), 1, u64::MAX);
        let mut st = ReadState { t: 0, off: 0, stop: false };
        s.computing.store(4, Ordering::Relaxed);
        assert_eq!(
            claims(&s, &mut st),
            vec![
                (4, 0, q),
                (5, 0, c),
                (6, 0, c),
                (6, c, 2 * c),
                (6, 2 * c, 3 * c),
                (7, 0, c),
                (7, c, 2 * c)
            ]
        );
        // No sliver under half a claim is left at a stage's end: the last claim takes it.
        let s = Shared::new(vec![vec![vec![(0, 9 * C / 4)]]], 0, u64::MAX);
        let mut st = ReadState { t: 0, off: 0, stop: false };
        assert_eq!(claims(&s, &mut st), vec![(0, 0, c), (0, c, 9 * c / 4)]);
        // Everything pinned: nothing to read.
        let s = Shared::new(layers(2), 2, u64::MAX);
        assert_eq!(claims(&s, &mut ReadState { t: 0, off: 0, stop: false }), vec![]);
    }

    #[test]
    fn a_drop_takes_folios_shared_only_with_stages_already_done() {
        let s = Shared::new(layers(3), 1, 0);
        let drop = |il: usize, st: usize| s.drop_ranges(il, st).collect::<Vec<_>>();
        // Layer 1 is the first streamed: its first stage's first folio also holds layer 0
        // (pinned), its last folio the next stage (still to come): nothing widened.
        assert_eq!(drop(1, 0), s.layers[1][0]);
        // Over a pass, every folio wholly inside the streamed layers (from the first folio
        // boundary in layer 1 to the end of the file's last folio) is wholly inside one drop,
        // so none stays cached.
        let mut drops = Vec::new();
        for il in 1..3 {
            for st in 0..STAGES {
                drops.extend(s.drop_ranges(il, st));
            }
        }
        let (lo, hi) = (s.layers[1][0][0].0.div_ceil(FOLIO), s.layers[2][3][0].1.div_ceil(FOLIO));
        for k in lo..hi {
            let (a, b) = (k * FOLIO, (k + 1) * FOLIO);
            assert!(drops.iter().any(|&(x, y)| x <= a && b <= y), "folio {k} never dropped whole");
        }
        // Pinning layer 1 too: layer 2's first stage no longer widens into it.
        s.pinned.store(2, Ordering::Relaxed);
        assert_eq!(drop(2, 0)[0].0, s.layers[2][0][0].0);
        // A file in another order (down first, as llama.cpp's quantizer sorts names): stage 0,
        // computed first, lies last. A drop never reaches a stage still to come.
        let l: LayerStages = vec![
            vec![(20 * M + 4096, 21 * M)],
            vec![(19 * M, 20 * M)],
            vec![(9 * M + 4096, 19 * M)],
            vec![(4096, 9 * M)],
        ];
        let s = Shared::new(vec![l], 0, 0);
        let drop = |st: usize| s.drop_ranges(0, st).collect::<Vec<_>>();
        assert_eq!(drop(0), vec![(20 * M, 22 * M)], "its folios hold nothing else");
        assert_eq!(drop(1), vec![(19 * M, 20 * M)], "[18, 19) MiB is stage 2's, still to come");
        assert_eq!(
            drop(2),
            vec![(9 * M + 4096, 20 * M)],
            "up into stage 1 (done), not down into 3"
        );
        assert_eq!(drop(3), vec![(0, 10 * M)], "both neighbours done");
    }

    #[test]
    fn streamed_data_reads_back_and_stages_drop() {
        let path = std::env::temp_dir().join(format!("snug-readers-{}.bin", std::process::id()));
        let ls = layers(4);
        let len = ls.last().unwrap()[3][0].1 + (16 << 10);
        let bytes: Vec<u8> = (0..len).map(|i| (i / 4096) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        // SAFETY: a fresh read-only shared mapping of a file we just wrote, unmapped below after
        // the streamer (and its reader threads) are gone.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the mapping above, live until munmap.
        let map = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
        let s = Streamer::new(map, &path, ls.clone(), 2, false, 16 * M as u64).unwrap();
        assert_eq!(s.drops.load(Ordering::Relaxed), 2, "streamed layers unmapped at start");
        for _pass in 0..2 {
            for (il, l) in ls.iter().enumerate() {
                for (st, ranges) in l.iter().enumerate() {
                    s.before_stage(il, st);
                    for &(a, b) in ranges {
                        let sum: u64 = map[a..b].iter().step_by(4096).map(|&x| x as u64).sum();
                        let want: u64 = bytes[a..b].iter().step_by(4096).map(|&x| x as u64).sum();
                        assert_eq!(sum, want, "layer {il} stage {st} reads back");
                    }
                    s.after_stage(il, st);
                }
            }
        }
        assert_eq!(s.threads.lock().unwrap().len(), READERS);
        assert_eq!(s.drops.load(Ordering::Relaxed), 2 + 2 * 2 * STAGES as u64);
        drop(s);
        // SAFETY: the streamer that used the mapping is dropped and its threads joined.
        unsafe { libc::munmap(p, len) };
        let _ = std::fs::remove_file(&path);
    }
}
