//! `GET /metrics` in Prometheus text format (prometheus-client): HTTP requests by route and
//! status; the scheduler's queue depth, running sequences, prompt and generated token totals,
//! time to first token and inter-token latency, KV blocks used / free / held by the prefix
//! cache, prefix-cache hit tokens and sheds; the process's resident set against the memory
//! budget the plan was made in, and the memory governor's reactions to pressure. Cost: an atomic
//! add per request and per token; a scrape reads `/proc/self/status` once and encodes a few
//! dozen lines.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::scheduler::Counters;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route's pattern (`/v1/chat/completions`), or `other` for paths no route matches.
    pub route: String,
    pub status: u16,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RouteLabels, Counter>,
    /// Resident set in bytes, read at each scrape.
    rss: Gauge,
    /// Reactions of the memory governor (layers demoted or pinned again, page cache dropped).
    pub pressure_events: Counter,
}

impl Metrics {
    /// A registry over the scheduler's `counters`, the HTTP request counts and the process's
    /// memory against `budget` bytes (the plan's budget; 0 if unknown).
    pub fn new(counters: &Counters, budget: u64) -> Metrics {
        let mut registry = Registry::with_prefix("snug");
        let requests = Family::<RouteLabels, Counter>::default();
        let rss = Gauge::default();
        let budget_gauge: Gauge = Gauge::default();
        budget_gauge.set(budget.min(i64::MAX as u64) as i64);
        let pressure_events = Counter::default();
        macro_rules! register {
            ($($name:literal: $help:literal => $metric:expr),* $(,)?) => {
                $(registry.register($name, $help, $metric.clone());)*
            };
        }
        register! {
            "http_requests": "HTTP requests by route and status" => requests,
            "queue_depth": "Requests waiting for a free sequence" => counters.queued,
            "running_sequences": "Sequences being computed" => counters.running,
            "prompt_tokens": "Prompt tokens computed" => counters.prompt_tokens,
            "generated_tokens": "Tokens generated" => counters.generated_tokens,
            "time_to_first_token_seconds": "Seconds from a request's admission to its first token"
                => counters.ttft,
            "inter_token_seconds": "Seconds between consecutive tokens of one sequence"
                => counters.itl,
            "kv_blocks_used": "KV cache blocks held by running sequences" => counters.kv_blocks_used,
            "kv_blocks_free": "KV cache blocks free" => counters.kv_blocks_free,
            "kv_blocks_cached": "KV cache blocks held only by the prefix cache"
                => counters.kv_blocks_cached,
            "prefix_hit_tokens": "Prompt tokens whose KV came from the prefix cache"
                => counters.prefix_hit_tokens,
            "prefix_cache_sheds": "Times the prefix cache was dropped for memory pressure"
                => counters.prefix_sheds,
            "resident_memory_bytes": "Resident set of the server process" => rss,
            "memory_budget_bytes": "The memory budget the server's plan was made in"
                => budget_gauge,
            "memory_pressure_events": "Reactions of the memory governor to the budget"
                => pressure_events,
        }
        Metrics { registry, requests, rss, pressure_events }
    }

    pub fn record(&self, route: &str, status: u16) {
        self.requests.get_or_create(&RouteLabels { route: route.to_string(), status }).inc();
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        if let Some(rss) = memory::probe::self_rss() {
            self.rss.set(rss.min(i64::MAX as u64) as i64);
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
