//! Page arithmetic on a mapping and faulting pages in: the primitives the one-shot modes and
//! the streamer share.

/// The system page size (4096 if `sysconf` cannot say).
pub(super) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// `[start, end)` of `map` widened to whole pages (for readahead and locking).
pub(super) fn outer(map: &[u8], start: usize, end: usize) -> Option<(*mut libc::c_void, usize)> {
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
pub(super) fn inner(map: &[u8], start: usize, end: usize) -> Option<(*mut libc::c_void, usize)> {
    let ps = page_size();
    let base = map.as_ptr() as usize;
    let a = (base + start + ps - 1) & !(ps - 1);
    let b = (base + end.min(map.len())) & !(ps - 1);
    (a < b).then_some((a as *mut libc::c_void, b - a))
}

/// Reads one byte of every page of `map[lo..hi]` (a page fault each where not resident), asking
/// `stop()` before each page whether to go on.
pub(super) fn touch_pages(map: &[u8], lo: usize, hi: usize, stop: impl Fn() -> bool) {
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
