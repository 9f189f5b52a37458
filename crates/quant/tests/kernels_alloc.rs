//! The decode and prefill loops must not allocate: after one warm-up call, `matmul` (activation
//! quantization into the caller's scratch, the pool hand-off, the kernels) allocates nothing.

use std::sync::atomic::{AtomicBool, Ordering};

use quant::kernels::{matmul, MatRef};
use quant::threads::ThreadPool;
use quant::GgmlType;

/// Counts the allocations of the test's thread and the pool's worker (`alloc-count`).
#[global_allocator]
static ALLOC: alloc_count::Counting = alloc_count::Counting;

#[test]
fn matmul_allocates_nothing_after_warm_up() {
    let pool = ThreadPool::new(2);
    // Thread start-up allocates (std's per-thread info); wait until the worker has really run a
    // share itself (the caller takes over the share of a worker that has not started yet).
    let worker_ran = AtomicBool::new(false);
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
        let mat = MatRef { ty, data: &w, rows, cols };
        for m in [1usize, 9, 40] {
            let x = vec![0.5f32; m * cols];
            let mut y = vec![0f32; m * rows];
            let mut scratch = Vec::new();
            matmul(&pool, mat, &x, m, &mut y, &mut scratch).unwrap();
            let before = alloc_count::allocations();
            for _ in 0..20 {
                matmul(&pool, mat, &x, m, &mut y, &mut scratch).unwrap();
            }
            let n = alloc_count::allocations() - before;
            assert_eq!(n, 0, "{ty} m={m}: {n} allocations in 20 steady-state calls");
        }
    }
}
