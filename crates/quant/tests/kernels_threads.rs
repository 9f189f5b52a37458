//! ThreadPool: every index runs exactly once per job, back-to-back and nested jobs work, panics
//! propagate, and dropping the pool joins its workers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use quant::threads::ThreadPool;

#[test]
fn every_thread_index_runs_exactly_once_per_job() {
    for n in [1, 2, 3, 5] {
        let pool = ThreadPool::new(n);
        assert_eq!(pool.n_threads(), n);
        for _ in 0..200 {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(|ith, nth| {
                assert_eq!(nth, n);
                hits[ith].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }
}

#[test]
fn all_work_items_are_done_exactly_once_when_split_by_thread() {
    let pool = ThreadPool::new(3);
    let items: Vec<AtomicUsize> = (0..1001).map(|_| AtomicUsize::new(0)).collect();
    pool.run(|ith, nth| {
        for i in (ith..items.len()).step_by(nth) {
            items[i].fetch_add(1, Ordering::Relaxed);
        }
    });
    assert!(items.iter().all(|h| h.load(Ordering::Relaxed) == 1));
}

#[test]
fn jobs_after_workers_have_parked_still_run() {
    let pool = ThreadPool::new(2);
    let count = AtomicUsize::new(0);
    for _ in 0..3 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        pool.run(|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
    }
    assert_eq!(count.load(Ordering::Relaxed), 6);
}

#[test]
fn a_nested_run_executes_inline_without_deadlock() {
    let pool = ThreadPool::new(2);
    let count = AtomicUsize::new(0);
    pool.run(|_, _| {
        pool.run(|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
    });
    assert_eq!(count.load(Ordering::Relaxed), 4);
}

#[test]
fn concurrent_runs_from_two_threads_each_complete() {
    let pool = Arc::new(ThreadPool::new(2));
    let count = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (pool, count) = (Arc::clone(&pool), Arc::clone(&count));
            std::thread::spawn(move || {
                for _ in 0..500 {
                    pool.run(|_, _| {
                        count.fetch_add(1, Ordering::Relaxed);
                    });
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    assert_eq!(count.load(Ordering::Relaxed), 2 * 500 * 2);
}

#[test]
fn a_panic_in_a_worker_reaches_the_caller_and_the_pool_still_works() {
    let pool = ThreadPool::new(2);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.run(|ith, _| assert_ne!(ith, 1, "worker fails"));
    }));
    assert!(r.is_err());
    let count = AtomicUsize::new(0);
    pool.run(|_, _| {
        count.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(count.load(Ordering::Relaxed), 2);
}

#[test]
fn dropping_the_pool_joins_its_workers() {
    let marker = Arc::new(());
    let pool = ThreadPool::new(4);
    let m = Arc::clone(&marker);
    pool.run(move |_, _| {
        let _ = &m;
    });
    drop(pool);
    // The job (and its clone of the Arc) is gone and every worker has exited.
    assert_eq!(Arc::strong_count(&marker), 1);
}
