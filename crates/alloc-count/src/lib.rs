//! A counting global allocator for the "allocates nothing" tests (kernels, decode loop).
//!
//! It counts every allocation (`alloc`, `alloc_zeroed`, `realloc`) made by any thread **except
//! the process's main thread**. libtest runs each test on a thread of its own and keeps its own
//! books on the main thread (the map of running tests, the timeout queue) right after spawning
//! it; on a loaded machine that bookkeeping can land in the middle of the measured window and
//! show up as a handful of allocations the code under test never made (CI saw "4 allocations in
//! 20 steady-state calls" this way). The code under test runs on the test's thread and on the
//! kernel pool's workers, all of which are counted.
//!
//! A test binary installs it with
//! `#[global_allocator] static ALLOC: alloc_count::Counting = alloc_count::Counting;`
//! and reads [`allocations`] before and after the window it checks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

/// Allocations counted so far (see the crate docs for which threads count).
pub fn allocations() -> usize {
    ALLOCS.load(Ordering::SeqCst)
}

/// Forwards to the system allocator, counting allocations made off the main thread.
pub struct Counting;

// Whether this thread's allocations count: 0 = not known yet, 1 = no (main thread), 2 = yes.
// A const-initialized `Cell` has no destructor and never allocates, so reading it inside the
// allocator is safe even while a thread is being torn down.
thread_local!(static COUNTED: Cell<u8> = const { Cell::new(0) });

fn counted() -> bool {
    COUNTED
        .try_with(|c| {
            if c.get() == 0 {
                c.set(if is_main_thread() { 1 } else { 2 });
            }
            c.get() == 2
        })
        .unwrap_or(true)
}

#[cfg(target_os = "linux")]
fn is_main_thread() -> bool {
    // SAFETY: plain syscalls without arguments; the main thread's id equals the process id.
    unsafe { libc::gettid() == libc::getpid() }
}

#[cfg(not(target_os = "linux"))]
fn is_main_thread() -> bool {
    false // no cheap way to tell without allocating: count every thread
}

fn count() {
    if counted() {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
}
