//! The file mapping as a shareable owner: what lets other threads (the weight streamer's readers)
//! keep the mapping alive and work on its pages without borrowing the [`crate::GgufFile`].

use std::fs::File;
use std::sync::Arc;

/// A read-only mapping of a whole file. Cloning is cheap (an `Arc`); the mapping lives until the
/// last clone is dropped. Only [`Mapping::open`] makes one, so it is always a read-only mapping of
/// a file: dropping its pages (`MADV_DONTNEED`, `POSIX_FADV_DONTNEED`) loses nothing, the next
/// read faults them in again from the file. Dereferences to the file's bytes.
#[derive(Clone)]
pub struct Mapping(Arc<memmap2::Mmap>);

impl Mapping {
    /// Maps `file` read-only.
    pub fn open(file: &File) -> std::io::Result<Mapping> {
        // SAFETY: the mapping is read-only. If another process truncates or rewrites the file
        // while it is mapped, reads of the lost pages raise SIGBUS or see the new bytes; that is
        // the accepted contract of every mmap-based model loader (llama.cpp included).
        let map = unsafe { memmap2::Mmap::map(file) }?;
        Ok(Mapping(Arc::new(map)))
    }

    /// Takes the pages this process has touched out of its resident set (`MADV_DONTNEED`). The
    /// page cache keeps them, so the next read faults them back in from memory or the file. For
    /// a file read once and converted (an adapter made hot), so its bytes stop counting twice.
    pub fn release_resident(&self) {
        // SAFETY: a read-only file mapping (see the type's doc): dropping its pages loses
        // nothing, every later read sees the file's bytes again.
        #[cfg(unix)]
        let _ = unsafe { self.0.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
    }

    /// The mapping itself (for `madvise` hints).
    pub(crate) fn mmap(&self) -> &memmap2::Mmap {
        &self.0
    }
}

impl std::ops::Deref for Mapping {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}
