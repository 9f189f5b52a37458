//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, what
//! Claude Code and opencode speak.
//!
//! The request is read into the shared chat request ([`super`]): `system` (a string or text
//! blocks; `cache_control` accepted, since every prefix is cached anyway) first; each message's
//! blocks in order: `text`, `thinking` (the turn's `reasoning_content`; the signature is not
//! checked), `tool_use` (a call, its `input` object in the order sent), `tool_result` (a `tool`
//! message; string or text blocks); `redacted_thinking` is dropped; images and documents are a
//! 400 (text models). `tools` (`input_schema`) become function tools; one of a built-in type
//! (`bash_…`, `web_search_…`) is left out with a warning in the log. `tool_choice` `auto`,
//! `any` (a call from the first token), `tool` (that tool), `none`; `disable_parallel_tool_use`
//! allows one call. `thinking` `enabled` / `disabled` sets the template's `enable_thinking`
//! (`budget_tokens` is accepted: the answer's `max_tokens` bounds it); reasoning comes back as
//! `thinking` blocks. `stop_sequences` end the answer and the one met is `stop_sequence`.
//! Sampling: `temperature` (0 to 1, Anthropic's range), `top_p`, `top_k`, the agent default
//! otherwise ([`super::AGENT_TEMPERATURE`]). `metadata` is accepted and unused.
//!
//! `usage.input_tokens` counts the prompt tokens computed, `cache_read_input_tokens` those the
//! prefix cache held; count_tokens answers their sum for the same body (the same template and
//! tokenizer, no generation). Errors are Anthropic's shape ([`crate::error::Style::Anthropic`]).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use engine::scheduler::{Event as EngineEvent, Finish, FinishReason};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use tokenizer::ChatMessage;

use super::{Answer, BlockEvent, BlockKind, Blocks, Call, Part};
use crate::api::limits;
use crate::api::{collect, event_body, streamed, Names, Settings};
use crate::error::{body_bytes, from_json, some_messages, ApiError, Style};
use crate::responses::anthropic::{
    Block, Delta, ErrorBody, Event, Message, MessageDeltaBody, StopReason, TokenCount, Usage,
};
use crate::tools::ChatOptions;
use crate::Shared;

const S: Style = Style::Anthropic;

/// `/v1/messages`' body (and `/v1/messages/count_tokens`', which needs no `max_tokens`).
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "AnthropicMessagesRequest")]
pub struct MessagesRequest {
    /// The served model's name (or `BASE:ADAPTER`).
    model: String,
    /// Tokens to generate at most (required by `/v1/messages`).
    #[schemars(range(min = 1))]
    max_tokens: Option<u64>,
    /// The conversation: `user` and `assistant` turns.
    #[serde(deserialize_with = "limits::messages")]
    #[schemars(length(min = 1, max = 4096))]
    messages: Vec<InMessage>,
    /// A string, or text blocks (`cache_control` accepted).
    system: Option<System>,
    #[serde(default, deserialize_with = "limits::opt_stops")]
    #[schemars(length(max = 16))]
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stream: bool,
    /// 0 to 1, Anthropic's range.
    #[schemars(range(min = 0, max = 1))]
    temperature: Option<f32>,
    #[schemars(range(min = 0, max = 1))]
    top_p: Option<f32>,
    top_k: Option<i64>,
    /// Accepted and unused (`user_id` labels the caller).
    #[allow(dead_code)]
    metadata: Option<Value>,
    /// At most 64.
    #[serde(default, deserialize_with = "limits::opt_tools")]
    #[schemars(length(max = 64))]
    tools: Option<Vec<InTool>>,
    tool_choice: Option<ToolChoice>,
    thinking: Option<Thinking>,
}

/// `system`: a string or text blocks.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "AnthropicSystem")]
enum System {
    Text(String),
    Blocks(Vec<SystemBlock>),
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "AnthropicSystemBlock")]
struct SystemBlock {
    /// `text`.
    #[serde(rename = "type")]
    #[allow(dead_code)]
    kind: String,
    text: String,
    /// Accepted: snug caches every prefix.
    #[allow(dead_code)]
    cache_control: Option<Value>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "AnthropicInMessage")]
struct InMessage {
    role: Role,
    content: Content,
}

#[derive(Debug, Deserialize, JsonSchema, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "AnthropicRole")]
enum Role {
    User,
    Assistant,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "AnthropicContent")]
enum Content {
    Text(String),
    Blocks(Vec<InBlock>),
}

/// A block of a message sent.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schemars(rename = "AnthropicInBlock")]
enum InBlock {
    Text {
        text: String,
    },
    Thinking {
        thinking: String,
    },
    RedactedThinking {},
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        content: Option<ResultContent>,
        /// Accepted: the result's text says what went wrong.
        #[allow(dead_code)]
        is_error: Option<bool>,
    },
    /// Refused: a text model reads no images.
    Image {},
    /// Refused: a text model reads no documents.
    Document {},
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "AnthropicResultContent")]
enum ResultContent {
    Text(String),
    Blocks(Vec<ResultBlock>),
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "AnthropicResultBlock")]
struct ResultBlock {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// A tool: a custom one (`input_schema`), or a built-in type snug leaves out.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "AnthropicTool")]
struct InTool {
    name: String,
    description: Option<String>,
    /// The arguments' JSON schema (the call is generated under it).
    input_schema: Option<Value>,
    /// Absent or `custom`; a built-in type (`bash_20250124`, `web_search_20250305`…) is left
    /// out with a warning.
    #[serde(rename = "type")]
    kind: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schemars(rename = "AnthropicToolChoice")]
enum ToolChoice {
    Auto { disable_parallel_tool_use: Option<bool> },
    Any { disable_parallel_tool_use: Option<bool> },
    Tool { name: String, disable_parallel_tool_use: Option<bool> },
    None {},
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schemars(rename = "AnthropicThinking")]
enum Thinking {
    Enabled {
        #[allow(dead_code)]
        budget_tokens: Option<u64>,
    },
    Disabled {},
    Adaptive {},
}

/// `/v1/messages`' request decoded: the conversation for the template and the settings.
#[derive(Debug)]
pub struct Decoded {
    pub model: String,
    pub stream: bool,
    pub messages: Vec<ChatMessage>,
    pub settings: Settings,
}

impl Decoded {
    fn parts(&mut self) -> (&mut Settings, &[ChatMessage]) {
        (&mut self.settings, &self.messages)
    }

    /// `/v1/messages`' body: `max_tokens` required.
    pub fn decode(body: &[u8]) -> Result<Decoded, ApiError> {
        let d = Decoded::read(body)?;
        if d.settings.max_tokens.is_none() {
            return Err(ApiError::bad_request(S, "max_tokens: Field required"));
        }
        Ok(d)
    }

    /// The body read and checked, `max_tokens` optional (count_tokens).
    pub fn read(body: &[u8]) -> Result<Decoded, ApiError> {
        let r: MessagesRequest = from_json(S, body)?;
        // Anthropic's range is 0 to 1 (the schema says so too).
        let knobs = super::knobs(S, r.temperature, r.top_p, r.top_k, 1.0)?;
        let max = r.max_tokens.map(|n| n.min(usize::MAX as u64) as usize);
        let mut settings = Settings::new(S, &knobs, max, r.stop_sequences.unwrap_or_default())?;
        let mut tools = Vec::new();
        for t in r.tools.unwrap_or_default() {
            match t.kind.as_deref() {
                None | Some("custom") => tools.push(super::function_tool(
                    &t.name,
                    t.description.as_deref(),
                    t.input_schema.as_ref(),
                )),
                Some(other) => super::warn(&format!(
                    "/v1/messages: the built-in tool {:?} of type {other:?} is left out (snug runs no server tools)",
                    t.name
                )),
            }
        }
        let (choice, parallel) = match r.tool_choice {
            None => (None::<Value>, None),
            Some(ToolChoice::Auto { disable_parallel_tool_use: d }) => (Some("auto".into()), d),
            Some(ToolChoice::Any { disable_parallel_tool_use: d }) => (Some("required".into()), d),
            Some(ToolChoice::None {}) => (Some("none".into()), None),
            Some(ToolChoice::Tool { name, disable_parallel_tool_use: d }) => {
                (Some(serde_json::json!({"type": "function", "function": {"name": name}})), d)
            }
        };
        settings.chat = ChatOptions::new(Some(&tools), choice.as_ref(), parallel.map(|d| !d))
            .map_err(|e| ApiError::bad_request(S, e))?;
        settings.chat.enable_thinking = match r.thinking {
            Some(Thinking::Enabled { .. }) => Some(true),
            Some(Thinking::Disabled {}) => Some(false),
            Some(Thinking::Adaptive {}) | None => None,
        };
        let mut messages = Vec::new();
        match r.system {
            Some(System::Text(t)) => messages.push(ChatMessage::new("system", t)),
            Some(System::Blocks(b)) => {
                let text: Vec<String> = b.into_iter().map(|b| b.text).collect();
                messages.push(ChatMessage::new("system", text.join("\n")));
            }
            None => {}
        }
        for (i, m) in r.messages.into_iter().enumerate() {
            turn(i, m, &mut messages)?;
        }
        let messages = some_messages(S, messages)?;
        Ok(Decoded { model: r.model, stream: r.stream, messages, settings })
    }
}

/// Message `i`'s blocks as template messages, in order.
fn turn(i: usize, m: InMessage, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let blocks = match m.content {
        Content::Text(t) => vec![InBlock::Text { text: t }],
        Content::Blocks(b) => b,
    };
    let (mut text, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    let flush_user = |text: &mut String, out: &mut Vec<ChatMessage>| {
        if !text.is_empty() {
            out.push(ChatMessage::new("user", std::mem::take(text)));
        }
    };
    for b in blocks {
        match (m.role, b) {
            (_, InBlock::Text { text: t }) => text.push_str(&t),
            (Role::Assistant, InBlock::Thinking { thinking }) => reasoning.push_str(&thinking),
            (_, InBlock::RedactedThinking {}) | (Role::User, InBlock::Thinking { .. }) => {}
            (Role::Assistant, InBlock::ToolUse { id, name, input }) => {
                calls.push(Call { id, name, arguments: input })
            }
            (Role::User, InBlock::ToolResult { tool_use_id, content, .. }) => {
                flush_user(&mut text, out);
                let content = match content {
                    None => String::new(),
                    Some(ResultContent::Text(t)) => t,
                    Some(ResultContent::Blocks(b)) => result_text(i, b)?,
                };
                let name = super::called_name(out, &tool_use_id);
                out.push(super::tool_result(&tool_use_id, name.as_deref(), content));
            }
            (role, InBlock::ToolUse { .. } | InBlock::ToolResult { .. }) => {
                return Err(ApiError::bad_request(
                    S,
                    format!("messages[{i}]: a {role:?} turn cannot hold this block (tool_use belongs to assistant turns, tool_result to user turns)").to_lowercase(),
                ))
            }
            (_, InBlock::Image {} | InBlock::Document {}) => {
                return Err(ApiError::bad_request(
                    S,
                    format!("messages[{i}]: image and document blocks are not supported: this model reads text only"),
                ))
            }
        }
    }
    match m.role {
        Role::User => flush_user(&mut text, out),
        Role::Assistant => out.push(super::assistant(text, reasoning, calls)),
    }
    Ok(())
}

/// A tool result's text blocks joined.
fn result_text(i: usize, blocks: Vec<ResultBlock>) -> Result<String, ApiError> {
    let mut text = String::new();
    for b in blocks {
        match (b.kind.as_str(), b.text) {
            ("text", Some(t)) => text.push_str(&t),
            (kind, _) => {
                return Err(ApiError::bad_request(
                    S,
                    format!("messages[{i}]: a tool_result block of type {kind:?} is not supported: text only"),
                ))
            }
        }
    }
    Ok(text)
}

fn stop_reason(f: &Finish, called: bool) -> StopReason {
    match f.reason {
        FinishReason::Stop if called => StopReason::ToolUse,
        FinishReason::Stop if f.stop_string.is_some() => StopReason::StopSequence,
        FinishReason::Length | FinishReason::ContextFull => StopReason::MaxTokens,
        // A drain cut the answer short: it ended, as the client sees it.
        FinishReason::Stop | FinishReason::Aborted => StopReason::EndTurn,
    }
}

/// The stop sequence that ended the answer.
fn stop_sequence(f: &Finish, stops: &[String]) -> Option<String> {
    f.stop_string.and_then(|i| stops.get(i).cloned())
}

fn usage(f: &Finish) -> Usage {
    Usage::new(f.n_prompt, f.n_cached, f.n_gen)
}

fn message_id() -> String {
    format!("msg_{}", crate::tools::call_id(None).trim_start_matches("call_"))
}

/// `POST /v1/messages`.
pub async fn create(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let run = async {
        let body = body_bytes(S, body)?;
        let (ticket, req, prompt) =
            st.prepare_chat(S, Names::Any, body, Decoded::decode, Decoded::parts).await?;
        let n_prompt = prompt.len();
        let asked = st.agent_model(S, Some(&req.model));
        let model = st.answer_model(asked);
        let stops = req.settings.stop.clone();
        let started = super::start(&st, S, ticket, asked, req.settings, prompt).await?;
        let head = Message {
            id: message_id(),
            kind: "message",
            role: "assistant",
            model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: Usage::new(n_prompt, 0, 0),
        };
        if req.stream {
            return Ok(stream(head, started, stops));
        }
        let (text, f) = collect(S, started.rx).await?;
        let a = Answer::parse(text, started.parser, started.format);
        let mut content = Vec::new();
        if !a.reasoning.is_empty() {
            content.push(Block::Thinking { thinking: a.reasoning, signature: String::new() });
        }
        if !a.text.is_empty() || a.calls.is_empty() {
            content.push(Block::Text { text: a.text });
        }
        let called = !a.calls.is_empty();
        for (id, name, args) in a.calls {
            content.push(Block::ToolUse { id, name, input: super::arguments(&args) });
        }
        let m = Message {
            content,
            stop_reason: Some(stop_reason(&f, called)),
            stop_sequence: stop_sequence(&f, &stops),
            usage: usage(&f),
            ..head
        };
        Ok::<_, ApiError>(axum::Json(m).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// The answer as Anthropic's events.
fn stream(head: Message, started: super::Started, stops: Vec<String>) -> Response {
    let mut blocks = Blocks::new(started.parser, started.format);
    let mut opening = Some(head);
    let body = event_body(started.rx, move |ev| {
        let mut out = String::new();
        if let Some(message) = opening.take() {
            out += &Event::MessageStart { message }.sse();
            out += &Event::Ping.sse();
        }
        let (steps, done) = match ev {
            EngineEvent::Text(t) => (blocks.push(Some(&t)), None),
            EngineEvent::Done(f) => (blocks.push(None), Some(f)),
            EngineEvent::Failed(e) => {
                let error = ErrorBody { kind: "api_error", message: e };
                return out + &Event::Error { error }.sse();
            }
        };
        for s in steps {
            out += &block_event(s).sse();
        }
        if let Some(f) = done {
            let delta = MessageDeltaBody {
                stop_reason: Some(stop_reason(&f, blocks.called)),
                stop_sequence: stop_sequence(&f, &stops),
            };
            out += &Event::MessageDelta { delta, usage: usage(&f) }.sse();
            out += &Event::MessageStop.sse();
        }
        out
    });
    streamed("text/event-stream", body)
}

fn block_event(s: BlockEvent) -> Event {
    match s {
        BlockEvent::Start { index, kind } => Event::ContentBlockStart {
            index,
            content_block: match kind {
                BlockKind::Text => Block::Text { text: String::new() },
                BlockKind::Thinking => {
                    Block::Thinking { thinking: String::new(), signature: String::new() }
                }
                BlockKind::Call { id, name } => {
                    Block::ToolUse { id, name, input: Value::Object(Default::default()) }
                }
            },
        },
        BlockEvent::Delta { index, part, text } => {
            let delta = match part {
                Part::Text => Delta::TextDelta { text },
                Part::Thinking => Delta::ThinkingDelta { thinking: text },
                Part::Arguments => Delta::InputJsonDelta { partial_json: text },
            };
            Event::ContentBlockDelta { index, delta }
        }
        BlockEvent::Stop { index } => Event::ContentBlockStop { index },
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens for the same body, no generation.
pub async fn count_tokens(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let run = async {
        let body = body_bytes(S, body)?;
        // The place it holds bounds the work in flight, as a generation's does; it is given
        // back at once.
        let (ticket, _, prompt) =
            st.prepare_chat(S, Names::Any, body, Decoded::read, Decoded::parts).await?;
        drop(ticket);
        Ok::<_, ApiError>(axum::Json(TokenCount { input_tokens: prompt.len() }).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
