//! Memory-pressure monitor: a thread that polls the budget (cgroup limit and usage, or
//! MemAvailable) and, when the room left falls under a threshold, demotes pinned layers of a
//! [`Streamer`] to streaming — the cheapest memory to give back, since the file is the backing
//! store — and logs what it did. Cost: one small file read per poll (default every 100 ms).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::fmt_bytes;
use crate::probe::{self, BudgetSource};
use crate::residency::Streamer;

/// A running monitor; dropping it stops the thread.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

/// What one poll sees.
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    pub limit: u64,
    pub usage: u64,
}

fn read(limit_file: &Option<PathBuf>) -> Option<Reading> {
    match limit_file {
        Some(f) => {
            let limit = std::fs::read_to_string(f).ok()?.trim().parse().ok()?;
            let usage = probe::cgroup_usage(f)?;
            Some(Reading { limit, usage })
        }
        None => {
            let avail = probe::mem_available()?;
            let rss = probe::self_rss()?;
            Some(Reading {
                limit: avail + rss,
                usage: rss,
            })
        }
    }
}

impl Monitor {
    /// Watches the budget `source` describes; when `limit - usage` drops below `reserve` bytes,
    /// demotes enough of `streamer`'s pinned layers (biggest first from the top) to restore it.
    pub fn start(
        source: &BudgetSource,
        streamer: Arc<Streamer>,
        layer_bytes: Vec<u64>,
        reserve: u64,
        every: Duration,
    ) -> Monitor {
        let limit_file = match source {
            BudgetSource::CgroupV1(p) | BudgetSource::CgroupV2(p) => Some(p.clone()),
            _ => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("snug-pressure".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    if let Some(r) = read(&limit_file) {
                        let free = r.limit.saturating_sub(r.usage);
                        if free < reserve && streamer.pinned() > 0 {
                            let mut need = reserve - free;
                            let mut pinned = streamer.pinned();
                            while need > 0 && pinned > 0 {
                                pinned -= 1;
                                need = need.saturating_sub(layer_bytes.get(pinned).copied().unwrap_or(0));
                            }
                            let was = streamer.pinned();
                            streamer.demote(pinned);
                            eprintln!(
                                "snug: memory pressure: {} free of {} limit ({} in use); layers {}..{} now stream ({} of {} pinned)",
                                fmt_bytes(free),
                                fmt_bytes(r.limit),
                                fmt_bytes(r.usage),
                                pinned,
                                was,
                                pinned,
                                streamer.n_layer()
                            );
                        }
                    }
                    std::thread::sleep(every);
                }
            })
            .ok();
        Monitor { stop, handle }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
