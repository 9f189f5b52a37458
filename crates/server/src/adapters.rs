//! LoRA adapters over HTTP: which adapters a request runs with, leasing them before the job
//! reaches the scheduler, and the routes that list, add and remove them while serving.
//!
//! The adapters themselves live in one [`AdapterStore`] (`model::lora`), shared by the
//! handlers and the scheduler: registering one only validates its file (it stays cold, on
//! disk); [`AdapterStore::acquire`] loads or promotes it and pins it with a lease. Handlers
//! acquire on tokio's blocking pool ([`Adapters::lease`]), so a cold adapter loading never
//! holds up the scheduler's step or the other sequences; the [`JobAdapters`] of leases travels
//! with the job, the scheduler sets the sequence's adapters when it admits the job and clears
//! them (dropping the leases) when the sequence ends or its client goes away. An adapter
//! removed while in use is unregistered at once (new requests get 404); the requests holding a
//! lease keep its weights until they finish.
//!
//! Which adapters a request runs with:
//! - `"model": "BASE:ADAPTER"` (OpenAI and Ollama routes): that adapter at scale 1; also
//!   `"model": "ADAPTER"`, vLLM's way, which an inference gateway sends (the served model's
//!   own names come first).
//! - `"lora": [{"id": N, "scale": S}]` (llama-server's field): `id` indexes the list
//!   `GET /lora-adapters` returns (every registered adapter, by name); the adapters named get
//!   their scales and no other adapter applies, as in llama-server. With a `BASE:ADAPTER` model
//!   too, both apply (the `lora` entry's scale wins for the same adapter).
//! - Neither: the default scales, which `snug serve --lora FILE[:SCALE]` sets (like
//!   llama-server's `--lora`, they apply to every such request) and `POST /lora-adapters`
//!   changes. Adapters at scale 0 are left out.
//!
//! An adapter nobody registered is a 404 naming it; a malformed `lora` entry (a scale outside
//! ±[`MAX_SCALE`], an id twice, more entries than [`MAX_ADAPTERS`]) a 400.
//!
//! Adding, removing and setting default scales administer the server: [`crate::access`] lets
//! them through only with the admin key or `--allow-admin`. At most [`MAX_ADAPTERS`] are
//! registered, and one larger than the whole adapter share is refused when added.
//!
//! Files: `POST /v1/adapters {"name", "file"}` takes a file NAME inside `--lora-dir` and
//! nothing else ([`open_confined`]): a path separator, `..` or an absolute path is refused,
//! and the file is opened once and checked on its handle (a regular file whose real path is in
//! the directory), then mapped from that handle, never reopened by name. Without
//! `--lora-dir` nothing can be added over HTTP. Names are `[A-Za-z0-9._-]`, 1 to 64 bytes, not
//! starting with `.` or `-` ([`check_name`]).
//!
//! Tiers: an adapter nobody leased for [`IDLE`] steps down a tier (hot → warm → cold), checked
//! every quarter of that on the blocking pool ([`demote_idle`]); the store also demotes by
//! itself when it needs room for another.
//!
//! Cost per request: a lock and a scan of the registered names; acquiring a hot adapter is a
//! refcount, a cold one is a file read and dequantization on the blocking pool.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use engine::scheduler::JobAdapters;
use model::lora::{AdapterInfo, AdapterStore, LoraError, Tier};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::error::{body_bytes, from_json, ApiError, Style};
use crate::flags::{LORA_DIR, MAX_LORAS};
use crate::responses::llama::{LoraAdapter, Success};
use crate::responses::snug;
use crate::Shared;

/// One entry of llama-server's `lora` list (a request's field and `POST /lora-adapters`'
/// body): an adapter by its index in `GET /lora-adapters`, and its scale.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema)]
#[schemars(rename = "LoraScale")]
pub struct LoraScale {
    /// Index in the list `GET /lora-adapters` returns.
    pub id: u32,
    /// The adapter's scale (0 leaves it out).
    pub scale: f32,
}

/// The largest scale magnitude an adapter may be applied with: past a few units an adapter's
/// delta swamps the base weights and the logits overflow (a scale of 3e38 turns every answer
/// into NaN), so such a scale is a mistake, refused with a 400.
pub const MAX_SCALE: f32 = 8.0;

/// Adapters registered at once at most (each keeps its file mapped and its header parsed);
/// past it, adding one is a 409 and `--lora-dir` files beyond it are skipped at start.
pub const MAX_ADAPTERS: usize = 256;

/// Checks a `lora` list: at most [`MAX_ADAPTERS`] entries, finite scales within
/// ±[`MAX_SCALE`], each id once (one pass, a set of the ids seen).
pub fn check_lora(style: Style, list: &[LoraScale]) -> Result<(), ApiError> {
    if list.len() > MAX_ADAPTERS {
        return Err(ApiError::bad_request(
            style,
            format!(
                "lora lists {} entries: at most {MAX_ADAPTERS} (one per registered adapter)",
                list.len()
            ),
        ));
    }
    let mut seen = HashSet::with_capacity(list.len());
    for (i, e) in list.iter().enumerate() {
        if !e.scale.is_finite() || e.scale.abs() > MAX_SCALE {
            return Err(ApiError::bad_request(
                style,
                format!("lora[{i}].scale must be a number from -{MAX_SCALE} to {MAX_SCALE}"),
            ));
        }
        if !seen.insert(e.id) {
            return Err(ApiError::bad_request(
                style,
                format!("lora names adapter id {} twice: give each adapter once", e.id),
            ));
        }
    }
    Ok(())
}

/// The server's adapters: the store, the directory files may come from, the default scales.
pub struct Adapters {
    pub store: Arc<AdapterStore>,
    /// `--lora-dir`, canonical; `None`: no adapter can be added over HTTP.
    pub dir: Option<PathBuf>,
    /// Scales applied to requests that name no adapter (`--lora`, `POST /lora-adapters`).
    defaults: Mutex<HashMap<String, f32>>,
    /// The base model's name, for `BASE:ADAPTER` listings.
    base: String,
}

/// A name clients may use for an adapter: `[A-Za-z0-9._-]`, 1 to 64 bytes, not starting with
/// `.` or `-`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty()
        || name.len() > 64
        || name.starts_with(['.', '-'])
        || !name.chars().all(ok_char)
    {
        return Err(format!(
            "adapter name {name:?} is not valid: use 1 to 64 of A-Z a-z 0-9 . _ - (not starting with . or -)"
        ));
    }
    Ok(())
}

/// Why a file name was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Confine {
    /// Not a plain file name, or it resolves outside the directory (a 400).
    Outside(String),
    /// No such file in the directory (a 404).
    Missing(String),
}

/// `file` (a plain name) opened inside `dir`, and its real path: refused if it is not a plain
/// file name (a path separator, `..`, an absolute path, a NUL), if it does not exist or is
/// not a regular file, or if what was opened (symlinks resolved) is not in `dir`.
///
/// The file is opened once and every check runs on the open handle (`fstat`, and the path
/// the kernel gives for the descriptor in `/proc/self/fd`), so swapping the name for a symlink
/// elsewhere or a FIFO between a check and the open changes nothing: the caller maps this
/// very handle and never opens the name again. `O_NONBLOCK` keeps a FIFO from blocking the
/// open itself.
pub fn open_confined(dir: &Path, file: &str) -> Result<(File, PathBuf), Confine> {
    use std::os::unix::fs::OpenOptionsExt;
    let plain = !file.is_empty()
        && file != "."
        && !file.contains(['/', '\\', '\0'])
        && !file.contains("..")
        && !Path::new(file).is_absolute();
    if !plain {
        return Err(Confine::Outside(format!(
            "file {file:?} must be the name of a file in the adapter directory: no path separators, `..` or absolute paths"
        )));
    }
    let missing =
        || Confine::Missing(format!("there is no adapter file {file:?} in the adapter directory"));
    let root = dir.canonicalize().map_err(|_| missing())?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(root.join(file))
        .map_err(|_| missing())?;
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return Err(missing());
    }
    use std::os::fd::AsRawFd;
    let real =
        std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).map_err(|_| missing())?;
    if real.parent() != Some(root.as_path()) {
        return Err(Confine::Outside(format!(
            "file {file:?} resolves outside the adapter directory (a symlink?): refused"
        )));
    }
    Ok((f, real))
}

/// A `*.gguf` file of the adapter directory, opened by [`open_confined`].
pub struct DirFile {
    /// The name it is served as (the file name without `.gguf`).
    pub stem: String,
    pub real: PathBuf,
    pub file: File,
}

/// The `*.gguf` files directly in `dir` (a symlink only if it resolves inside `dir`), sorted
/// by name, each opened once.
pub fn dir_files(dir: &Path) -> std::io::Result<Vec<DirFile>> {
    let mut files: Vec<DirFile> = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let name = e?.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(".gguf") else { continue };
        match open_confined(dir, name) {
            Ok((file, real)) => files.push(DirFile { stem: stem.to_string(), real, file }),
            Err(Confine::Outside(m)) => eprintln!("snug: skipping {name}: {m}"),
            Err(Confine::Missing(_)) => {}
        }
    }
    files.sort_by(|a, b| a.stem.cmp(&b.stem));
    Ok(files)
}

/// Registers the opened `file` (shown by its file name only) as `name` in `store`.
pub fn register_opened(
    store: &AdapterStore,
    name: &str,
    real: &Path,
    file: &File,
) -> Result<AdapterInfo, LoraError> {
    let label = real.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let f = gguf::GgufFile::from_file(file, &label)?;
    store.register_file(name, real, f)
}

fn tier(t: Tier) -> snug::Tier {
    match t {
        Tier::Hot => snug::Tier::Hot,
        Tier::Warm => snug::Tier::Warm,
        Tier::Cold => snug::Tier::Cold,
    }
}

/// A file's name, never its directory (which tells a client about the server's filesystem).
fn file_name(p: &Path) -> String {
    p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
}

impl Adapters {
    /// `store` serving `base`, with files from `dir` (canonicalized here) and `defaults`
    /// (registered names and their scales).
    pub fn new(
        store: Arc<AdapterStore>,
        dir: Option<&Path>,
        defaults: &[(String, f32)],
        base: &str,
    ) -> std::io::Result<Adapters> {
        let dir = dir.map(Path::canonicalize).transpose()?;
        let defaults = Mutex::new(defaults.iter().cloned().collect());
        Ok(Adapters { store, dir, defaults, base: base.to_string() })
    }

    fn defaults(&self) -> std::sync::MutexGuard<'_, HashMap<String, f32>> {
        self.defaults.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `BASE:NAME`.
    pub fn model_name(&self, name: &str) -> String {
        format!("{}:{name}", self.base)
    }

    pub fn list(&self) -> Vec<AdapterInfo> {
        self.store.list()
    }

    fn unknown(style: Style, what: String) -> ApiError {
        ApiError::new(style, StatusCode::NOT_FOUND, what).with_code("adapter_not_found")
    }

    /// `Ok` if `name` is in `list`, else a 404 naming it.
    pub fn require(style: Style, list: &[AdapterInfo], name: &str) -> Result<(), ApiError> {
        if list.iter().any(|a| a.name == name) {
            return Ok(());
        }
        Err(Adapters::unknown(
            style,
            format!("adapter {name:?} is not registered here (GET /v1/adapters lists them)"),
        ))
    }

    /// The adapters and scales a request runs with (see the module doc), by name.
    pub fn select(
        &self,
        style: Style,
        named: Option<&str>,
        lora: Option<&[LoraScale]>,
    ) -> Result<Vec<(String, f32)>, ApiError> {
        let list = self.list();
        let mut set: Vec<(String, f32)> = Vec::new();
        if let Some(n) = named {
            Adapters::require(style, &list, n)?;
            set.push((n.to_string(), 1.0));
        }
        match lora {
            Some(entries) => {
                check_lora(style, entries)?;
                for e in entries {
                    let a = list.get(e.id as usize).ok_or_else(|| {
                        Adapters::unknown(
                            style,
                            format!(
                                "adapter id {} is not registered here: GET /lora-adapters lists {} adapters",
                                e.id,
                                list.len()
                            ),
                        )
                    })?;
                    set.retain(|(n, _)| *n != a.name);
                    set.push((a.name.clone(), e.scale));
                }
            }
            None if named.is_none() => {
                let d = self.defaults();
                set.extend(
                    list.iter().filter_map(|a| d.get(&a.name).map(|&s| (a.name.clone(), s))),
                );
            }
            None => {}
        }
        set.retain(|&(_, s)| s != 0.0);
        Ok(set)
    }

    /// Leases `set` on the blocking pool (a cold adapter is read and converted there, never on
    /// the scheduler's thread) and computes its prefix-cache salt. When the adapter share is
    /// full of adapters running sequences pin, it waits for one to finish (retrying every
    /// [`RETRY`], holding no lease meanwhile, so two sets cannot block each other), up to
    /// [`WAIT`]; then a 503 with `Retry-After`. A client that leaves stops the wait.
    pub async fn lease(
        self: &Arc<Self>,
        style: Style,
        set: Vec<(String, f32)>,
    ) -> Result<JobAdapters, ApiError> {
        if set.is_empty() {
            return Ok(JobAdapters::default());
        }
        let t0 = std::time::Instant::now();
        loop {
            match self.try_lease(style, set.clone()).await? {
                Ok(got) => return Ok(got),
                // Pages held by other adapters (pinned: the store evicts unpinned ones itself)
                // come back as their requests end; with none held, it can never fit.
                Err((_, LoraError::PoolFull { source, .. }))
                    if source.adapter > 0 && t0.elapsed() < WAIT =>
                {
                    tokio::time::sleep(RETRY).await;
                }
                Err((name, e)) => return Err(lease_error(style, &name, e)),
            }
        }
    }

    /// One attempt at leasing `set` (all or none) on the blocking pool.
    async fn try_lease(
        self: &Arc<Self>,
        style: Style,
        set: Vec<(String, f32)>,
    ) -> Result<Result<JobAdapters, (String, LoraError)>, ApiError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut leases = Vec::with_capacity(set.len());
            for (name, scale) in set {
                let lease = me.store.acquire(&name).map_err(|e| (name, e))?;
                leases.push((lease, scale));
            }
            let salt = me.store.salt(&leases);
            Ok(JobAdapters { leases, salt })
        })
        .await
        .map_err(|e| {
            ApiError::new(
                style,
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("loading adapters stopped: {e}"),
            )
        })
    }

    fn answer(&self, a: &AdapterInfo) -> snug::Adapter {
        snug::Adapter {
            name: a.name.clone(),
            model: self.model_name(&a.name),
            file: file_name(&a.path),
            rank: a.rank,
            alpha: a.alpha as f64,
            bytes_hot: a.bytes_hot,
            tier: tier(a.tier),
            leases: a.leases,
            default_scale: self.defaults().get(&a.name).copied().unwrap_or(0.0) as f64,
        }
    }
}

/// Adapters nobody used for this long step down a tier (hot → warm → cold) ...
pub const IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// ... checked this often, on the blocking pool (demoting to warm quantizes), for the server's
/// life.
pub async fn demote_idle(store: Arc<AdapterStore>) {
    let mut tick = tokio::time::interval(IDLE / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let s = store.clone();
        // A failed demotion pass changes nothing; the next tick tries again.
        let _ = tokio::task::spawn_blocking(move || s.demote_idle(IDLE)).await;
    }
}

/// How long a request waits for room among the hot adapters ...
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// ... trying again this often.
pub const RETRY: std::time::Duration = std::time::Duration::from_millis(25);

/// A failed lease in the API's shape: 404 for an adapter removed meanwhile, 503 with
/// `Retry-After` when the adapter share stayed full for [`WAIT`], 500 for a file that no
/// longer loads.
fn lease_error(style: Style, name: &str, e: LoraError) -> ApiError {
    match e {
        LoraError::Unknown(_) => {
            Adapters::unknown(style, format!("adapter {name:?} was removed: {e}"))
        }
        LoraError::PoolFull { ref source, .. } if source.adapter == 0 => ApiError::new(
            style,
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("adapter {name:?} is larger than the whole adapter share ({e}): serve with a larger {MAX_LORAS}"),
        ),
        LoraError::PoolFull { .. } => {
            let mut err = ApiError::new(
                style,
                StatusCode::SERVICE_UNAVAILABLE,
                format!("adapter {name:?} cannot be made hot: the adapters running requests use hold the whole adapter share ({e}); retry shortly, or serve with a larger {MAX_LORAS}"),
            )
            .with_code("adapters_busy");
            err.retry_after = Some(1);
            err
        }
        e => ApiError::new(
            style,
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("adapter {name:?} does not load: {e}"),
        ),
    }
}

/// `POST /v1/adapters`' body.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "AdapterAddRequest")]
pub struct AddRequest {
    /// The name requests use (`BASE:NAME`); default: the file's stem.
    pub name: Option<String>,
    /// A `*.gguf` adapter file directly inside the server's `--lora-dir` (a name, not a path).
    pub file: String,
}

/// `POST /v1/load_lora_adapter`'s body (vLLM's, served by [`crate::replica`]).
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "LoadLoraAdapterRequest")]
pub struct LoadRequest {
    /// The name requests use (`model: NAME` or `BASE:NAME`).
    pub lora_name: String,
    /// A `*.gguf` adapter of the server's `--lora-dir`: its file name, or a path whose
    /// directory is `--lora-dir`.
    pub lora_path: String,
}

/// `POST /v1/unload_lora_adapter`'s body (vLLM's, served by [`crate::replica`]).
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "UnloadLoraAdapterRequest")]
pub struct UnloadRequest {
    pub lora_name: String,
}

const S: Style = Style::OpenAi;

/// `GET /v1/adapters`.
pub async fn list(State(st): Shared) -> Response {
    let data = st.adapters.list().iter().map(|a| st.adapters.answer(a)).collect();
    axum::Json(snug::AdapterList { object: "list", data }).into_response()
}

/// `POST /v1/adapters`: registers a file of `--lora-dir` (201 with its entry).
pub async fn add(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let run = async {
        let req: AddRequest = from_json(S, &body_bytes(S, body)?)?;
        let info = st.adapters.register_file(req.name, &req.file).await?;
        Ok::<_, ApiError>(
            (StatusCode::CREATED, axum::Json(st.adapters.answer(&info))).into_response(),
        )
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

impl Adapters {
    /// The directory adapters may be added from, or the 400 saying there is none.
    pub fn require_dir(&self) -> Result<&Path, ApiError> {
        self.dir.as_deref().ok_or_else(|| {
            ApiError::bad_request(
                S,
                format!("this server has no adapter directory: start it with {LORA_DIR} DIR to add adapters"),
            )
        })
    }

    /// Registers `file` of `--lora-dir` as `name` (default: the file's stem): what every route
    /// that adds an adapter runs. Errors in OpenAI's shape: 400 (no directory, a name or file
    /// refused, not an adapter, too large), 404 (no such file), 409 (the name is taken, or
    /// [`MAX_ADAPTERS`] are registered).
    pub async fn register_file(
        &self,
        name: Option<String>,
        file: &str,
    ) -> Result<AdapterInfo, ApiError> {
        let ad = self;
        let dir = ad.require_dir()?;
        let (file_handle, path) = open_confined(dir, file).map_err(|e| match e {
            Confine::Outside(m) => ApiError::bad_request(S, m),
            Confine::Missing(m) => Adapters::unknown(S, m),
        })?;
        let name = match name {
            Some(n) => n,
            None => file.strip_suffix(".gguf").unwrap_or(file).to_string(),
        };
        check_name(&name).map_err(|m| ApiError::bad_request(S, m))?;
        let conflict = |name: &str| {
            ApiError::new(
                S,
                StatusCode::CONFLICT,
                format!("an adapter named {name:?} is already registered: DELETE it first or pick another name"),
            )
        };
        let list = ad.list();
        if list.iter().any(|a| a.name == name) {
            return Err(conflict(&name));
        }
        if list.len() >= MAX_ADAPTERS {
            return Err(ApiError::new(
                S,
                StatusCode::CONFLICT,
                format!("{MAX_ADAPTERS} adapters are registered, as many as this server keeps: DELETE one first"),
            ));
        }
        let store = ad.store.clone();
        let n2 = name.clone();
        let done = tokio::task::spawn_blocking(move || {
            let info = register_opened(&store, &n2, &path, &file_handle).map_err(Some)?;
            // One the whole adapter share cannot hold could never be leased (every request
            // naming it would fail): refused now instead.
            let pool = store.pool();
            if pool.pages_for(info.bytes_hot) > pool.adapter_limit() {
                let _ = store.unregister(&n2);
                return Err(None);
            }
            Ok(info)
        })
        .await
        .map_err(|e| ApiError::new(S, StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let info = match done {
            Ok(info) => info,
            Err(Some(LoraError::Duplicate(_))) => return Err(conflict(&name)),
            Err(None) => {
                return Err(ApiError::bad_request(
                    S,
                    format!("{file:?} is larger than the whole adapter share: serve with a larger {MAX_LORAS}, or with it in {LORA_DIR} at start (the share is sized for the largest file there)"),
                ))
            }
            Err(Some(e)) => {
                return Err(ApiError::bad_request(S, format!("{file:?} is not a usable adapter: {e}")))
            }
        };
        Ok(info)
    }

    /// Unregisters `name` (requests running on it finish on it) and forgets its default
    /// scale; 404 for a name not registered.
    pub fn unregister(&self, name: &str) -> Result<(), ApiError> {
        if !self.list().iter().any(|a| a.name == name) {
            return Err(Adapters::unknown(S, format!("adapter {name:?} is not registered here")));
        }
        self.store
            .unregister(name)
            .map_err(|e| Adapters::unknown(S, format!("adapter {name:?}: {e}")))?;
        self.defaults().remove(name);
        Ok(())
    }
}

/// `DELETE /v1/adapters/{name}`: 204, or 404 for a name not registered. Requests holding the
/// adapter finish on it.
pub async fn remove(
    State(st): Shared,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    match st.adapters.unregister(&name) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /lora-adapters` (llama-server's): `[{"id", "path", "scale"}]`, ids in name order, the
/// scale each applies with by default.
pub async fn lora_list(State(st): Shared) -> Response {
    let d = st.adapters.defaults().clone();
    let v: Vec<LoraAdapter> = st
        .adapters
        .list()
        .iter()
        .enumerate()
        .map(|(id, a)| LoraAdapter {
            id,
            path: file_name(&a.path),
            name: a.name.clone(),
            scale: d.get(&a.name).copied().unwrap_or(0.0) as f64,
        })
        .collect();
    axum::Json(v).into_response()
}

/// `POST /lora-adapters` (llama-server's): sets the default scales of the adapters listed
/// (`[{"id", "scale"}]`); others keep theirs. Answers `{"success": true}`.
pub async fn lora_set(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let run = async {
        let req: Vec<LoraScale> = from_json(S, &body_bytes(S, body)?)?;
        check_lora(S, &req)?;
        let list = st.adapters.list();
        let mut named = Vec::with_capacity(req.len());
        for e in &req {
            let a = list.get(e.id as usize).ok_or_else(|| {
                Adapters::unknown(
                    S,
                    format!("adapter id {} is not registered here: {} adapters", e.id, list.len()),
                )
            })?;
            named.push((a.name.clone(), e.scale));
        }
        st.adapters.defaults().extend(named);
        Ok::<_, ApiError>(axum::Json(Success { success: true }).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain() {
        for ok in ["a", "sql-v2", "x_1.0", "A9"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".x", "-x", "a/b", "a:b", "a b", "é", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn files_are_confined_to_the_directory() {
        let root = std::env::temp_dir().join(format!("snug-confine-{}", std::process::id()));
        let dir = root.join("loras");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.gguf"), b"x").unwrap();
        std::fs::write(root.join("secret.gguf"), b"x").unwrap();
        std::os::unix::fs::symlink(root.join("secret.gguf"), dir.join("link.gguf")).unwrap();
        std::os::unix::fs::symlink(dir.join("a.gguf"), dir.join("inside.gguf")).unwrap();
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        // A FIFO is refused without blocking the open.
        let fifo =
            std::ffi::CString::new(dir.join("fifo.gguf").into_os_string().into_encoded_bytes())
                .unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let confine = |d: &Path, f: &str| open_confined(d, f).map(|(_, real)| real);
        let real_a = dir.canonicalize().unwrap().join("a.gguf");
        assert_eq!(confine(&dir, "a.gguf"), Ok(real_a.clone()));
        // A symlink to a file inside the directory resolves to it.
        assert_eq!(confine(&dir, "inside.gguf"), Ok(real_a));
        for bad in [
            "../secret.gguf",
            "..",
            ".",
            "sub/../a.gguf",
            "/etc/passwd",
            "a\\b",
            "a\0",
            "",
            "link.gguf",
        ] {
            assert!(matches!(confine(&dir, bad), Err(Confine::Outside(_))), "{bad:?}");
        }
        assert!(matches!(confine(&dir, "nope.gguf"), Err(Confine::Missing(_))));
        assert!(matches!(confine(&dir, "sub"), Err(Confine::Missing(_))));
        assert!(matches!(confine(&dir, "fifo.gguf"), Err(Confine::Missing(_))));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn lora_lists_need_finite_scales_and_distinct_ids() {
        let e = |id, scale| LoraScale { id, scale };
        assert!(check_lora(S, &[e(0, 1.0), e(1, 0.5)]).is_ok());
        assert!(check_lora(S, &[e(0, f32::NAN)]).is_err());
        assert!(check_lora(S, &[e(0, f32::INFINITY)]).is_err());
        assert!(check_lora(S, &[e(2, 1.0), e(2, 0.5)]).is_err());
        assert!(check_lora(S, &[e(0, -MAX_SCALE), e(1, MAX_SCALE)]).is_ok());
        assert!(check_lora(S, &[e(0, 8.01)]).is_err());
        assert!(check_lora(S, &[e(0, -3e38)]).is_err());
        let many: Vec<LoraScale> = (0..=MAX_ADAPTERS as u32).map(|i| e(i, 0.0)).collect();
        assert!(check_lora(S, &many[..MAX_ADAPTERS]).is_ok());
        assert!(check_lora(S, &many).is_err());
    }
}
