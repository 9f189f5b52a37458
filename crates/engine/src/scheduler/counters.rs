//! What the scheduler counts, as plain shared numbers: gauges and counters are atomics, the two
//! latency histograms a bucket array behind a lock. Cloning a handle shares its value, so
//! whoever exports them (the server's `/metrics`, which registers each under its Prometheus
//! name) reads the numbers the scheduler writes, with no copy and no refresh. Cost: an atomic
//! add per token and per job; a histogram observation takes an uncontended lock and scans at
//! most 15 bucket bounds.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// What the scheduler counts for the metrics endpoint (shared handles: cloning one shares its
/// value, so the registry and the scheduler hold the same numbers).
#[derive(Clone, Debug)]
pub struct Counters {
    /// Requests waiting for a slot.
    pub queued: Gauge,
    /// Sequences running.
    pub running: Gauge,
    /// Prompt tokens computed and tokens generated.
    pub prompt_tokens: Counter,
    pub generated_tokens: Counter,
    /// Seconds from admission to the first token, and between a sequence's tokens.
    pub ttft: Histogram,
    pub itl: Histogram,
    /// KV pool blocks held by sequences, free, and held by the prefix cache alone (their sum
    /// is the pool's capacity), after the last step.
    pub kv_blocks_used: Gauge,
    pub kv_blocks_free: Gauge,
    pub kv_blocks_cached: Gauge,
    /// Prompt tokens not computed because their KV came from the prefix cache.
    pub prefix_hit_tokens: Counter,
    /// Times the prefix cache was dropped for memory pressure.
    pub prefix_sheds: Counter,
    /// Guesses verified by speculative decoding, guesses kept, and guesses kept per pass.
    pub draft_tokens: Counter,
    pub draft_kept: Counter,
    pub draft_kept_per_pass: Histogram,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            queued: Gauge::default(),
            running: Gauge::default(),
            prompt_tokens: Counter::default(),
            generated_tokens: Counter::default(),
            ttft: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            itl: Histogram::new(exponential_buckets(0.005, 2.0, 12)),
            kv_blocks_used: Gauge::default(),
            kv_blocks_free: Gauge::default(),
            kv_blocks_cached: Gauge::default(),
            prefix_hit_tokens: Counter::default(),
            prefix_sheds: Counter::default(),
            draft_tokens: Counter::default(),
            draft_kept: Counter::default(),
            draft_kept_per_pass: Histogram::new([0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0]),
        }
    }
}

/// A number that goes up and down; clones share it.
#[derive(Clone, Debug, Default)]
pub struct Gauge(Arc<AtomicI64>);

impl Gauge {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A number that only goes up; clones share it.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    pub fn inc(&self) {
        self.inc_by(1);
    }

    pub fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Observations counted in buckets by upper bound (the last one unbounded, `f64::MAX`), with
/// their sum: Prometheus's histogram, each observation in the first bucket whose bound is at
/// least it. Clones share it.
#[derive(Clone, Debug)]
pub struct Histogram(Arc<Mutex<Buckets>>);

/// A histogram's state.
#[derive(Clone, Debug, Default)]
pub struct Buckets {
    pub sum: f64,
    pub count: u64,
    /// (upper bound, observations in this bucket alone), bounds rising, the last `f64::MAX`.
    pub buckets: Vec<(f64, u64)>,
}

impl Histogram {
    /// A histogram over `bounds` (rising) and an unbounded last bucket.
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Histogram {
        let buckets = bounds.into_iter().chain([f64::MAX]).map(|b| (b, 0)).collect();
        Histogram(Arc::new(Mutex::new(Buckets { sum: 0.0, count: 0, buckets })))
    }

    pub fn observe(&self, v: f64) {
        let mut h = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        h.sum += v;
        h.count += 1;
        if let Some((_, n)) = h.buckets.iter_mut().find(|(bound, _)| *bound >= v) {
            *n += 1;
        }
    }

    /// The state now.
    pub fn get(&self) -> Buckets {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// `n` bounds from `start`, each `factor` times the one before.
pub fn exponential_buckets(start: f64, factor: f64, n: u16) -> impl Iterator<Item = f64> {
    (0..n).map(move |i| start * factor.powf(f64::from(i)))
}
