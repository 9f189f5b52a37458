//! The route table and the router built from it, with the middleware every routed request
//! passes (the access check, request counting, CORS, the body deadline) and the few handlers
//! that belong to no API (`/health`, `/metrics`, `/openapi.json`, the 404).
//!
//! One table ([`table`]) owns the HTTP surface: each entry is a path, its method and handler,
//! and its description for `/openapi.json` (summary, request type, answer types, error
//! statuses), so the router ([`router`]) and the document ([`openapi::document`]) are built from
//! the same list and a route cannot be served without being described, or the reverse. Cost:
//! the table is built twice per server (once for the router, once for the document), a few
//! hundred small allocations.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::handler::Handler;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, MethodRouter};
use axum::Router;

use crate::access::Denied;
use crate::error::{ApiError, Style};
use crate::openapi::{self, schema_of, Answer, Op, GENERATION_ERRORS};
use crate::requests::BodyRoute;
use crate::responses::anthropic::{
    Event as AnthropicEvent, Message as AnthropicMessage, TokenCount,
};
use crate::responses::llama::{InfillRecord, LoraAdapter, Success};
use crate::responses::oai_responses::{Event as ResponseEvent, Response as ResponseObject};
use crate::responses::ollama::{
    ChatRecord, Embed, Embedding, GenerateRecord, Ps, PullRecord, Show, Tags, Version,
};
use crate::responses::openai::{
    ChatCompletion, ChatCompletionChunk, EmbeddingList, ModelList, TextCompletion,
    TextCompletionChunk,
};
use crate::responses::snug::{Adapter, AdapterList, Health, Ready};
use crate::transport::{self, Deadline};
use crate::{adapters, agents, embeddings, fim, ollama, openai, replica, ui, AppState, Shared};

/// A route: its description for the document, whether the document lists it (the HTML page
/// is for browsers, not part of the API), and its handler.
pub struct Route {
    pub op: Op,
    pub in_spec: bool,
    handler: MethodRouter<Arc<AppState>>,
}

/// The route `op` answered by `handler`.
fn route<H: Handler<T, Arc<AppState>>, T: 'static>(op: Op, handler: H) -> Route {
    let handler = match op.method {
        openapi::Method::Get => get(handler),
        openapi::Method::Post => post(handler),
        openapi::Method::Delete => delete(handler),
    };
    Route { op, in_spec: true, handler }
}

/// A `GET` route that answers `answer` and refuses nothing of its own.
fn get_op(path: &'static str, summary: &'static str, answer: Answer) -> Op {
    Op { method: openapi::Method::Get, path, summary, request: None, answer, errors: &[] }
}

const SSE: &str = "text/event-stream";
const NDJSON: &str = "application/x-ndjson";
const TEXT: &str = "text/plain";

/// Every route of the server.
pub fn table() -> Vec<Route> {
    use openapi::Method::{Delete, Post};
    let post_op = |r: BodyRoute, summary, request, answer, errors| Op {
        method: Post,
        path: r.path(),
        summary,
        request: Some(request),
        answer,
        errors,
    };
    let mut page = route(
        get_op(
            "/ui",
            "The page: memory plan, load and a chat (HTML)",
            Answer::text("The page", "text/html"),
        ),
        ui::page,
    );
    page.in_spec = false;
    vec![
        route(
            post_op(
                BodyRoute::ChatCompletions,
                "OpenAI chat completion (SSE ending in `data: [DONE]` with `stream: true`)",
                schema_of::<openai::ChatRequest>,
                Answer::stream::<ChatCompletion, ChatCompletionChunk>("The answer", SSE),
                GENERATION_ERRORS,
            ),
            openai::chat,
        ),
        route(
            post_op(
                BodyRoute::Completions,
                "OpenAI text completion (SSE ending in `data: [DONE]` with `stream: true`)",
                schema_of::<openai::CompletionRequest>,
                Answer::stream::<TextCompletion, TextCompletionChunk>("The answer", SSE),
                GENERATION_ERRORS,
            ),
            openai::completions,
        ),
        route(
            post_op(
                BodyRoute::Messages,
                "Anthropic Messages (SSE events `message_start` … `message_stop` with `stream: true`); `x-api-key` is taken as the key",
                schema_of::<agents::messages::MessagesRequest>,
                Answer::stream::<AnthropicMessage, AnthropicEvent>("The answer", SSE),
                GENERATION_ERRORS,
            ),
            agents::messages::create,
        ),
        route(
            post_op(
                BodyRoute::CountTokens,
                "Anthropic's token count: the prompt tokens the same /v1/messages body would use (input plus cache read)",
                schema_of::<agents::messages::MessagesRequest>,
                Answer::json::<TokenCount>("The count"),
                GENERATION_ERRORS,
            ),
            agents::messages::count_tokens,
        ),
        route(
            post_op(
                BodyRoute::Responses,
                "OpenAI Responses, stateless (SSE events `response.created` … `response.completed` with `stream: true`)",
                schema_of::<agents::responses::ResponsesRequest>,
                Answer::stream::<ResponseObject, ResponseEvent>("The answer", SSE),
                GENERATION_ERRORS,
            ),
            agents::responses::create,
        ),
        route(get_op("/v1/models", "The served model", Answer::json::<ModelList>("Models")), openai::models),
        route(get_op("/", "Ollama's liveness text", Answer::text("`Ollama is running`", TEXT)), ollama::root),
        route(get_op("/api/version", "The Ollama version this API follows", Answer::json::<Version>("Version")), ollama::version),
        route(get_op("/api/tags", "Models available", Answer::json::<Tags>("Models")), ollama::tags),
        route(get_op("/api/ps", "Models loaded", Answer::json::<Ps>("Models")), ollama::ps),
        route(
            post_op(BodyRoute::Show, "A model's details", schema_of::<ollama::ShowRequest>, Answer::json::<Show>("Details"), &[400, 404, 413]),
            ollama::show,
        ),
        route(
            post_op(
                BodyRoute::Chat,
                "Ollama chat (NDJSON records unless `stream: false`)",
                schema_of::<ollama::ChatRequest>,
                Answer::stream::<ChatRecord, ChatRecord>("The answer", NDJSON),
                GENERATION_ERRORS,
            ),
            ollama::chat,
        ),
        route(
            post_op(
                BodyRoute::Generate,
                "Ollama generate (NDJSON records unless `stream: false`; an empty prompt only answers that the model is loaded)",
                schema_of::<ollama::GenerateRequest>,
                Answer::stream::<GenerateRecord, GenerateRecord>("The answer", NDJSON),
                GENERATION_ERRORS,
            ),
            ollama::generate,
        ),
        route(
            post_op(
                BodyRoute::Pull,
                "Fetch a known model into the cache (NDJSON progress records unless `stream: false`)",
                schema_of::<ollama::PullRequest>,
                Answer::stream::<PullRecord, PullRecord>("Progress, then `{\"status\": \"success\"}`", NDJSON),
                &[400, 404, 409, 413, 500, 502],
            ),
            ollama::pull,
        ),
        route(
            Op {
                method: Post,
                path: "/infill",
                summary: "llama-server's fill-in-the-middle: the text between `input_prefix` and `input_suffix` (SSE records with `stream: true`; a model without FIM tokens is a 400)",
                request: Some(schema_of::<fim::InfillRequest>),
                answer: Answer::stream::<InfillRecord, InfillRecord>("The answer", SSE),
                errors: GENERATION_ERRORS,
            },
            fim::infill,
        ),
        route(
            Op {
                method: Post,
                path: "/v1/embeddings",
                summary: "OpenAI embeddings: one L2-normalised vector per input (floats, or base64 of little-endian f32)",
                request: Some(schema_of::<embeddings::OpenAiRequest>),
                answer: Answer::json::<EmbeddingList>("The answer"),
                errors: GENERATION_ERRORS,
            },
            embeddings::openai,
        ),
        route(
            Op {
                method: Post,
                path: "/api/embed",
                summary: "Ollama embeddings: one L2-normalised vector per input",
                request: Some(schema_of::<embeddings::EmbedRequest>),
                answer: Answer::json::<Embed>("The answer"),
                errors: GENERATION_ERRORS,
            },
            embeddings::ollama,
        ),
        route(
            Op {
                method: Post,
                path: "/api/embeddings",
                summary: "Ollama's legacy embedding of `prompt` (not normalised)",
                request: Some(schema_of::<embeddings::LegacyRequest>),
                answer: Answer::json::<Embedding>("The answer"),
                errors: GENERATION_ERRORS,
            },
            embeddings::legacy,
        ),
        route(
            Op {
                errors: &[503],
                ..get_op("/health", "Liveness: 200 while the scheduler runs (no API key needed); 503 once it has stopped, so a supervisor restarts the server. While the model loads, before this document is served, it answers 200 `{\"status\": \"loading\"}` and every other route 503", Answer::json::<Health>("Alive"))
            },
            health,
        ),
        route(
            Op {
                errors: &[503],
                ..get_op("/ready", "Readiness: 200 once the model is loaded and the scheduler serves (no API key needed); 503 while loading, draining after SIGTERM, or once the scheduler has stopped", Answer::json::<Ready>("Ready"))
            },
            replica::ready,
        ),
        route(
            Op {
                method: Post,
                path: "/v1/load_lora_adapter",
                summary: "vLLM's: register an adapter file of the server's adapter directory under `lora_name` (again from the same file: 200)",
                request: Some(schema_of::<adapters::LoadRequest>),
                answer: Answer::text("Registered", TEXT),
                errors: &[400, 404, 409, 413],
            },
            replica::load_lora,
        ),
        route(
            Op {
                method: Post,
                path: "/v1/unload_lora_adapter",
                summary: "vLLM's: unregister an adapter (requests running on it finish on it)",
                request: Some(schema_of::<adapters::UnloadRequest>),
                answer: Answer::text("Unregistered", TEXT),
                errors: &[400, 404, 413],
            },
            replica::unload_lora,
        ),
        route(get_op("/metrics", "Prometheus metrics (OpenMetrics text): snug's own (`snug_…`) and the model-server protocol's under vLLM's names (`vllm:…`)", Answer::text("Metrics", "application/openmetrics-text")), metrics),
        route(get_op("/openapi.json", "This document", Answer::json::<serde_json::Map<String, serde_json::Value>>("OpenAPI 3.0")), openapi_document),
        page,
        route(get_op("/ui/memory", "The memory picture the page /ui shows: the plan's numbers, what the server holds now, the bar's segments and the bar as SVG (the page itself is HTML, not part of this API)", Answer::json::<ui::Memory>("Memory")), ui::memory),
        route(get_op("/v1/adapters", "The registered LoRA adapters (request one with `model: BASE:NAME`)", Answer::json::<AdapterList>("Adapters")), adapters::list),
        route(
            Op {
                method: Post,
                path: "/v1/adapters",
                summary: "Register an adapter file of the server's adapter directory (a file name, not a path)",
                request: Some(schema_of::<adapters::AddRequest>),
                answer: Answer::created::<Adapter>("Registered (cold: loaded on first use)"),
                errors: &[400, 404, 409, 413],
            },
            adapters::add,
        ),
        route(
            Op {
                method: Delete,
                path: "/v1/adapters/{name}",
                summary: "Unregister an adapter (requests running on it finish on it)",
                request: None,
                answer: Answer::no_content("Unregistered"),
                errors: &[404],
            },
            adapters::remove,
        ),
        route(get_op("/lora-adapters", "llama-server's adapter list: ids for a request's `lora` field, default scales", Answer::json::<Vec<LoraAdapter>>("Adapters")), adapters::lora_list),
        route(
            Op {
                method: Post,
                path: "/lora-adapters",
                summary: "llama-server's: set the default scales of the adapters listed by id",
                request: Some(schema_of::<Vec<adapters::LoraScale>>),
                answer: Answer::json::<Success>("Set"),
                errors: &[400, 404, 413],
            },
            adapters::lora_set,
        ),
    ]
}

/// Whether `route` (a matched route pattern) has a `POST` row: every such row takes a JSON body
/// (its `request` schema), so [`guard`] refuses any other `Content-Type` with 415 on it
/// ([`crate::access::json_body`]). Derived from [`table`] once, so a new route inherits it.
pub fn takes_json(route: &str) -> bool {
    static POSTS: OnceLock<Vec<&'static str>> = OnceLock::new();
    POSTS
        .get_or_init(|| {
            let rows = table().into_iter().map(|r| r.op);
            rows.filter(|op| op.method == openapi::Method::Post).map(|op| op.path).collect()
        })
        .contains(&route)
}

/// The routes `/openapi.json` describes.
pub fn ops() -> Vec<Op> {
    table().into_iter().filter(|r| r.in_spec).map(|r| r.op).collect()
}

/// Every route of [`table`]; bodies above `max_body` bytes are refused with 413.
pub fn router(state: Arc<AppState>, max_body: usize) -> Router {
    let mut routes = Router::new();
    for r in table() {
        routes = routes.route(r.op.path, r.handler);
    }
    routes
        .route_layer(middleware::from_fn_with_state(state.clone(), guard))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(state.clone(), cors))
        .with_state(state)
}

/// What the access rules say of a request to `route` (its pattern): [`Access::check`], then
/// on every POST row the JSON content type ([`crate::access::json_body`]); a POST to another
/// route is left to the router's 405.
pub fn access_verdict(
    access: &crate::access::Access,
    method: &Method,
    route: &str,
    headers: &axum::http::HeaderMap,
) -> Result<(), Denied> {
    access.check(method, route, headers)?;
    if method == Method::POST && takes_json(route) {
        crate::access::json_body(headers)?;
    }
    Ok(())
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
    let verdict = access_verdict(&st.access, req.method(), &route, req.headers());
    let refusal = match verdict {
        Err(Denied::ContentType(_)) | Ok(()) if length > st.max_body as u64 => {
            Some(ApiError::too_large(style))
        }
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
                transport::drain(req.into_body(), st.body_timeout, st.max_body).await;
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
            HeaderValue::from_static("authorization, content-type, x-api-key, anthropic-version"),
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
    axum::Json(Health {
        status: "ok",
        model: st.card.name.clone(),
        uptime_seconds: st.started.elapsed().as_secs(),
    })
    .into_response()
}

async fn metrics(State(st): Shared) -> Response {
    let ct = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, ct)], st.metrics.render()).into_response()
}

/// `/openapi.json`: the document of [`ops`], built on the first request (one for a server with
/// an API key, one without).
async fn openapi_document(State(st): Shared) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], document(st.api_key.is_some())).into_response()
}

/// The document for a server that requires an API key (`auth`) or not, built once.
pub fn document(auth: bool) -> &'static str {
    static DOCS: [OnceLock<String>; 2] = [OnceLock::new(), OnceLock::new()];
    DOCS[auth as usize].get_or_init(|| openapi::document(&ops(), auth).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn doc() -> Value {
        serde_json::from_str(document(true)).expect("the document is JSON")
    }

    /// Every `$ref` in `v`.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r.clone());
                }
                m.values().for_each(|x| refs(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }

    #[test]
    fn every_post_row_takes_json_and_refuses_other_content_types() {
        use axum::http::{HeaderMap, HeaderValue};
        let access = crate::access::Access::new(None, None, true, "127.0.0.1", true, &[]);
        let mut plain = HeaderMap::new();
        plain.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        let mut json = HeaderMap::new();
        json.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let posts: Vec<Op> = table()
            .into_iter()
            .map(|r| r.op)
            .filter(|o| o.method == openapi::Method::Post)
            .collect();
        assert!(posts.len() >= 14, "{} POST rows", posts.len());
        for op in posts {
            assert!(op.request.is_some(), "POST {} has no request schema", op.path);
            assert!(takes_json(op.path), "{}", op.path);
            let verdict = |h: &HeaderMap| access_verdict(&access, &Method::POST, op.path, h);
            let got = verdict(&plain);
            assert!(matches!(got, Err(Denied::ContentType(_))), "POST {}: {got:?}", op.path);
            assert_eq!(verdict(&json), Ok(()), "{}", op.path);
        }
        assert!(!takes_json("/v1/models") && !takes_json("/health"));
    }

    #[test]
    fn every_reference_resolves_and_every_body_route_has_its_schema() {
        let d = doc();
        let mut all = Vec::new();
        refs(&d, &mut all);
        assert!(all.len() > 10);
        for r in all {
            let name = r.strip_prefix("#/components/schemas/").expect("a local schema");
            assert!(d["components"]["schemas"][name].is_object(), "{r} does not resolve");
        }
        for r in BodyRoute::ALL {
            let body = &d["paths"][r.path()]["post"]["requestBody"]["content"]["application/json"];
            assert!(body["schema"]["$ref"].is_string(), "{} has no request schema", r.path());
        }
    }

    #[test]
    fn request_schemas_state_what_the_decoder_checks() {
        let d = doc();
        let s = &d["components"]["schemas"];
        assert_eq!(s["OpenAiChatRequest"]["required"], json!(["messages"]));
        assert_eq!(s["OpenAiChatRequest"]["properties"]["messages"]["minItems"], 1);
        assert_eq!(s["OpenAiCompletionRequest"]["required"], json!(["prompt"]));
        let top_p = &s["OpenAiChatRequest"]["properties"]["top_p"];
        assert_eq!((top_p["minimum"].as_f64(), top_p["maximum"].as_f64()), (Some(0.0), Some(1.0)));
        assert_eq!(s["OllamaOptions"]["properties"]["repeat_penalty"]["exclusiveMinimum"], true);
    }

    #[test]
    fn errors_take_the_shape_of_their_api() {
        let d = doc();
        let err = |path: &str, status: &str| {
            d["paths"][path]["post"]["responses"][status]["content"]["application/json"]["schema"]
                ["$ref"]
                .clone()
        };
        assert_eq!(err("/v1/chat/completions", "400"), "#/components/schemas/OpenAiError");
        assert_eq!(err("/api/chat", "404"), "#/components/schemas/OllamaError");
        assert!(d["paths"]["/health"]["get"]["responses"]["401"].is_null());
        assert!(d["paths"]["/ready"]["get"]["responses"]["401"].is_null());
        assert!(d["paths"]["/ready"]["get"]["responses"]["503"].is_object());
        let load = &d["paths"]["/v1/load_lora_adapter"]["post"];
        assert!(load["responses"]["200"].is_object() && load["responses"]["503"].is_object());
        let s = &d["components"]["schemas"];
        assert_eq!(s["LoadLoraAdapterRequest"]["required"], json!(["lora_name", "lora_path"]));
        assert!(d["paths"]["/metrics"]["get"]["responses"]["401"].is_object());
    }

    #[test]
    fn answers_are_described_by_their_types_streams_by_their_items() {
        let d = doc();
        let p = &d["paths"];
        let ok = |path: &str, method: &str| p[path][method]["responses"]["200"]["content"].clone();
        let chat = ok("/v1/chat/completions", "post");
        let item = &chat["text/event-stream"]["x-itemSchema"]["$ref"];
        assert_eq!(item, "#/components/schemas/ChatCompletionChunk", "{chat}");
        let whole = &chat["application/json"]["schema"]["$ref"];
        assert_eq!(whole, "#/components/schemas/ChatCompletion");
        let s = &d["components"]["schemas"];
        assert!(s["OllamaChatRecord"]["properties"]["total_duration"].is_object());
        assert_eq!(s["OpenAiDelta"].get("required"), None, "every delta field is optional");
        let content = &s["OpenAiAssistantMessage"]["properties"]["content"];
        assert_eq!(content["nullable"], true, "{content}");
        // Every route of the table is served and described, and only the page is left out.
        let served: Vec<&str> = table().iter().map(|r| r.op.path).collect();
        let described = p.as_object().expect("paths").len();
        assert_eq!(ops().len() + 1, table().len());
        assert!(served.contains(&"/ui") && p["/ui"].is_null() && described > 20);
    }

    #[test]
    fn adapter_routes_and_the_lora_field_are_described() {
        let d = doc();
        let p = &d["paths"];
        assert!(p["/v1/adapters"]["get"].is_object() && p["/lora-adapters"]["get"].is_object());
        assert!(p["/v1/adapters"]["post"]["responses"]["201"].is_object());
        assert!(p["/v1/adapters"]["post"]["responses"]["409"].is_object());
        let del = &p["/v1/adapters/{name}"]["delete"];
        assert!(del["responses"]["204"].is_object() && del["responses"]["404"].is_object());
        assert_eq!(del["parameters"][0]["in"], "path");
        let s = &d["components"]["schemas"];
        assert_eq!(s["AdapterAddRequest"]["required"], json!(["file"]));
        assert!(s["OpenAiChatRequest"]["properties"]["lora"].is_object());
        assert_eq!(s["LoraScale"]["required"], json!(["id", "scale"]));
    }

    /// Schemathesis found it: a server without an API key documented bearer authentication as
    /// required, and then accepted every request without the header.
    #[test]
    fn authentication_is_documented_only_when_a_key_is_required() {
        let open: Value = serde_json::from_str(document(false)).expect("JSON");
        assert!(open["security"].is_null() && open["components"]["securitySchemes"].is_null());
        assert!(open["paths"]["/metrics"]["get"]["responses"]["401"].is_null());
        let keyed = doc();
        assert_eq!(keyed["security"], json!([{"bearer": []}]));
        assert_eq!(keyed["paths"]["/health"]["get"]["security"], json!([]));
    }
}
