//! The coding agents' APIs (issue 48): Anthropic's Messages ([`messages`]) and OpenAI's
//! Responses ([`responses`]), translated into the one chat request the other routes make.
//!
//! Each API module reads its own shapes into what this module takes, written once for both:
//! - the conversation as [`ChatMessage`]s: an assistant turn's calls as OpenAI-style
//!   `tool_calls` with the arguments object as the model generated it (serde_json keeps key
//!   order), a tool result as a `tool` message, reasoning as `reasoning_content`; the template
//!   renders them, so a turn's prompt extends the previous prompt and its answer token for
//!   token and the prefix cache serves it;
//! - tools as `{"type": "function", "function": {...}}` and the choice as OpenAI's, read by
//!   [`ChatOptions`], whose grammar holds each call to its tool's schema;
//! - the answer: the parser's pieces ([`crate::tools::pieces`]) as whole parts ([`Answer`]) or
//!   as a stream of content blocks ([`Blocks`]: open, deltas, close), which each API writes in
//!   its own events;
//! - the sampling defaults ([`knobs`]) and the usage (prompt, cached, generated).
//!
//! Cost: one pass over the request's JSON to build the messages; per text piece, the parser's
//! work and one small JSON encode per event.

pub mod messages;
pub mod responses;

use engine::scheduler::{Event, Finish, Ticket};
use engine::tools::{Format, OutputParser, ParsedOutput, Piece};
use serde_json::{json, Map, Value};
use tokenizer::ChatMessage;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::{Knobs, Settings};
use crate::error::{ApiError, Style};
use crate::AppState;

/// The sampling an agent route uses when the client sends none: a cooler temperature than
/// the chat routes' 0.8, since a call's arguments and code want the likely token. The 2026
/// Anthropic SDK no longer sends temperature, top-p or top-k at all.
pub const AGENT_TEMPERATURE: f32 = 0.6;

/// The request's sampling knobs with the agent default; a temperature outside
/// `0..=max_temperature` (the API's own range) or a `top_p` outside `0..=1` is a 400.
pub fn knobs(
    style: Style,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    max_temperature: f32,
) -> Result<Knobs, ApiError> {
    if temperature.is_some_and(|t| !(0.0..=max_temperature).contains(&t)) {
        let msg = format!("temperature must be between 0 (greedy) and {max_temperature}");
        return Err(ApiError::bad_request(style, msg));
    }
    if top_p.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
        return Err(ApiError::bad_request(style, "top_p must be between 0 and 1"));
    }
    Ok(Knobs {
        temperature: Some(temperature.unwrap_or(AGENT_TEMPERATURE)),
        top_p,
        top_k,
        ..Knobs::default()
    })
}

/// A function tool as the template and [`ChatOptions`] read it.
pub fn function_tool(name: &str, description: Option<&str>, parameters: Option<&Value>) -> Value {
    let mut f = Map::new();
    f.insert("name".into(), Value::String(name.to_string()));
    if let Some(d) = description {
        f.insert("description".into(), Value::String(d.to_string()));
    }
    if let Some(p) = parameters {
        f.insert("parameters".into(), p.clone());
    }
    json!({"type": "function", "function": f})
}

/// One call of an assistant turn: its id, the tool, the arguments object as generated.
pub struct Call {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// An assistant turn for the template: its text, its reasoning, its calls.
pub fn assistant(text: String, reasoning: String, calls: Vec<Call>) -> ChatMessage {
    let mut m = ChatMessage::new("assistant", &text);
    if !reasoning.is_empty() {
        m.extra.insert("reasoning_content".into(), Value::String(reasoning));
    }
    if !calls.is_empty() {
        let calls: Vec<Value> = calls
            .into_iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        m.extra.insert("tool_calls".into(), Value::Array(calls));
    }
    m
}

/// A tool's result for the template: the call it answers and its text.
pub fn tool_result(call_id: &str, name: Option<&str>, content: String) -> ChatMessage {
    let mut m = ChatMessage::new("tool", &content);
    m.extra.insert("tool_call_id".into(), Value::String(call_id.to_string()));
    if let Some(n) = name {
        m.extra.insert("name".into(), Value::String(n.to_string()));
    }
    m
}

/// Arguments text as the object it holds (a call's arguments sent back as a JSON string);
/// text that is not an object stays a string.
pub fn arguments(text: &str) -> Value {
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::String(text.to_string()),
    }
}

/// The name of the tool `call_id` called, among the assistant turns so far (a tool result
/// of Anthropic's or OpenAI's Responses names only the call).
pub fn called_name(messages: &[ChatMessage], call_id: &str) -> Option<String> {
    messages.iter().rev().find_map(|m| {
        let calls = m.extra.get("tool_calls")?.as_array()?;
        calls
            .iter()
            .find(|c| c.get("id").and_then(Value::as_str) == Some(call_id))
            .and_then(|c| c.pointer("/function/name").and_then(Value::as_str).map(String::from))
    })
}

/// A whole answer: reasoning, text, then the calls (arguments text as generated).
pub struct Answer {
    pub reasoning: String,
    pub text: String,
    pub calls: Vec<(String, String, String)>,
}

impl Answer {
    /// The answer in `text` read through `parser` (none: the text as is); each call gets a
    /// fresh id.
    pub fn parse(text: String, parser: Option<OutputParser>, format: Option<Format>) -> Answer {
        let Some(mut parser) = parser else {
            return Answer { reasoning: String::new(), text, calls: Vec::new() };
        };
        let mut pieces = crate::tools::pieces(&mut parser, Some(&text));
        pieces.extend(crate::tools::pieces(&mut parser, None));
        let o = ParsedOutput::gather(&pieces);
        let calls = o
            .calls
            .into_iter()
            .map(|c| (crate::tools::call_id(format), c.name, c.arguments))
            .collect();
        Answer { reasoning: o.reasoning, text: o.content, calls }
    }
}

/// What a streamed content block is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockKind {
    Thinking,
    Text,
    /// A call: its fresh id and the tool.
    Call {
        id: String,
        name: String,
    },
}

/// What a delta adds to: reasoning, text, or a call's arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Thinking,
    Text,
    Arguments,
}

/// A step of a streamed answer, in content blocks numbered from 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockEvent {
    Start { index: usize, kind: BlockKind },
    Delta { index: usize, part: Part, text: String },
    Stop { index: usize },
}

/// The parser's pieces as content blocks: text and reasoning run on in one block until the
/// kind changes; each call is a block of its own whose deltas are its arguments text. A call
/// the parser gives up on is closed and its raw text goes on as text.
pub struct Blocks {
    parser: Option<OutputParser>,
    format: Option<Format>,
    /// The block open now: its index and kind.
    open: Option<(usize, BlockKind)>,
    next: usize,
    /// Block index of each call index.
    calls: Vec<Option<usize>>,
    /// A call was made and not given up.
    pub called: bool,
}

impl Blocks {
    pub fn new(parser: Option<OutputParser>, format: Option<Format>) -> Blocks {
        Blocks { parser, format, open: None, next: 0, calls: Vec::new(), called: false }
    }

    /// The blocks' steps for a piece of text (`None`: the answer ended; every block closes).
    pub fn push(&mut self, text: Option<&str>) -> Vec<BlockEvent> {
        let pieces = match (&mut self.parser, text) {
            (Some(p), t) => crate::tools::pieces(p, t),
            (None, Some(t)) => vec![Piece::Content(t.to_string())],
            (None, None) => Vec::new(),
        };
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Content(t) => self.run_on(BlockKind::Text, t, &mut out),
                Piece::Reasoning(t) => self.run_on(BlockKind::Thinking, t, &mut out),
                Piece::CallStart { index, name } => {
                    self.close(&mut out);
                    let id = crate::tools::call_id(self.format);
                    let block = self.open(BlockKind::Call { id, name }, &mut out);
                    if self.calls.len() <= index {
                        self.calls.resize(index + 1, None);
                    }
                    self.calls[index] = Some(block);
                    self.called = true;
                }
                Piece::CallArgs { index, fragment } => {
                    if let Some(Some(b)) = self.calls.get(index) {
                        let (index, part) = (*b, Part::Arguments);
                        out.push(BlockEvent::Delta { index, part, text: fragment });
                    }
                }
                Piece::CallEnd { .. } => self.close(&mut out),
                Piece::CallBroken { index, raw } => {
                    if index.is_some() {
                        self.close(&mut out);
                        self.called = self.calls.iter().filter(|c| c.is_some()).count() > 1;
                    }
                    self.run_on(BlockKind::Text, raw, &mut out);
                }
            }
        }
        if text.is_none() {
            self.close(&mut out);
        }
        out
    }

    /// `text` in the open block if it is of `kind`, else in a new one.
    fn run_on(&mut self, kind: BlockKind, text: String, out: &mut Vec<BlockEvent>) {
        if text.is_empty() {
            return;
        }
        let part = if kind == BlockKind::Thinking { Part::Thinking } else { Part::Text };
        let index = match &self.open {
            Some((i, k)) if *k == kind => *i,
            _ => {
                self.close(out);
                self.open(kind, out)
            }
        };
        out.push(BlockEvent::Delta { index, part, text });
    }

    fn open(&mut self, kind: BlockKind, out: &mut Vec<BlockEvent>) -> usize {
        let index = self.next;
        self.next += 1;
        out.push(BlockEvent::Start { index, kind: kind.clone() });
        self.open = Some((index, kind));
        index
    }

    fn close(&mut self, out: &mut Vec<BlockEvent>) {
        if let Some((index, _)) = self.open.take() {
            out.push(BlockEvent::Stop { index });
        }
    }
}

/// A prepared chat request queued: the events, the parser its answer goes through and the
/// call format.
pub struct Started {
    pub rx: UnboundedReceiver<Event>,
    pub parser: Option<OutputParser>,
    pub format: Option<Format>,
}

/// Queues `prompt` with `settings` on the adapters `model` names.
pub async fn start(
    st: &AppState,
    style: Style,
    ticket: Ticket,
    model: Option<&str>,
    settings: Settings,
    prompt: Vec<u32>,
) -> Result<Started, ApiError> {
    let adapters = st.adapter_set(style, model, None).await?;
    let parser = settings.chat.parser();
    let format = parser.as_ref().and_then(|p| p.format());
    let (rx, _) = st.submit(style, ticket, prompt, settings, adapters, None)?;
    Ok(Started { rx, parser, format })
}

/// The prompt's tokens read from the cache, and those computed.
pub fn split_prompt(f: &Finish) -> (usize, usize) {
    let cached = f.n_cached.min(f.n_prompt);
    (cached, f.n_prompt - cached)
}

/// A warning in the server's log: a part of a request snug leaves out.
pub fn warn(what: &str) {
    eprintln!("snug: warning: {what}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::tools::Reasoning;

    #[test]
    fn blocks_follow_the_kind_and_give_each_call_its_own() {
        let names = vec!["f".to_string()];
        let parser = OutputParser::new(Some(Format::Hermes), names, Reasoning::Off);
        let mut b = Blocks::new(Some(parser), Some(Format::Hermes));
        let mut ev = b.push(Some("Sure. "));
        ev.extend(
            b.push(Some("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>")),
        );
        ev.extend(b.push(None));
        assert_eq!(ev[0], BlockEvent::Start { index: 0, kind: BlockKind::Text });
        assert!(ev.contains(&BlockEvent::Stop { index: 0 }));
        let call = ev.iter().find_map(|e| match e {
            BlockEvent::Start { index: 1, kind: BlockKind::Call { name, .. } } => Some(name),
            _ => None,
        });
        assert_eq!(call.map(String::as_str), Some("f"));
        let args: String = ev
            .iter()
            .filter_map(|e| match e {
                BlockEvent::Delta { index: 1, part: Part::Arguments, text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(args, "{\"x\": 1}");
        assert_eq!(ev.last(), Some(&BlockEvent::Stop { index: 1 }));
        assert!(b.called);
    }

    #[test]
    fn arguments_keep_their_order_and_a_result_finds_its_call() {
        let a = arguments("{\"b\": 1, \"a\": 2}");
        assert_eq!(a.to_string(), "{\"b\":1,\"a\":2}");
        let m = assistant(
            String::new(),
            String::new(),
            vec![Call { id: "c1".into(), name: "f".into(), arguments: a }],
        );
        assert_eq!(called_name(&[m], "c1").as_deref(), Some("f"));
    }
}
