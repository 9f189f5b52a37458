//! `snug ps`: what a running `snug serve` holds, like `ollama ps` — model, file size and context
//! per sequence from its Ollama route `GET /api/ps` (and parallel sequences if a record has
//! `parallel`), then the sequences running and waiting and its resident memory against the
//! budget its plan was made in from `GET /metrics` (`snug_running_sequences`, `snug_queue_depth`,
//! `snug_resident_memory_bytes`, `snug_memory_budget_bytes`; `-` where a server has none).
//!
//! Each request is one HTTP/1.0 GET (no client crate: HTTP/1.0 has no chunked bodies or
//! keep-alive, so the answer is the bytes up to the server's close).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use std::collections::HashMap;

use anyhow::Context as _;
use serde_json::Value;

/// Where `snug serve` listens unless told otherwise (one owner: `snug serve` takes these too).
pub const DEFAULT_HOST: &str = "127.0.0.1";
pub const DEFAULT_PORT: u16 = 8080;

#[derive(clap::Args, Debug)]
pub struct PsArgs {
    /// The server's address.
    #[arg(long, default_value = DEFAULT_HOST)]
    pub host: String,
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// The key the server was started with (default: $SNUG_API_KEY).
    #[arg(long)]
    pub api_key: Option<String>,
}

pub fn run(args: PsArgs) -> anyhow::Result<()> {
    let key = args.api_key.clone().or_else(|| std::env::var("SNUG_API_KEY").ok());
    let body = get(&args.host, args.port, "/api/ps", key.as_deref())?;
    let ps: Value = serde_json::from_str(&body).with_context(|| {
        format!("{}:{} answered /api/ps with something other than JSON", args.host, args.port)
    })?;
    // The server's own gauges; a server without /metrics (or an older one) still lists its models.
    let gauges = get(&args.host, args.port, "/metrics", key.as_deref())
        .map(|text| gauges(&text))
        .unwrap_or_default();
    let models = ps["models"].as_array().cloned().unwrap_or_default();
    let rows: Vec<[String; 7]> = models.iter().map(|m| row(m, &gauges)).collect();
    let w = rows.iter().map(|r| r[0].len()).max().unwrap_or(0).max(4);
    println!(
        "{:w$}  {:>10}  {:>7}  {:>8}  {:>7}  {:>6}  MEMORY",
        "NAME", "SIZE", "CONTEXT", "PARALLEL", "RUNNING", "QUEUED"
    );
    for r in &rows {
        println!(
            "{:w$}  {:>10}  {:>7}  {:>8}  {:>7}  {:>6}  {}",
            r[0], r[1], r[2], r[3], r[4], r[5], r[6]
        );
    }
    if rows.is_empty() {
        eprintln!("the server at {}:{} holds no model", args.host, args.port);
    }
    Ok(())
}

/// The unlabelled samples of a Prometheus text exposition, by metric name.
fn gauges(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            let value = value.split_whitespace().next()?.parse().ok()?;
            (!name.contains('{')).then(|| (name.to_string(), value))
        })
        .collect()
}

/// One `/api/ps` record and the server's gauges as table cells; what the server does not
/// report is `-`.
fn row(m: &Value, gauges: &HashMap<String, f64>) -> [String; 7] {
    let num = |k: &str| m[k].as_u64();
    let gauge = |k: &str| gauges.get(k).map(|&v| v.max(0.0) as u64);
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let memory = match (gauge("snug_resident_memory_bytes"), gauge("snug_memory_budget_bytes")) {
        (Some(rss), Some(budget)) => {
            format!("{} of {}", runtime::fmt_bytes(rss), runtime::fmt_bytes(budget))
        }
        (Some(rss), None) => runtime::fmt_bytes(rss),
        _ => "-".to_string(),
    };
    [
        or_dash(m["name"].as_str().or(m["model"].as_str()).map(str::to_string)),
        or_dash(num("size").map(runtime::fmt_bytes)),
        or_dash(num("context_length").map(|n| n.to_string())),
        or_dash(num("parallel").map(|n| n.to_string())),
        or_dash(gauge("snug_running_sequences").map(|n| n.to_string())),
        or_dash(gauge("snug_queue_depth").map(|n| n.to_string())),
        memory,
    ]
}

/// `GET path` from `host:port`; the body of a 200, else an error that says what to do.
fn get(host: &str, port: u16, path: &str, key: Option<&str>) -> anyhow::Result<String> {
    let no_server =
        || format!("no snug server at {host}:{port}: start one with `snug serve MODEL`");
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve the server address {host}:{port}"))?
        .collect();
    let mut stream = addrs
        .iter()
        .find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(5)).ok())
        .with_context(no_server)?;
    // A server that accepts but never answers is not a snug server worth waiting for.
    stream.set_read_timeout(Some(Duration::from_secs(30))).context("setting a read timeout")?;
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\n{auth}\r\n");
    let mut response = Vec::new();
    stream
        .write_all(request.as_bytes())
        .and_then(|_| stream.read_to_end(&mut response))
        .with_context(no_server)?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse::<u16>().ok());
    match status {
        Some(200) => Ok(body.to_string()),
        Some(401) => anyhow::bail!(
            "the server at {host}:{port} wants an API key: pass --api-key or set SNUG_API_KEY"
        ),
        Some(code) => anyhow::bail!("{host}:{port} answered {path} with HTTP {code}: {body}"),
        None => anyhow::bail!("{}: it did not answer HTTP", no_server()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_takes_the_record_and_the_servers_gauges() {
        let text = "# HELP snug_queue_depth x\n# TYPE snug_queue_depth gauge\nsnug_queue_depth 2\n\
                    snug_running_sequences 1\nsnug_resident_memory_bytes 1073741824\n\
                    snug_memory_budget_bytes 2147483648\n\
                    snug_http_requests_total{route=\"/api/ps\",status=\"200\"} 3\n# EOF\n";
        let g = gauges(text);
        assert_eq!(g.len(), 4, "{g:?}");
        let m = serde_json::json!({"name": "m", "size": 1048576, "context_length": 512});
        assert_eq!(row(&m, &g), ["m", "1.0 MiB", "512", "-", "1", "2", "1.00 GiB of 2.00 GiB"]);
        assert_eq!(row(&m, &HashMap::new())[4..], ["-", "-", "-"]);
    }
}
