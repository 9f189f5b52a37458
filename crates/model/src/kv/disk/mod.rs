//! The prefix cache's disk tier: full KV blocks written to a directory ([`store`]) so that a
//! later request (after eviction from RAM, or after a restart) reads them back instead of
//! computing them.
//!
//! Design. A block is written when the prefix cache takes it (write-through, so a crash or a
//! kill loses nothing already written) and, if it is not on disk by then, when it is evicted
//! from RAM. The scheduler thread only copies the block's bytes (`[n_layer][block_bytes]`,
//! into a buffer recycled from the writer) and hands them to the tier's writer thread over a
//! bounded queue ([`QUEUE_BYTES`]); when the queue is full the block is not written (counted as
//! skipped), so a stream's step never waits for the disk. Reads happen at admission, on the
//! scheduler thread: after the RAM cache's longest match, the chain is followed on disk block by
//! block (each next address needs only the next 32 tokens), each block read into the tier's
//! buffer and copied into freshly allocated pool blocks, until a block is missing, damaged, or
//! [`READ_DEADLINE`] has passed; whatever was not read is computed as usual. Blocks skipped
//! while the queue was full are offered again when the scheduler goes idle.
//!
//! Cost. A read blocks the scheduler for its transfer: running streams skip steps for that long
//! (qwen2.5-coder-0.5b's f16 KV is 12 KiB a token, so 6k tokens are 70 MB; times in
//! BENCHMARKS.md), against the minutes of prefill it saves. Writes cost the scheduler one copy
//! of each new full block; the I/O and its CRC run on the writer thread. Memory: the queue
//! ([`QUEUE_BYTES`] of blocks, at least two), the block the writer holds and one read buffer:
//! [`heap_bytes`], which the plan counts. A write error (full disk, read-only directory) turns
//! writing off with one warning; reads go on, and every failed read is a recomputation, never a
//! failed request.

pub mod store;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::chain::chain_key;
pub use store::{BlockKey, DiskStats, Store};

/// Bytes of blocks waiting for the writer at most (at least two blocks).
pub const QUEUE_BYTES: usize = 32 << 20;
/// How long one admission may read blocks from disk; the rest of the prompt is computed.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);
/// Directory budget when none is given.
pub const DEFAULT_BUDGET: u64 = 2 << 30;

/// Where and how much: `dir`, `budget` bytes, and `identity`, a salt of the model file (see
/// [`file_identity`]) that every key on disk carries.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    pub dir: PathBuf,
    pub budget: u64,
    pub identity: u64,
}

/// A salt naming a model file as it is now: its canonical path, length and modification time.
/// A file replaced or rewritten gets another, so its old blocks are never found.
pub fn file_identity(path: &Path) -> std::io::Result<u64> {
    let real = std::fs::canonicalize(path)?;
    let meta = std::fs::metadata(&real)?;
    let mtime = meta.modified()?.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut words: Vec<u32> =
        real.as_os_str().as_encoded_bytes().iter().map(|&b| b.into()).collect();
    words.extend([meta.len() as u32, (meta.len() >> 32) as u32]);
    words.extend([mtime.as_secs() as u32, (mtime.as_secs() >> 32) as u32, mtime.subsec_nanos()]);
    Ok(chain_key(0x534e_5547, &words))
}

/// Heap the tier holds at most for blocks of `payload` bytes (all layers): the queue, the
/// block being written and one read buffer.
pub fn heap_bytes(payload: usize) -> usize {
    (queue_blocks(payload) + 2).saturating_mul(payload)
}

fn queue_blocks(payload: usize) -> usize {
    (QUEUE_BYTES / payload.max(1)).max(2)
}

/// The tier: the store, its writer thread and the buffers passed to it (see the module doc).
pub struct DiskTier {
    store: Arc<Store>,
    tx: Option<SyncSender<(BlockKey, Vec<u8>)>>,
    /// Buffers the writer is done with, for the next block (in a mutex only so that the
    /// context stays `Sync`; the scheduler thread alone takes from it).
    free: Mutex<Receiver<Vec<u8>>>,
    writer: Option<JoinHandle<()>>,
    writing: Arc<AtomicBool>,
    /// Blocks queued at most (the channel's slots and the one the writer holds).
    cap: u64,
    /// The read buffer.
    buf: Vec<u8>,
    stats: Arc<DiskStats>,
}

impl DiskTier {
    /// Opens the tier in `cfg.dir` for blocks of `n_layer` × `block_bytes` under store salt
    /// `salt` (the model file's identity mixed with the KV layout), counting into `stats`.
    pub fn open(
        cfg: &DiskConfig,
        salt: u64,
        n_layer: usize,
        block_bytes: usize,
        stats: Arc<DiskStats>,
    ) -> std::io::Result<DiskTier> {
        let store =
            Arc::new(Store::open(&cfg.dir, cfg.budget, salt, n_layer, block_bytes, stats.clone())?);
        let payload = store.payload_bytes();
        let (tx, rx) = mpsc::sync_channel::<(BlockKey, Vec<u8>)>(queue_blocks(payload) - 1);
        let (free_tx, free) = mpsc::sync_channel(queue_blocks(payload) + 1);
        let writing = Arc::new(AtomicBool::new(true));
        let (st, on, dir, left) = (store.clone(), writing.clone(), cfg.dir.clone(), stats.clone());
        let writer = std::thread::Builder::new().name("snug-kv-disk".into()).spawn(move || {
            for (key, data) in rx {
                if on.load(Ordering::Relaxed) {
                    if let Err(e) = st.write(&key, &data) {
                        on.store(false, Ordering::Relaxed);
                        eprintln!(
                            "snug: warning: cannot write the prefix cache's disk tier in {}: {e}; blocks are no longer written there (prompts are computed as usual)",
                            dir.display()
                        );
                    }
                }
                let _ = free_tx.try_send(data);
                left.queued.fetch_sub(1, Ordering::AcqRel);
            }
        })?;
        Ok(DiskTier {
            store,
            tx: Some(tx),
            free: Mutex::new(free),
            writer: Some(writer),
            writing,
            cap: queue_blocks(payload) as u64,
            buf: vec![0; payload],
            stats,
        })
    }

    pub fn stats(&self) -> &Arc<DiskStats> {
        &self.stats
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Queues the block `key` for writing unless it is on disk already; `fill` copies its
    /// bytes (`[n_layer][block_bytes]`) into the buffer it is given. Never waits: with the
    /// queue full or writing off, the block is skipped (and false returned).
    pub fn offer(&mut self, key: BlockKey, fill: impl FnOnce(&mut [u8])) -> bool {
        if self.store.contains(key.key()) {
            return true;
        }
        let full = self.stats.queued.load(Ordering::Acquire) >= self.cap;
        let Some(tx) = self.tx.as_ref().filter(|_| self.writing() && !full) else {
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let free = self.free.get_mut().unwrap_or_else(PoisonError::into_inner);
        let mut data = free.try_recv().unwrap_or_default();
        data.resize(self.store.payload_bytes(), 0);
        fill(&mut data);
        self.stats.queued.fetch_add(1, Ordering::AcqRel);
        match tx.try_send((key, data)) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.stats.queued.fetch_sub(1, Ordering::AcqRel);
                self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// False once a write failed: blocks are no longer written.
    pub fn writing(&self) -> bool {
        self.writing.load(Ordering::Relaxed)
    }

    /// Waits until every block queued is written (or given up), at most `timeout`; true if
    /// none is left.
    pub fn flush(&self, timeout: Duration) -> bool {
        let end = std::time::Instant::now() + timeout;
        while self.stats.queued.load(Ordering::Acquire) > 0 {
            if std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// Reads the block `key` (`[n_layer][block_bytes]`) into the tier's buffer; `None` when it
    /// is not on disk whole and under this key.
    pub fn fetch(&mut self, key: &BlockKey) -> Option<&[u8]> {
        if !self.store.read(key, &mut self.buf) {
            return None;
        }
        self.stats.hits.fetch_add(1, Ordering::Relaxed);
        Some(&self.buf)
    }
}

impl Drop for DiskTier {
    /// Writes what is queued, then ends the writer.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests;
