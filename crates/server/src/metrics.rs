//! `GET /metrics` in Prometheus text format (prometheus-client): HTTP requests by route and
//! status, the scheduler's queue depth and running sequences, prompt and generated token
//! totals, time to first token and inter-token latency. Cost: an atomic add per request and per
//! token; a scrape encodes a few dozen lines.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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
}

impl Metrics {
    /// A registry over the scheduler's `counters` and the HTTP request counts.
    pub fn new(counters: &Counters) -> Metrics {
        let mut registry = Registry::with_prefix("snug");
        let requests = Family::<RouteLabels, Counter>::default();
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
        }
        Metrics { registry, requests }
    }

    pub fn record(&self, route: &str, status: u16) {
        self.requests.get_or_create(&RouteLabels { route: route.to_string(), status }).inc();
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
