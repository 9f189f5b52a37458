//! A persistent thread pool for the matmul kernels: `n - 1` workers plus the calling thread.
//! A job is handed off by bumping a generation counter; workers spin on it briefly (as
//! llama.cpp does) and then park on a condvar, so a hand-off costs ~1 µs and no allocation.
//! Each thread index is a slot claimed once per job by compare-and-swap: when the caller has
//! finished its own share it claims the slots of workers that have not woken yet and runs them
//! itself, so a descheduled worker never stalls a job (on a shared 2-core box this matters).
//! A nested or concurrent `run` (pool already busy) runs its job inline on the calling thread.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins on the generation counter before it parks.
const SPIN_BEFORE_PARK: Duration = Duration::from_micros(200);

/// The job every thread runs: `f(ith, nth)`. Borrowed for the duration of one `run`.
type Job = *const (dyn Fn(usize, usize) + Sync);

struct Shared {
    n_threads: usize,
    /// Bumped once per job; workers run the job when they see a value they have not run.
    generation: AtomicUsize,
    /// The current job. Written only by the `run` holding `busy`, before `generation` is bumped.
    job: UnsafeCell<Option<Job>>,
    /// Per thread index: the last generation whose call of that index was claimed.
    claimed: Vec<Padded>,
    /// Per thread index: the last generation whose call a worker has finished.
    done: Vec<Padded>,
    /// Workers currently parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    /// Set when a worker's call of the job panicked; `run` re-raises the panic.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    shutdown: AtomicBool,
    /// Held by the one `run` that owns the workers right now.
    busy: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

/// An atomic on its own cache line, so workers do not false-share their slots.
#[repr(align(64))]
struct Padded(AtomicUsize);

// SAFETY: `job` is only written by the thread that won `busy`, at the start of a generation,
// when every claimed call of the previous generation has finished; workers read it only after
// claiming a slot of the generation they observed (Acquire pairs with the writer's SeqCst bump),
// and `run` does not return (so the job is not replaced) until every claimed call is done.
unsafe impl Sync for Shared {}
// SAFETY: the raw job pointer is only dereferenced by a worker holding a claim of the current
// generation, while the `run` that set it waits for that claim's `done`, so the closure it
// points to is alive and `Sync`.
unsafe impl Send for Shared {}

/// A fixed set of threads that all run the same closure, split by thread index.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl ThreadPool {
    /// A pool of `n_threads` (at least 1): the caller of [`ThreadPool::run`] is thread 0 and
    /// `n_threads - 1` persistent workers are started now.
    pub fn new(n_threads: usize) -> Self {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads,
            generation: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            claimed: (0..n_threads).map(|_| Padded(AtomicUsize::new(0))).collect(),
            done: (0..n_threads).map(|_| Padded(AtomicUsize::new(0))).collect(),
            sleepers: AtomicUsize::new(0),
            panic: Mutex::new(None),
            shutdown: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|ith| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("snug-worker-{ith}"))
                    .spawn(move || worker_loop(&shared, ith))
                    .expect("spawning a kernel worker thread")
            })
            .collect();
        ThreadPool { shared, workers }
    }

    /// Threads that run each job, the caller included.
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Run `f(ith, nth)` once for every `ith` in `0..nth` (nth = [`Self::n_threads`]), the
    /// caller as `ith == 0`, and return when all calls have returned. If the pool is already
    /// running a job (a nested call from inside `f`, or another thread's call), the calls run
    /// one after another on this thread instead. A panic in any call is re-raised here.
    pub fn run<F: Fn(usize, usize) + Sync>(&self, f: F) {
        let sh = &*self.shared;
        let nth = sh.n_threads;
        if nth == 1
            || sh.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err()
        {
            (0..nth).for_each(|ith| f(ith, nth));
            return;
        }
        let job: &(dyn Fn(usize, usize) + Sync) = &f;
        // SAFETY: erasing the lifetime is sound because this function does not return until
        // every call claimed by a worker has finished (the `done` wait below, also on panic), and
        // we own `busy`, so no worker reads `job` concurrently with this write.
        unsafe {
            *sh.job.get() =
                Some(std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + '_), Job>(job));
        }
        let gen = sh.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this wake-up after any worker's check-then-wait.
            drop(sh.lock.lock().unwrap_or_else(|e| e.into_inner()));
            sh.wake.notify_all();
        }
        let mut result = catch_unwind(AssertUnwindSafe(|| f(0, nth)));
        // Run the share of every worker that has not started yet; wait for the others.
        for ith in 1..nth {
            if claim(&sh.claimed[ith].0, gen) {
                let r = catch_unwind(AssertUnwindSafe(|| f(ith, nth)));
                if result.is_ok() {
                    result = r;
                }
                continue;
            }
            let mut spins = 0u32;
            while sh.done[ith].0.load(Ordering::Acquire) != gen {
                spins += 1;
                if spins < 1 << 14 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        // SAFETY: no claimed call is running; clear the job so no dangling pointer remains.
        unsafe { *sh.job.get() = None };
        let theirs = sh.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        sh.busy.store(false, Ordering::Release);
        if let Err(p) = result {
            resume_unwind(p);
        }
        if let Some(p) = theirs {
            resume_unwind(p);
        }
    }
}

/// Claim a slot for generation `gen`: true if nobody (caller or worker) has claimed it yet.
fn claim(slot: &AtomicUsize, gen: usize) -> bool {
    let mut cur = slot.load(Ordering::Acquire);
    while cur < gen {
        match slot.compare_exchange_weak(cur, gen, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
    false
}

fn worker_loop(sh: &Shared, ith: usize) {
    let mut seen = 0usize;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        let gen = loop {
            let g = sh.generation.load(Ordering::Acquire);
            if g != seen || sh.shutdown.load(Ordering::Acquire) {
                break g;
            }
            spins = spins.wrapping_add(1);
            if spins & 255 != 0 || start.elapsed() < SPIN_BEFORE_PARK {
                std::hint::spin_loop();
                continue;
            }
            // Park: announce ourselves, then re-check under the lock so a bump that happened
            // before `run` read `sleepers` is not missed.
            let mut guard = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.sleepers.fetch_add(1, Ordering::SeqCst);
            while sh.generation.load(Ordering::SeqCst) == seen
                && !sh.shutdown.load(Ordering::SeqCst)
            {
                guard = sh.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            sh.sleepers.fetch_sub(1, Ordering::SeqCst);
        };
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = gen;
        if !claim(&sh.claimed[ith].0, gen) {
            continue; // the caller already ran this share (we woke late)
        }
        // SAFETY: `run` wrote this generation's job before bumping `generation` (observed above
        // with Acquire), and with the slot claimed it waits for our `done` before returning.
        let job = unsafe { *sh.job.get() };
        if let Some(job) = job {
            // SAFETY: see above; the pointer is valid for the whole call.
            let f = unsafe { &*job };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(ith, sh.n_threads))) {
                *sh.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
            }
        }
        sh.done[ith].0.store(gen, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    /// Stops and joins every worker.
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        drop(self.shared.lock.lock().unwrap_or_else(|e| e.into_inner()));
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool").field("n_threads", &self.n_threads()).finish()
    }
}
