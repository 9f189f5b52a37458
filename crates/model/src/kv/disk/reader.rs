//! The disk tier's reader thread: it follows a chain of blocks on disk for whoever asked
//! ([`Reader::request`]) and hands each block back over a channel, so the thread that owns the
//! KV cache never waits for the disk.
//!
//! Design. A request is the chain's keys in order and a deadline. The thread reads them one by
//! one into buffers from a fixed set ([`read_blocks`] of them, made resident at open), each
//! checked by [`Store::read`] (length, whole key, CRC), and sends it back as an [`Arrival`]; the
//! owner copies it into pool blocks and returns the buffer ([`Reader::recycle`]). The chain ends at
//! the first block missing or damaged, at the deadline, when the request is cancelled (its
//! [`ReadTicket`] dropped) or when the tier closes; an arrival without data then says so.
//! Requests are served in order, one at a time; at most [`MAX_REQUESTS`] wait, and one more is
//! refused (its prompt is computed).
//!
//! Cost. Memory: the buffers ([`read_blocks`] × one block of all layers, counted by
//! `super::heap_bytes`) and the waiting requests' keys (136 bytes a block). When every buffer
//! is out the thread waits for one back (in 10 ms slices, to see a deadline or a cancel), so a
//! busy owner slows a read, never the reverse.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::store::{BlockKey, DiskStats, Store};

/// Bytes of read buffers (at least two blocks).
pub const READ_BYTES: usize = 8 << 20;
/// Requests waiting for the thread at most.
pub const MAX_REQUESTS: usize = 16;

/// Read buffers for blocks of `payload` bytes.
pub fn read_blocks(payload: usize) -> usize {
    (READ_BYTES / payload.max(1)).max(2)
}

/// A buffer of `len` bytes whose pages are resident from the start: the plan counts every
/// buffer, so the peak is the same whether or not the disk is busy.
pub(crate) fn resident(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for b in v.iter_mut().step_by(4096) {
        *b = 1;
    }
    std::hint::black_box(v)
}

/// One block read for request `id`, or (`data: None`) the end of that request.
pub struct Arrival {
    pub id: u64,
    pub data: Option<Vec<u8>>,
}

/// A request in flight: dropping it cancels the rest of its reads.
pub struct ReadTicket {
    pub id: u64,
    cancel: Arc<AtomicBool>,
}

impl Drop for ReadTicket {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// A restore in flight for one sequence (`KvCache::prefix_adopt_start`): its request, the
/// chain asked for and how much of it has arrived.
pub struct Pending {
    /// Dropping it cancels the reads left.
    pub(crate) ticket: ReadTicket,
    /// The blocks asked for, in chain order; `keys[got]` arrives next.
    pub(crate) keys: Vec<BlockKey>,
    pub(crate) got: usize,
    pub(crate) deadline: Instant,
}

struct Job {
    id: u64,
    keys: Vec<BlockKey>,
    deadline: Instant,
    cancel: Arc<AtomicBool>,
}

/// The thread, its channels and its buffers (see the module doc).
pub(super) struct Reader {
    jobs: Option<SyncSender<Job>>,
    /// In a mutex only so that the context stays `Sync`; its owner alone receives.
    arrivals: Mutex<Receiver<Arrival>>,
    free: SyncSender<Vec<u8>>,
    closing: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    next: u64,
}

impl Reader {
    pub(super) fn start(store: Arc<Store>, stats: Arc<DiskStats>) -> std::io::Result<Reader> {
        let payload = store.payload_bytes();
        let n = read_blocks(payload);
        let (free, free_rx) = mpsc::sync_channel(n);
        for _ in 0..n {
            let _ = free.try_send(resident(payload));
        }
        let (jobs, jobs_rx) = mpsc::sync_channel(MAX_REQUESTS);
        let (out, arrivals) = mpsc::channel();
        let closing = Arc::new(AtomicBool::new(false));
        let shut = closing.clone();
        let thread = std::thread::Builder::new()
            .name("snug-kv-read".into())
            .spawn(move || serve(&store, &stats, jobs_rx, free_rx, out, &shut))?;
        Ok(Reader {
            jobs: Some(jobs),
            arrivals: Mutex::new(arrivals),
            free,
            closing,
            thread: Some(thread),
            next: 0,
        })
    }

    /// Asks for the blocks `keys`, in order, until `deadline`; `None` when too many requests
    /// wait already (or the thread is gone).
    pub(super) fn request(&mut self, keys: Vec<BlockKey>, deadline: Instant) -> Option<ReadTicket> {
        self.next += 1;
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job { id: self.next, keys, deadline, cancel: cancel.clone() };
        self.jobs.as_ref()?.try_send(job).ok()?;
        Some(ReadTicket { id: self.next, cancel })
    }

    /// The next arrival, waiting up to `wait` for one.
    pub(super) fn arrival(&mut self, wait: Duration) -> Option<Arrival> {
        let rx = self.arrivals.get_mut().unwrap_or_else(PoisonError::into_inner);
        match rx.try_recv() {
            Ok(a) => Some(a),
            Err(_) if wait.is_zero() => None,
            Err(_) => rx.recv_timeout(wait).ok(),
        }
    }

    /// Gives a buffer of an arrival back for the next read.
    pub(super) fn recycle(&mut self, buf: Vec<u8>) {
        let _ = self.free.try_send(buf);
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Relaxed);
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: each request's chain, block by block (see the module doc).
fn serve(
    store: &Store,
    stats: &DiskStats,
    jobs: Receiver<Job>,
    free: Receiver<Vec<u8>>,
    out: Sender<Arrival>,
    closing: &AtomicBool,
) {
    let mut spare: Option<Vec<u8>> = None;
    for job in jobs {
        for key in &job.keys {
            if !live(&job, closing) {
                break;
            }
            let Some(mut buf) = spare.take().or_else(|| take_buffer(&free, &job, closing)) else {
                break;
            };
            if !store.read(key, &mut buf) {
                spare = Some(buf);
                break;
            }
            stats.hits.fetch_add(1, Ordering::Relaxed);
            if out.send(Arrival { id: job.id, data: Some(buf) }).is_err() {
                return;
            }
        }
        if out.send(Arrival { id: job.id, data: None }).is_err() {
            return;
        }
    }
}

/// A free buffer, waiting for one while `job` is live.
fn take_buffer(free: &Receiver<Vec<u8>>, job: &Job, closing: &AtomicBool) -> Option<Vec<u8>> {
    loop {
        if !live(job, closing) {
            return None;
        }
        let left = job.deadline.saturating_duration_since(Instant::now());
        let slice = left.min(Duration::from_millis(10));
        match free.recv_timeout(slice) {
            Ok(b) => return Some(b),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// True while `job` is wanted: before its deadline, not cancelled, the tier open.
fn live(job: &Job, closing: &AtomicBool) -> bool {
    Instant::now() < job.deadline
        && !job.cancel.load(Ordering::Relaxed)
        && !closing.load(Ordering::Relaxed)
}
