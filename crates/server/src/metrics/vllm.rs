//! The model-server protocol's metrics, under the names vLLM gives them: what the Gateway API
//! Inference Extension's endpoint picker reads by default to route across replicas (queue
//! depth, running requests, KV-cache use, the KV block geometry, the LoRA adapters in use).
//!
//! Design: no number here is counted twice. The queue and running gauges are the scheduler's
//! own handles registered under a second name; KV use is the scheduler's used-block gauge over
//! the pool's blocks; the adapters in use are the scheduler's published snapshot
//! ([`Handle::waiting_adapters`]) and the adapter store's hot tier. KV use counts blocks held by sequences: blocks only the
//! prefix cache holds are free to take (they are evicted on demand), as vLLM counts its own.
//! `vllm:lora_requests_info` follows the protocol: one series whose labels carry `max_lora`
//! (adapters kept ready in memory at once, `--max-loras`), `running_lora_adapters` (those
//! ready in memory now: the store's hot tier, which holds every adapter a running request
//! uses) and `waiting_lora_adapters` (those of requests waiting for a slot), comma-separated,
//! and whose value is the Unix time it was last set (here: the scrape, which reads the current
//! state); the picker takes the series with the newest value. The waiting label only ever names
//! adapters of the hot tier read for the running label ([`waiting_label`]): a waiting job holds
//! leases, so its adapters are hot anyway, and a name the store no longer serves (a snapshot a
//! step late, an adapter removed since) never reaches a scrape; every name shown is one any key
//! holder can list at `/v1/adapters`. Which served adapters have queued work is what the picker's
//! affinity needs, so that much is shown; no other request detail (bodies, counts per client) is.
//! Cost per scrape: the store's list (a lock per adapter), one division, a binary search per
//! waiting adapter, a few short strings.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use model::lora::{AdapterStore, Tier};

use engine::scheduler::Handle;

use super::Exported;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    block_size: String,
    num_gpu_blocks: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LoraLabels {
    max_lora: String,
    running_lora_adapters: String,
    waiting_lora_adapters: String,
}

/// The protocol's gauges over one scheduler.
pub struct Protocol {
    engine: Handle,
    store: Arc<AdapterStore>,
    max_lora: usize,
    kv_usage: Gauge<f64, AtomicU64>,
    lora: Family<LoraLabels, Gauge<f64, AtomicU64>>,
}

impl Protocol {
    /// Registers the gauges of `engine` and `store` in `r` (the root registry: these names
    /// carry no `snug_` prefix); `max_lora` is how many adapters the server keeps ready at
    /// once (`--max-loras`).
    pub fn register(
        r: &mut Registry,
        engine: &Handle,
        store: Arc<AdapterStore>,
        max_lora: usize,
    ) -> Protocol {
        let c = &engine.counters;
        r.register(
            "vllm:num_requests_waiting",
            "Requests waiting for a free sequence (the same gauge as snug_queue_depth)",
            Exported(c.queued.clone()),
        );
        r.register(
            "vllm:num_requests_running",
            "Sequences being computed (the same gauge as snug_running_sequences)",
            Exported(c.running.clone()),
        );
        let kv_usage = Gauge::<f64, AtomicU64>::default();
        r.register(
            "vllm:kv_cache_usage_perc",
            "Fraction of the KV cache's blocks held by sequences, 0 to 1 (snug_kv_blocks_used over all blocks)",
            kv_usage.clone(),
        );
        let cache = Family::<CacheLabels, Gauge>::default();
        cache
            .get_or_create(&CacheLabels {
                block_size: model::kv::BLOCK_TOKENS.to_string(),
                // vLLM's block spans every layer; snug's pool counts one per layer.
                num_gpu_blocks: (engine.kv_blocks / engine.n_layer.max(1)).to_string(),
            })
            .set(1);
        r.register(
            "vllm:cache_config_info",
            "The KV cache's geometry in its labels: tokens per block and blocks (in memory, not on a GPU)",
            cache,
        );
        let lora = Family::<LoraLabels, Gauge<f64, AtomicU64>>::default();
        r.register(
            "vllm:lora_requests_info",
            "LoRA adapters of the running and waiting requests in the labels; the value is the Unix time they were read",
            lora.clone(),
        );
        Protocol { engine: engine.clone(), store, max_lora, kv_usage, lora }
    }

    /// Reads the scheduler's state into the gauges (before each encoding).
    pub fn refresh(&self) {
        let used = self.engine.counters.kv_blocks_used.get().max(0) as f64;
        let all = self.engine.kv_blocks.max(1) as f64;
        self.kv_usage.set((used / all).min(1.0));
        let mut hot: Vec<String> =
            self.store.list().into_iter().filter(|a| a.tier == Tier::Hot).map(|a| a.name).collect();
        hot.sort_unstable();
        let labels = LoraLabels {
            max_lora: self.max_lora.to_string(),
            running_lora_adapters: hot.join(","),
            waiting_lora_adapters: waiting_label(&self.engine.waiting_adapters(), &hot),
        };
        self.lora.clear();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        self.lora.get_or_create(&labels).set(now.map_or(0.0, |d| d.as_secs_f64()));
    }
}

/// The waiting jobs' adapters (sorted) that are among `hot` (sorted), comma-separated.
fn waiting_label(waiting: &[String], hot: &[String]) -> String {
    let shown: Vec<&str> =
        (waiting.iter()).filter(|w| hot.binary_search(w).is_ok()).map(String::as_str).collect();
    shown.join(",")
}

#[cfg(test)]
mod tests {
    use super::waiting_label;

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_waiting_label_names_only_hot_adapters() {
        let hot = v(&["fr", "legal", "sql"]);
        assert_eq!(waiting_label(&v(&["fr", "sql"]), &hot), "fr,sql");
        // A name the store no longer holds hot (removed, or a stale snapshot) is not shown.
        assert_eq!(waiting_label(&v(&["gone", "legal", "zz-secret"]), &hot), "legal");
        assert_eq!(waiting_label(&v(&["gone"]), &hot), "");
        assert_eq!(waiting_label(&[], &hot), "");
        assert_eq!(waiting_label(&v(&["fr"]), &[]), "");
    }
}
