//! The router: each path and its handler, and the middleware every routed request passes
//! (the access check, request counting, CORS, the body deadline), with the few handlers that
//! belong to no API (`/health`, `/metrics`, `/openapi.json`, the 404).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use serde_json::json;

use crate::access::Denied;
use crate::error::{ApiError, Style};
use crate::transport::{self, Deadline};
use crate::{adapters, ollama, openai, AppState, Shared};

/// Every route, with `extra` routes beside the APIs' own (checked by the same guard); bodies
/// above `max_body` bytes are refused with 413.
pub fn router(state: Arc<AppState>, max_body: usize, extra: Router<Arc<AppState>>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/models", get(openai::models))
        .route("/", get(ollama::root))
        .route("/api/version", get(ollama::version))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/pull", post(ollama::pull))
        .route("/v1/adapters", get(adapters::list).post(adapters::add))
        .route("/v1/adapters/{name}", delete(adapters::remove))
        .route("/lora-adapters", get(adapters::lora_list).post(adapters::lora_set))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/ui", get(crate::ui::page))
        .route("/ui/memory", get(crate::ui::memory))
        .merge(extra)
        .route_layer(middleware::from_fn_with_state(state.clone(), guard))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(state.clone(), cors))
        .with_state(state)
}

/// Counts every routed request by route and status, and refuses what [`Access::check`]
/// refuses (a foreign `Host` or `Origin`, a missing key, an admin route while administration
/// is off, a body that is not JSON, a `Content-Length` past `--max-body`) and any `POST` while
/// the server drains, before the handler runs, reading and discarding the refused body first
/// ([`transport::drain`]). The body it lets through must arrive within the body timeout
/// ([`Deadline`]).
async fn guard(State(st): Shared, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or("other", |m| m.as_str()).to_string();
    let style = Style::of_path(&route);
    let length = req.headers().get(header::CONTENT_LENGTH);
    let length = length.and_then(|v| v.to_str().ok()?.parse::<u64>().ok()).unwrap_or(0);
    // A body past the limit is a 413 whatever its type; access refusals come first.
    let refusal = match st.access.check(req.method(), &route, req.headers()) {
        Err(Denied::ContentType(_)) | Ok(()) if length > st.max_body as u64 => Some(
            ApiError::new(
                style,
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is larger than this server accepts (--max-body)",
            )
            .with_code("invalid_body"),
        ),
        Err(denied) => {
            let status = StatusCode::from_u16(denied.status()).unwrap_or(StatusCode::FORBIDDEN);
            Some(ApiError::new(style, status, denied.to_string()).with_code(denied.code()))
        }
        // Draining (`replica::drain`): no new work; the gateway retries on another replica.
        Ok(()) if req.method() == Method::POST && st.draining.load(Ordering::Acquire) => {
            let msg = "the server is shutting down and takes no new requests: retry (another replica answers)";
            let mut e =
                ApiError::new(style, StatusCode::SERVICE_UNAVAILABLE, msg).with_code("draining");
            e.retry_after = Some(1);
            Some(e)
        }
        Ok(()) => None,
    };
    let resp = match refusal {
        Some(e) => {
            // A client waiting for `100 Continue` has sent no body yet: it reads the refusal.
            let waits = req.headers().get(header::EXPECT).is_some_and(|v| v == "100-continue");
            if !waits {
                transport::drain(req.into_body(), st.body_timeout).await;
            }
            e.into_response()
        }
        None => {
            let req = req.map(|b| Deadline::wrap(b, st.body_timeout));
            next.run(req).await
        }
    };
    st.metrics.record(&route, resp.status().as_u16());
    resp
}

/// Answers a browser's CORS preflight for an origin `--allowed-origins` lists, and marks every
/// answer to such an origin as readable by it. Other origins get no CORS headers (their
/// requests are refused by [`guard`]).
async fn cors(State(st): Shared, req: Request, next: Next) -> Response {
    let origin = req.headers().get(header::ORIGIN).cloned();
    let allowed =
        origin.as_ref().and_then(|o| o.to_str().ok()).is_some_and(|o| st.access.origin_allowed(o));
    if !allowed {
        return next.run(req).await;
    }
    let preflight = req.method() == Method::OPTIONS
        && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut resp =
        if preflight { StatusCode::NO_CONTENT.into_response() } else { next.run(req).await };
    let h = resp.headers_mut();
    if let Some(o) = origin {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
    }
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    if preflight {
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, DELETE"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type"),
        );
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    }
    resp
}

async fn not_found(State(st): Shared, req: Request) -> Response {
    st.metrics.record("other", 404);
    let path = req.uri().path().to_string();
    ApiError::new(
        Style::of_path(&path),
        StatusCode::NOT_FOUND,
        format!(
            "no route {} {path}: see /v1/models, /v1/chat/completions, /api/chat …",
            req.method()
        ),
    )
    .into_response()
}

/// 200 while the scheduler thread runs; 503 (OpenAI's error shape) once it is gone, so a
/// supervisor's liveness probe restarts the server instead of keeping a process that can only
/// refuse.
async fn health(State(st): Shared) -> Response {
    if !st.engine.is_alive() {
        return ApiError::new(
            Style::OpenAi,
            StatusCode::SERVICE_UNAVAILABLE,
            "the scheduler thread has stopped, so no request can be answered: restart snug serve",
        )
        .with_code("scheduler_down")
        .into_response();
    }
    axum::Json(json!({
        "status": "ok",
        "model": st.card.name,
        "uptime_seconds": st.started.elapsed().as_secs(),
    }))
    .into_response()
}

async fn metrics(State(st): Shared) -> Response {
    let ct = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, ct)], st.metrics.render()).into_response()
}

async fn openapi(State(st): Shared) -> Response {
    let doc = crate::openapi::document(st.api_key.is_some());
    ([(header::CONTENT_TYPE, "application/json")], doc).into_response()
}
