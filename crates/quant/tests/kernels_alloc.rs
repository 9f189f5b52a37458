//! The decode and prefill loops must not allocate: after one warm-up call, `matmul` (activation
//! quantization into the caller's scratch, the pool hand-off, the kernels) allocates nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use quant::kernels::{matmul, MatRef};
use quant::threads::ThreadPool;
use quant::GgmlType;

/// Counts every allocation in this test binary (all threads).
struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn matmul_allocates_nothing_after_warm_up() {
    let pool = ThreadPool::new(2);
    // Thread start-up allocates (std's per-thread info); wait until the worker has really run a
    // share itself (the caller takes over the share of a worker that has not started yet).
    let worker_ran = std::sync::atomic::AtomicBool::new(false);
    while !worker_ran.load(Ordering::Relaxed) {
        pool.run(|ith, _| {
            if ith == 1 && std::thread::current().name() == Some("snug-worker-1") {
                worker_ran.store(true, Ordering::Relaxed);
            }
        });
    }
    let (rows, cols) = (64, 512);
    for ty in [GgmlType::Q4K, GgmlType::Q8_0, GgmlType::F16] {
        let w = vec![0u8; ty.row_bytes(cols).unwrap() * rows];
        let mat = MatRef {
            ty,
            data: &w,
            rows,
            cols,
        };
        for m in [1usize, 9, 40] {
            let x = vec![0.5f32; m * cols];
            let mut y = vec![0f32; m * rows];
            let mut scratch = Vec::new();
            matmul(&pool, mat, &x, m, &mut y, &mut scratch).unwrap();
            let before = ALLOCS.load(Ordering::Relaxed);
            for _ in 0..20 {
                matmul(&pool, mat, &x, m, &mut y, &mut scratch).unwrap();
            }
            let n = ALLOCS.load(Ordering::Relaxed) - before;
            assert_eq!(n, 0, "{ty} m={m}: {n} allocations in 20 steady-state calls");
        }
    }
}
