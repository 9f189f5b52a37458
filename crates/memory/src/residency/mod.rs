//! Residency of the mapped weights: how the model file's pages come into memory and stay there.
//!
//! Three modes are one-shot and live here: `mmap` (nothing to do: pages come in on first touch),
//! `populate` ([`populate`]: every page read in at load) and `mlock` ([`lock_all`]: read in and
//! pinned, within `RLIMIT_MEMLOCK`). The fourth keeps some layers resident and streams the
//! others through memory a stage at a time: the [`Streamer`]; for a mixture of experts its
//! layers are their attention, norms and router, and the experts live in an [`ExpertCache`]
//! under a budget of their own. Every mode runs through a
//! streamer (with every layer pinned it only counts stages), so the pressure governor can move
//! layers between the two sets at any time.
//!
//! Pages are read in by [`READERS`] threads faulting one byte per page, not by
//! `MADV_WILLNEED`: the kernel reads at most one readahead window (`read_ahead_kb`) per
//! `WILLNEED` call and ignores the rest of the range, so one call on a whole layer reads a few
//! MiB and the computing threads' own faults read the rest as two synchronous streams, while the
//! disks this runs on serve several parallel synchronous streams best. Cost: [`READERS`]
//! threads while populating. The measurements behind this are in BENCHMARKS.md (7B in cgroup
//! limits, sessions 4 and 5).

mod experts;
mod pages;
mod stream;

pub use experts::{slot_bytes, ExpertCache, ExpertRanges, ExpertStats, Held};
pub use stream::{LayerObserver, LayerStages, Release, Streamer};

use pages::{outer, touch_pages};

/// Threads that fault pages in: [`populate`]'s, and each streamer's readers. Eight parallel
/// synchronous reads keep a virtual disk busiest; more gain nothing measurable (the sweep is in
/// BENCHMARKS.md, session 5).
pub const READERS: usize = 8;

/// Reads every page of `map` in now, [`READERS`] threads each faulting a contiguous part, so
/// decoding never waits on the disk.
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

/// Leaves exactly the byte ranges `hot` of the file `path` (mapped as `map`) in memory: drops
/// every page of it this process maps and the page cache holds, asks that later faults read only
/// their page (`MADV_RANDOM`), then reads `hot` in. [`READERS`] threads `pread` an equal share
/// each with the file opened for random access (`POSIX_FADV_RANDOM`: no read-ahead past a read,
/// so no folio straddles a neighbouring tensor), then fault the pages in, which finds them cached.
/// For a mixture of experts whose experts an [`ExpertCache`] reads: without this, what the load's
/// faults read around (several MiB each, as large folios that cannot be dropped while their other
/// part is mapped) stays charged against the limit. Cost: whatever else of the file was cached
/// is read again when needed.
pub fn read_in_only(
    path: &std::path::Path,
    map: &[u8],
    hot: &[(usize, usize)],
) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    if let Some((p, n)) = pages::outer(map, 0, map.len()) {
        // SAFETY: the whole read-only file mapping `map` borrows: MADV_RANDOM changes no data,
        // and MADV_DONTNEED of a file mapping's pages loses nothing (they read back from the file).
        unsafe {
            libc::madvise(p, n, libc::MADV_RANDOM);
            libc::madvise(p, n, libc::MADV_DONTNEED);
        }
    }
    // SAFETY: advice on a descriptor we own; DONTNEED drops only clean cached pages nobody maps.
    unsafe {
        libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
        libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_RANDOM);
    }
    let ranges = hot;
    let total: usize = ranges.iter().map(|&(a, b)| b.saturating_sub(a)).sum();
    let part = total.div_ceil(READERS).max(1);
    // The ranges cut into READERS parts of `part` bytes.
    let mut parts: Vec<Vec<(usize, usize)>> = vec![Vec::new()];
    let mut room = part;
    for &(mut a, b) in ranges {
        while a < b {
            let n = (b - a).min(room);
            if let Some(p) = parts.last_mut() {
                p.push((a, a + n));
            }
            (a, room) = (a + n, room - n);
            if room == 0 {
                parts.push(Vec::new());
                room = part;
            }
        }
    }
    let file = &file;
    std::thread::scope(|sc| {
        for p in &parts {
            let read = move || {
                let mut buf = vec![0u8; experts::READ_BYTES];
                for &(lo, hi) in p {
                    for at in (lo..hi).step_by(buf.len()) {
                        let n = buf.len().min(hi - at);
                        // A short or failed read leaves the rest to the page faults below.
                        let _ = file.read_at(&mut buf[..n], at as u64);
                    }
                    touch_pages(map, lo, hi, || false);
                }
            };
            // No thread to be had: read this part here instead.
            if std::thread::Builder::new().spawn_scoped(sc, read).is_err() {
                read();
            }
        }
    });
    Ok(())
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

/// Why pages could not be locked in memory: the facts; the front end says which of its
/// options to change.
#[derive(Debug)]
pub enum LockError {
    /// `RLIMIT_MEMLOCK` (bytes) is below what is to be locked.
    Limit { need: u64, limit: u64 },
    /// The kernel refused `mlock` of this many bytes.
    Refused { bytes: u64, source: std::io::Error },
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Limit { need, limit } => write!(
                f,
                "locking the weights needs {} but RLIMIT_MEMLOCK is {}; raise it (`ulimit -l unlimited`, or LimitMEMLOCK= in a systemd unit)",
                crate::fmt_bytes(*need),
                crate::fmt_bytes(*limit)
            ),
            LockError::Refused { bytes, source } => write!(
                f,
                "mlock of {} failed: {source}; check `ulimit -l` and the memory limit",
                crate::fmt_bytes(*bytes)
            ),
        }
    }
}

impl std::error::Error for LockError {}

/// Locks `[start, end)` of `map` in memory, failing with the numbers if `RLIMIT_MEMLOCK` is too
/// small or the kernel refuses.
pub fn lock_range(map: &[u8], start: usize, end: usize) -> Result<(), LockError> {
    let Some((p, n)) = outer(map, start, end) else {
        return Ok(());
    };
    if !has_ipc_lock() {
        if let Some(lim) = memlock_limit() {
            if (n as u64) > lim {
                return Err(LockError::Limit { need: n as u64, limit: lim });
            }
        }
    }
    // SAFETY: [p, p+n) lies within the live mapping `map` borrows.
    let rc = unsafe { libc::mlock(p, n) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(LockError::Refused { bytes: n as u64, source: e });
    }
    Ok(())
}

/// Locks the whole mapping (`--load mlock`).
pub fn lock_all(map: &[u8]) -> Result<(), LockError> {
    lock_range(map, 0, map.len())
}

fn unlock_range(map: &[u8], start: usize, end: usize) {
    if let Some((p, n)) = outer(map, start, end) {
        // SAFETY: [p, p+n) lies within the live mapping; munlock of unlocked pages is harmless.
        unsafe { libc::munlock(p, n) };
    }
}
