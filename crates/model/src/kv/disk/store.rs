//! The disk tier's directory: one file per KV block, named by the block's address, written once
//! (to a temporary name in the same directory, then renamed), read back only when its header
//! repeats the whole key asked for and its checksum holds.
//!
//! File layout (little-endian): [`HEADER_BYTES`] of header — magic, format version, the store
//! salt (model file identity, KV precisions, rotation, block layout), the chain seed (adapter
//! salt and rotation), the parent's chain key, the block's 32 tokens, layers and bytes per
//! layer — then `[n_layer][block_bytes]` KV bytes exactly as the pool holds them, then a CRC-32
//! of everything before it. A file of any other length, magic, version or key, or whose
//! checksum fails, is deleted and counted as dropped: the block is computed again.
//!
//! Budget: an index (address → bytes, last use) is rebuilt from the directory at open (oldest
//! modification time first) and kept by every write and read; a write first deletes the least
//! recently used files until it fits. Two servers on one directory each keep their own index:
//! files are content-addressed and written once, so they never see a half-written or another
//! key's block, but the directory may hold up to the sum of their budgets until one restarts.
//!
//! Cost: per file 20 bytes of index and two map slots; a read or a write is one open, one
//! sequential transfer of the block and a CRC-32 pass over it (several GB/s).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::kv::chain::{chain_key, BLOCK_TOKENS};

/// First bytes of every block file.
pub const MAGIC: [u8; 8] = *b"SNUGKVB\0";
/// Format version: a file of another version is dropped.
pub const VERSION: u32 = 1;
/// Bytes before the KV bytes: magic, version, four keys, the tokens, layers, bytes per layer.
pub const HEADER_BYTES: usize = 8 + 4 + 4 * 8 + 4 * BLOCK_TOKENS + 4 + 4;
/// A block file's name ends so; a file being written ends in `.tmp`.
pub const EXT: &str = "kv";
/// A temporary file older than this was left by a process that died while writing.
const STALE_TMP: Duration = Duration::from_secs(600);

/// The full key of a cached block: chain seed (adapter salt, rotation), parent chain key and
/// tokens. Its chain key is [`BlockKey::key`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockKey {
    pub seed: u64,
    pub parent: u64,
    pub tokens: [u32; BLOCK_TOKENS],
}

impl BlockKey {
    pub fn key(&self) -> u64 {
        chain_key(self.parent, &self.tokens)
    }
}

/// The tier's counters (read by `/metrics`).
#[derive(Debug, Default)]
pub struct DiskStats {
    /// Blocks read back from disk.
    pub hits: AtomicU64,
    /// Admissions that looked on disk past the RAM cache's match and found no block.
    pub misses: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Files dropped as damaged, truncated or foreign.
    pub dropped: AtomicU64,
    /// Blocks not written because the queue was full or writing was off.
    pub skipped: AtomicU64,
    /// Blocks queued for the writer and not yet written (or given up).
    pub queued: AtomicU64,
    /// Block files and their bytes in the directory (as this process knows them).
    pub files: AtomicU64,
    pub bytes: AtomicU64,
}

/// Files by address, with their sizes and last use.
#[derive(Default)]
struct Index {
    files: HashMap<u64, (u64, u64)>,
    /// last use → address, oldest first.
    lru: BTreeMap<u64, u64>,
    bytes: u64,
    tick: u64,
}

impl Index {
    fn touch(&mut self, addr: u64, size: u64) {
        self.tick += 1;
        if let Some((old_size, t)) = self.files.insert(addr, (size, self.tick)) {
            self.lru.remove(&t);
            self.bytes -= old_size;
        }
        self.lru.insert(self.tick, addr);
        self.bytes += size;
    }

    fn forget(&mut self, addr: u64) {
        if let Some((size, t)) = self.files.remove(&addr) {
            self.lru.remove(&t);
            self.bytes -= size;
        }
    }
}

/// One directory of block files for one store salt (see the module doc).
pub struct Store {
    dir: PathBuf,
    budget: u64,
    salt: u64,
    n_layer: usize,
    block_bytes: usize,
    index: Mutex<Index>,
    stats: Arc<DiskStats>,
}

impl Store {
    /// Opens (creating it if needed) `dir` for blocks of `n_layer` × `block_bytes` under store
    /// salt `salt`, and indexes the block files there; more than `budget` bytes of them are
    /// trimmed, oldest first.
    pub fn open(
        dir: &Path,
        budget: u64,
        salt: u64,
        n_layer: usize,
        block_bytes: usize,
        stats: Arc<DiskStats>,
    ) -> io::Result<Store> {
        fs::create_dir_all(dir)?;
        let store = Store {
            dir: dir.to_path_buf(),
            budget,
            salt,
            n_layer,
            block_bytes,
            index: Mutex::new(Index::default()),
            stats,
        };
        let mut found = Vec::new();
        for e in fs::read_dir(dir)?.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let Ok(meta) = e.metadata() else { continue };
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if name.ends_with(".tmp") {
                if mtime.elapsed().is_ok_and(|age| age > STALE_TMP) {
                    let _ = fs::remove_file(e.path());
                }
                continue;
            }
            if let Some(addr) = parse_name(name) {
                found.push((mtime, addr, meta.len()));
            }
        }
        found.sort_unstable();
        {
            let mut ix = store.lock();
            for (_, addr, size) in found {
                ix.touch(addr, size);
            }
            store.trim(&mut ix, 0);
        }
        store.publish();
        Ok(store)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes of one block file.
    pub fn file_bytes(&self) -> u64 {
        (HEADER_BYTES + self.n_layer * self.block_bytes + 4) as u64
    }

    /// Bytes of KV in one block (all layers).
    pub fn payload_bytes(&self) -> usize {
        self.n_layer * self.block_bytes
    }

    /// The address (file name) of the block with chain key `key` under this store's salt.
    pub fn addr(&self, key: u64) -> u64 {
        chain_key(self.salt, &[key as u32, (key >> 32) as u32])
    }

    fn path(&self, addr: u64) -> PathBuf {
        self.dir.join(format!("{addr:016x}.{EXT}"))
    }

    /// True if this process knows a file at `key`'s address.
    pub fn contains(&self, key: u64) -> bool {
        self.lock().files.contains_key(&self.addr(key))
    }

    /// True if a file is at `key`'s address, known to this process or not.
    pub fn exists(&self, key: u64) -> bool {
        self.path(self.addr(key)).exists()
    }

    /// Files indexed and their bytes.
    pub fn usage(&self) -> (usize, u64) {
        let ix = self.lock();
        (ix.files.len(), ix.bytes)
    }

    fn publish(&self) {
        let (files, bytes) = self.usage();
        self.stats.files.store(files as u64, Ordering::Relaxed);
        self.stats.bytes.store(bytes, Ordering::Relaxed);
    }

    /// Deletes least-recently-used files until `incoming` more bytes fit the budget.
    fn trim(&self, ix: &mut Index, incoming: u64) {
        while ix.bytes.saturating_add(incoming) > self.budget {
            let Some((_, &addr)) = ix.lru.iter().next() else { break };
            ix.forget(addr);
            let _ = fs::remove_file(self.path(addr));
        }
    }

    /// Writes the block `key` holding `data` (`[n_layer][block_bytes]`), unless a file is at
    /// its address already; a block larger than the whole budget is skipped. An error (a full
    /// disk, a read-only directory) leaves no file behind.
    pub fn write(&self, key: &BlockKey, data: &[u8]) -> io::Result<()> {
        debug_assert_eq!(data.len(), self.payload_bytes());
        let addr = self.addr(key.key());
        let size = self.file_bytes();
        {
            let mut ix = self.lock();
            if ix.files.contains_key(&addr) || size > self.budget {
                return Ok(());
            }
            self.trim(&mut ix, size);
        }
        let header = self.header(key);
        let mut crc = crc32fast::Hasher::new();
        crc.update(&header);
        crc.update(data);
        let tmp = self.dir.join(format!(".{addr:016x}.{}.tmp", std::process::id()));
        let written = (|| {
            let mut f = File::create(&tmp)?;
            f.write_all(&header)?;
            f.write_all(data)?;
            f.write_all(&crc.finalize().to_le_bytes())?;
            f.flush()?;
            drop(f);
            fs::rename(&tmp, self.path(addr))
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        self.lock().touch(addr, size);
        self.stats.bytes_written.fetch_add(size, Ordering::Relaxed);
        self.publish();
        Ok(())
    }

    fn header(&self, key: &BlockKey) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        let mut at = 0;
        let mut put = |b: &[u8]| {
            h[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        };
        put(&MAGIC);
        put(&VERSION.to_le_bytes());
        for k in [self.salt, key.seed, key.parent, key.key()] {
            put(&k.to_le_bytes());
        }
        for t in key.tokens {
            put(&t.to_le_bytes());
        }
        put(&(self.n_layer as u32).to_le_bytes());
        put(&(self.block_bytes as u32).to_le_bytes());
        h
    }

    /// Reads the block `key` into `out` (`[n_layer][block_bytes]`). False when there is no file
    /// at its address, or when the file is not exactly that block (wrong length, magic,
    /// version or key, or a failed checksum): such a file is deleted and counted as dropped.
    pub fn read(&self, key: &BlockKey, out: &mut [u8]) -> bool {
        let addr = self.addr(key.key());
        let path = self.path(addr);
        let Ok(mut f) = File::open(&path) else {
            self.lock().forget(addr);
            return false;
        };
        let size = self.file_bytes();
        let ok = (|| {
            if f.metadata().ok()?.len() != size || out.len() != self.payload_bytes() {
                return None;
            }
            let mut header = [0u8; HEADER_BYTES];
            f.read_exact(&mut header).ok()?;
            if header != self.header(key) {
                return None;
            }
            f.read_exact(out).ok()?;
            let mut sum = [0u8; 4];
            f.read_exact(&mut sum).ok()?;
            let mut crc = crc32fast::Hasher::new();
            crc.update(&header);
            crc.update(out);
            (crc.finalize() == u32::from_le_bytes(sum)).then_some(())
        })();
        if ok.is_none() {
            self.drop_file(addr);
            return false;
        }
        // The last use survives a restart: the index is rebuilt by modification time.
        let _ = f.set_modified(SystemTime::now());
        self.lock().touch(addr, size);
        self.stats.bytes_read.fetch_add(size, Ordering::Relaxed);
        self.publish();
        true
    }

    fn drop_file(&self, addr: u64) {
        self.lock().forget(addr);
        let _ = fs::remove_file(self.path(addr));
        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        self.publish();
    }
}

/// The address a block file's name gives (`{16 hex digits}.kv`), if it is one.
fn parse_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(EXT)?.strip_suffix('.')?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok()).flatten()
}

/// Block files (and files being written) in `dir` and their bytes; (0, 0) if it cannot be read.
pub fn dir_usage(dir: &Path) -> (usize, u64) {
    let Ok(rd) = fs::read_dir(dir) else { return (0, 0) };
    rd.flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| parse_name(n).is_some()))
        .filter_map(|e| e.metadata().ok())
        .fold((0, 0), |(n, b), m| (n + 1, b + m.len()))
}

/// Deletes the block files (and left-over temporary files) in `dir`; returns how many block
/// files and bytes went.
pub fn dir_clear(dir: &Path) -> io::Result<(usize, u64)> {
    let (mut n, mut bytes) = (0, 0);
    for e in fs::read_dir(dir)?.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let block = parse_name(name).is_some();
        if block || name.ends_with(".tmp") {
            let len = e.metadata().map_or(0, |m| m.len());
            fs::remove_file(e.path())?;
            if block {
                n += 1;
                bytes += len;
            }
        }
    }
    Ok((n, bytes))
}
