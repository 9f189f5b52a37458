//! `snug serve [MODEL]`: the OpenAI and Ollama HTTP APIs over the continuous-batching scheduler
//! (crate `server`). The KV cache is planned for `--parallel` whole contexts within the memory
//! budget; a plan that does not fit fails here, before anything listens.
//!
//! LoRA adapters: `--lora-dir DIR` serves every `*.gguf` adapter in DIR as `MODEL:STEM` (and
//! lets clients add files of DIR and remove adapters while serving); `--lora FILE[:SCALE]`
//! serves FILE the same way and applies it by default. The plan's adapter share is what the
//! adapter store may keep hot: `--max-loras` times the largest adapter's converted size (f32
//! rows, `4·r·(n_in + n_out)` bytes a matrix, read from the files' headers), or the `--lora`
//! files' sizes if larger.
//!
//! Prefix cache on disk (`model::kv::disk`): `--prefix-cache-dir DIR` (default a folder per
//! model file under `$SNUG_HOME/kv-cache`), `--prefix-cache-disk SIZE` (2G; 0: off).
//!
//! Behind a gateway (deploy/README.md): the port answers `/health` while the model loads and
//! `/ready` once it serves; SIGTERM drains within `--drain-timeout` and exits 0.
//!
//! Access (docs/SECURITY.md): `--api-key`/`--api-key-file`/$SNUG_API_KEY for every route but
//! `/health` and `/ready`; the admin routes need `--admin-key` (or $SNUG_ADMIN_KEY) or `--allow-admin`;
//! `--allowed-origins` for web pages; `--header-timeout`, `--body-timeout`,
//! `--max-connections` and `--max-body` bound what one client can hold.

use anyhow::Context as _;
use clap::Args;
use engine::draft::DraftKind;
use runtime::RunOptions;

use crate::cmd_ps::{DEFAULT_HOST, DEFAULT_PORT};
use crate::common::{explain, open, RunArgs, DEFAULT_MODEL};

#[derive(Args, Debug)]
pub struct ServeCmd {
    /// Model alias or .gguf path.
    #[arg(default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Address to listen on (loopback by default: other machines cannot connect).
    #[arg(long, default_value = DEFAULT_HOST)]
    pub host: String,
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Sequences computed together (each gets a whole context of KV cache).
    #[arg(long, short = 'p', default_value_t = 4)]
    pub parallel: usize,
    /// Requests that may wait for a free sequence; past that, 429 with Retry-After.
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Require `Authorization: Bearer KEY` (default: $SNUG_API_KEY; unset: no key needed).
    /// Prefer $SNUG_API_KEY or --api-key-file: a key on the command line shows in `ps`.
    #[arg(long, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from the first line of FILE.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// A separate key for the admin routes (adding and removing adapters, default LoRA
    /// scales, /api/pull), also accepted wherever the API key is (default: $SNUG_ADMIN_KEY).
    /// Without it or --allow-admin those routes answer 403.
    #[arg(long, conflicts_with_all = ["admin_key_file", "allow_admin"])]
    pub admin_key: Option<String>,
    /// Read the admin key from the first line of FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "allow_admin")]
    pub admin_key_file: Option<std::path::PathBuf>,
    /// Open the admin routes to whoever may use the API (key holders; anyone who can connect
    /// if there is no API key, which is refused on a non-loopback --host).
    #[arg(long)]
    pub allow_admin: bool,
    /// Browser origins (`http://app.example:3000`, or `*`) whose pages may call the server;
    /// requests from other origins are refused with 403. Comma-separated or repeated.
    #[arg(long, value_delimiter = ',', value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// Largest request body in bytes (1 MiB holds an OpenAI-sized request: a full 32k-token
    /// context of text is ~128 KiB; images are not accepted).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body: usize,
    /// Seconds a client has to send a request's headers; also how long an idle kept-alive
    /// connection stays open.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub header_timeout: f64,
    /// Seconds a client has to send a whole request body, counted from its headers.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub body_timeout: f64,
    /// Connections open at once. Past it the oldest connection that has sent no request yet is
    /// closed to make room; if every open connection has sent one, the new one is answered 503.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Connections one remote (non-loopback) address may hold at once; past it, 503.
    #[arg(long, default_value_t = 32)]
    pub max_connections_per_peer: usize,
    /// Seconds an answer may wait for the client to read any of it; then the connection is
    /// closed and the answer freed.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub write_timeout: f64,
    /// Prompt tokens computed per step while other sequences generate (default: sized so a
    /// step costs about two generation steps).
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    /// Speculative decoding: `ngram` guesses the next tokens of an answer from its prompt and
    /// what it wrote so far, verified in the same pass, while at most two sequences decode
    /// (a request can opt out with `"draft": false`); `off` computes one token a pass. Answers
    /// are the same either way.
    #[arg(long, value_name = "ngram|off", default_value = "ngram", value_parser = ["ngram", "off"])]
    pub draft: String,
    /// The name clients use for the model (default: MODEL as given, or the file's stem).
    #[arg(long)]
    pub name: Option<String>,
    /// A directory of LoRA adapters (`*.gguf`): each is served as MODEL:STEM, and clients may
    /// add more of its files (`POST /v1/adapters`) and remove adapters while serving.
    #[arg(long, value_name = "DIR")]
    pub lora_dir: Option<std::path::PathBuf>,
    /// Adapters kept converted in memory at once (the plan reserves room for this many of the
    /// largest in --lora-dir); others wait on disk and load on their first request. Default 4:
    /// room for 4 rank-16 adapters on all seven projections of a 7B model is ~0.6 GiB.
    #[arg(long, default_value_t = 4)]
    pub max_loras: usize,
    /// Seconds the requests in flight get to finish after SIGTERM or Ctrl-C (new ones are
    /// refused 503 and /ready says 503 meanwhile); those still running then end early, each
    /// with a well-formed end (`finish_reason: "abort"`).
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub drain_timeout: f64,
    /// How embeddings pool the token states: mean, cls or last. Default: the file's
    /// `{arch}.pooling_type`, else mean (decoder models).
    #[arg(long, value_name = "MODE", value_parser = engine::embed::parse_pooling)]
    pub pooling: Option<model::config::Pooling>,
    /// Use the chat template in this file instead of the model's (a Hugging Face Jinja
    /// template, as llama-server's --chat-template-file): for a model whose template is missing
    /// or renders no tools.
    #[arg(long, value_name = "FILE")]
    pub chat_template_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub prefix_disk: crate::cmd_cache::PrefixDiskArgs,
    #[command(flatten)]
    pub run: RunArgs,
}

pub fn run(cmd: ServeCmd) -> anyhow::Result<()> {
    if cmd.parallel == 0 {
        anyhow::bail!("--parallel must be at least 1");
    }
    if cmd.run.kv.window.is_some() {
        anyhow::bail!(
            "--window is not supported by snug serve: each sequence keeps its whole context"
        );
    }
    if let Some(d) = &cmd.lora_dir {
        if !d.is_dir() {
            anyhow::bail!("--lora-dir {} is not a directory", d.display());
        }
    }
    let keys = keys(&cmd)?;
    let limits = server::transport::Limits {
        header_timeout: seconds("--header-timeout", cmd.header_timeout)?,
        body_timeout: seconds("--body-timeout", cmd.body_timeout)?,
        max_connections: cmd.max_connections,
        max_connections_per_peer: cmd.max_connections_per_peer,
        write_timeout: seconds("--write-timeout", cmd.write_timeout)?,
    };
    if cmd.max_connections == 0 {
        anyhow::bail!("--max-connections must be at least 1");
    }
    let m = open(&cmd.model)?;
    let adapter_bytes = adapter_share(&cmd, &m.model.config)?;
    let (kv_k, kv_v) = cmd.run.kv.types()?;
    let kv_given =
        cmd.run.kv.kv.is_some() || cmd.run.kv.kv_k.is_some() || cmd.run.kv.kv_v.is_some();
    let o = RunOptions {
        n_ctx: cmd.run.ctx,
        n_threads: cmd.run.threads,
        n_ubatch: cmd.run.ubatch,
        kv: kv_given.then_some((kv_k, kv_v)),
        kv_window: None,
        kv_sinks: cmd.run.kv.sinks,
        n_seq: cmd.parallel,
        mem: cmd.run.mem.options(),
        adapter_bytes,
        json_mode: true,
        draft_tokens: DraftKind::parse(&cmd.draft).guess_rows(),
        draft_bytes: 0,
        prefix_disk: cmd.prefix_disk.prefix_cache_disk > 0,
    };
    let (mut params, planned) = runtime::plan_context(&m.model, &o, 2, None).map_err(explain)?;
    params.kv_rotate = cmd.run.kv.rotate()?;
    eprintln!("snug: {} sequences, {}", cmd.parallel, crate::advice::summary(&planned));
    if cmd.run.mem.verbose {
        eprintln!("{}", planned.choice.prediction.breakdown());
    }
    let name = cmd.name.clone().unwrap_or_else(|| {
        // A path is served by its file's stem, never as the path itself (clients see the name).
        let p = std::path::Path::new(&cmd.model);
        let is_path = p.extension().is_some_and(|e| e == "gguf") || p.components().count() > 1;
        match p.file_stem() {
            Some(s) if is_path => s.to_string_lossy().into_owned(),
            _ => cmd.model.clone(),
        }
    });
    let prefix_disk = cmd.prefix_disk.config(&m.path)?;
    if let Some(d) = &prefix_disk {
        eprintln!(
            "snug: prefix cache on disk: {}, at most {}",
            d.dir.display(),
            memory::fmt_bytes(d.budget)
        );
    }
    let opts = server::ServeOptions {
        host: cmd.host,
        port: cmd.port,
        api_key: keys.0,
        admin_key: keys.1,
        allow_admin: cmd.allow_admin,
        allowed_origins: cmd.allowed_origins.clone(),
        limits,
        max_body: cmd.max_body,
        queue: cmd.queue,
        prefill_chunk: cmd.prefill_chunk,
        draft: !DraftKind::parse(&cmd.draft).is_off(),
        name,
        budget: planned.budget.bytes,
        lora_dir: cmd.lora_dir.clone(),
        loras: cmd.run.lora.lora.clone(),
        adapter_budget: usize::try_from(adapter_bytes).unwrap_or(usize::MAX),
        plan: crate::cmd_plan::picture(
            &planned.choice.prediction,
            planned.budget.bytes,
            m.model.file.file_len(),
            planned.request(),
        ),
        max_loras: cmd.max_loras,
        drain_timeout: seconds("--drain-timeout", cmd.drain_timeout)?,
        pooling: cmd.pooling,
        chat_template: match &cmd.chat_template_file {
            Some(f) => Some(
                std::fs::read_to_string(f)
                    .with_context(|| format!("reading the chat template file {}", f.display()))?,
            ),
            None => None,
        },
        prefix_disk: prefix_disk.clone(),
    };
    let loaded =
        runtime::Loaded { path: m.path.clone(), model: m.model.clone(), tok: m.tok.clone() };
    server::serve(m.model, m.tok, &m.path, params, opts, move |ctx, pressure| {
        let log = pressure.clone();
        let residence = planned
            .attach(&loaded, ctx, move |line| log.say(line))
            .map_err(|e| format!("{:#}", explain(e)))?;
        if let Some(c) = residence.experts() {
            pressure.experts(c.stats().clone());
        }
        Ok(residence)
    })?;
    Ok(())
}

/// A positive number of seconds given to `flag`.
fn seconds(flag: &str, s: f64) -> anyhow::Result<std::time::Duration> {
    if !(s.is_finite() && s > 0.0 && s <= 86_400.0) {
        anyhow::bail!("{flag} must be a number of seconds above 0 and at most 86400");
    }
    Ok(std::time::Duration::from_secs_f64(s))
}

/// A key from `flag`, `file` or the environment variable `env`, in that order (empty: none).
fn key(
    flag: &Option<String>,
    file: &Option<std::path::PathBuf>,
    env: &str,
) -> anyhow::Result<Option<String>> {
    let k = match (flag, file) {
        (Some(k), _) => {
            eprintln!("snug: warning: a key given on the command line shows in `ps`; prefer ${env} or the -file flag");
            Some(k.clone())
        }
        (None, Some(f)) => {
            let text = std::fs::read_to_string(f)
                .map_err(|e| anyhow::anyhow!("cannot read the key file {}: {e}", f.display()))?;
            Some(text.lines().next().unwrap_or("").trim().to_string())
        }
        (None, None) => std::env::var(env).ok(),
    };
    Ok(k.filter(|k| !k.is_empty()))
}

/// The API key and the admin key; administration opened to anyone on a non-loopback address
/// is refused.
fn keys(cmd: &ServeCmd) -> anyhow::Result<(Option<String>, Option<String>)> {
    let api = key(&cmd.api_key, &cmd.api_key_file, "SNUG_API_KEY")?;
    let admin = if cmd.allow_admin {
        None
    } else {
        key(&cmd.admin_key, &cmd.admin_key_file, "SNUG_ADMIN_KEY")?
    };
    for (what, k) in [("the API key", &api), ("the admin key", &admin)] {
        if let Some(k) = k {
            server::access::check_key(what, k).map_err(|e| anyhow::anyhow!(e))?;
        }
    }
    let loopback = matches!(cmd.host.as_str(), "localhost" | "::1")
        || cmd.host.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback());
    if cmd.allow_admin && api.is_none() && !loopback {
        anyhow::bail!(
            "--allow-admin without an API key on --host {} would let anyone who can connect add adapters and pull models: set SNUG_API_KEY (or --admin-key instead)",
            cmd.host
        );
    }
    Ok((api, admin))
}

/// Bytes an adapter takes hot, from its GGUF header (checked against the model, nothing
/// converted): `model::lora::hot_bytes`.
fn hot_bytes(
    f: &gguf::GgufFile,
    path: &std::path::Path,
    c: &model::ModelConfig,
) -> anyhow::Result<usize> {
    model::lora::hot_bytes(f, c).map_err(|e| anyhow::anyhow!("the adapter {}: {e}", path.display()))
}

/// The plan's adapter share (`model::lora::share_bytes`, whole pool pages included): room for
/// `--max-loras` of the largest adapter in `--lora-dir` (files that are not adapters for this
/// model are left to the server, which skips them), or for the `--lora` files together,
/// whichever is larger.
fn adapter_share(cmd: &ServeCmd, c: &model::ModelConfig) -> anyhow::Result<u64> {
    let mut given = 0usize;
    for (path, _) in &cmd.run.lora.lora {
        let f = gguf::GgufFile::open(path)
            .map_err(|e| anyhow::anyhow!("reading the adapter {}: {e}", path.display()))?;
        given = given.saturating_add(model::lora::share_bytes(c, 1, hot_bytes(&f, path, c)?));
    }
    let mut largest = None;
    if let Some(dir) = &cmd.lora_dir {
        for d in server::adapters::dir_files(dir)? {
            let f = gguf::GgufFile::from_file(&d.file, &d.stem);
            largest = largest.max(f.ok().and_then(|f| hot_bytes(&f, &d.real, c).ok()));
        }
    }
    let dir = largest.map_or(0, |b| model::lora::share_bytes(c, cmd.max_loras, b));
    Ok(given.max(dir) as u64)
}
