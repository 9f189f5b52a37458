//! What a replica behind an inference gateway needs besides the APIs: a readiness probe that
//! tells loading and draining apart from serving, a graceful drain on SIGTERM, and vLLM's
//! routes for loading and unloading LoRA adapters (what the gateway's adapter syncer calls).
//! The protocol's metrics are [`crate::metrics::vllm`].
//!
//! Life: the server binds its port first and answers with [`loading_router`] while the model
//! loads (`/health` 200, `/ready` and everything else 503 with `Retry-After`), so a probe sees
//! a live process that is not ready instead of a refused connection. Once the scheduler runs,
//! the real router takes the port and `/ready` says 200. On SIGTERM or SIGINT, [`drain`]
//! marks the server draining: `/ready` says 503 (the gateway stops picking it), every `POST`
//! is refused 503 with `Retry-After` (the gateway retries elsewhere), and the requests running
//! or waiting get the grace period (`--drain-timeout`) to finish. Those still running then are
//! cut by [`Handle::close`](engine::scheduler::Handle::close): each ends with its text so far
//! and a final event (`finish_reason: "abort"` and `data: [DONE]`; Ollama's `done` record), so
//! every client reads a well-formed end. Then the transport closes the connections and the
//! process exits 0. Cost: one atomic load per request, a 20 ms poll while draining.
//!
//! Adapters: `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` registers a file of
//! `--lora-dir` (its name, or a path whose directory is `--lora-dir`) under `lora_name`, like
//! `POST /v1/adapters`, and loads it into memory at once (the hot tier, which the protocol
//! metrics list as ready; it steps down when idle like any adapter); loading a name again from
//! the same file is a 200 (the syncer repeats itself). `POST /v1/unload_lora_adapter {"lora_name"}` unregisters it. Both are admin routes
//! ([`crate::access::is_admin`]) and answer vLLM's plain-text success lines.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::adapters::{LoadRequest, UnloadRequest};
use crate::error::{body_bytes, from_json, ApiError, Style};
use crate::flags::LORA_DIR;
use crate::responses::snug::{Loading, Ready};
use crate::AppState;

/// Seconds a client refused while loading or draining is told to wait.
const RETRY_SECS: u64 = 1;

/// 503 in the path's API shape, with `Retry-After`.
fn unavailable(path: &str, code: &'static str, message: &str) -> Response {
    let mut e = ApiError::new(Style::of_path(path), StatusCode::SERVICE_UNAVAILABLE, message)
        .with_code(code);
    e.retry_after = Some(RETRY_SECS);
    e.into_response()
}

/// `GET /ready`: 200 while the scheduler serves and the server is not draining; else 503.
pub async fn ready(State(st): State<Arc<AppState>>) -> Response {
    if st.draining.load(Ordering::Acquire) {
        return unavailable("/ready", "draining", "the server is shutting down");
    }
    if !st.engine.is_alive() {
        return unavailable("/ready", "scheduler_down", "the scheduler thread has stopped");
    }
    axum::Json(Ready { status: "ready", model: st.card.name.clone() }).into_response()
}

/// What answers while the model loads: `/health` 200 (alive), `/ready` 503, anything else
/// 503 in its API's shape, each with `Retry-After`.
pub fn loading_router() -> Router {
    let loading = "the model is loading: retry shortly";
    Router::new()
        .route("/health", get(|| async { axum::Json(Loading { status: "loading" }) }))
        .fallback(
            move |req: Request| async move { unavailable(req.uri().path(), "loading", loading) },
        )
}

/// Drains `st` (see the module doc): refuses new work at once, waits up to `grace` for the
/// requests in flight, cuts those left, and returns once the scheduler holds none (or 5 s
/// after the cut, should it not answer).
pub async fn drain(st: &AppState, grace: Duration) {
    st.draining.store(true, Ordering::Release);
    let held = st.engine.outstanding();
    eprintln!(
        "snug: draining: {held} requests in flight, up to {} s to finish",
        grace.as_secs_f32()
    );
    let until = Instant::now() + grace;
    while st.engine.outstanding() > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = st.engine.outstanding();
    if left > 0 {
        eprintln!("snug: drain grace ran out: ending {left} requests with what they have");
        st.engine.close();
        let until = Instant::now() + Duration::from_secs(5);
        while st.engine.outstanding() > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// In debug builds only (the `ci` and test profiles), `SNUG_TEST_LOAD_DELAY_MS` holds the
/// model's load back that long, so a test can watch `/ready` answer 503 on a small model. No
/// request can set it; a release build ignores it.
pub fn test_load_delay() {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var("SNUG_TEST_LOAD_DELAY_MS").ok().and_then(|v| v.parse().ok()) {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

const S: Style = Style::OpenAi;

/// `lora_path` as a file name of `dir`: itself if it has no directory part, else its name if
/// its directory is `dir` (compared canonically); a 400 otherwise. The file itself is opened
/// and checked by [`crate::adapters::open_confined`].
fn file_in_dir(dir: &Path, lora_path: &str) -> Result<String, ApiError> {
    let p = Path::new(lora_path);
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let parent = p.parent().filter(|d| !d.as_os_str().is_empty());
    let inside = match parent {
        None => true,
        Some(d) => d.canonicalize().is_ok_and(|d| d == dir),
    };
    if !inside || name.is_empty() {
        return Err(ApiError::bad_request(
            S,
            format!(
                "lora_path {lora_path:?} is not a file of this server's {LORA_DIR} {}: give the file's name",
                dir.display()
            ),
        ));
    }
    Ok(name.to_string())
}

fn success(what: &str, name: &str) -> Response {
    format!("Success: LoRA adapter '{name}' {what} successfully.").into_response()
}

/// `POST /v1/load_lora_adapter`.
pub async fn load_lora(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async {
        let req: LoadRequest = from_json(S, &body_bytes(S, body)?)?;
        let ad = &st.adapters;
        let file = file_in_dir(ad.require_dir()?, &req.lora_path)?;
        let same_file = |a: &model::lora::AdapterInfo| {
            let dir = ad.dir.as_deref().unwrap_or(Path::new(""));
            a.path.canonicalize().ok() == dir.join(&file).canonicalize().ok()
        };
        if !ad.list().iter().any(|a| a.name == req.lora_name && same_file(a)) {
            ad.register_file(Some(req.lora_name.clone()), &file).await?;
        }
        // Loaded now, not at the first request; without room (the share is full of adapters
        // in use) it stays registered and loads on first use.
        let (store, name) = (ad.store.clone(), req.lora_name.clone());
        let _ = tokio::task::spawn_blocking(move || store.acquire(&name).map(drop)).await;
        Ok(success("added", &req.lora_name))
    };
    run.await.unwrap_or_else(|e: ApiError| e.into_response())
}

/// `POST /v1/unload_lora_adapter`.
pub async fn unload_lora(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = || {
        let req: UnloadRequest = from_json(S, &body_bytes(S, body)?)?;
        st.adapters.unregister(&req.lora_name)?;
        Ok(success("removed", &req.lora_name))
    };
    run().unwrap_or_else(|e: ApiError| e.into_response())
}
