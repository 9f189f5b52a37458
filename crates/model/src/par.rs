//! Splitting an output buffer across the thread pool: each work item owns one disjoint chunk.

use quant::threads::ThreadPool;

/// Calls `f(ith, i, chunk_i)` (ith: the running thread's index) for every `chunk_len`-sized chunk of `out`, spread over the pool's
/// threads (item i goes to thread i mod nth). Chunks are disjoint, so each is handed out as
/// `&mut` exactly once.
pub fn for_each_chunk_mut<F>(pool: &ThreadPool, out: &mut [f32], chunk_len: usize, f: F)
where
    F: Fn(usize, usize, &mut [f32]) + Sync,
{
    assert!(chunk_len > 0 && out.len() % chunk_len == 0);
    let n_items = out.len() / chunk_len;
    let base = SendPtr(out.as_mut_ptr());
    pool.run(|ith, nth| {
        let base = &base;
        let mut i = ith;
        while i < n_items {
            // SAFETY: item i covers [i*chunk_len, (i+1)*chunk_len), inside `out` (checked by the
            // assert above) and disjoint from every other item; each item is visited by exactly
            // one thread (i ≡ ith mod nth), and `out` stays mutably borrowed until `run` returns.
            let chunk = unsafe { std::slice::from_raw_parts_mut(base.0.add(i * chunk_len), chunk_len) };
            f(ith, i, chunk);
            i += nth;
        }
    });
}

struct SendPtr(*mut f32);
// SAFETY: the pointer is only dereferenced for disjoint chunks as described above.
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}
