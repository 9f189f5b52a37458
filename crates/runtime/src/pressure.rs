//! Memory-pressure governor: keeps the predicted peak of the running configuration inside the
//! plan's own prediction and inside the room the machine leaves now, by moving layers between
//! "pinned" (resident) and "streamed" (read before use, dropped after) — the cheapest memory to
//! give back, since the file is the backing store.
//!
//! Two inputs move the boundary. The KV cache's length ([`Governor::fit_kv`], called before each
//! generation): a short cache leaves room for more pinned layers, a growing one takes it back.
//! The budget ([`Governor::poll`], from a [`Monitor`] thread every 100 ms): a cgroup limit
//! lowered (v1 `memory.limit_in_bytes`, v2 `memory.max`, any ancestor), MemAvailable falling
//! (other processes taking memory), or usage creeping into the reserve below the limit. Each
//! reaction logs one line saying what was seen and what was done. The KV page pool already
//! returns freed blocks past its high-water mark to the OS (`model::kv::pool`); it has no
//! "trim now" call, so freed-but-warm KV pages are not something the governor can release.
//! Cost: two or three small file reads per poll; the decision is a few hundred additions.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use memory::probe::{self, Budget, BudgetSource};
use memory::residency::{Release, Streamer};
use model::ModelConfig;

use crate::plan::{self, fmt_bytes, ModelFacts, Request};

/// What one poll sees: the bytes this process may hold and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub limit: u64,
    pub usage: u64,
}

impl Reading {
    pub fn free(&self) -> u64 {
        self.limit.saturating_sub(self.usage)
    }
}

/// Reads the budget the way it was first found: the tightest cgroup limit (looked up again, so
/// a lowered ancestor counts) and its usage; MemAvailable plus this process's anonymous memory
/// (the page cache it maps is already counted as available) against its RSS; or `--ram`
/// against its RSS.
pub fn read(source: &BudgetSource, ram: u64) -> Option<Reading> {
    match source {
        BudgetSource::CgroupV1(_) | BudgetSource::CgroupV2(_) => match probe::cgroup_limit() {
            Some((limit, src)) => {
                let (BudgetSource::CgroupV1(f) | BudgetSource::CgroupV2(f)) = &src else {
                    return None;
                };
                Some(Reading { limit, usage: probe::cgroup_usage(f)? })
            }
            // The limit was lifted: the machine's memory is what is left.
            None => read(&BudgetSource::MemAvailable, ram),
        },
        BudgetSource::MemAvailable => {
            let status = probe::self_status()?;
            Some(Reading {
                limit: probe::mem_available()?
                    + probe::meminfo_field(&status, "RssAnon:").unwrap_or(0),
                usage: probe::meminfo_field(&status, "VmRSS:")?,
            })
        }
        BudgetSource::Flag => Some(Reading { limit: ram, usage: probe::self_rss()? }),
    }
}

/// Why layers moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The limit leaves too little usable room for the pinned layers' predicted peak.
    Limit { predicted: u64, usable: u64 },
    /// Usage came within the reserve of the limit.
    Reserve { free: u64 },
}

/// The planner's view of the running configuration: how many layers may stay pinned.
#[derive(Clone, Debug)]
pub struct Fit {
    pub config: ModelConfig,
    pub facts: ModelFacts,
    /// As planned; `n_kv` is replaced by the cache's current need.
    pub request: Request,
    /// The planned configuration's predicted peak: the most the prediction may reach.
    pub predicted: u64,
    /// Room kept free under the limit before layers are demoted for usage alone.
    pub reserve: u64,
}

impl Fit {
    pub fn new(config: ModelConfig, facts: ModelFacts, request: Request, budget: u64) -> Fit {
        let predicted = plan::predict(&config, &facts, &request).total;
        Fit { config, facts, request, predicted, reserve: plan::headroom(budget) / 2 }
    }

    fn request_for(&self, n_kv: usize, pinned: usize) -> Request {
        let residency = if pinned >= self.config.n_layer {
            self.request.residency
        } else {
            plan::Residency::Stream
        };
        Request {
            n_kv: n_kv.min(self.request.n_ctx),
            pinned_layers: pinned,
            residency,
            ..self.request
        }
    }

    /// Predicted peak with `pinned` layers resident and `n_kv` positions cached.
    pub fn predict(&self, n_kv: usize, pinned: usize) -> u64 {
        plan::predict(&self.config, &self.facts, &self.request_for(n_kv, pinned)).total
    }

    /// Room the prediction may use under `limit`: its usable bytes, and never more than the plan
    /// promised.
    pub fn usable(&self, limit: u64) -> u64 {
        limit.saturating_sub(plan::headroom(limit)).min(self.predicted)
    }

    /// Most layers that may stay pinned under `limit` with `n_kv` positions cached (0 when even
    /// streaming every layer does not fit: nothing more can be given back).
    pub fn target(&self, limit: u64, n_kv: usize) -> usize {
        let usable = self.usable(limit);
        (0..=self.config.n_layer).rev().find(|&k| self.predict(n_kv, k) <= usable).unwrap_or(0)
    }

    /// What one reading asks for with `pinned` layers resident and `n_kv` positions cached: the
    /// pinned count to demote to, and why; `None` when nothing needs to move.
    pub fn react(&self, r: Reading, pinned: usize, n_kv: usize) -> Option<(usize, Cause)> {
        if pinned == 0 {
            return None;
        }
        let target = self.target(r.limit, n_kv);
        if target < pinned {
            let cause = Cause::Limit {
                predicted: self.predict(n_kv, pinned),
                usable: self.usable(r.limit),
            };
            return Some((target, cause));
        }
        let free = r.free();
        if free < self.reserve {
            // Demote the top pinned layers until their bytes cover the shortfall.
            let mut need = self.reserve - free;
            let mut k = pinned;
            while need > 0 && k > 0 {
                k -= 1;
                need = need.saturating_sub(self.facts.layer_bytes.get(k).copied().unwrap_or(0));
            }
            return Some((k, Cause::Reserve { free }));
        }
        None
    }
}

/// The running configuration's memory: the fit, the streamer it moves layers of, the budget it
/// watches and the KV length it was last told.
pub struct Governor {
    fit: Fit,
    streamer: Arc<Streamer>,
    source: BudgetSource,
    /// The budget found at start (the limit for `--ram`).
    budget: u64,
    /// Positions the KV cache may reach now.
    n_kv: AtomicUsize,
    /// Most positions any [`Governor::fit_kv`] asked for: activation rows a long prompt touched
    /// stay resident after the cache shrinks (`/reset`), so fits never go below it.
    n_kv_seen: AtomicUsize,
    /// The "nothing left to give back" line was printed.
    exhausted: AtomicBool,
}

impl Governor {
    pub fn new(fit: Fit, streamer: Arc<Streamer>, budget: &Budget) -> Governor {
        let n_kv = fit.request.n_kv;
        Governor {
            fit,
            streamer,
            source: budget.source.clone(),
            budget: budget.bytes,
            n_kv: AtomicUsize::new(n_kv),
            n_kv_seen: AtomicUsize::new(0),
            exhausted: AtomicBool::new(false),
        }
    }

    pub fn streamer(&self) -> &Arc<Streamer> {
        &self.streamer
    }

    fn limit_now(&self) -> u64 {
        read(&self.source, self.budget).map_or(self.budget, |r| r.limit)
    }

    /// The KV cache is about to hold up to `n_kv` positions: pin as many layers as that leaves
    /// room for (more while the cache is short, fewer as it grows). A line when that changed.
    pub fn fit_kv(&self, n_kv: usize) -> Option<String> {
        let n_kv = self.n_kv_seen.fetch_max(n_kv, Ordering::Relaxed).max(n_kv);
        self.n_kv.store(n_kv, Ordering::Relaxed);
        let target = self.fit.target(self.limit_now(), n_kv);
        let (was, now) = self.streamer.set_pinned(target);
        (was != now).then(|| {
            format!(
                "snug: KV cache for {n_kv} positions: {} ({now} of {} pinned, predicted peak {})",
                moved(was, now),
                self.streamer.n_layer(),
                fmt_bytes(self.fit.predict(n_kv, now))
            )
        })
    }

    /// One look at the budget; acts on it and returns the line saying so, if anything was done.
    pub fn poll(&self) -> Option<String> {
        let r = read(&self.source, self.budget)?;
        let cgroup = matches!(self.source, BudgetSource::CgroupV1(_) | BudgetSource::CgroupV2(_));
        let biggest_layer = self.fit.facts.layer_bytes.iter().copied().max().unwrap_or(0);
        let rss = if cgroup { probe::self_rss() } else { None };
        self.streamer.set_release(release(r, rss, self.fit.reserve, biggest_layer));
        let pinned = self.streamer.pinned();
        let n_kv = self.n_kv.load(Ordering::Relaxed);
        let seen = format!(
            "limit {}, {} in use, {} free",
            fmt_bytes(r.limit),
            fmt_bytes(r.usage),
            fmt_bytes(r.free())
        );
        let Some((k, cause)) = self.fit.react(r, pinned, n_kv) else {
            if pinned == 0
                && r.free() < self.fit.reserve
                && !self.exhausted.swap(true, Ordering::Relaxed)
            {
                return Some(format!(
                    "snug: memory pressure: {seen}; every layer already streams, nothing left to give back"
                ));
            }
            return None;
        };
        let why = match cause {
            Cause::Limit { predicted, usable } => format!(
                "predicted peak {} with {pinned} layers pinned exceeds {} usable",
                fmt_bytes(predicted),
                fmt_bytes(usable)
            ),
            Cause::Reserve { free } => format!(
                "{} free is under the {} reserve",
                fmt_bytes(free),
                fmt_bytes(self.fit.reserve)
            ),
        };
        let (was, now) = self.streamer.demote(k);
        Some(format!(
            "snug: memory pressure: {seen} ({why}); {} ({now} of {} pinned, predicted peak {})",
            moved(was, now),
            self.streamer.n_layer(),
            fmt_bytes(self.fit.predict(n_kv, now))
        ))
    }
}

/// Whether streamed layers must also leave the page cache when dropped: when what is charged to
/// us leaves less than the reserve plus room for [`CACHE_ROOM_LAYERS`] of the largest layer. A
/// cold read of a streamed layer is charged to our cgroup, so the room shrinks and dropping starts
/// before usage reaches the reserve (where layers would be demoted). A warm cache charged
/// elsewhere, or usage measured as RSS (`--ram`, MemAvailable: unmapped cache is not counted and
/// the kernel reclaims it), leaves the room wide and the cache alone.
fn must_drop_cache(r: Reading, reserve: u64, biggest_layer: u64) -> bool {
    r.free() < reserve + CACHE_ROOM_LAYERS * biggest_layer
}

/// What a streamed layer's pages become after use, from one reading of the budget and, under a
/// cgroup, this process's resident set (`rss`; `None` elsewhere):
/// - near the limit ([`must_drop_cache`]): unmapped and dropped from the page cache;
/// - under a cgroup whose usage is below what this process maps by more than a layer: kept
///   mapped. Those pages are a page cache warmed by someone else and charged to them, so keeping
///   them costs the limit nothing and saves a fault per page per pass;
/// - otherwise unmapped. Pages a cold read charged to us count in the limit mapped or not, but
///   mapped they also count in the resident set, which the plan predicts: kept mapped they would
///   take it past the plan by every streamed layer touched since the last drop.
fn release(r: Reading, rss: Option<u64>, reserve: u64, biggest_layer: u64) -> Release {
    if must_drop_cache(r, reserve, biggest_layer) {
        Release::UnmapAndUncache
    } else if rss.is_some_and(|rss| rss > r.usage.saturating_add(biggest_layer)) {
        Release::KeepMapped
    } else {
        Release::Unmap
    }
}

/// Streamed layers whose cache may stay charged to us before dropping it starts: the readers'
/// window (under a layer) and about two polls' worth of cold reads (a layer takes ≥ 100 ms from
/// disk), with a layer to spare.
const CACHE_ROOM_LAYERS: u64 = 4;

/// `layers 5..24 now stream` / `layers 5..9 now pinned` / `no layer moved`.
fn moved(was: usize, now: usize) -> String {
    match now.cmp(&was) {
        std::cmp::Ordering::Less => format!("layers {now}..{was} now stream"),
        std::cmp::Ordering::Greater => format!("layers {was}..{now} now pinned"),
        std::cmp::Ordering::Equal => "no layer moved".to_string(),
    }
}

/// A thread polling a [`Governor`]; dropping it stops the thread.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Polls `governor` every `every`, printing each reaction on stderr.
    pub fn start(
        governor: Arc<Governor>,
        every: Duration,
        log: impl Fn(&str) + Send + 'static,
    ) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("snug-pressure".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    if let Some(line) = governor.poll() {
                        log(&line);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{choose, tests::qwen7b, tests::wants, Residency};
    use model::KvType;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// The Qwen2.5-7B Q4_K_M shape (28 layers of ~134 MiB) planned at context 4096.
    fn fit(residency: Residency, pinned: usize, n_kv: usize, budget: u64) -> Fit {
        let (config, facts) = qwen7b();
        let request = Request {
            n_ctx: 4096,
            n_kv,
            kv_k: KvType::F16,
            kv_v: KvType::F16,
            n_ubatch: 512,
            n_threads: 2,
            n_seq: 1,
            residency,
            pinned_layers: pinned,
            expert_cache: 0,
            kv_windowed: false,
            json_mode: false,
            draft_tokens: 0,
            prefix_disk: false,
        };
        Fit::new(config, facts, request, budget)
    }

    #[test]
    fn streamed_layers_leave_the_page_cache_only_when_what_is_charged_to_us_nears_the_limit() {
        let (reserve, layer) = (64 * MIB, 140 * MIB);
        // Warm cache charged elsewhere: usage is our anonymous memory and pinned layers only.
        assert!(!must_drop_cache(Reading { limit: 3 * GIB, usage: 209 * MIB }, reserve, layer));
        // Cold streaming fills the cgroup with cache: drop before the reserve is reached.
        let near = 3 * GIB - reserve - 4 * layer + MIB;
        assert!(must_drop_cache(Reading { limit: 3 * GIB, usage: near }, reserve, layer));
        assert!(must_drop_cache(Reading { limit: 3 * GIB, usage: 3 * GIB }, reserve, layer));
    }

    #[test]
    fn streamed_pages_stay_mapped_only_when_someone_else_is_charged_for_them() {
        let (reserve, layer) = (64 * MIB, 140 * MIB);
        let limit = 3 * GIB;
        // Cold: every page we map is charged to us, so usage is at least the resident set.
        let cold = Reading { limit, usage: 900 * MIB };
        assert_eq!(release(cold, Some(700 * MIB), reserve, layer), Release::Unmap);
        // Warm, charged elsewhere: we map far more than our cgroup is charged.
        let warm = Reading { limit, usage: 300 * MIB };
        assert_eq!(release(warm, Some(2 * GIB), reserve, layer), Release::KeepMapped);
        // Less than a layer apart is no evidence either way.
        assert_eq!(release(warm, Some(300 * MIB + layer), reserve, layer), Release::Unmap);
        // Near the limit the cache goes too, warm or not.
        let near = Reading { limit, usage: limit - reserve - layer };
        assert_eq!(release(near, Some(limit), reserve, layer), Release::UnmapAndUncache);
        // Without a cgroup (MemAvailable or --ram) usage is the resident set itself.
        assert_eq!(release(warm, None, reserve, layer), Release::Unmap);
    }

    #[test]
    fn an_unchanged_limit_moves_nothing() {
        let f = fit(Residency::Mmap, 28, 100, 6 * GIB);
        assert_eq!(f.target(6 * GIB, 100), 28);
        assert_eq!(f.react(Reading { limit: 6 * GIB, usage: 4 * GIB }, 28, 100), None);
    }

    #[test]
    fn a_lowered_limit_streams_the_top_layers_within_the_new_usable_room() {
        let f = fit(Residency::Mmap, 28, 100, 6 * GIB);
        let r = Reading { limit: 3 * GIB, usage: 3 * GIB - 10 * MIB };
        let (k, cause) = f.react(r, 28, 100).expect("reacts");
        assert!(k > 0 && k < 28, "{k}");
        assert!(
            f.predict(100, k) <= f.usable(3 * GIB) && f.predict(100, k + 1) > f.usable(3 * GIB)
        );
        assert!(matches!(cause, Cause::Limit { predicted, usable } if predicted > usable));
        // Too small for anything: every layer streams.
        assert_eq!(f.react(Reading { limit: 600 * MIB, usage: 0 }, 28, 100).map(|x| x.0), Some(0));
    }

    #[test]
    fn usage_in_the_reserve_demotes_enough_layers_to_cover_it() {
        let f = fit(Residency::Mmap, 28, 100, 6 * GIB);
        assert_eq!(f.reserve, 96 * MIB);
        // 16 MiB free: 80 MiB short, one 134 MiB layer covers it.
        let r = Reading { limit: 6 * GIB, usage: 6 * GIB - 16 * MIB };
        assert_eq!(f.react(r, 28, 100), Some((27, Cause::Reserve { free: 16 * MIB })));
        assert_eq!(f.react(r, 0, 100), None);
    }

    #[test]
    fn a_short_cache_pins_more_layers_than_the_full_context_plan_and_a_long_one_fewer() {
        let (c, m) = qwen7b();
        let planned = choose(&c, &m, 3 * GIB, &wants()).unwrap().request;
        let f = Fit::new(c, m, planned, 3 * GIB);
        let k0 = planned.pinned_layers;
        assert_eq!(f.target(3 * GIB, 4096), k0);
        let short = f.target(3 * GIB, 80);
        assert!(short > k0, "{short} vs {k0}");
        assert!(f.predict(80, short) <= f.predicted, "never past the planned peak");
        let half = f.target(3 * GIB, 2048);
        assert!(k0 <= half && half <= short);
    }
}
