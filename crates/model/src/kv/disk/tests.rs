use std::fs;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::store::{dir_clear, dir_usage, HEADER_BYTES};
use super::*;
use crate::kv::BLOCK_TOKENS;

const LAYERS: usize = 3;
const BLOCK: usize = 64;

fn key(seed: u64, parent: u64, first: u32) -> BlockKey {
    let mut tokens = [0u32; BLOCK_TOKENS];
    for (i, t) in tokens.iter_mut().enumerate() {
        *t = first + i as u32;
    }
    BlockKey { seed, parent, tokens }
}

fn data(fill: u8) -> Vec<u8> {
    (0..LAYERS * BLOCK).map(|i| fill.wrapping_add(i as u8)).collect()
}

fn store(dir: &Path, budget: u64, salt: u64) -> (Store, Arc<DiskStats>) {
    let stats = Arc::new(DiskStats::default());
    (Store::open(dir, budget, salt, LAYERS, BLOCK, stats.clone()).unwrap(), stats)
}

/// The one block file in `dir`.
fn only_file(dir: &Path) -> PathBuf {
    let files: Vec<_> = fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

#[test]
fn a_block_written_is_read_back_bit_for_bit_even_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let (s, stats) = store(dir.path(), 1 << 20, 7);
    let k = key(1, 2, 100);
    s.write(&k, &data(3)).unwrap();
    let mut out = vec![0; LAYERS * BLOCK];
    assert!(s.read(&k, &mut out));
    assert_eq!(out, data(3));
    assert_eq!(stats.bytes_written.load(Ordering::Relaxed), s.file_bytes());
    assert_eq!(stats.bytes_read.load(Ordering::Relaxed), s.file_bytes());
    drop(s);
    let (s, stats) = store(dir.path(), 1 << 20, 7);
    assert!(s.contains(k.key()), "the index is rebuilt from the directory");
    out.fill(0);
    assert!(s.read(&k, &mut out));
    assert_eq!(out, data(3));
    assert_eq!(stats.dropped.load(Ordering::Relaxed), 0);
}

#[test]
fn a_flipped_byte_anywhere_drops_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (s, stats) = store(dir.path(), 1 << 20, 7);
    let k = key(1, 2, 100);
    let size = s.file_bytes() as usize;
    // In the header, in the KV bytes, in the checksum.
    for (n, at) in [9, HEADER_BYTES + 5, size - 1].into_iter().enumerate() {
        s.write(&k, &data(3)).unwrap();
        let path = only_file(dir.path());
        let mut bytes = fs::read(&path).unwrap();
        bytes[at] ^= 0x10;
        fs::write(&path, bytes).unwrap();
        let mut out = vec![0; LAYERS * BLOCK];
        assert!(!s.read(&k, &mut out), "byte {at}");
        assert!(!path.exists(), "a damaged file is deleted");
        assert!(!s.contains(k.key()));
        assert_eq!(stats.dropped.load(Ordering::Relaxed), n as u64 + 1);
    }
}

#[test]
fn a_truncated_or_missing_file_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let (s, stats) = store(dir.path(), 1 << 20, 7);
    let k = key(1, 2, 100);
    s.write(&k, &data(3)).unwrap();
    let path = only_file(dir.path());
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    let mut out = vec![0; LAYERS * BLOCK];
    assert!(!s.read(&k, &mut out));
    assert_eq!(stats.dropped.load(Ordering::Relaxed), 1);
    // Deleted under the store's feet: a plain miss, not a drop.
    s.write(&k, &data(3)).unwrap();
    fs::remove_file(only_file(dir.path())).unwrap();
    assert!(!s.read(&k, &mut out));
    assert_eq!(stats.dropped.load(Ordering::Relaxed), 1);
    s.write(&k, &data(4)).unwrap();
    assert!(s.read(&k, &mut out), "written again after the miss");
    assert_eq!(out, data(4));
}

#[test]
fn a_foreign_file_at_the_address_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = store(dir.path(), 1 << 20, 7);
    let k = key(1, 2, 100);
    a.write(&k, &data(3)).unwrap();
    let path = only_file(dir.path());
    // Another model's (another salt's) block renamed onto this address, with a sound checksum.
    let other = tempfile::tempdir().unwrap();
    let (b, _) = store(other.path(), 1 << 20, 8);
    b.write(&k, &data(3)).unwrap();
    fs::copy(only_file(other.path()), &path).unwrap();
    let mut out = vec![0; LAYERS * BLOCK];
    let (a, stats) = store(dir.path(), 1 << 20, 7);
    assert!(!a.read(&k, &mut out));
    assert_eq!(stats.dropped.load(Ordering::Relaxed), 1);
    // Another key asked at the same address (another seed, parent or tokens): never read.
    a.write(&k, &data(3)).unwrap();
    for wrong in [key(9, 2, 100), key(1, 9, 100), key(1, 2, 101)] {
        assert!(!a.read(&wrong, &mut out), "{wrong:?}");
    }
}

#[test]
fn the_directory_keeps_to_its_budget_least_recently_used_first() {
    let dir = tempfile::tempdir().unwrap();
    let (probe, _) = store(dir.path(), 1 << 20, 7);
    let file = probe.file_bytes();
    drop(probe);
    let (s, _) = store(dir.path(), 3 * file + 1, 7);
    let keys: Vec<BlockKey> = (0..4).map(|i| key(1, i, 10 * i as u32)).collect();
    let mut out = vec![0; LAYERS * BLOCK];
    for k in &keys[..3] {
        s.write(k, &data(1)).unwrap();
    }
    assert!(s.read(&keys[0], &mut out), "the first becomes the most recent");
    s.write(&keys[3], &data(1)).unwrap();
    assert_eq!(dir_usage(dir.path()), (3, 3 * file));
    assert!(s.contains(keys[0].key()));
    assert!(!s.contains(keys[1].key()), "the least recently used went");
    assert!(!s.read(&keys[1], &mut out));
    drop(s);
    // A smaller budget at the next start trims the directory, oldest first.
    let (s, stats) = store(dir.path(), file, 7);
    assert_eq!(dir_usage(dir.path()).0, 1);
    assert_eq!(stats.files.load(Ordering::Relaxed), 1);
    assert_eq!(s.usage(), (1, file));
    assert_eq!(dir_clear(dir.path()).unwrap(), (1, file));
    assert_eq!(dir_usage(dir.path()), (0, 0));
}

/// The blocks the reader thread sends back for `keys`, until it says the request is over.
fn read_all(t: &mut DiskTier, keys: Vec<BlockKey>) -> Vec<Vec<u8>> {
    let ticket = t.request(keys).expect("the reader takes the request");
    let mut got = Vec::new();
    loop {
        let a = t.arrival(Duration::from_secs(60)).expect("the reader answers");
        assert_eq!(a.id, ticket.id);
        let Some(d) = a.data else { return got };
        got.push(d.clone());
        t.recycle(d);
    }
}

#[test]
fn reads_stop_when_cancelled_and_blocks_come_back_in_a_bounded_set_of_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = DiskConfig::new(dir.path().to_path_buf(), 1 << 30, 5);
    let stats = Arc::new(DiskStats::default());
    let mut t = DiskTier::open(&cfg, 5, LAYERS, BLOCK, stats.clone()).unwrap();
    let payload = LAYERS * BLOCK;
    let n = reader::read_blocks(payload) + 3;
    let keys: Vec<BlockKey> = (0..n).map(|i| key(1, i as u64, 0)).collect();
    for (i, k) in keys.iter().enumerate() {
        t.store().write(k, &data(i as u8)).unwrap();
    }
    // Nothing recycled: the reader stops at its set of buffers and waits.
    let ticket = t.request(keys.clone()).unwrap();
    let mut held = Vec::new();
    while held.len() < reader::read_blocks(payload) {
        let a = t.arrival(Duration::from_secs(60)).expect("a block");
        held.push(a.data.expect("not the end yet"));
    }
    assert_eq!(held[1], data(1));
    assert!(t.arrival(Duration::from_millis(50)).is_none(), "no buffer, no read");
    // Cancelled (the ticket dropped): the end comes, with no more blocks.
    drop(ticket);
    let end = t.arrival(Duration::from_secs(60)).expect("the end");
    assert!(end.data.is_none());
    for b in held {
        t.recycle(b);
    }
    // The next request reads all of them, recycled as they come.
    assert_eq!(read_all(&mut t, keys).len(), n);
}

#[test]
fn the_tier_writes_on_its_thread_and_reads_back_under_the_same_key_only() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = DiskConfig::new(dir.path().to_path_buf(), 1 << 20, 5);
    let stats = Arc::new(DiskStats::default());
    let mut t = DiskTier::open(&cfg, 5, LAYERS, BLOCK, stats.clone()).unwrap();
    let k = key(1, 2, 100);
    assert!(t.offer(k, |d| d.copy_from_slice(&data(9))));
    drop(t);
    assert_eq!(dir_usage(dir.path()).0, 1, "the queue is written before the tier ends");
    let mut t = DiskTier::open(&cfg, 5, LAYERS, BLOCK, stats.clone()).unwrap();
    assert!(t.may_hold(k.key()));
    assert_eq!(read_all(&mut t, vec![k, key(1, 2, 101), k]), vec![data(9)], "to the first miss");
    // Another store salt (another model file or KV layout): another address, nothing found.
    let mut other = DiskTier::open(&cfg, 6, LAYERS, BLOCK, Arc::default()).unwrap();
    assert!(!other.may_hold(k.key()));
    assert!(read_all(&mut other, vec![k]).is_empty());
    assert_eq!(stats.hits.load(Ordering::Relaxed), 1);
}

#[test]
fn a_directory_that_cannot_be_written_turns_writing_off_without_failing() {
    let dir = tempfile::tempdir().unwrap();
    // A path under a regular file can be neither created nor written, even by root.
    let file = dir.path().join("not-a-dir");
    fs::write(&file, b"x").unwrap();
    let cfg = DiskConfig::new(file.join("kv"), 1 << 20, 5);
    assert!(DiskTier::open(&cfg, 5, LAYERS, BLOCK, Arc::default()).is_err());
    // A directory that goes away (or turns read-only) while serving.
    let cfg = DiskConfig::new(dir.path().join("kv"), 1 << 20, 5);
    let stats = Arc::new(DiskStats::default());
    let mut t = DiskTier::open(&cfg, 5, LAYERS, BLOCK, stats.clone()).unwrap();
    fs::remove_dir(&cfg.dir).unwrap();
    fs::write(&cfg.dir, b"x").unwrap();
    assert!(t.offer(key(1, 2, 100), |d| d.fill(1)));
    // The writer's failure turns writing off; later blocks are skipped, reads miss.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while t.writing.load(Ordering::Relaxed) {
        assert!(std::time::Instant::now() < deadline, "the write error was not seen");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!t.offer(key(1, 2, 200), |d| d.fill(1)));
    assert_eq!(stats.skipped.load(Ordering::Relaxed), 1);
    assert!(read_all(&mut t, vec![key(1, 2, 100)]).is_empty());
    assert_eq!(stats.bytes_written.load(Ordering::Relaxed), 0);
}
