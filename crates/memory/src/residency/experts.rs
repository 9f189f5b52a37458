//! The expert cache: a mixture-of-experts model's experts held in memory of their own under a
//! byte budget, read from the file when the router chooses one that is not held, the least
//! recently used slot reused first.
//!
//! Why not the page cache. An expert is three blocks of the file (its rows of the stacked gate,
//! up and down tensors), a few MiB that a token uses with probability `k / n_expert`. Faulted in
//! through the mapping, each miss reads around the fault (`read_ahead_kb`, 8 MiB on the disks
//! this runs on: neighbouring experts nobody chose), the cgroup is charged for page-cache folios
//! the kernel decides when to drop, and under a limit those folios thrash against the attention
//! weights that every token reads. So the attention, norms and router stay in the mapping
//! (pinned or streamed as layers), and the experts get slots of anonymous memory: what the cache
//! holds is exactly its slots, and a miss reads exactly the expert's bytes, with `O_DIRECT` so
//! that the page cache keeps no second copy (buffered reads, each dropped from the page cache
//! after use, where the file system refuses `O_DIRECT`).
//!
//! Reads. Once a layer's router has chosen, [`ExpertCache::hold`] gives every chosen expert that
//! is not held a slot (free, else the least recently used) and queues its reads; [`READERS`]
//! threads `pread` them, at most [`READ_BYTES`] a read, in the order the layer computes its
//! experts, so the disk reads the later experts while the first is computed on.
//! [`Held::get`] waits for one expert. A held expert's slot is not reused until its [`Held`] is
//! dropped, which is what makes handing out its bytes sound.
//!
//! Cost: one slot per cached expert at the biggest expert's size (each block widened to whole
//! pages, which `O_DIRECT` needs); a lock and a wake-up per expert per micro-batch; on a miss the
//! expert's bytes from disk. A cache holding a fraction f of the experts of a model that routes
//! uniformly (a synthetic one) hits about f of the time; real models' routing is skewed (a
//! minority of experts takes most of a domain's tokens), and the same cache hits more.

use std::collections::{BTreeSet, VecDeque};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::pages::page_size;
use super::READERS;

/// Most bytes one `pread` asks for: an expert's blocks are cut into reads of this size so that
/// several readers share a big block.
pub const READ_BYTES: usize = 1 << 20;

/// How many given-back lists of held slots a cache keeps: one per hold alive at once (the
/// forward pass holds one group at a time), with room to spare.
const SPARE_LISTS: usize = 4;

/// Where one expert's gate, up and down blocks are in the file: `(offset, len)` each.
pub type ExpertRanges = [(usize, usize); 3];

/// Bytes of the slot that holds an expert of `ranges`: each block widened to whole pages.
pub fn slot_bytes(ranges: &ExpertRanges) -> usize {
    let ps = page_size();
    ranges.iter().map(|&(o, n)| (o + n).next_multiple_of(ps) - o / ps * ps).sum()
}

/// Hit and read counters since the cache was made.
#[derive(Default)]
pub struct ExpertStats {
    /// Chosen experts that were held already.
    pub hits: AtomicU64,
    /// Chosen experts read from the file.
    pub misses: AtomicU64,
    /// Bytes of the experts read (the blocks themselves, not the page-rounded reads).
    pub bytes_read: AtomicU64,
}

impl ExpertStats {
    /// Hits over hits and misses (0 before any).
    pub fn hit_rate(&self) -> f64 {
        let h = self.hits.load(Ordering::Relaxed) as f64;
        let m = self.misses.load(Ordering::Relaxed) as f64;
        if h + m == 0.0 {
            0.0
        } else {
            h / (h + m)
        }
    }
}

/// Anonymous memory for the slots, mapped once and unmapped on drop.
struct Memory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is only written by readers into slots whose expert is being read (nobody
// reads those bytes until the read is done, under the state lock), and only read through a
// `Held`, which keeps the slot from being given to another expert.
unsafe impl Send for Memory {}
unsafe impl Sync for Memory {}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: ptr/len are the mapping made in `ExpertCache::new`, unmapped only here.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    /// Holds no expert (or one whose read failed).
    Empty,
    /// Reads outstanding, and whether one of this expert's reads has failed already.
    Reading {
        left: u32,
        failed: bool,
    },
    Ready,
}

#[derive(Clone, Copy)]
struct Slot {
    /// `il · n_expert + e` of the expert it holds.
    key: Option<usize>,
    state: SlotState,
    /// `Held` sets holding it.
    held: u32,
    /// Last release, for the least-recently-used order.
    tick: u64,
}

/// One `pread`: `len` bytes (whole pages) from `at` in the file into the slots' memory at
/// `to`, of which the first `need` are the expert's (the rest may lie past the end of the file).
struct Read {
    slot: usize,
    at: u64,
    len: usize,
    need: usize,
    to: usize,
}

struct State {
    slots: Vec<Slot>,
    /// Slot of each expert (`il · n_expert + e`) held or being read.
    of: Vec<Option<usize>>,
    /// Slots nobody holds whose reads are done, by last release: the next to reuse first.
    idle: BTreeSet<(u64, usize)>,
    tick: u64,
    queue: VecDeque<Read>,
    stop: bool,
    /// Why the last failed read failed.
    error: Option<String>,
    /// Lists of held slots that dropped [`Held`]s gave back, so a hold does not allocate.
    spare: Vec<Vec<(u32, usize)>>,
}

struct Shared {
    /// The file opened with `O_DIRECT`, unless the file system refused it.
    direct: Option<File>,
    /// Whether `direct` still serves (cleared when its reads fail with `EINVAL`).
    use_direct: AtomicBool,
    buffered: File,
    mem: Memory,
    slot_bytes: usize,
    ranges: Vec<ExpertRanges>,
    n_expert: usize,
    state: Mutex<State>,
    /// Readers wait on this for reads; the computing thread for reads done.
    work: Condvar,
    done: Condvar,
    stats: Arc<ExpertStats>,
}

/// A layer's experts under a byte budget of slots; see the module docs.
pub struct ExpertCache {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl ExpertCache {
    /// `ranges[il][e]`: where expert `e` of layer `il` is in `path` (every layer has as many
    /// experts); `budget`: bytes of slots, at least one slot. Starts [`READERS`] threads.
    pub fn new(
        path: &Path,
        ranges: Vec<Vec<ExpertRanges>>,
        budget: u64,
    ) -> Result<ExpertCache, String> {
        let n_expert = ranges.first().map_or(0, |l| l.len());
        if n_expert == 0 || ranges.iter().any(|l| l.len() != n_expert) {
            return Err("an expert cache needs the same number of experts in every layer".into());
        }
        let file_len = std::fs::metadata(path)
            .map_err(|e| format!("reading {}'s size: {e}", path.display()))?
            .len() as usize;
        if let Some((i, _)) = ranges
            .iter()
            .flatten()
            .enumerate()
            .find(|(_, r)| r.iter().any(|&(o, n)| o.saturating_add(n) > file_len))
        {
            return Err(format!(
                "expert {} of layer {} lies past the end of {} ({file_len} bytes): is the file cut short?",
                i % n_expert,
                i / n_expert,
                path.display()
            ));
        }
        let ranges: Vec<ExpertRanges> = ranges.into_iter().flatten().collect();
        let slot = ranges.iter().map(slot_bytes).max().unwrap_or(0).max(page_size());
        let n_slots = (budget / slot as u64).clamp(1, ranges.len() as u64) as usize;
        let len = n_slots * slot;
        // SAFETY: a fresh private anonymous mapping; checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                // Committed now: the plan counts every slot, and the run then holds what it
                // said before it reads an expert, not after hours of use.
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(format!("mapping {len} bytes for the expert cache: {e}"));
        }
        let mem = Memory { ptr: ptr.cast(), len };
        let open = |path: &Path| {
            File::open(path).map_err(|e| format!("opening {} for experts: {e}", path.display()))
        };
        let buffered = open(path)?;
        let direct =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).ok();
        let state = State {
            slots: vec![Slot { key: None, state: SlotState::Empty, held: 0, tick: 0 }; n_slots],
            of: vec![None; ranges.len()],
            idle: (0..n_slots).map(|s| (0, s)).collect(),
            tick: 0,
            queue: VecDeque::new(),
            stop: false,
            error: None,
            spare: Vec::new(),
        };
        let shared = Arc::new(Shared {
            use_direct: AtomicBool::new(direct.is_some()),
            direct,
            buffered,
            mem,
            slot_bytes: slot,
            ranges,
            n_expert,
            state: Mutex::new(state),
            work: Condvar::new(),
            done: Condvar::new(),
            stats: Arc::default(),
        });
        let mut threads = Vec::new();
        for i in 0..READERS {
            let sh = shared.clone();
            match std::thread::Builder::new()
                .name(format!("snug-experts-{i}"))
                .spawn(move || sh.run())
            {
                Ok(h) => threads.push(h),
                Err(e) if threads.is_empty() => {
                    return Err(format!("starting the expert cache's readers: {e}"))
                }
                Err(_) => break,
            }
        }
        Ok(ExpertCache { shared, threads })
    }

    /// Slots: the most experts one [`ExpertCache::hold`] may ask for.
    pub fn slots(&self) -> usize {
        self.shared.mem.len / self.shared.slot_bytes
    }

    /// Bytes of the slots (what the cache holds once every slot has been used).
    pub fn bytes(&self) -> u64 {
        self.shared.mem.len as u64
    }

    /// The counters, shared (a server's `/metrics` reads them at each scrape).
    pub fn stats(&self) -> &Arc<ExpertStats> {
        &self.shared.stats
    }

    /// Holds experts `experts` (distinct, at most [`ExpertCache::slots`]) of layer `il`:
    /// those not held are given slots and their reads queued, in this order.
    pub fn hold(&self, il: usize, experts: &[u32]) -> Result<Held<'_>, String> {
        let sh = &*self.shared;
        if experts.len() > self.slots() {
            return Err(format!(
                "{} experts asked for at once but the expert cache has {} slots",
                experts.len(),
                self.slots()
            ));
        }
        // Declared before the lock's guard, so that on an early return it is dropped (and
        // takes the lock to release its slots) after the guard.
        let mut held = Held { cache: self, il, slots: Vec::new() };
        let mut st = sh.lock();
        held.slots = st.spare.pop().unwrap_or_default();
        held.slots.reserve(experts.len());
        for &e in experts {
            let key = il * sh.n_expert + e as usize;
            if key >= sh.ranges.len() {
                return Err(format!("layer {il} has no expert {e}"));
            }
            if let Some(s) = st.of[key] {
                sh.stats.hits.fetch_add(1, Ordering::Relaxed);
                let slot = st.slots[s];
                st.idle.remove(&(slot.tick, s));
                st.slots[s].held += 1;
                held.slots.push((e, s));
                continue;
            }
            // Fewer experts than slots are held (checked above), and a slot whose reads are
            // outstanding is held or becomes idle when they finish: one is idle unless another
            // hold's reads are still running; wait for them.
            let (_, s) = loop {
                if let Some(first) = st.idle.pop_first() {
                    break first;
                }
                st = sh.done.wait(st).unwrap_or_else(|p| p.into_inner());
            };
            if let Some(old) = st.slots[s].key.take() {
                st.of[old] = None;
            }
            sh.stats.misses.fetch_add(1, Ordering::Relaxed);
            let mut reads = 0;
            let ps = page_size();
            let mut to = s * sh.slot_bytes;
            for &(off, len) in &sh.ranges[key] {
                sh.stats.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
                let (a, b) = (off / ps * ps, (off + len).next_multiple_of(ps));
                for lo in (a..b).step_by(READ_BYTES) {
                    let n = READ_BYTES.min(b - lo);
                    let need = (off + len).min(lo + n) - lo;
                    st.queue.push_back(Read { slot: s, at: lo as u64, len: n, need, to });
                    to += n;
                    reads += 1;
                }
            }
            let state = SlotState::Reading { left: reads, failed: false };
            st.slots[s] = Slot { key: Some(key), state, held: 1, tick: 0 };
            st.of[key] = Some(s);
            held.slots.push((e, s));
        }
        drop(st);
        sh.work.notify_all();
        Ok(held)
    }
}

impl Drop for ExpertCache {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Experts held by one [`ExpertCache::hold`]: their slots are not reused while this lives.
pub struct Held<'a> {
    cache: &'a ExpertCache,
    il: usize,
    /// (expert, slot)
    slots: Vec<(u32, usize)>,
}

impl Held<'_> {
    /// Expert `e`'s gate, up and down blocks, exactly the file's bytes, once read (waits for
    /// the reads); an error if `e` is not held here or its read failed.
    pub fn get(&self, e: u32) -> Result<[&[u8]; 3], String> {
        let sh = &*self.cache.shared;
        let &(_, s) = self
            .slots
            .iter()
            .find(|&&(x, _)| x == e)
            .ok_or_else(|| format!("expert {e} of layer {} is not held", self.il))?;
        let mut st = sh.lock();
        loop {
            match st.slots[s].state {
                SlotState::Ready => break,
                SlotState::Reading { failed: false, .. } => {
                    st = sh.done.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                SlotState::Reading { failed: true, .. } | SlotState::Empty => {
                    let why = st.error.clone().unwrap_or_else(|| "read failed".into());
                    return Err(format!("reading expert {e} of layer {}: {why}", self.il));
                }
            }
        }
        drop(st);
        let ps = page_size();
        let key = self.il * sh.n_expert + e as usize;
        let mut at = s * sh.slot_bytes;
        Ok(sh.ranges[key].map(|(off, len)| {
            let start = at + off % ps;
            at += (off + len).next_multiple_of(ps) - off / ps * ps;
            // SAFETY: within slot `s` of the mapping (slots are `slot_bytes` apart and hold the
            // page-widened blocks back to back); its reads are done (state Ready, seen under the
            // lock after the readers' writes), and while `self` holds the slot it is not given
            // to another expert, so nothing writes these bytes while the borrow lives.
            unsafe { std::slice::from_raw_parts(sh.mem.ptr.add(start), len) }
        }))
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let sh = &*self.cache.shared;
        let mut st = sh.lock();
        for &(_, s) in &self.slots {
            st.slots[s].held -= 1;
            st.release_if_idle(s);
        }
        if st.spare.len() < SPARE_LISTS {
            let mut list = std::mem::take(&mut self.slots);
            list.clear();
            st.spare.push(list);
        }
    }
}

impl State {
    /// Puts slot `s` in the reuse order once nobody holds it and no read of it is outstanding.
    fn release_if_idle(&mut self, s: usize) {
        let slot = &mut self.slots[s];
        if slot.held == 0 && !matches!(slot.state, SlotState::Reading { .. }) {
            self.tick += 1;
            slot.tick = self.tick;
            self.idle.insert((self.tick, s));
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A reader thread: takes queued reads in order until the cache is dropped.
    fn run(&self) {
        loop {
            let r = {
                let mut st = self.lock();
                loop {
                    if st.stop {
                        return;
                    }
                    if let Some(r) = st.queue.pop_front() {
                        break r;
                    }
                    st = self.work.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            let res = self.read(&r);
            let mut st = self.lock();
            if let SlotState::Reading { left, failed } = st.slots[r.slot].state {
                let failed = failed || res.is_err();
                if let Err(e) = res {
                    st.error = Some(e);
                    // Forget the expert: the next hold reads it again. The slot is reused
                    // only once its other reads are done.
                    if let Some(k) = st.slots[r.slot].key.take() {
                        st.of[k] = None;
                    }
                }
                st.slots[r.slot].state = match (left - 1, failed) {
                    (0, false) => SlotState::Ready,
                    (0, true) => SlotState::Empty,
                    (left, failed) => SlotState::Reading { left, failed },
                };
                st.release_if_idle(r.slot);
            }
            drop(st);
            self.done.notify_all();
        }
    }

    /// One read into the slots' memory. The end of the file may come before the page-widened
    /// read's end, not before its `need` bytes.
    fn read(&self, r: &Read) -> Result<(), String> {
        // SAFETY: `to..to + len` lies within slot `r.slot` (its page-widened blocks), which is
        // being read: no one reads or writes these bytes until its state leaves `Reading`.
        let buf = unsafe { std::slice::from_raw_parts_mut(self.mem.ptr.add(r.to), r.len) };
        let mut got = 0;
        while got < buf.len() {
            let direct = self.use_direct.load(Ordering::Relaxed);
            let file = match (&self.direct, direct) {
                (Some(f), true) => f,
                _ => &self.buffered,
            };
            match file.read_at(&mut buf[got..], r.at + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // The file system takes `O_DIRECT` at open but not for this read: buffered
                // from now on.
                Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    self.use_direct.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        if got < r.need {
            return Err(format!(
                "the file ends {} bytes into a read of {} at {}",
                got, r.need, r.at
            ));
        }
        if !self.use_direct.load(Ordering::Relaxed) {
            // SAFETY: fadvise on a descriptor we own; it only drops clean cached pages.
            unsafe {
                libc::posix_fadvise(
                    std::os::fd::AsRawFd::as_raw_fd(&self.buffered),
                    r.at as libc::off_t,
                    r.len as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A file of `n_layer · n_expert` experts, each three blocks of `sizes` bytes at unaligned
    /// offsets, every byte a function of its offset.
    fn file(
        n_layer: usize,
        n_expert: usize,
        sizes: [usize; 3],
    ) -> (PathBuf, Vec<Vec<ExpertRanges>>) {
        let path = std::env::temp_dir().join(format!(
            "snug-experts-{}-{}.bin",
            std::process::id(),
            sizes[0]
        ));
        let mut off = 100;
        let mut ranges = vec![vec![[(0, 0); 3]; n_expert]; n_layer];
        for (m, &size) in sizes.iter().enumerate() {
            for l in ranges.iter_mut() {
                for e in l.iter_mut() {
                    e[m] = (off, size);
                    off += size;
                }
            }
            off += 32;
        }
        let bytes: Vec<u8> = (0..off + 7).map(byte).collect();
        std::fs::write(&path, bytes).unwrap();
        (path, ranges)
    }

    fn byte(i: usize) -> u8 {
        (i.wrapping_mul(2_654_435_761) >> 13) as u8
    }

    #[test]
    fn held_experts_read_back_and_the_least_recently_used_slot_is_reused() {
        let (path, ranges) = file(2, 6, [9000, 9000, 5000]);
        let slot = ranges.iter().flatten().map(slot_bytes).max().unwrap();
        let cache = ExpertCache::new(&path, ranges.clone(), 3 * slot as u64 + 100).unwrap();
        assert_eq!(cache.slots(), 3);
        let check = |h: &Held, il: usize, e: u32| {
            let got = h.get(e).unwrap();
            for (m, part) in got.iter().enumerate() {
                let (off, len) = ranges[il][e as usize][m];
                assert_eq!(part.len(), len);
                assert!(part.iter().enumerate().all(|(i, &b)| b == byte(off + i)), "{il} {e} {m}");
            }
        };
        {
            let h = cache.hold(1, &[4, 0, 2]).unwrap();
            for e in [4, 0, 2] {
                check(&h, 1, e);
            }
        }
        assert_eq!(cache.stats().misses.load(Ordering::Relaxed), 3);
        // Expert 0 used again: a hit, and now the most recent; the next miss takes 4's slot.
        drop(cache.hold(1, &[0]).unwrap());
        let h = cache.hold(0, &[5]).unwrap();
        check(&h, 0, 5);
        drop(h);
        assert_eq!(cache.stats().hits.load(Ordering::Relaxed), 1);
        let h = cache.hold(1, &[0, 2]).unwrap();
        check(&h, 1, 0);
        check(&h, 1, 2);
        drop(h);
        assert_eq!(cache.stats().hits.load(Ordering::Relaxed), 3, "0 and 2 stayed");
        drop(cache.hold(1, &[4]).unwrap());
        assert_eq!(cache.stats().misses.load(Ordering::Relaxed), 5, "4 was the one reused");
        // A hold takes the list of slots the last one gave back: decoding allocates nothing.
        // (`taken` would take the freed list's memory if the list were freed.)
        let first = cache.hold(0, &[1, 2]).unwrap();
        let (list, cap) = (first.slots.as_ptr(), first.slots.capacity());
        drop(first);
        let taken: Vec<(u32, usize)> = Vec::with_capacity(cap);
        assert_eq!(cache.hold(1, &[3]).unwrap().slots.as_ptr(), list);
        drop(taken);
        assert!(cache.hold(1, &[1, 2, 3, 5]).is_err(), "more than the slots at once");
        assert!(cache.hold(2, &[0]).is_err(), "no such layer");
        drop(cache);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn experts_past_the_end_of_the_file_are_errors_not_hangs() {
        let (path, mut ranges) = file(1, 2, [3000, 3000, 3000]);
        let cache = ExpertCache::new(&path, ranges.clone(), 1 << 20).unwrap();
        // Cut short under the running cache: expert 1's down block ends past the end.
        let (off, _) = ranges[0][1][2];
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(off as u64 + 10)
            .unwrap();
        let h = cache.hold(0, &[1, 0]).unwrap();
        assert!(h.get(0).is_ok());
        let e = h.get(1).err();
        drop(h);
        assert!(e.as_ref().is_some_and(|e| e.contains("expert 1")), "{e:?}");
        // The next hold reads it again (and fails again), rather than serving half an expert.
        assert!(cache.hold(0, &[1]).unwrap().get(1).is_err());
        drop(cache);
        // A file already short is refused when the cache is made.
        ranges[0][1][2].0 += 1 << 20;
        let e = ExpertCache::new(&path, ranges, 1 << 20).err();
        let _ = std::fs::remove_file(&path);
        assert!(e.is_some_and(|e| e.contains("past the end")));
    }
}
