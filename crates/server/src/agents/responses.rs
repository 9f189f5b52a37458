//! OpenAI's Responses API, stateless: `POST /v1/responses`, what Codex and the Agents SDK speak.
//!
//! `input` is a string (one user message) or items, read in order into the shared chat request
//! ([`super`]): `message` (roles `user`, `system`, `developer` (as `system`), `assistant`;
//! content a string or `input_text` / `output_text` parts), `reasoning` (its text as the next
//! assistant turn's `reasoning_content`), `function_call` (the arguments text read back into
//! the object the model generated) and `function_call_output` (a `tool` message). An
//! assistant's reasoning, message and calls that follow one another are one assistant turn, as
//! the model generated them. Other item types (outputs of built-in tools) are left out with a
//! warning. `instructions` is the system message; `tools` of type `function` are offered (other
//! types, such as Codex's `web_search` or `image_generation`, are left out with a warning);
//! `tool_choice`, `parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p`, and
//! `text.format` (`json_schema`, `json_object`, `text`) as on Chat Completions.
//!
//! No state is kept: `previous_response_id`, `conversation` and `store: true` are 400s that
//! say to send the whole conversation as `input` (and `store: false`). The answer's `usage`
//! has `input_tokens_details.cached_tokens`, the prompt tokens the prefix cache held.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response as HttpResponse};
use engine::scheduler::{Event as EngineEvent, Finish, FinishReason};
use engine::JsonFormat;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use tokenizer::ChatMessage;

use super::{Answer, BlockEvent, BlockKind, Blocks, Call};
use crate::api::limits;
use crate::api::{collect, event_body, streamed, Names, Settings};
use crate::error::{body_bytes, from_json, some_messages, ApiError, Style};
use crate::responses::oai_responses::{
    Event, IncompleteDetails, Item, OutputText, ReasoningText, Response, Status, Usage,
};
use crate::tools::ChatOptions;
use crate::{unix_now, Shared};

const S: Style = Style::OpenAi;

/// `/v1/responses`' body.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "ResponsesRequest")]
pub struct ResponsesRequest {
    model: Option<String>,
    /// A string (one user message) or a list of items (at most 4096).
    #[schemars(with = "InputSchema")]
    input: Input,
    /// The system message.
    instructions: Option<String>,
    /// Function tools `{"type": "function", "name", "description", "parameters"}`; other
    /// types are left out with a warning. At most 64.
    #[serde(default, deserialize_with = "limits::opt_tools")]
    #[schemars(length(max = 64))]
    tools: Option<Vec<Value>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "name": ...}`.
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    #[schemars(range(min = 1))]
    max_output_tokens: Option<u64>,
    #[schemars(range(min = 0, max = 2))]
    temperature: Option<f32>,
    #[schemars(range(min = 0, max = 1))]
    top_p: Option<f32>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", "schema": ...}}`.
    text: Option<TextParam>,
    #[serde(default)]
    stream: bool,
    /// Only false (or absent): snug keeps no responses.
    #[schemars(extend("enum" = [false, null]))]
    store: Option<bool>,
    /// Refused: snug keeps no responses; send the whole conversation as `input`.
    #[schemars(with = "Option<()>")]
    previous_response_id: Option<String>,
    /// Refused, as `previous_response_id`.
    #[schemars(with = "Option<()>")]
    conversation: Option<Value>,
    /// Accepted and unused.
    #[allow(dead_code)]
    metadata: Option<Value>,
}

#[derive(JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "ResponsesInput")]
#[allow(dead_code)]
enum InputSchema {
    Text(String),
    Items(#[schemars(length(max = 4096))] Vec<Value>),
}

#[derive(Debug)]
enum Input {
    Text(String),
    Items(Vec<Value>),
}

impl<'de> Deserialize<'de> for Input {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Input, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Input;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a list of at most 4096 input items")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Input, E> {
                Ok(Input::Text(v.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Input, A::Error> {
                let items: Vec<Value> =
                    limits::messages(serde::de::value::SeqAccessDeserializer::new(seq))?;
                Ok(Input::Items(items))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "ResponsesTextParam")]
struct TextParam {
    format: Option<Value>,
}

/// `/v1/responses`' request decoded.
#[derive(Debug)]
pub struct Decoded {
    pub model: Option<String>,
    pub stream: bool,
    pub messages: Vec<ChatMessage>,
    pub settings: Settings,
    /// What the response object repeats of the request.
    echo: Echo,
}

#[derive(Debug, Clone)]
struct Echo {
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    parallel_tool_calls: bool,
    temperature: f32,
    top_p: f32,
    tool_choice: Value,
    tools: Vec<Value>,
    text: Value,
}

impl Decoded {
    fn parts(&mut self) -> (&mut Settings, &[ChatMessage]) {
        (&mut self.settings, &self.messages)
    }

    pub fn decode(body: &[u8]) -> Result<Decoded, ApiError> {
        let r: ResponsesRequest = from_json(S, body)?;
        let stateless = "snug keeps no responses (stateless): send the whole conversation as `input` and `store: false`";
        if r.previous_response_id.is_some() {
            return Err(ApiError::bad_request(
                S,
                format!("previous_response_id is not supported: {stateless}"),
            ));
        }
        if r.conversation.as_ref().is_some_and(|c| !c.is_null()) {
            return Err(ApiError::bad_request(
                S,
                format!("conversation is not supported: {stateless}"),
            ));
        }
        if r.store == Some(true) {
            return Err(ApiError::bad_request(
                S,
                format!("store: true is not supported: {stateless}"),
            ));
        }
        let knobs = super::knobs(S, r.temperature, r.top_p, None, limits::MAX_TEMPERATURE)?;
        let max = r.max_output_tokens.map(|n| n.min(usize::MAX as u64) as usize);
        let mut settings = Settings::new(S, &knobs, max, Vec::new())?;
        let mut tools = Vec::new();
        let mut echoed = Vec::new();
        for (i, t) in r.tools.unwrap_or_default().into_iter().enumerate() {
            match t.get("type").and_then(Value::as_str) {
                Some("function") => {
                    let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
                        ApiError::bad_request(S, format!("tools[{i}]: a function tool needs a name"))
                    })?;
                    let desc = t.get("description").and_then(Value::as_str);
                    tools.push(super::function_tool(name, desc, t.get("parameters")));
                    echoed.push(t);
                }
                other => super::warn(&format!(
                    "/v1/responses: tools[{i}] of type {other:?} is left out (snug runs only function tools)"
                )),
            }
        }
        // `{"type": "function", "name": ...}` is Chat Completions' named choice, flattened.
        let choice = r.tool_choice.clone().map(|c| {
            if c.get("function").is_none() && c.get("name").is_some() {
                json!({"type": "function", "function": {"name": c["name"].clone()}})
            } else {
                c
            }
        });
        settings.chat = ChatOptions::new(Some(&tools), choice.as_ref(), r.parallel_tool_calls)
            .map_err(|e| ApiError::bad_request(S, e))?;
        let format = r.text.as_ref().and_then(|t| t.format.clone());
        settings.json = match format.as_ref().and_then(|f| f.get("type")).and_then(Value::as_str) {
            None | Some("text") => None,
            Some("json_object") => Some(JsonFormat::Object),
            Some("json_schema") => {
                let schema = format.as_ref().and_then(|f| f.get("schema")).ok_or_else(|| {
                    ApiError::bad_request(S, "text.format json_schema needs `schema` (the JSON schema the answer must follow)")
                })?;
                Some(crate::api::json_schema(S, schema)?)
            }
            Some(other) => {
                return Err(ApiError::bad_request(S, format!("text.format.type {other:?} is not one of \"text\", \"json_object\", \"json_schema\"")))
            }
        };
        let mut messages = Vec::new();
        if let Some(i) = &r.instructions {
            messages.push(ChatMessage::new("system", i.clone()));
        }
        match r.input {
            Input::Text(t) => messages.push(ChatMessage::new("user", t)),
            Input::Items(items) => read_items(items, &mut messages)?,
        }
        let messages = some_messages(S, messages)?;
        let p = &settings.sampling;
        let echo = Echo {
            instructions: r.instructions,
            max_output_tokens: r.max_output_tokens,
            parallel_tool_calls: settings.chat.parallel,
            temperature: p.temperature,
            top_p: p.top_p,
            tool_choice: r.tool_choice.unwrap_or_else(|| json!("auto")),
            tools: echoed,
            text: json!({"format": format.unwrap_or_else(|| json!({"type": "text"}))}),
        };
        Ok(Decoded { model: r.model, stream: r.stream, messages, settings, echo })
    }
}

/// An assistant turn being gathered from consecutive output items.
#[derive(Default)]
struct Turn {
    text: String,
    reasoning: String,
    calls: Vec<Call>,
    open: bool,
}

impl Turn {
    fn flush(&mut self, out: &mut Vec<ChatMessage>) {
        if std::mem::take(&mut self.open) {
            let t = std::mem::take(self);
            out.push(super::assistant(t.text, t.reasoning, t.calls));
        }
    }
}

/// The input items in order as template messages.
fn read_items(items: Vec<Value>, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let mut turn = Turn::default();
    for (i, item) in items.into_iter().enumerate() {
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        let field = |name: &str| item.get(name).and_then(Value::as_str);
        match kind {
            "message" => {
                let role = field("role").ok_or_else(|| {
                    ApiError::bad_request(S, format!("input[{i}]: a message needs a role"))
                })?;
                let text = content_text(i, item.get("content"))?;
                match role {
                    "assistant" => {
                        turn.open = true;
                        turn.text.push_str(&text);
                    }
                    "user" | "system" | "developer" => {
                        turn.flush(out);
                        let role = if role == "developer" { "system" } else { role };
                        out.push(ChatMessage::new(role, text));
                    }
                    other => {
                        return Err(ApiError::bad_request(
                            S,
                            format!("input[{i}]: role {other:?} is not one of user, assistant, system, developer"),
                        ))
                    }
                }
            }
            "reasoning" => {
                turn.open = true;
                for part in ["content", "summary"] {
                    if let Some(Value::Array(ps)) = item.get(part) {
                        ps.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).for_each(
                            |t| turn.reasoning.push_str(t),
                        );
                        if !ps.is_empty() {
                            break;
                        }
                    }
                }
            }
            "function_call" => {
                let (Some(call_id), Some(name)) = (field("call_id"), field("name")) else {
                    return Err(ApiError::bad_request(S, format!("input[{i}]: a function_call needs call_id and name")));
                };
                turn.open = true;
                let arguments = super::arguments(field("arguments").unwrap_or("{}"));
                turn.calls.push(Call { id: call_id.to_string(), name: name.to_string(), arguments });
            }
            "function_call_output" => {
                turn.flush(out);
                let call_id = field("call_id").ok_or_else(|| {
                    ApiError::bad_request(S, format!("input[{i}]: a function_call_output needs call_id"))
                })?;
                let text = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    other => content_text(i, other)?,
                };
                let name = super::called_name(out, call_id);
                out.push(super::tool_result(call_id, name.as_deref(), text));
            }
            "item_reference" => {
                return Err(ApiError::bad_request(
                    S,
                    format!("input[{i}]: item_reference needs stored responses, which snug does not keep: send the item itself"),
                ))
            }
            other => super::warn(&format!("/v1/responses: input[{i}] of type {other:?} is left out")),
        }
    }
    turn.flush(out);
    Ok(())
}

/// A message's text: a string, or its text parts (`input_text`, `output_text`, `text`).
fn content_text(i: usize, content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                let kind = p.get("type").and_then(Value::as_str);
                match (kind, p.get("text").and_then(Value::as_str)) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::bad_request(
                            S,
                            format!("input[{i}]: a content part of type {kind:?} is not supported: this model reads text only"),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::bad_request(
            S,
            format!("input[{i}]: content must be a string or a list of text parts"),
        )),
    }
}

fn fresh(prefix: &str) -> String {
    format!("{prefix}_{}", crate::tools::call_id(None).trim_start_matches("call_"))
}

/// The response object around `output`.
fn response(
    id: &str,
    model: &str,
    echo: &Echo,
    output: Vec<Item>,
    done: Option<&Finish>,
) -> Response {
    let incomplete =
        done.is_some_and(|f| matches!(f.reason, FinishReason::Length | FinishReason::ContextFull));
    let status = match done {
        None => Status::InProgress,
        Some(_) if incomplete => Status::Incomplete,
        Some(_) => Status::Completed,
    };
    Response {
        id: id.to_string(),
        object: "response",
        created_at: unix_now(),
        status,
        model: model.to_string(),
        output,
        usage: done.map(|f| Usage::new(f.n_prompt, f.n_cached, f.n_gen)),
        error: None,
        incomplete_details: incomplete.then_some(IncompleteDetails { reason: "max_output_tokens" }),
        instructions: echo.instructions.clone(),
        max_output_tokens: echo.max_output_tokens,
        parallel_tool_calls: echo.parallel_tool_calls,
        previous_response_id: None,
        store: false,
        temperature: echo.temperature,
        top_p: echo.top_p,
        tool_choice: echo.tool_choice.clone(),
        tools: echo.tools.clone(),
        text: echo.text.clone(),
        truncation: "disabled",
        metadata: json!({}),
    }
}

/// `POST /v1/responses`.
pub async fn create(State(st): Shared, body: Result<Bytes, BytesRejection>) -> HttpResponse {
    let run = async {
        let body = body_bytes(S, body)?;
        let (ticket, req, prompt) =
            st.prepare_chat(S, Names::Any, body, Decoded::decode, Decoded::parts).await?;
        let asked = st.agent_model(S, req.model.as_deref());
        let model = st.answer_model(asked);
        let started = super::start(&st, S, ticket, asked, req.settings, prompt).await?;
        let id = fresh("resp");
        if req.stream {
            return Ok(stream(id, model, req.echo, started));
        }
        let (text, f) = collect(S, started.rx).await?;
        let a = Answer::parse(text, started.parser, started.format);
        let mut output = Vec::new();
        if !a.reasoning.is_empty() {
            let content = vec![ReasoningText { kind: "reasoning_text", text: a.reasoning }];
            output.push(Item::Reasoning {
                id: fresh("rs"),
                summary: Vec::new(),
                content,
                status: Status::Completed,
            });
        }
        if !a.text.is_empty() || a.calls.is_empty() {
            let content = vec![OutputText::new(a.text)];
            output.push(Item::Message {
                id: fresh("msg"),
                status: Status::Completed,
                role: "assistant",
                content,
            });
        }
        for (call_id, name, arguments) in a.calls {
            output.push(Item::FunctionCall {
                id: fresh("fc"),
                call_id,
                name,
                arguments,
                status: Status::Completed,
            });
        }
        let r = response(&id, &model, &req.echo, output, Some(&f));
        Ok::<_, ApiError>(axum::Json(r).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// The streamed answer's state: the output items so far and the next sequence number.
struct Stream {
    id: String,
    model: String,
    echo: Echo,
    items: Vec<Item>,
    seq: u64,
}

impl Stream {
    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq - 1
    }

    fn item_id(&self, index: usize) -> String {
        match self.items.get(index) {
            Some(
                Item::Message { id, .. }
                | Item::FunctionCall { id, .. }
                | Item::Reasoning { id, .. },
            ) => id.clone(),
            None => String::new(),
        }
    }

    /// The events of one block step.
    fn step(&mut self, s: BlockEvent, out: &mut String) {
        match s {
            BlockEvent::Start { index, kind } => {
                let item = match kind {
                    BlockKind::Text => Item::Message {
                        id: fresh("msg"),
                        status: Status::InProgress,
                        role: "assistant",
                        content: Vec::new(),
                    },
                    BlockKind::Thinking => Item::Reasoning {
                        id: fresh("rs"),
                        summary: Vec::new(),
                        content: Vec::new(),
                        status: Status::InProgress,
                    },
                    BlockKind::Call { id, name } => Item::FunctionCall {
                        id: fresh("fc"),
                        call_id: id,
                        name,
                        arguments: String::new(),
                        status: Status::InProgress,
                    },
                };
                self.items.push(item.clone());
                let sequence_number = self.next();
                *out += &Event::ItemAdded { sequence_number, output_index: index, item }.sse();
                if let Item::Message { .. } = self.items[index] {
                    let (sequence_number, item_id) = (self.next(), self.item_id(index));
                    let part = OutputText::new(String::new());
                    *out += &Event::PartAdded {
                        sequence_number,
                        item_id,
                        output_index: index,
                        content_index: 0,
                        part,
                    }
                    .sse();
                }
            }
            BlockEvent::Delta { index, text, .. } => {
                let (sequence_number, item_id) = (self.next(), self.item_id(index));
                let output_index = index;
                let ev = match &mut self.items[index] {
                    Item::Message { content, .. } => {
                        match content.first_mut() {
                            Some(c) => c.text.push_str(&text),
                            None => content.push(OutputText::new(text.clone())),
                        }
                        let logprobs = Vec::new();
                        Event::TextDelta {
                            sequence_number,
                            item_id,
                            output_index,
                            content_index: 0,
                            delta: text,
                            logprobs,
                        }
                    }
                    Item::Reasoning { content, .. } => {
                        match content.first_mut() {
                            Some(c) => c.text.push_str(&text),
                            None => content
                                .push(ReasoningText { kind: "reasoning_text", text: text.clone() }),
                        }
                        Event::ReasoningDelta {
                            sequence_number,
                            item_id,
                            output_index,
                            content_index: 0,
                            delta: text,
                        }
                    }
                    Item::FunctionCall { arguments, .. } => {
                        arguments.push_str(&text);
                        Event::ArgumentsDelta {
                            sequence_number,
                            item_id,
                            output_index,
                            delta: text,
                        }
                    }
                };
                *out += &ev.sse();
            }
            BlockEvent::Stop { index } => {
                let item_id = self.item_id(index);
                let item = &mut self.items[index];
                let mut evs = Vec::new();
                match item {
                    Item::Message { content, status, .. } => {
                        *status = Status::Completed;
                        let text = content.first().map(|c| c.text.clone()).unwrap_or_default();
                        evs.push(Event::TextDone {
                            sequence_number: 0,
                            item_id: item_id.clone(),
                            output_index: index,
                            content_index: 0,
                            text: text.clone(),
                            logprobs: Vec::new(),
                        });
                        evs.push(Event::PartDone {
                            sequence_number: 0,
                            item_id,
                            output_index: index,
                            content_index: 0,
                            part: OutputText::new(text),
                        });
                    }
                    Item::Reasoning { content, status, .. } => {
                        *status = Status::Completed;
                        let text = content.first().map(|c| c.text.clone()).unwrap_or_default();
                        evs.push(Event::ReasoningDone {
                            sequence_number: 0,
                            item_id,
                            output_index: index,
                            content_index: 0,
                            text,
                        });
                    }
                    Item::FunctionCall { name, arguments, status, .. } => {
                        *status = Status::Completed;
                        evs.push(Event::ArgumentsDone {
                            sequence_number: 0,
                            item_id,
                            output_index: index,
                            name: name.clone(),
                            arguments: arguments.clone(),
                        });
                    }
                }
                evs.push(Event::ItemDone {
                    sequence_number: 0,
                    output_index: index,
                    item: item.clone(),
                });
                for mut e in evs {
                    set_sequence(&mut e, self.next());
                    *out += &e.sse();
                }
            }
        }
    }
}

fn set_sequence(e: &mut Event, n: u64) {
    match e {
        Event::Created { sequence_number, .. }
        | Event::InProgress { sequence_number, .. }
        | Event::ItemAdded { sequence_number, .. }
        | Event::ItemDone { sequence_number, .. }
        | Event::PartAdded { sequence_number, .. }
        | Event::PartDone { sequence_number, .. }
        | Event::TextDelta { sequence_number, .. }
        | Event::TextDone { sequence_number, .. }
        | Event::ReasoningDelta { sequence_number, .. }
        | Event::ReasoningDone { sequence_number, .. }
        | Event::ArgumentsDelta { sequence_number, .. }
        | Event::ArgumentsDone { sequence_number, .. }
        | Event::Completed { sequence_number, .. }
        | Event::Incomplete { sequence_number, .. }
        | Event::Error { sequence_number, .. } => *sequence_number = n,
    }
}

/// The answer as the Responses API's events.
fn stream(id: String, model: String, echo: Echo, started: super::Started) -> HttpResponse {
    let mut blocks = Blocks::new(started.parser, started.format);
    let mut s = Stream { id, model, echo, items: Vec::new(), seq: 0 };
    let mut opening = true;
    let body = event_body(started.rx, move |ev| {
        let mut out = String::new();
        if std::mem::take(&mut opening) {
            let r = response(&s.id, &s.model, &s.echo, Vec::new(), None);
            out += &Event::Created { sequence_number: s.next(), response: r.clone() }.sse();
            out += &Event::InProgress { sequence_number: s.next(), response: r }.sse();
        }
        let (steps, done) = match ev {
            EngineEvent::Text(t) => (blocks.push(Some(&t)), None),
            EngineEvent::Done(f) => (blocks.push(None), Some(f)),
            EngineEvent::Failed(message) => {
                let sequence_number = s.next();
                return out
                    + &Event::Error { sequence_number, code: "server_error", message }.sse();
            }
        };
        for step in steps {
            s.step(step, &mut out);
        }
        if let Some(f) = done {
            let r = response(&s.id, &s.model, &s.echo, s.items.clone(), Some(&f));
            let sequence_number = s.next();
            out += &match r.status {
                Status::Incomplete => Event::Incomplete { sequence_number, response: r },
                _ => Event::Completed { sequence_number, response: r },
            }
            .sse();
        }
        out
    });
    streamed("text/event-stream", body)
}
