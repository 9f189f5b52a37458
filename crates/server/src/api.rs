//! What the OpenAI and Ollama handlers share once a request is decoded
//! ([`crate::requests`]): model-name checks, sampling settings, the chat prompt, submitting to
//! the scheduler and relaying its events as a streamed or a collected body. What needs the
//! model (its name, the template, the vocabulary) is here; the router is [`crate::routes`].

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use engine::json_schema::Schema;
use engine::{JsonFormat, SamplerParams};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::sync::mpsc::UnboundedReceiver;

use engine::scheduler::{self, Event, Finish, JobAdapters, Refused, Ticket};

use crate::adapters::LoraScale;
use crate::error::{ApiError, Style};
use crate::flags::CTX;
use crate::{adapters, AppState};

pub mod limits;

/// A refusal of the scheduler's admission as an error in the route's shape.
impl ApiError {
    pub fn refused(style: Style, r: Refused) -> ApiError {
        let msg = r.to_string();
        match r {
            Refused::Busy { retry_after, .. } => {
                let mut e = ApiError::new(style, StatusCode::TOO_MANY_REQUESTS, msg)
                    .with_code("server_busy");
                e.retry_after = Some(retry_after.max(1));
                e
            }
            Refused::TooLong { .. } => {
                ApiError::bad_request(style, msg).with_code("context_length_exceeded")
            }
            Refused::Empty => ApiError::bad_request(style, msg),
            Refused::Down => ApiError::new(style, StatusCode::SERVICE_UNAVAILABLE, msg),
        }
    }
}

impl AppState {
    /// The adapter `asked` names, if any: `Ok(None)` if it (absent or empty: the served model)
    /// names the served model, `Ok(Some(adapter))` for `BASE:ADAPTER` or `ADAPTER` with ADAPTER
    /// registered,
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
        // A registered adapter's bare name: vLLM's way, which an inference gateway sends.
        if self.adapters.list().iter().any(|x| x.name == a) {
            return Ok(Some(a.to_string()));
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
    ) -> Result<JobAdapters, ApiError> {
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
    ///
    /// `chat` carries the offered tools and the thinking switch into the template, and comes
    /// back knowing whether the prompt opened a reasoning section ([`crate::tools`]).
    pub fn chat_prompt(
        &self,
        style: Style,
        messages: &[tokenizer::ChatMessage],
        chat: &mut crate::tools::ChatOptions,
    ) -> Result<Vec<u32>, ApiError> {
        let template = self.template.as_ref().map_err(|e| {
            ApiError::new(style, StatusCode::INTERNAL_SERVER_ERROR, format!("the model's chat template does not load: {e}; use the completion route with a prompt of your own"))
        })?;
        chat.fit(template).map_err(|e| ApiError::bad_request(style, e))?;
        let prompt = template
            .render_prompt_thinking(
                &self.tok,
                messages,
                &chat.tools,
                true,
                chat.template_thinking(template),
            )
            .map_err(|e| {
                ApiError::bad_request(style, format!("{e}; check the messages' roles and order"))
            })?;
        chat.opened(&prompt.text);
        self.check_control_text(style, messages, &chat.tools, prompt.aligned)?;
        Ok(self.tok.encode_chat(&prompt))
    }

    /// Refuses (400) a client string the template would pass to the tokenizer as markup that
    /// holds a control token's text (`<|im_start|>`). When the render was lined up, every
    /// client string (contents, tool definitions, tool calls and their arguments, reasoning)
    /// is tokenized as text, and only object keys, which are never marked, are refused; when
    /// it was not (a template that transforms or tests such a string), every string is.
    /// One Aho–Corasick pass over the strings.
    fn check_control_text(
        &self,
        style: Style,
        messages: &[tokenizer::ChatMessage],
        tools: &[serde_json::Value],
        aligned: bool,
    ) -> Result<(), ApiError> {
        let refuse = |what: String, token: &str| {
            let why = if what.ends_with(".content") {
                "; this model's chat template transforms message contents, so they cannot be kept apart from its markup"
            } else {
                ""
            };
            Err(ApiError::bad_request(
                style,
                format!("{what} holds {token:?}, the text of one of the model's control tokens, which only the chat template may write{why}"),
            ))
        };
        for (i, m) in messages.iter().enumerate() {
            if !aligned {
                if let Some(t) = self.tok.control_text_in(&m.content) {
                    return refuse(format!("messages[{i}].content"), t);
                }
            }
            for (k, v) in &m.extra {
                let found = self.tok.control_text_in(k);
                if let Some(t) = found.or_else(|| control_text_in_json(&self.tok, v, aligned)) {
                    return refuse(format!("messages[{i}].{k}"), t);
                }
            }
        }
        for (i, v) in tools.iter().enumerate() {
            if let Some(t) = control_text_in_json(&self.tok, v, aligned) {
                return refuse(format!("tools[{i}]"), t);
            }
        }
        Ok(())
    }

    /// The model name an agent route (Messages, Responses) runs and answers as, for `asked`.
    ///
    /// Coding agents send their vendor's names (Claude Code `claude-sonnet-4-5` and a small fast
    /// model's, Codex `gpt-5-codex`) and have no setting for a local one everywhere, so a name that
    /// is neither the served model, `BASE:ADAPTER`, nor a registered adapter is served by the model
    /// itself, with a warning in the log once per name (llama-server answers any name). Adapters'
    /// names route as on every route, and `BASE:ADAPTER` with an adapter not registered is still a
    /// 404. Chat Completions and Ollama keep their 404: their clients let a user pick the name.
    pub fn agent_model<'a>(&self, style: Style, asked: Option<&'a str>) -> Option<&'a str> {
        let a = asked.filter(|a| !a.is_empty())?;
        let base_adapter = a.match_indices(':').any(|(i, _)| self.card.matches(&a[..i]));
        if base_adapter || self.check_model(style, Some(a)).is_ok() {
            return Some(a);
        }
        warn_once(a);
        None
    }

    /// The cheap checks a generation request passes before any work proportional to it: the
    /// model it names is served here (404), and a place is free among the slots and the queue
    /// (429 with `Retry-After`, or 503 once the scheduler is gone). `body` is only scanned for
    /// its top-level `model` (a malformed body is left for the route's decode to refuse).
    pub fn admit(&self, style: Style, names: Names, body: &[u8]) -> Result<Ticket, ApiError> {
        #[derive(Deserialize)]
        struct Named {
            model: Option<String>,
        }
        let asked = serde_json::from_slice::<Named>(body).ok().and_then(|n| n.model);
        let asked = match names {
            Names::Served => asked.as_deref(),
            Names::Any => self.agent_model(style, asked.as_deref()),
        };
        self.check_model(style, asked)?;
        self.engine.reserve().map_err(|r| ApiError::refused(style, r))
    }

    /// A 400 for a text of `bytes` bytes that certainly has more tokens than a prompt may
    /// (no token covers more than the vocabulary's longest piece), decided before tokenizing it.
    pub fn check_text_len(&self, style: Style, bytes: usize) -> Result<(), ApiError> {
        let max = self.engine.n_ctx.saturating_sub(1);
        // Every token covers at least one byte: most texts are decided without the scan.
        if bytes <= max {
            return Ok(());
        }
        let piece = max_piece_bytes(&self.tok);
        if bytes > max.saturating_mul(piece) {
            return Err(ApiError::bad_request(
                style,
                format!(
                    "the prompt has {bytes} bytes of text, more than the {max} tokens a prompt \
                     may use here can hold (a token is at most {piece} bytes); shorten it"
                ),
            )
            .with_code("context_length_exceeded"));
        }
        Ok(())
    }

    /// Queues a generation of `prompt` with `s` (at most `s.max_tokens`, default: until the
    /// context is full; a [`Settings`] never holds 0) on `adapters`, on the place `ticket`
    /// holds; with `logprobs`, each token's log-probability and that many alternatives on the
    /// second receiver.
    pub fn submit(
        &self,
        style: Style,
        ticket: Ticket,
        prompt: Vec<u32>,
        s: Settings,
        adapters: JobAdapters,
        logprobs: Option<usize>,
    ) -> Result<
        (UnboundedReceiver<Event>, Option<UnboundedReceiver<engine::logprobs::TokenLogprob>>),
        ApiError,
    > {
        let n_ctx = self.engine.n_ctx;
        let mut max_tokens = s.max_tokens.unwrap_or(n_ctx);
        // Ollama's `num_ctx` below the served context: the request runs in that many positions.
        if let Some(c) = s.num_ctx.filter(|&c| c < n_ctx) {
            if prompt.len() >= c {
                return Err(ApiError::bad_request(
                    style,
                    format!(
                        "the prompt has {} tokens but options.num_ctx is {c}; raise num_ctx (up \
                         to {n_ctx}) or shorten the prompt",
                        prompt.len()
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            max_tokens = max_tokens.min(c - prompt.len());
        }
        let (sampling, stop, json, logit_bias, draft) =
            (s.sampling, s.stop, s.json, s.logit_bias, s.draft);
        let tools = s.chat.grammar;
        let req = scheduler::Request {
            prompt,
            sampling,
            max_tokens,
            stop,
            json,
            logprobs,
            adapters,
            logit_bias,
            tools,
            draft,
        };
        self.engine.request_on(ticket, req).map_err(|r| ApiError::refused(style, r))
    }
}

/// The longest token piece of `tok`'s vocabulary in bytes (at least 4, a UTF-8 character: a
/// text the tokenizer cannot match falls back to one token per character or byte). Scanned
/// once per tokenizer.
fn max_piece_bytes(tok: &Arc<tokenizer::Tokenizer>) -> usize {
    use std::sync::Mutex;
    static CACHE: Mutex<Option<(usize, usize)>> = Mutex::new(None);
    let key = Arc::as_ptr(tok) as usize;
    let mut c = CACHE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match *c {
        Some((k, n)) if k == key => n,
        _ => {
            let n = (0..tok.n_vocab() as u32).map(|t| tok.token_piece(t).len()).max().unwrap_or(0);
            let n = n.max(4);
            *c = Some((key, n));
            n
        }
    }
}

/// A request body from this size on hands its decoding's freed memory back to the kernel
/// ([`memory::heap::release_free`]) when its preparation ends: bodies this large are rare, and
/// their decoded trees are what spread over the blocking pool's arenas.
const RELEASE_AFTER: usize = 64 << 10;

/// Which model names a route answers ([`AppState::admit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    /// The served model, `BASE:ADAPTER` and registered adapters; any other name is a 404.
    Served,
    /// Those, and any other name, answered by the served model (the agent routes:
    /// [`AppState::agent_model`]).
    Any,
}

impl AppState {
    /// A generation request's body prepared: the cheap refusals first ([`AppState::admit`]),
    /// then `work` (decode and tokenize) off the HTTP thread ([`off_thread`]); the place the
    /// request holds, what `work` made of the body, and the prompt. The place moves into the
    /// blocking job and comes back with its result, so a client that leaves while its body is
    /// decoded does not free its place until that work has ended (and it ends early: see
    /// [`still_wanted`]).
    pub async fn prepare<R: Send + 'static>(
        self: &Arc<Self>,
        style: Style,
        body: Bytes,
        work: impl FnOnce(&AppState, &[u8]) -> Result<(R, Vec<u32>), ApiError> + Send + 'static,
    ) -> Result<(Ticket, R, Vec<u32>), ApiError> {
        self.prepare_named(style, Names::Served, body, work).await
    }

    /// [`AppState::prepare`] with the model-name rule `names`.
    async fn prepare_named<R: Send + 'static>(
        self: &Arc<Self>,
        style: Style,
        names: Names,
        body: Bytes,
        work: impl FnOnce(&AppState, &[u8]) -> Result<(R, Vec<u32>), ApiError> + Send + 'static,
    ) -> Result<(Ticket, R, Vec<u32>), ApiError> {
        let ticket = self.admit(style, names, &body)?;
        let app = self.clone();
        let (ticket, done) = off_thread_holding(style, ticket, move || {
            let big = body.len() >= RELEASE_AFTER;
            let out = work(&app, &body);
            drop(body);
            if big {
                // The decoded tree of a large body (up to ~45× its size) was just freed into
                // this blocking thread's arena, which would otherwise keep it as its high-water
                // mark: handed back, so RSS stays the plan's whatever the bodies were.
                memory::heap::release_free();
            }
            out
        })
        .await?;
        let (r, prompt) = done?;
        Ok((ticket, r, prompt))
    }

    /// [`AppState::prepare`] for a chat route: `decode`, then [`AppState::chat_tokens`] over
    /// the settings and messages `parts` points at.
    pub async fn prepare_chat<R: Send + 'static>(
        self: &Arc<Self>,
        style: Style,
        names: Names,
        body: Bytes,
        decode: fn(&[u8]) -> Result<R, ApiError>,
        parts: fn(&mut R) -> (&mut Settings, &[tokenizer::ChatMessage]),
    ) -> Result<(Ticket, R, Vec<u32>), ApiError> {
        self.prepare_named(style, names, body, move |app, body| {
            let mut req = decode(body)?;
            if !still_wanted() {
                return Err(gone(style));
            }
            let (settings, messages) = parts(&mut req);
            let prompt = app.chat_tokens(style, settings, messages)?;
            Ok((req, prompt))
        })
        .await
    }

    /// A chat's prompt with its settings fitted to the context: the bounds that need the
    /// model ([`Settings::fit`]), a text certainly too long refused before the template, then
    /// the template and tokenization ([`AppState::chat_prompt`]).
    pub fn chat_tokens(
        &self,
        style: Style,
        settings: &mut Settings,
        messages: &[tokenizer::ChatMessage],
    ) -> Result<Vec<u32>, ApiError> {
        settings.fit(style, self.engine.n_ctx, self.tok.n_vocab())?;
        self.check_text_len(style, messages.iter().map(|m| m.content.len()).sum())?;
        if let Some((i, m)) =
            messages.iter().enumerate().find(|(_, m)| !ROLES.contains(&m.role.as_str()))
        {
            return Err(ApiError::bad_request(
                style,
                format!(
                    "messages[{i}].role is {:?}: a role is one of {}",
                    m.role,
                    ROLES.join(", ")
                ),
            ));
        }
        let extras = messages.iter().flat_map(|m| m.extra.values());
        limits::check_json_values(extras.chain(&settings.chat.tools))
            .map_err(|e| ApiError::bad_request(style, e))?;
        self.chat_prompt(style, messages, &mut settings.chat)
    }
}

/// The control-token text any string (or object key; only keys when `keys_only`) of `v` holds.
fn control_text_in_json<'t>(
    tok: &'t tokenizer::Tokenizer,
    v: &serde_json::Value,
    keys_only: bool,
) -> Option<&'t str> {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::String(s) if !keys_only => {
                if let Some(t) = tok.control_text_in(s) {
                    return Some(t);
                }
            }
            serde_json::Value::Array(a) => stack.extend(a),
            serde_json::Value::Object(o) => {
                for (k, x) in o {
                    if let Some(t) = tok.control_text_in(k) {
                        return Some(t);
                    }
                    stack.push(x);
                }
            }
            _ => {}
        }
    }
    None
}

/// Message roles a chat may use: the ones the APIs and the templates know. Any other string
/// would be rendered raw into the prompt by templates that print the role.
pub const ROLES: [&str; 7] =
    ["system", "developer", "user", "assistant", "tool", "function", "ipython"];

/// Runs `work` (decode, schema compile, template render, tokenization: work proportional to
/// the request) on the blocking pool, so it never holds the HTTP thread; a panic in it is a 500
/// for this request alone.
pub async fn off_thread<T: Send + 'static>(
    style: Style,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| panicked(style, e))?
}

/// [`off_thread`] holding `ticket` (the request's place among the slots and the queue) until
/// `work` has ended, whether or not the client is still waiting: the blocking pool then never
/// runs more request jobs than the scheduler has places, however many clients send a body and
/// leave. While the handler waits, [`still_wanted`] is true on `work`'s thread; once the
/// handler is dropped (its client left) it is false, so `work` can stop between its phases.
pub async fn off_thread_holding<T: Send + 'static>(
    style: Style,
    ticket: Ticket,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<(Ticket, Result<T, ApiError>), ApiError> {
    /// Clears the flag when the handler's future is dropped (or done).
    struct Waiting(Arc<AtomicBool>);
    impl Drop for Waiting {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Release);
        }
    }
    let waiting = Waiting(Arc::new(AtomicBool::new(true)));
    let flag = waiting.0.clone();
    let job = tokio::task::spawn_blocking(move || {
        let result = if flag.load(Ordering::Acquire) {
            WANTED.with(|w| *w.borrow_mut() = Some(flag.clone()));
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            WANTED.with(|w| *w.borrow_mut() = None);
            r.unwrap_or_else(|p| std::panic::resume_unwind(p))
        } else {
            Err(gone(style))
        };
        (ticket, result)
    });
    let out = job.await.map_err(|e| panicked(style, e));
    drop(waiting);
    out
}

thread_local! {
    /// The flag of the request whose work runs on this blocking thread ([`off_thread_holding`]).
    static WANTED: std::cell::RefCell<Option<Arc<AtomicBool>>> = const { std::cell::RefCell::new(None) };
}

/// Whether the client of the request being prepared on this thread still waits for it (true
/// outside [`off_thread_holding`]).
pub fn still_wanted() -> bool {
    WANTED.with(|w| w.borrow().as_ref().is_none_or(|f| f.load(Ordering::Acquire)))
}

/// The error of work stopped because its client left (nobody reads it).
fn gone(style: Style) -> ApiError {
    ApiError::new(style, StatusCode::SERVICE_UNAVAILABLE, "the client closed the connection")
}

fn panicked(style: Style, e: tokio::task::JoinError) -> ApiError {
    ApiError::new(
        style,
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("internal error while preparing the request: {e}"),
    )
}

/// Sampling settings as the APIs name them; absent ones take snug's defaults, an absent seed a
/// fresh one.
#[derive(Clone, Debug, Default)]
pub struct Knobs {
    pub temperature: Option<f32>,
    pub top_k: Option<i64>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub repeat_penalty: Option<f32>,
    /// Ollama's: -1 is the whole context, 0 off; at most the context.
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// snug's own: `Some(false)` turns speculative decoding off for the request.
    pub draft: Option<bool>,
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
    /// `repeat_last_n` was -1: the penalties look at the whole context ([`Settings::fit`]).
    pub repeat_last_n_whole: bool,
    /// Ollama's `num_ctx`: the positions this request may use (at most the served context).
    pub num_ctx: Option<usize>,
    /// OpenAI's `logit_bias`: added to the token's logit before sampling.
    pub logit_bias: Vec<(u32, f32)>,
    /// A chat's tools and reasoning ([`crate::tools`]).
    pub chat: crate::tools::ChatOptions,
    /// Speculative decoding may run ([`Knobs::draft`]).
    pub draft: bool,
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
        limits::check_stops(&stop).map_err(|e| ApiError::bad_request(style, e))?;
        Ok(Settings {
            sampling: knobs.params(style)?,
            max_tokens,
            stop,
            json: None,
            repeat_last_n_whole: knobs.repeat_last_n == Some(-1),
            num_ctx: None,
            logit_bias: Vec::new(),
            chat: Default::default(),
            draft: knobs.draft.unwrap_or(true),
        })
    }

    /// The checks that need the served context of `n_ctx` positions and a vocabulary of
    /// `n_vocab`: `repeat_last_n` (-1 becomes the context) and `num_ctx` at most the context,
    /// `logit_bias` tokens in the vocabulary; each refusal a 400 naming the field and bound.
    pub fn fit(&mut self, style: Style, n_ctx: usize, n_vocab: usize) -> Result<(), ApiError> {
        if self.repeat_last_n_whole {
            self.sampling.repeat_last_n = n_ctx;
        }
        let n = self.sampling.repeat_last_n;
        if n > n_ctx {
            return Err(ApiError::bad_request(
                style,
                format!("repeat_last_n is {n}, but it may be at most the context of {n_ctx} positions (-1: the whole context)"),
            ));
        }
        if let Some(c) = self.num_ctx.filter(|&c| c > n_ctx) {
            return Err(ApiError::bad_request(
                style,
                format!("options.num_ctx is {c}, but this server's context is {n_ctx} positions, fixed when it starts ({CTX}); ask for at most {n_ctx}"),
            ));
        }
        if let Some(&(t, _)) = self.logit_bias.iter().find(|&&(t, _)| t as usize >= n_vocab) {
            return Err(ApiError::bad_request(
                style,
                format!("logit_bias names token {t}, outside the vocabulary of {n_vocab}"),
            ));
        }
        Ok(())
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
            repeat_last_n: match self.repeat_last_n {
                None => d.repeat_last_n,
                // -1 (the whole context) is resolved by `Settings::fit`.
                Some(-1) => 0,
                Some(n) if (0..=limits::MAX_REPEAT_LAST_N).contains(&n) => n as usize,
                Some(n) => {
                    return Err(ApiError::bad_request(
                        style,
                        format!("repeat_last_n is {n}; it must be -1 (the whole context), 0 (off) or a window of at most the context's positions"),
                    ))
                }
            },
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            seed: self.seed.unwrap_or_else(fresh_seed),
        };
        p.validate().map_err(|e| ApiError::bad_request(style, e))?;
        Ok(p)
    }
}

fn fresh_seed() -> u64 {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    t.as_nanos() as u64 ^ (std::process::id() as u64).rotate_left(32)
}

/// `stop` as OpenAI sends it: one string or a list (of at most [`limits::MAX_STOPS`], refused
/// while parsing past that).
#[derive(Clone, Debug, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "OpenAiStop")]
pub enum Stop {
    One(#[schemars(length(max = 256))] String),
    Many(#[schemars(length(max = 16))] Vec<StopString>),
}

/// One stop string as the schema states it (at most [`limits::MAX_STOP_BYTES`] bytes).
#[derive(Clone, Debug, JsonSchema)]
#[schemars(rename = "StopString")]
pub struct StopString(#[schemars(length(max = 256))] pub String);

impl<'de> Deserialize<'de> for Stop {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Stop, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Stop;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a stop string or a list of at most 16")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Stop, E> {
                Ok(Stop::One(v.to_string()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Stop, E> {
                Ok(Stop::One(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Stop, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    if out.len() == limits::MAX_STOPS {
                        return Err(serde::de::Error::custom(limits::too_many(
                            "stop",
                            limits::MAX_STOPS,
                        )));
                    }
                    out.push(StopString(s));
                }
                Ok(Stop::Many(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl Stop {
    pub fn into_vec(s: Option<Stop>) -> Vec<String> {
        match s {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v.into_iter().map(|s| s.0).collect(),
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

/// A streamed response with `content_type`; an SSE one sends a comment after each silence of
/// [`crate::keepalive::EVERY`] (a long prompt being read), so clients do not time out.
pub fn streamed(content_type: &'static str, body: Body) -> Response {
    let body = if content_type == "text/event-stream" {
        crate::keepalive::KeepAlive::wrap(body, crate::keepalive::EVERY)
    } else {
        body
    };
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

/// Names warned about by [`AppState::agent_model`] (at most [`WARNED_NAMES`]; past that, no more
/// warnings: a client cycling names cannot grow it or flood the log).
static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
const WARNED_NAMES: usize = 64;

fn warn_once(name: &str) {
    let mut w = WARNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if w.len() < WARNED_NAMES && !w.iter().any(|n| n == name) {
        w.push(name.to_string());
        let shown: String = name.chars().take(100).collect();
        eprintln!("snug: warning: model {shown:?} is not served here; the served model answers it (the agent routes answer any model name)");
    }
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
