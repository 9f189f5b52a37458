//! The allocator's free pages handed back to the kernel.
//!
//! glibc keeps memory a thread freed in that thread's arena, and a process has up to eight arenas
//! a core. A server decodes request bodies and loads adapters on its blocking pool, whose
//! threads come and go and so spread over many arenas; each arena then keeps the high-water mark
//! of the largest job it ran, long after the job ended. [`release_free`] returns the whole free
//! pages of every arena (`malloc_trim(0)`): it walks the arenas' free chunks, so callers run it
//! after work that freed a lot (a large body decoded, an adapter dropped), never per token.

/// Returns the allocator's whole free pages to the kernel (a no-op off glibc).
pub fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and madvises the allocator's own free chunks.
    unsafe {
        libc::malloc_trim(0);
    }
}
