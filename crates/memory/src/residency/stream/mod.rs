//! Streaming: layers `0..pinned` stay resident (left in the page cache; locked only under
//! `--load mlock`), the others pass through memory a stage at a time (a block of rows of one of a
//! layer's matrix groups, [`crate::stages`]) with a [`Streamer`] that the forward pass calls
//! around each stage.
//!
//! For the streamed layers, [`READERS`] threads fault the stages in ahead of the compute, in
//! compute order (one read per page), claiming a chunk at a time while what they have asked for,
//! counted from the stage computing, stays within the window (the biggest stage plus a
//! read-ahead; [`schedule`] decides what to read and what a finished stage releases). Each stage
//! is unmapped as soon as its matmul is done (`MADV_DONTNEED`) and, near a cgroup limit, dropped
//! from the page cache (`POSIX_FADV_DONTNEED`) so the charge is returned at once. Streamed
//! weights resident = the window, instead of the two whole layers (computing, read ahead) of a
//! layer-by-layer streamer, which leaves room to pin more layers (BENCHMARKS.md, 7B in cgroup
//! limits, session 5).
//!
//! The streamer owns a handle on the file mapping ([`gguf::Mapping`]) and gives one to each
//! reader thread, so no safe caller can leave the readers or the drops pointing at an unmapped
//! range, and the type admits only a read-only file mapping, where dropping pages loses nothing.
//! Cost: a few atomic operations per stage on the computing thread while every layer is pinned;
//! two system calls and a wake-up of the readers per streamed stage.

mod schedule;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use gguf::Mapping;

use super::pages::inner;
use super::{lock_range, unlock_range, ExpertCache, READERS};
use schedule::Shared;

/// What a streamed stage's pages become after use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Left mapped: under a cgroup limit, pages cached before we started (a warm cache) are
    /// charged to whoever read them and cost our limit nothing; unmapping them would only add a
    /// page fault per page per token (measured in BENCHMARKS.md, 7B in cgroup limits, session 3).
    KeepMapped = 0,
    /// Unmapped (`MADV_DONTNEED`), left in the page cache: lowers RSS, which is what `--ram` and
    /// MemAvailable budgets count; the kernel reclaims the unmapped cache as needed.
    Unmap = 1,
    /// Unmapped and dropped from the page cache (`POSIX_FADV_DONTNEED`): what a cold read charged
    /// to our cgroup needs when usage nears the limit. Dropping a warm cache instead turns every
    /// streamed layer into a disk read (a warm run as slow as a cold one: BENCHMARKS.md, session
    /// 3).
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
    /// Where a mixture of experts' experts come from when not from the mapping: the layers'
    /// stages then leave the experts out.
    fn experts(&self) -> Option<&ExpertCache> {
        None
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
    /// The file mapping the forward pass reads; each reader thread holds a clone.
    map: Mapping,
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
    /// A mixture of experts' experts, when they are cached apart from their layers.
    experts: Option<ExpertCache>,
}

impl Streamer {
    /// `map`: the mapping the forward pass reads (the streamer keeps it alive); `path`: the same
    /// file (opened again for `posix_fadvise`). `window`: most streamed bytes read ahead from the
    /// stage computing on (at least the biggest stage).
    pub fn new(
        map: Mapping,
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
            map,
            shared: Arc::new(Shared::new(layers, pinned, window)),
            threads: Mutex::new(Vec::new()),
            started: AtomicBool::new(false),
            cap: AtomicUsize::new(n_layer),
            change: Mutex::new(()),
            lock,
            file,
            release: AtomicU8::new(Release::UnmapAndUncache as u8),
            drops: AtomicU64::new(0),
            experts: None,
        };
        let pinned = s.pinned();
        if lock {
            for il in 0..pinned {
                let (a, b) = s.shared.layer_span(il);
                lock_range(s.map(), a, b).map_err(|e| e.to_string())?;
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
        &self.map
    }

    /// Serves the experts from `cache` (whose layers' stages, given to [`Streamer::new`], leave
    /// the experts out).
    pub fn with_experts(mut self, cache: ExpertCache) -> Streamer {
        self.experts = Some(cache);
        self
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
            self.shared.wake_readers();
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
            let (shared, map) = (self.shared.clone(), self.map.clone());
            match std::thread::Builder::new()
                .name(format!("snug-reader-{i}"))
                .spawn(move || shared.run(i, &map))
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
        // SAFETY: within the mapping we hold, whole pages of streamed weights only. It is a
        // read-only file mapping (`Mapping`): DONTNEED unmaps pages, and the next read faults
        // them in again from the file, so no data is lost.
        unsafe { libc::madvise(p, n, libc::MADV_DONTNEED) };
        if r == Release::UnmapAndUncache {
            let off = p as usize - self.map.as_ptr() as usize;
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
    fn experts(&self) -> Option<&ExpertCache> {
        self.experts.as_ref()
    }

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
            while sh.reading(t) {
                std::thread::yield_now();
            }
            self.drop_stage(il, st);
        }
        self.notify();
    }
}

impl Drop for Streamer {
    fn drop(&mut self) {
        self.shared.stop_readers();
        for t in self.threads.get_mut().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::schedule::tests::{layers, M, STAGES};
    use super::*;

    #[test]
    fn streamed_data_reads_back_and_stages_drop() {
        let path = std::env::temp_dir().join(format!("snug-readers-{}.bin", std::process::id()));
        let ls = layers(4);
        let len = ls.last().unwrap()[3][0].1 + (16 << 10);
        let bytes: Vec<u8> = (0..len).map(|i| (i / 4096) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let map = Mapping::open(&File::open(&path).unwrap()).unwrap();
        let s = Streamer::new(map.clone(), &path, ls.clone(), 2, false, 16 * M as u64).unwrap();
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
        // The streamer's handle keeps the mapping alive for its readers, whoever drops first.
        drop(map);
        drop(s);
        let _ = std::fs::remove_file(&path);
    }
}
