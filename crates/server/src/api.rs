//! The router and what the OpenAI and Ollama handlers share: errors in each API's own shape,
//! the API key check and request counting, model-name checks, sampling settings, submitting to
//! the scheduler and relaying its events as a streamed or a collected body.
//!
//! Every route that takes a body starts with [`decode`]: the body's decoding and every check
//! that needs no model (JSON shape, messages, prompt, sampling ranges, token limit), a pure
//! function of the bytes, so the fuzz target `server_requests` runs exactly what the handlers
//! run. What needs the model (its name, the template, the vocabulary) follows in the handler.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use engine::json_schema::Schema;
use engine::{JsonFormat, SamplerParams};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::adapters::{AdapterSet, LoraScale};
use crate::scheduler::{self, Event, Finish, Refused};
use crate::{adapters, ollama, openai, AppState};

pub type Shared = State<Arc<AppState>>;

/// Every route; bodies above `max_body` bytes are refused with 413.
pub fn router(state: Arc<AppState>, max_body: usize) -> Router {
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
        .route_layer(middleware::from_fn_with_state(state.clone(), guard))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// Which API's error shape a response takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// `{"error": {"message", "type", "code"}}`
    OpenAi,
    /// `{"error": "message"}`
    Ollama,
}

impl Style {
    pub(crate) fn of_path(path: &str) -> Style {
        if path.starts_with("/api/") {
            Style::Ollama
        } else {
            Style::OpenAi
        }
    }
}

/// An error response: the status, what was wrong and what to do, in the API's shape.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`.
    pub kind: &'static str,
    /// OpenAI's `code`.
    pub code: Option<&'static str>,
    pub style: Style,
    /// Seconds, sent as `Retry-After`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(style: Style, status: StatusCode, message: impl Into<String>) -> ApiError {
        let kind = match status.as_u16() {
            401 => "authentication_error",
            429 => "rate_limit_error",
            500.. => "server_error",
            _ => "invalid_request_error",
        };
        ApiError { status, message: message.into(), kind, code: None, style, retry_after: None }
    }

    pub fn bad_request(style: Style, message: impl Into<String>) -> ApiError {
        ApiError::new(style, StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn refused(style: Style, r: Refused) -> ApiError {
        let msg = r.to_string();
        match r {
            Refused::Busy { .. } => {
                let mut e = ApiError::new(style, StatusCode::TOO_MANY_REQUESTS, msg)
                    .with_code("server_busy");
                e.retry_after = Some(1);
                e
            }
            Refused::TooLong { .. } => {
                ApiError::bad_request(style, msg).with_code("context_length_exceeded")
            }
            Refused::Empty => ApiError::bad_request(style, msg),
            Refused::Down => ApiError::new(style, StatusCode::SERVICE_UNAVAILABLE, msg),
        }
    }

    /// A body that is not the JSON the route takes.
    pub fn json(style: Style, e: serde_json::Error) -> ApiError {
        ApiError::bad_request(
            style,
            format!("the request body is not valid JSON for this route: {e}"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.style {
            Style::OpenAi => json!({"error": {
                "message": self.message,
                "type": self.kind,
                "param": null,
                "code": self.code,
            }}),
            Style::Ollama => json!({ "error": self.message }),
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// A request body's bytes, or the error in the route's shape (413 past the size limit).
pub fn body_bytes(style: Style, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        let msg = if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body is larger than this server accepts (--max-body)".to_string()
        } else {
            format!("reading the request body: {}", r.body_text())
        };
        ApiError::new(style, r.status(), msg).with_code("invalid_body")
    })
}

/// A request body parsed as `T`, or a 400 in the route's shape.
pub fn from_json<T: for<'de> Deserialize<'de>>(style: Style, body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::json(style, e))
}

/// `messages` if there is at least one.
pub fn some_messages(
    style: Style,
    messages: Vec<tokenizer::ChatMessage>,
) -> Result<Vec<tokenizer::ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request(style, "messages is empty: send at least one message"));
    }
    Ok(messages)
}

/// The routes that take a body, by path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyRoute {
    ChatCompletions,
    Completions,
    Show,
    Chat,
    Generate,
    Pull,
}

impl BodyRoute {
    pub const ALL: [BodyRoute; 6] = [
        BodyRoute::ChatCompletions,
        BodyRoute::Completions,
        BodyRoute::Show,
        BodyRoute::Chat,
        BodyRoute::Generate,
        BodyRoute::Pull,
    ];

    pub fn path(self) -> &'static str {
        match self {
            BodyRoute::ChatCompletions => "/v1/chat/completions",
            BodyRoute::Completions => "/v1/completions",
            BodyRoute::Show => "/api/show",
            BodyRoute::Chat => "/api/chat",
            BodyRoute::Generate => "/api/generate",
            BodyRoute::Pull => "/api/pull",
        }
    }
}

/// A route's request, decoded and validated as far as it can be without the model.
#[derive(Debug)]
pub enum Decoded {
    ChatCompletions(openai::Chat),
    Completions(openai::Completion),
    Show(ollama::Show),
    Chat(ollama::Chat),
    Generate(ollama::Generate),
    Pull(ollama::Pull),
}

/// `body` as `route`'s request: the decoding and validation its handler runs first (a pure
/// function of the bytes, which is what the `server_requests` fuzz target drives).
pub fn decode(route: BodyRoute, body: &[u8]) -> Result<Decoded, ApiError> {
    Ok(match route {
        BodyRoute::ChatCompletions => Decoded::ChatCompletions(openai::Chat::decode(body)?),
        BodyRoute::Completions => Decoded::Completions(openai::Completion::decode(body)?),
        BodyRoute::Show => Decoded::Show(ollama::Show::decode(body)?),
        BodyRoute::Chat => Decoded::Chat(ollama::Chat::decode(body)?),
        BodyRoute::Generate => Decoded::Generate(ollama::Generate::decode(body)?),
        BodyRoute::Pull => Decoded::Pull(ollama::Pull::decode(body)?),
    })
}

/// Counts every routed request by route and status, and checks the API key on every route but
/// `/health`.
async fn guard(State(st): Shared, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or("other", |m| m.as_str()).to_string();
    let resp = match &st.api_key {
        Some(key) if route != "/health" && !has_key(&req, key) => ApiError::new(
            Style::of_path(&route),
            StatusCode::UNAUTHORIZED,
            "this server requires an API key: send `Authorization: Bearer <key>`",
        )
        .with_code("invalid_api_key")
        .into_response(),
        _ => next.run(req).await,
    };
    st.metrics.record(&route, resp.status().as_u16());
    resp
}

fn has_key(req: &Request, key: &str) -> bool {
    let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    given.and_then(|v| v.strip_prefix("Bearer ")).is_some_and(|k| k.trim() == key)
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

async fn health(State(st): Shared) -> Response {
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

impl AppState {
    /// The adapter `asked` names, if any: `Ok(None)` if it (absent or empty: the served model)
    /// names the served model, `Ok(Some(adapter))` for `BASE:ADAPTER` with ADAPTER registered,
    /// else a 404 in the API's shape that names the model (or adapter) asked for. A name is only
    /// ever compared with the served and registered names.
    pub fn check_model(
        &self,
        style: Style,
        asked: Option<&str>,
    ) -> Result<Option<String>, ApiError> {
        let a = match asked {
            Some(a) if !a.is_empty() && !self.card.matches(a) => a,
            _ => return Ok(None),
        };
        // `BASE:ADAPTER`, where BASE (which may hold a colon itself) names the served model.
        let split = a.match_indices(':').map(|(i, _)| i).find(|&i| self.card.matches(&a[..i]));
        if let Some(i) = split {
            let adapter = &a[i + 1..];
            if !adapter.is_empty() {
                adapters::Adapters::require(style, &self.adapters.list(), adapter)?;
                return Ok(Some(adapter.to_string()));
            }
        }
        Err(ApiError::new(
            style,
            StatusCode::NOT_FOUND,
            format!(
                "model {a:?} is not served here; this server serves {:?} and its adapters as {:?}:ADAPTER (see /v1/models or /api/tags)",
                self.card.name, self.card.name
            ),
        )
        .with_code("model_not_found"))
    }

    /// The `model` an answer names: the request's own, once it resolved (`BASE:ADAPTER` stays
    /// so, as OpenAI and Ollama echo the name asked for), else the served model's.
    pub fn answer_model(&self, asked: Option<&str>) -> String {
        asked.filter(|m| !m.is_empty()).unwrap_or(&self.card.name).to_string()
    }

    /// The adapters a generation request runs with (its `model` and `lora` fields), leased:
    /// a 404 for a model or adapter not served here, a 400 for a malformed `lora` list.
    pub async fn adapter_set(
        &self,
        style: Style,
        model: Option<&str>,
        lora: Option<&[LoraScale]>,
    ) -> Result<AdapterSet, ApiError> {
        let named = self.check_model(style, model)?;
        let set = self.adapters.select(style, named.as_deref(), lora)?;
        for (name, _) in &set {
            self.metrics.adapter_request(name);
        }
        self.adapters.lease(style, set).await
    }

    /// The prompt of a chat: the model's template over `messages` (at least one), tokenized
    /// with the template's markup parsed for control tokens and the messages' contents as
    /// text, so a message cannot forge a turn (`tokenizer::Tokenizer::encode_chat`).
    pub fn chat_prompt(
        &self,
        style: Style,
        messages: &[tokenizer::ChatMessage],
    ) -> Result<Vec<u32>, ApiError> {
        let template = self.template.as_ref().map_err(|e| {
            ApiError::new(style, StatusCode::INTERNAL_SERVER_ERROR, format!("the model's chat template does not load: {e}; use the completion route with a prompt of your own"))
        })?;
        let prompt = template.render_prompt(messages, &[], true).map_err(|e| {
            ApiError::bad_request(style, format!("{e}; check the messages' roles and order"))
        })?;
        Ok(self.tok.encode_chat(&prompt))
    }

    /// Queues a generation of `prompt` with `s` (at most `s.max_tokens`, default: until the
    /// context is full; a [`Settings`] never holds 0) on `adapters`; with `logprobs`, each
    /// token's log-probability and that many alternatives on the second receiver.
    pub fn submit(
        &self,
        style: Style,
        prompt: Vec<u32>,
        s: Settings,
        adapters: AdapterSet,
        logprobs: Option<usize>,
    ) -> Result<
        (UnboundedReceiver<Event>, Option<UnboundedReceiver<crate::logprobs::TokenLogprob>>),
        ApiError,
    > {
        let max_tokens = s.max_tokens.unwrap_or(self.engine.n_ctx);
        let (sampling, stop, json) = (s.sampling, s.stop, s.json);
        let req =
            scheduler::Request { prompt, sampling, max_tokens, stop, json, logprobs, adapters };
        self.engine.request(req).map_err(|r| ApiError::refused(style, r))
    }
}

/// Sampling settings as the APIs name them; absent ones take snug's defaults, an absent seed a
/// fresh one.
#[derive(Clone, Debug, Default)]
pub struct Knobs {
    pub temperature: Option<f32>,
    pub top_k: Option<i64>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
}

/// A generation's settings, validated: what the scheduler takes besides the prompt.
#[derive(Clone, Debug)]
pub struct Settings {
    pub sampling: SamplerParams,
    /// At least 1; `None`: until the context is full.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// JSON mode: the answer is one JSON object (OpenAI's `response_format` `json_object`,
    /// Ollama's `format: "json"`) or a value a schema accepts (`json_schema`, a schema in
    /// `format`); generation ends when it closes.
    pub json: Option<JsonFormat>,
}

/// A request's JSON schema compiled for structured output; one it cannot enforce is a 400 that
/// says why.
pub fn json_schema(style: Style, schema: &serde_json::Value) -> Result<JsonFormat, ApiError> {
    match Schema::compile(schema) {
        Ok(s) => Ok(JsonFormat::Schema(Arc::new(s))),
        Err(why) => Err(ApiError::bad_request(style, format!("unsupported JSON schema: {why}"))),
    }
}

impl Settings {
    /// `knobs` validated, a token limit of 0 refused.
    pub fn new(
        style: Style,
        knobs: &Knobs,
        max_tokens: Option<usize>,
        stop: Vec<String>,
    ) -> Result<Settings, ApiError> {
        if max_tokens == Some(0) {
            return Err(ApiError::bad_request(style, "the token limit must be at least 1"));
        }
        Ok(Settings { sampling: knobs.params(style)?, max_tokens, stop, json: None })
    }
}

impl Knobs {
    pub fn params(&self, style: Style) -> Result<SamplerParams, ApiError> {
        let d = SamplerParams::default();
        let p = SamplerParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.map_or(d.top_k, |k| k.max(0) as usize),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            repeat_last_n: self.repeat_last_n.map_or(d.repeat_last_n, |n| n.max(0) as usize),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            seed: self.seed.map_or_else(fresh_seed, |s| s as u64),
        };
        p.validate().map_err(|e| ApiError::bad_request(style, e))?;
        Ok(p)
    }
}

fn fresh_seed() -> u64 {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    t.as_nanos() as u64 ^ (std::process::id() as u64).rotate_left(32)
}

/// `stop` as OpenAI sends it: one string or a list.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "OpenAiStop")]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(s: Option<Stop>) -> Vec<String> {
        match s {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        }
    }
}

/// A streamed body: each event rendered by `render` as it arrives; ends after the last event.
pub fn event_body<T: Send + 'static>(
    rx: UnboundedReceiver<T>,
    render: impl FnMut(T) -> String + Send + 'static,
) -> Body {
    let s = futures_util::stream::unfold((rx, render), |(mut rx, mut render)| async move {
        let ev = rx.recv().await?;
        let chunk = Bytes::from(render(ev));
        Some((Ok::<_, Infallible>(chunk), (rx, render)))
    });
    Body::from_stream(s)
}

/// All text of a job and how it finished.
pub async fn collect(
    style: Style,
    mut rx: UnboundedReceiver<Event>,
) -> Result<(String, Finish), ApiError> {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done(f) => return Ok((text, f)),
            Event::Failed(e) => {
                return Err(ApiError::new(style, StatusCode::INTERNAL_SERVER_ERROR, e))
            }
        }
    }
    Err(ApiError::new(style, StatusCode::SERVICE_UNAVAILABLE, "the scheduler stopped mid-answer"))
}

/// A streamed response with `content_type`.
pub fn streamed(content_type: &'static str, body: Body) -> Response {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// `t` as RFC 3339 in UTC with nanoseconds (`2026-11-24T01:02:03.456789012Z`).
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs().min(i64::MAX as u64) as i64;
    format!("{}.{:09}Z", tokenizer::strftime("%Y-%m-%dT%H:%M:%S", secs), d.subsec_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        let t = |s| UNIX_EPOCH + std::time::Duration::from_secs(s);
        assert_eq!(rfc3339(t(0)), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(rfc3339(t(951_782_400)), "2000-02-29T00:00:00.000000000Z");
        assert_eq!(rfc3339(t(1_795_482_123)), "2026-11-24T01:02:03.000000000Z");
    }
}
