//! A persistent thread pool for the matmul kernels: `n - 1` workers plus the calling thread.
//! A job is handed off by bumping a generation counter; workers spin on it briefly (as
//! llama.cpp does) and then park on a condvar, so a hand-off costs ~1 µs and no allocation.
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
    /// Workers that have not yet finished the current job.
    pending: AtomicUsize,
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

// SAFETY: `job` is only written by the thread that won `busy` while no worker reads it (all
// workers have finished the previous generation: `pending == 0`), and only read by workers after
// they observe the new `generation` (Acquire pairs with the writer's SeqCst bump).
unsafe impl Sync for Shared {}
// SAFETY: the raw job pointer is only dereferenced while the `run` that set it is blocked
// waiting for the workers, so the closure it points to is alive and `Sync`.
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
            pending: AtomicUsize::new(0),
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
            || sh
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            (0..nth).for_each(|ith| f(ith, nth));
            return;
        }
        let job: &(dyn Fn(usize, usize) + Sync) = &f;
        // SAFETY: erasing the lifetime is sound because this function does not return until
        // every worker has finished calling the job (`pending` reaches 0 below, also on panic),
        // and we own `busy`, so no worker reads `job` concurrently with this write.
        unsafe {
            *sh.job.get() = Some(std::mem::transmute::<
                *const (dyn Fn(usize, usize) + Sync + '_),
                Job,
            >(job));
        }
        sh.pending.store(nth - 1, Ordering::Relaxed);
        sh.generation.fetch_add(1, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this wake-up after any worker's check-then-wait.
            drop(sh.lock.lock().unwrap_or_else(|e| e.into_inner()));
            sh.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, nth)));
        let mut spins = 0u32;
        while sh.pending.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        // SAFETY: all workers are done with the job; clear it so no dangling pointer remains.
        unsafe { *sh.job.get() = None };
        let theirs = sh.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        sh.busy.store(false, Ordering::Release);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if let Some(p) = theirs {
            resume_unwind(p);
        }
    }
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
            if spins % 256 != 0 || start.elapsed() < SPIN_BEFORE_PARK {
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
        // SAFETY: `run` wrote the job before bumping `generation` (observed above with Acquire)
        // and keeps the closure alive until `pending` reaches 0, which we only signal after the
        // call.
        let job = unsafe { *sh.job.get() };
        if let Some(job) = job {
            // SAFETY: see above; the pointer is valid for the whole call.
            let f = unsafe { &*job };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(ith, sh.n_threads))) {
                *sh.panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
            }
        }
        sh.pending.fetch_sub(1, Ordering::Release);
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
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads())
            .finish()
    }
}
