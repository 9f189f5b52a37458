//! `GET /metrics` in Prometheus text format (prometheus-client): HTTP requests by route and
//! status; the scheduler's queue depth, running sequences, prompt and generated token totals,
//! time to first token and inter-token latency, KV blocks used / free / held by the prefix
//! cache, prefix-cache hit tokens and sheds, the prefix cache's disk tier (blocks read back,
//! prompts that found none, bytes read and written, files dropped as damaged, blocks skipped,
//! files and bytes held), speculative decoding's guesses verified and kept
//! (by drafter) and kept per pass; the process's resident set against the memory
//! budget the plan was made in, and the memory governor's reactions to pressure. LoRA adapters
//! (from [`AdapterStore::stats`] at each scrape): the page pool's utilisation and pages by
//! content (KV, of which prefix cache, adapters, free), pages evicted by content, the page
//! allocation latency histogram (seconds; the pool times one allocation in
//! `ALLOC_LATENCY_SAMPLE` and keeps bucket counts and a sum, copied at each scrape), adapters by tier, `acquire`s by the
//! tier they found the adapter in, promotions, demotions and adapter evictions, and generation
//! requests by adapter name. Beside them, unprefixed, the model-server protocol's gauges under
//! vLLM's names ([`vllm`]), which an inference gateway's endpoint picker reads. Cost: an atomic add per request and per token; a scrape reads
//! `/proc/self/status` once, takes the store's stats (a lock per adapter) and encodes a few
//! dozen lines.

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use engine::scheduler::{counters, Counters, Handle};

pub mod vllm;
use memory::residency::ExpertStats;
use model::kv::disk::DiskStats;
use model::kv::pool::{ALLOC_LATENCY_BUCKETS_NS, ALLOC_LATENCY_SAMPLE};
use model::lora::{AdapterStore, StoreStats};

/// One of the scheduler's numbers ([`Counters`]: plain shared atomics) as a Prometheus metric,
/// read at each scrape: clones share the number the scheduler writes.
#[derive(Clone, Debug)]
pub struct Exported<T>(pub T);

impl EncodeMetric for Exported<counters::Gauge> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

impl EncodeMetric for Exported<counters::Counter> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.0.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

impl EncodeMetric for Exported<counters::Histogram> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let h = self.0.get();
        encoder.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Where the expert cache's counters are, once the residency has one.
pub type ExpertSlot = Arc<std::sync::OnceLock<Arc<ExpertStats>>>;

/// One of the expert cache's counters, read at each scrape (0 without a cache).
#[derive(Clone)]
pub struct ExpertCounter(ExpertSlot, fn(&ExpertStats) -> &AtomicU64);

impl std::fmt::Debug for ExpertCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExpertCounter")
    }
}

impl EncodeMetric for ExpertCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let v = self.0.get().map_or(0, |s| self.1(s).load(Ordering::Relaxed));
        encoder.encode_counter::<NoLabelSet, _, u64>(&v, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// One of the prefix cache's disk tier's numbers (`model::kv::disk::DiskStats`), read at each
/// scrape: a counter, or a gauge when `gauge`.
#[derive(Clone)]
pub struct DiskMetric(Arc<DiskStats>, fn(&DiskStats) -> &AtomicU64, bool);

impl std::fmt::Debug for DiskMetric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DiskMetric")
    }
}

impl EncodeMetric for DiskMetric {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let v = self.1(&self.0).load(Ordering::Relaxed);
        if self.2 {
            encoder.encode_gauge(&i64::try_from(v).unwrap_or(i64::MAX))
        } else {
            encoder.encode_counter::<NoLabelSet, _, u64>(&v, None)
        }
    }

    fn metric_type(&self) -> MetricType {
        if self.2 {
            MetricType::Gauge
        } else {
            MetricType::Counter
        }
    }
}

/// A scheduler number labelled with the drafter that produced it (the server drafts with
/// prompt lookup only: `drafter="ngram"`).
#[derive(Clone, Debug)]
pub struct ByDrafter<T>(pub T);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DrafterLabels {
    pub drafter: &'static str,
}

const NGRAM: DrafterLabels = DrafterLabels { drafter: "ngram" };

impl EncodeMetric for ByDrafter<counters::Counter> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_family(&NGRAM)?.encode_counter::<NoLabelSet, _, u64>(&self.0.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

impl EncodeMetric for ByDrafter<counters::Histogram> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let h = self.0.get();
        encoder
            .encode_family(&NGRAM)?
            .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdapterLabels {
    pub adapter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContentLabels {
    pub content: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabels {
    pub tier: &'static str,
}

/// The pool's page-allocation latencies as a Prometheus histogram in seconds: the pool keeps
/// the bucket counts and sum, [`StoreMetrics::refresh`] copies them here at each scrape.
#[derive(Clone, Debug, Default)]
struct AllocLatency(Arc<Mutex<LatencySnapshot>>);

#[derive(Debug, Default)]
struct LatencySnapshot {
    sum_s: f64,
    count: u64,
    /// (upper bound in seconds, `f64::MAX` for +Inf; the count in this bucket alone — the
    /// text encoder makes them cumulative).
    buckets: Vec<(f64, u64)>,
}

impl AllocLatency {
    fn set(&self, counts: &[u64], sum_ns: u64) {
        let buckets = counts
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                (ALLOC_LATENCY_BUCKETS_NS.get(i).map_or(f64::MAX, |&ns| ns as f64 * 1e-9), n)
            })
            .collect();
        let count = counts.iter().sum();
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) =
            LatencySnapshot { sum_s: sum_ns as f64 * 1e-9, count, buckets };
    }
}

impl EncodeMetric for AllocLatency {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let h = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        encoder.encode_histogram::<NoLabelSet>(h.sum_s, h.count, &h.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The adapter store's numbers, refreshed from [`AdapterStore::stats`] at each scrape.
#[derive(Default)]
struct StoreMetrics {
    utilisation: Gauge<f64, std::sync::atomic::AtomicU64>,
    capacity: Gauge,
    pages: Family<ContentLabels, Gauge>,
    evicted_pages: Family<ContentLabels, Counter>,
    alloc_latency: AllocLatency,
    adapters: Family<TierLabels, Gauge>,
    hits: Family<TierLabels, Counter>,
    promotions: Counter,
    demotions: Counter,
    evictions: Counter,
}

impl StoreMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "pool_utilisation",
            "Fraction of the page pool in use (KV and adapters)",
            self.utilisation.clone(),
        );
        r.register("pool_capacity_pages", "Pages in the pool", self.capacity.clone());
        r.register(
            "pool_pages",
            "Pool pages by content (kv includes prefix_cache)",
            self.pages.clone(),
        );
        r.register(
            "pool_evicted_pages",
            "Pool pages freed by eviction, by content",
            self.evicted_pages.clone(),
        );
        r.register(
            "pool_allocation_seconds",
            format!("Page allocation latency (one allocation in {ALLOC_LATENCY_SAMPLE} is timed)"),
            self.alloc_latency.clone(),
        );
        r.register("adapters", "Registered LoRA adapters by tier", self.adapters.clone());
        r.register(
            "adapter_acquires_by_tier",
            "Adapter requests by the tier the adapter was found in",
            self.hits.clone(),
        );
        r.register("adapter_promotions", "Adapter tier steps up (to hot)", self.promotions.clone());
        r.register("adapter_demotions", "Adapter tier steps down", self.demotions.clone());
        r.register(
            "adapter_evictions",
            "Adapters dropped from the pool to make room",
            self.evictions.clone(),
        );
    }

    fn refresh(&self, s: &StoreStats) {
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let set = |c: &Counter, v: u64| c.inner().store(v, std::sync::atomic::Ordering::Relaxed);
        let p = &s.pool;
        let used = p.kv + p.adapter;
        self.utilisation.set(if p.capacity == 0 { 0.0 } else { used as f64 / p.capacity as f64 });
        self.capacity.set(g(p.capacity));
        let free = p.capacity.saturating_sub(used);
        for (content, n) in [
            ("kv", p.kv),
            ("prefix_cache", p.prefix_cached),
            ("adapter", p.adapter),
            ("free", free),
        ] {
            self.pages.get_or_create(&ContentLabels { content }).set(g(n));
        }
        for (content, n) in [("kv", p.evictions[0]), ("adapter", p.evictions[1])] {
            set(&self.evicted_pages.get_or_create(&ContentLabels { content }), n);
        }
        self.alloc_latency.set(&p.alloc_latency, p.alloc_latency_sum_ns);
        for (tier, n, hits) in [
            ("hot", s.hot, s.hits_hot),
            ("warm", s.warm, s.hits_warm),
            ("cold", s.cold, s.hits_cold),
        ] {
            self.adapters.get_or_create(&TierLabels { tier }).set(g(n));
            set(&self.hits.get_or_create(&TierLabels { tier }), hits);
        }
        set(&self.promotions, s.promotions);
        set(&self.demotions, s.demotions);
        set(&self.evictions, s.evictions);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route's pattern (`/v1/chat/completions`), or `other` for paths no route matches.
    pub route: String,
    pub status: u16,
}

/// Adapter names `adapter_requests_by_name` keeps a series for.
pub const ADAPTER_LABELS: usize = 64;

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RouteLabels, Counter>,
    /// Resident set in bytes, read at each scrape.
    rss: Gauge,
    /// Reactions of the memory governor (layers demoted or pinned again, page cache dropped).
    pub pressure_events: Counter,
    /// Generation requests by adapter name: at most [`ADAPTER_LABELS`] names, later ones
    /// counted as `other` (names come and go while serving; the series must not grow forever).
    adapter_requests: Family<AdapterLabels, Counter>,
    adapter_labels: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Connections closed at once because `--max-connections` were open.
    pub connections_refused: Counter,
    /// Connections that had sent no request, closed at `--max-connections` for a newer one.
    pub connections_evicted: Counter,
    store: Option<Arc<AdapterStore>>,
    store_metrics: StoreMetrics,
    protocol: Option<vllm::Protocol>,
    /// The expert cache's counters, set when the residency has one.
    pub experts: ExpertSlot,
    /// The prefix cache's disk tier's numbers (all 0 while it is off).
    pub disk: Arc<DiskStats>,
}

impl Metrics {
    /// A registry over the scheduler's `counters`, the HTTP request counts and the process's
    /// memory against `budget` bytes (the plan's budget; 0 if unknown).
    pub fn new(counters: &Counters, budget: u64) -> Metrics {
        // The root holds the protocol's unprefixed names ([`Metrics::set_engine`]); snug's own
        // are all `snug_…`.
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("snug");
        let requests = Family::<RouteLabels, Counter>::default();
        let rss = Gauge::default();
        let budget_gauge: Gauge = Gauge::default();
        budget_gauge.set(budget.min(i64::MAX as u64) as i64);
        let pressure_events = Counter::default();
        let adapter_requests = Family::<AdapterLabels, Counter>::default();
        let connections_refused = Counter::default();
        let connections_evicted = Counter::default();
        let experts = ExpertSlot::default();
        let expert = |f: fn(&ExpertStats) -> &AtomicU64| ExpertCounter(experts.clone(), f);
        let disk = Arc::new(DiskStats::default());
        let disk_n = |f: fn(&DiskStats) -> &AtomicU64| DiskMetric(disk.clone(), f, false);
        let disk_g = |f: fn(&DiskStats) -> &AtomicU64| DiskMetric(disk.clone(), f, true);
        macro_rules! register {
            ($($name:literal: $help:literal => $metric:expr),* $(,)?) => {
                $(registry.register($name, $help, $metric.clone());)*
            };
        }
        let c = counters;
        register! {
            "http_requests": "HTTP requests by route and status" => requests,
            "queue_depth": "Requests waiting for a free sequence" => Exported(c.queued.clone()),
            "running_sequences": "Sequences being computed" => Exported(c.running.clone()),
            "prompt_tokens": "Prompt tokens computed" => Exported(c.prompt_tokens.clone()),
            "generated_tokens": "Tokens generated" => Exported(c.generated_tokens.clone()),
            "time_to_first_token_seconds": "Seconds from a request's admission to its first token"
                => Exported(c.ttft.clone()),
            "inter_token_seconds": "Seconds between consecutive tokens of one sequence"
                => Exported(c.itl.clone()),
            "kv_blocks_used": "KV cache blocks held by running sequences"
                => Exported(c.kv_blocks_used.clone()),
            "kv_blocks_free": "KV cache blocks free" => Exported(c.kv_blocks_free.clone()),
            "kv_blocks_cached": "KV cache blocks held only by the prefix cache"
                => Exported(c.kv_blocks_cached.clone()),
            "prefix_hit_tokens": "Prompt tokens whose KV came from the prefix cache"
                => Exported(c.prefix_hit_tokens.clone()),
            "prefix_cache_sheds": "Times the prefix cache was dropped for memory pressure"
                => Exported(c.prefix_sheds.clone()),
            "draft_tokens": "Guessed tokens verified by speculative decoding, by drafter"
                => ByDrafter(c.draft_tokens.clone()),
            "draft_accepted_tokens": "Guessed tokens kept (the model sampled the same), by drafter"
                => ByDrafter(c.draft_kept.clone()),
            "draft_acceptance_length": "Guessed tokens kept per verification pass, by drafter"
                => ByDrafter(c.draft_kept_per_pass.clone()),
            "resident_memory_bytes": "Resident set of the server process" => rss,
            "memory_budget_bytes": "The memory budget the server's plan was made in"
                => budget_gauge,
            "memory_pressure_events": "Reactions of the memory governor to the budget"
                => pressure_events,
            "adapter_requests_by_name": "Generation requests by LoRA adapter" => adapter_requests,
            "connections_refused": "Connections answered 503 and closed at once: --max-connections were open and each was being answered, or --max-connections-per-peer"
                => connections_refused,
            "connections_evicted": "Connections waiting for a request head (their first, or the next one kept alive), closed at --max-connections to make room for a new one"
                => connections_evicted,
            "expert_cache_hits": "Chosen experts the expert cache held (a streamed mixture of experts)"
                => expert(|s| &s.hits),
            "expert_cache_misses": "Chosen experts the expert cache read from the model file"
                => expert(|s| &s.misses),
            "expert_read_bytes": "Bytes of experts the expert cache read from the model file"
                => expert(|s| &s.bytes_read),
            "prefix_disk_hits": "KV blocks (32 tokens, all layers) the prefix cache read back from its disk tier"
                => disk_n(|s| &s.hits),
            "prefix_disk_misses": "Prompts that found no block on disk past the prefix cache's RAM match"
                => disk_n(|s| &s.misses),
            "prefix_disk_read_bytes": "Bytes the prefix cache's disk tier read" => disk_n(|s| &s.bytes_read),
            "prefix_disk_written_bytes": "Bytes the prefix cache's disk tier wrote"
                => disk_n(|s| &s.bytes_written),
            "prefix_disk_dropped": "Block files dropped as damaged, truncated or foreign (recomputed)"
                => disk_n(|s| &s.dropped),
            "prefix_disk_skipped": "Blocks not written: the writer's queue was full or writing failed"
                => disk_n(|s| &s.skipped),
            "prefix_disk_files": "Block files in the prefix cache's disk tier" => disk_g(|s| &s.files),
            "prefix_disk_bytes": "Bytes of block files in the prefix cache's disk tier"
                => disk_g(|s| &s.bytes),
        }
        let store_metrics = StoreMetrics::default();
        store_metrics.register(registry);
        Metrics {
            registry: root,
            requests,
            rss,
            pressure_events,
            adapter_requests,
            adapter_labels: Default::default(),
            connections_refused,
            connections_evicted,
            store: None,
            store_metrics,
            protocol: None,
            experts,
            disk,
        }
    }

    /// Exports the model-server protocol's gauges of `engine` and `store` under vLLM's names
    /// ([`vllm::Protocol`]); `max_lora` is `--max-loras`.
    pub fn set_engine(&mut self, engine: &Handle, store: Arc<AdapterStore>, max_lora: usize) {
        let p = vllm::Protocol::register(&mut self.registry, engine, store, max_lora);
        self.protocol = Some(p);
    }

    /// The adapter store whose numbers (and its pool's) each scrape reports.
    pub fn set_store(&mut self, store: Arc<AdapterStore>) {
        self.store = Some(store);
    }

    /// Counts a generation request on adapter `name`.
    pub fn adapter_request(&self, name: &str) {
        let mut known = self.adapter_labels.lock().unwrap_or_else(|p| p.into_inner());
        let label = if known.contains(name) || known.len() < ADAPTER_LABELS {
            known.insert(name.to_string());
            name
        } else {
            "other"
        };
        self.adapter_requests.get_or_create(&AdapterLabels { adapter: label.to_string() }).inc();
    }

    pub fn record(&self, route: &str, status: u16) {
        self.requests.get_or_create(&RouteLabels { route: route.to_string(), status }).inc();
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        if let Some(rss) = memory::probe::self_rss() {
            self.rss.set(rss.min(i64::MAX as u64) as i64);
        }
        if let Some(store) = &self.store {
            self.store_metrics.refresh(&store.stats());
        }
        if let Some(p) = &self.protocol {
            p.refresh();
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
