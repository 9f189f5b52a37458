//! Sharing a raw output pointer with the thread pool: each work item owns one disjoint part.

/// A raw output pointer handed to pool threads, each of which touches only its own disjoint
/// part (as documented at every dereference).
pub(crate) struct SendPtr(pub *mut f32);
// SAFETY: the pointer is only dereferenced for disjoint regions, as described at each use.
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}
