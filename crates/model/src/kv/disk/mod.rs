//! The prefix cache's disk tier: full KV blocks written to a directory ([`store`]) so that a
//! later request (after eviction from RAM, or after a restart) reads them back instead of
//! computing them.
//!
//! Design. A block is written when the prefix cache takes it (write-through, so a crash or a
//! kill loses nothing already written) and, if it is not on disk by then, when it is evicted
//! from RAM. The scheduler thread only copies the block's bytes (`[n_layer][block_bytes]`) into
//! one of a fixed set of buffers made resident at open and hands it to the tier's writer thread
//! over a bounded queue ([`QUEUE_BYTES`]); with no buffer free (the queue full) the block is
//! not written (counted as skipped), so a stream's step never waits for the disk nor allocates.
//! Blocks skipped so are offered again when the scheduler goes idle. Reads run on the tier's
//! reader thread ([`reader`]): at admission, past the RAM cache's longest match, the owner asks
//! for the rest of the prompt's chain ([`DiskTier::request`], when the next block may be on
//! disk) and the sequence waits, off the steps, while the thread reads block after block and
//! sends each back; the owner copies each into pool blocks between steps
//! (`KvCache::prefix_restore_poll`). The chain ends at a block missing or damaged, or at the
//! deadline ([`DiskConfig::read_deadline`], [`READ_DEADLINE`] by default); whatever was not read
//! is computed as usual.
//!
//! Cost. The scheduler thread copies each block once each way (qwen2.5-coder-0.5b's f16 KV is
//! 12 KiB a token, so a 32-token block is 384 KiB, some tens of µs); the I/O and its CRC run on
//! the tier's threads, so running streams keep stepping while blocks load (times in
//! BENCHMARKS.md). Memory: the write buffers ([`QUEUE_BYTES`] of blocks, at least two) and the
//! read buffers ([`reader::READ_BYTES`], at least two), resident from the start so the peak
//! does not depend on the disk's traffic: [`heap_bytes`], which the plan counts.
//! A write error (full disk, read-only directory) turns writing off with one warning; reads go
//! on, and every failed read is a recomputation, never a failed request.

pub mod reader;
pub mod store;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::chain::chain_key;
pub use reader::{Arrival, Pending, ReadTicket};
pub use store::{BlockKey, DiskStats, Store};

/// Bytes of blocks waiting for the writer at most (at least two blocks).
pub const QUEUE_BYTES: usize = 16 << 20;
/// How long a prompt waits for its blocks from disk by default; the rest of it is computed.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);
/// Directory budget when none is given.
pub const DEFAULT_BUDGET: u64 = 2 << 30;

/// Where and how much: `dir`, `budget` bytes, `identity`, a salt of the model file (see
/// [`file_identity`]) that every key on disk carries, and how long a prompt waits for its
/// blocks.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    pub dir: PathBuf,
    pub budget: u64,
    pub identity: u64,
    pub read_deadline: Duration,
}

impl DiskConfig {
    /// The tier in `dir` of `budget` bytes for the model file of identity `identity`, waiting
    /// [`READ_DEADLINE`] for a prompt's blocks.
    pub fn new(dir: PathBuf, budget: u64, identity: u64) -> DiskConfig {
        DiskConfig { dir, budget, identity, read_deadline: READ_DEADLINE }
    }
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

/// Heap the tier holds at most for blocks of `payload` bytes (all layers): its write buffers
/// (the queue and the block being written) and its read buffers.
pub fn heap_bytes(payload: usize) -> usize {
    (queue_blocks(payload) + reader::read_blocks(payload)).saturating_mul(payload)
}

fn queue_blocks(payload: usize) -> usize {
    (QUEUE_BYTES / payload.max(1)).max(2)
}

/// The tier: the store, its writer thread and the buffers passed to it (see the module doc).
pub struct DiskTier {
    store: Arc<Store>,
    tx: Option<SyncSender<(BlockKey, Vec<u8>)>>,
    /// Write buffers free for the next block, all made at open (in a mutex only so that the
    /// context stays `Sync`; the scheduler thread alone takes from it).
    free: Mutex<Receiver<Vec<u8>>>,
    writer: Option<JoinHandle<()>>,
    writing: Arc<AtomicBool>,
    /// Blocks queued at most (the channel's slots and the one the writer holds).
    cap: u64,
    reader: reader::Reader,
    read_deadline: Duration,
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
        let (free_tx, free) = mpsc::sync_channel(queue_blocks(payload));
        for _ in 0..queue_blocks(payload) {
            let _ = free_tx.try_send(reader::resident(payload));
        }
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
        let reader = reader::Reader::start(store.clone(), stats.clone())?;
        Ok(DiskTier {
            store,
            tx: Some(tx),
            free: Mutex::new(free),
            writer: Some(writer),
            writing,
            cap: queue_blocks(payload) as u64,
            reader,
            read_deadline: cfg.read_deadline,
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
    /// bytes (`[n_layer][block_bytes]`) into the buffer it is given. Never waits nor
    /// allocates: with no write buffer free (the queue full) or writing off, the block is
    /// skipped (and false returned).
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
        let Ok(mut data) = free.try_recv() else {
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return false;
        };
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

    /// True if the block with chain key `key` may be on disk: this process knows its file, or
    /// a file is at its address (another server's, on the same directory).
    pub fn may_hold(&self, key: u64) -> bool {
        self.store.contains(key) || self.store.exists(key)
    }

    /// Asks the reader thread for the blocks `keys` (`[n_layer][block_bytes]` each), in order,
    /// for at most the configured deadline; `None` when too many requests wait already. The
    /// blocks come back through [`DiskTier::arrival`].
    pub fn request(&mut self, keys: Vec<BlockKey>) -> Option<ReadTicket> {
        self.reader.request(keys, Instant::now() + self.read_deadline)
    }

    /// How long a request may read.
    pub fn read_deadline(&self) -> Duration {
        self.read_deadline
    }

    /// The next block read (or end of a request), waiting up to `wait` for one.
    pub fn arrival(&mut self, wait: Duration) -> Option<Arrival> {
        self.reader.arrival(wait)
    }

    /// Gives an arrival's buffer back to the reader.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.reader.recycle(buf);
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
