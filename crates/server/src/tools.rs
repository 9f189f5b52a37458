//! Tool calls and reasoning on the chat routes (issue 31): the request's `tools`,
//! `tool_choice`, `parallel_tool_calls`, `reasoning_format` (OpenAI) or `think` (Ollama) read
//! into [`ChatOptions`]; the template renders the tools; [`engine::tools`] constrains the call
//! and parses the output; this module writes the answer in each API's shape.
//!
//! - OpenAI: `message.tool_calls[{id, type, function: {name, arguments (a JSON string)}}]`,
//!   `content` null when there are only calls, `finish_reason: "tool_calls"`; streamed, each
//!   call's `id`, `type` and `name` once, then its `arguments` in fragments as generated.
//!   Reasoning goes to `reasoning_content` (`delta.reasoning_content` streamed) unless the
//!   request sends `reasoning_format: "none"` (llama-server's name), which keeps the raw text.
//! - Ollama: `message.tool_calls[{function: {name, arguments (an object)}}]`, whole calls;
//!   `think: false` keeps reasoning off (and tells the template so), otherwise a thinking
//!   section goes to `message.thinking`.
//! - A call that does not parse (or names a tool not offered) is given back as content.
//!
//! Cost: the schemas are compiled once per request (each tool's `parameters`); per text piece
//! the parser reads the new bytes once.

use std::sync::Arc;

use engine::tools::{Format, OutputParser, Piece, Reasoning, Start, Tool, ToolGrammar};
use serde_json::{json, Value};
use tokenizer::{ChatMessage, ChatTemplate};

use crate::responses::ollama;
use crate::responses::openai::{
    AssistantMessage, Delta, DeltaCall, DeltaFunction, FunctionCall, FunctionKind, ToolCall,
};

/// What a request asks of tool calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Choice {
    /// `"none"`: tools are shown to the model, no call is made.
    None,
    #[default]
    Auto,
    Required,
    /// `{"type": "function", "function": {"name": ...}}`: a call to this tool.
    Named(String),
}

/// A chat's tools and reasoning, from the request, then fitted to the model's template.
#[derive(Clone, Debug, Default)]
pub struct ChatOptions {
    /// The tools as the template reads them (`{"type": "function", "function": {...}}`).
    pub tools: Vec<Value>,
    compiled: Vec<Tool>,
    pub choice: Choice,
    /// More than one call per answer (`parallel_tool_calls`, default true).
    pub parallel: bool,
    /// The template's `enable_thinking` (Ollama's `think`).
    pub enable_thinking: Option<bool>,
    /// Keep the output's raw text (no reasoning split): `reasoning_format: "none"`.
    pub raw_reasoning: bool,
    /// Set by [`ChatOptions::fit`]: the template's call format, if tools are in use.
    pub format: Option<Format>,
    /// Set by [`ChatOptions::fit`] and [`ChatOptions::opened`].
    pub reasoning: Option<Reasoning>,
    /// The grammar calls are generated under (absent under `"none"` or without tools).
    pub grammar: Option<Arc<ToolGrammar>>,
}

/// A tool name as OpenAI allows it (`[A-Za-z0-9_.-]{1,64}`): nothing a template could read as
/// markup.
pub fn is_tool_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

impl ChatOptions {
    /// `tools`, `tool_choice` and `parallel_tool_calls` as OpenAI (and Ollama) send them:
    /// each tool checked, its `parameters` compiled (one the JSON-schema machinery cannot
    /// enforce is a 400 naming the tool).
    /// An error is the 400's message.
    pub fn new(
        tools: Option<&[Value]>,
        choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<ChatOptions, String> {
        let bad = |m: String| m;
        let mut o = ChatOptions { parallel: parallel.unwrap_or(true), ..Default::default() };
        for (i, t) in tools.unwrap_or_default().iter().enumerate() {
            let f = match t.get("type").and_then(Value::as_str) {
                Some("function") | None => t.get("function"),
                Some(other) => {
                    return Err(bad(format!(
                        "tools[{i}].type is {other:?}; only \"function\" tools are supported"
                    )))
                }
            };
            let Some(Value::Object(f)) = f else {
                return Err(bad(format!("tools[{i}] has no `function` object")));
            };
            let name = match f.get("name").and_then(Value::as_str) {
                Some(n) if is_tool_name(n) => n.to_string(),
                _ => {
                    return Err(bad(format!(
                    "tools[{i}].function.name must be 1 to 64 of A-Z, a-z, 0-9, `_`, `.` and `-`"
                )))
                }
            };
            if o.compiled.iter().any(|c| c.name == name) {
                return Err(bad(format!("tools[{i}]: the tool name {name:?} is offered twice")));
            }
            let params = match f.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(bad(format!(
                        "tools[{i}] ({name}): function.parameters must be a JSON schema object"
                    )))
                }
            };
            let schema = engine::json_schema::Schema::compile(&params).map_err(|why| {
                bad(format!("tools[{i}] ({name}): its parameters schema cannot be enforced: {why}"))
            })?;
            let mut f = f.clone();
            f.insert("parameters".into(), params);
            o.tools.push(json!({"type": "function", "function": f}));
            o.compiled.push(Tool { name, parameters: Arc::new(schema) });
        }
        o.choice = match choice {
            None | Some(Value::Null) => Choice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => Choice::None,
                "auto" => Choice::Auto,
                "required" => Choice::Required,
                other => {
                    return Err(bad(format!(
                        "tool_choice {other:?} is not one of \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                    )))
                }
            },
            Some(v) => {
                let name = v
                    .pointer("/function/name")
                    .or_else(|| v.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("tool_choice must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}".into()))?;
                if !o.compiled.iter().any(|t| t.name == name) {
                    return Err(bad(format!("tool_choice names {name:?}, which is not among the tools offered")));
                }
                Choice::Named(name.to_string())
            }
        };
        if o.compiled.is_empty() && matches!(o.choice, Choice::Required | Choice::Named(_)) {
            return Err(bad("tool_choice demands a call but no tools are offered".into()));
        }
        Ok(o)
    }

    /// The template's `enable_thinking`: as asked, else on for a template with a reasoning
    /// section (as llama.cpp renders it: a DeepSeek-R1 template closes the section at once when
    /// the variable is not true), else undefined.
    pub fn template_thinking(&self, template: &ChatTemplate) -> Option<bool> {
        self.enable_thinking.or(has_thinking(template.source()).then_some(true))
    }

    /// The tool names offered.
    pub fn names(&self) -> Vec<String> {
        self.compiled.iter().map(|t| t.name.clone()).collect()
    }

    /// Fits the request to the model's template: its call format (tools with a template that
    /// writes calls in no format snug knows are a 400) and whether it has a thinking section.
    /// An error is the 400's message.
    pub fn fit(&mut self, template: &ChatTemplate) -> Result<(), String> {
        let source = template.source();
        if !self.compiled.is_empty() {
            let Some(format) = Format::detect(source) else {
                return Err("this model's chat template does not render tool calls in a format \
                     snug parses (Hermes/Qwen <tool_call>, Llama 3 JSON, Mistral [TOOL_CALLS]); \
                     send the request without tools (or serve with --chat-template-file)"
                    .into());
            };
            if self.choice != Choice::None {
                self.format = Some(format);
                let tools = match &self.choice {
                    Choice::Named(n) => {
                        self.compiled.iter().filter(|t| &t.name == n).cloned().collect()
                    }
                    _ => self.compiled.clone(),
                };
                let start = if self.choice == Choice::Auto { Start::Lazy } else { Start::Now };
                let max_calls = if self.parallel { usize::MAX } else { 1 };
                self.grammar = Some(Arc::new(ToolGrammar {
                    format,
                    tools,
                    start,
                    max_calls,
                    reasoning: Reasoning::Off,
                }));
            }
        }
        let thinks = has_thinking(source) && self.enable_thinking != Some(false);
        // The grammar follows the thinking section even where the raw text is kept.
        self.set_thinking(thinks.then_some(Reasoning::Tagged));
        Ok(())
    }

    /// The output's thinking section: split off by the parser (unless the raw text is kept),
    /// and free of the call grammar.
    fn set_thinking(&mut self, r: Option<Reasoning>) {
        self.reasoning = r.filter(|_| !self.raw_reasoning);
        if let Some(g) = &mut self.grammar {
            Arc::make_mut(g).reasoning = r.unwrap_or(Reasoning::Off);
        }
    }

    /// The rendered prompt is known: a template that ends it with `<think>` opened the
    /// reasoning section itself (DeepSeek-R1 distills), so the output starts inside it.
    pub fn opened(&mut self, prompt: &str) {
        let thinks = self.reasoning.is_some()
            || self.grammar.as_ref().is_some_and(|g| g.reasoning != Reasoning::Off);
        if thinks && prompt.trim_end().ends_with("<think>") {
            self.set_thinking(Some(Reasoning::Open));
        }
    }

    /// The parser the answer goes through, or `None` when the text is the answer as is.
    pub fn parser(&self) -> Option<OutputParser> {
        let reasoning = self.reasoning.unwrap_or(Reasoning::Off);
        if self.format.is_none() && reasoning == Reasoning::Off {
            return None;
        }
        Some(OutputParser::new(self.format, self.names(), reasoning))
    }
}

/// Whether a template has a reasoning section.
pub fn has_thinking(source: &str) -> bool {
    source.contains("<think>")
}

/// Whether a template renders tools in a format snug parses.
pub fn renders_tools(source: &str) -> bool {
    Format::detect(source).is_some()
}

/// History messages made ready for the template: an assistant's `tool_calls[].function.arguments`
/// sent as a JSON string becomes the object it holds (Qwen's template writes it with `tojson`),
/// Ollama's `thinking` is also `reasoning_content`, its `tool_name` also `name`.
pub fn history(messages: &mut [ChatMessage]) {
    for m in messages {
        if let Some(Value::Array(calls)) = m.extra.get_mut("tool_calls") {
            for c in calls.iter_mut() {
                if let Some(args) = c.pointer_mut("/function/arguments") {
                    if let Value::String(s) = args {
                        if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(s) {
                            *args = v;
                        }
                    }
                }
            }
        }
        if let Some(t) = m.extra.get("thinking").cloned() {
            m.extra.entry("reasoning_content").or_insert(t);
        }
        if let Some(t) = m.extra.get("reasoning").cloned() {
            m.extra.entry("reasoning_content").or_insert(t);
        }
        if let Some(t) = m.extra.get("tool_name").cloned() {
            m.extra.entry("name").or_insert(t);
        }
    }
}

/// A call id, unique within the server's life: `call_` and 24 hex digits, or for Mistral's
/// format 9 letters and digits, the only ids Mistral's templates accept back in history (they
/// raise an error on any other).
pub fn call_id(format: Option<Format>) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = N.fetch_add(1, Ordering::Relaxed);
    if format == Some(Format::Mistral) {
        // 62^9 ids: the count in the low digits keeps them unique, the time varies the rest.
        const DIGITS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        let mut v = (n as u128) | ((t as u128) << 32);
        return (0..9)
            .map(|_| {
                let d = DIGITS[(v % 62) as usize] as char;
                v /= 62;
                d
            })
            .collect();
    }
    format!("call_{t:016x}{:08x}", n as u32)
}

/// The pieces `text` settles (`None`: the output ended, everything held comes out).
pub fn pieces(parser: &mut OutputParser, text: Option<&str>) -> Vec<Piece> {
    let mut out = Vec::new();
    match text {
        Some(t) => parser.push(t, &mut out),
        None => parser.finish(&mut out),
    }
    out
}

/// OpenAI's streamed deltas for `pieces` of an answer in `format`; notes in `called` whether a
/// call was made.
pub fn openai_deltas(
    pieces: &[Piece],
    format: Option<Format>,
    called: &mut Vec<bool>,
) -> Vec<Delta> {
    let mut out = Vec::new();
    let call = |index: usize, id: Option<String>, name: Option<String>, arguments: String| Delta {
        tool_calls: vec![DeltaCall {
            index,
            kind: id.as_ref().map(|_| FunctionKind::Function),
            id,
            function: DeltaFunction { name, arguments },
        }],
        ..Delta::default()
    };
    for p in pieces {
        match p {
            Piece::Content(t) => out.push(Delta::content(t.clone())),
            Piece::Reasoning(t) => {
                out.push(Delta { reasoning_content: Some(t.clone()), ..Delta::default() })
            }
            Piece::CallStart { index, name } => {
                if called.len() <= *index {
                    called.resize(index + 1, false);
                }
                called[*index] = true;
                out.push(call(*index, Some(call_id(format)), Some(name.clone()), String::new()))
            }
            Piece::CallArgs { index, fragment } => {
                out.push(call(*index, None, None, fragment.clone()))
            }
            Piece::CallEnd { .. } => {}
            Piece::CallBroken { index, raw } => {
                if let Some(c) = index.and_then(|i| called.get_mut(i)) {
                    *c = false;
                }
                out.push(Delta::content(raw.clone()))
            }
        }
    }
    out
}

/// OpenAI's whole `message` for a parsed answer in `format`, and whether it holds calls.
pub fn openai_message(
    o: &engine::tools::ParsedOutput,
    format: Option<Format>,
) -> (AssistantMessage, bool) {
    let called = !o.calls.is_empty();
    let content = if called && o.content.is_empty() { None } else { Some(o.content.clone()) };
    let tool_calls = o
        .calls
        .iter()
        .map(|c| ToolCall {
            id: call_id(format),
            kind: FunctionKind::Function,
            function: FunctionCall { name: c.name.clone(), arguments: c.arguments.clone() },
        })
        .collect();
    let reasoning_content = (!o.reasoning.is_empty()).then(|| o.reasoning.clone());
    (AssistantMessage { role: "assistant", content, reasoning_content, tool_calls }, called)
}

/// Ollama's whole call: arguments as an object.
pub fn ollama_call(name: &str, arguments: &str) -> ollama::ToolCall {
    let arguments = serde_json::from_str::<Value>(arguments).unwrap_or(Value::Null);
    ollama::ToolCall { function: ollama::Function { name: name.to_string(), arguments } }
}

/// Ollama's streamed records for `pieces`: content and thinking together, each call whole
/// once it ends (`calls` gathers them meanwhile).
pub fn ollama_message(
    pieces: &[Piece],
    calls: &mut Vec<(String, String)>,
) -> Option<ollama::Message> {
    let (mut content, mut thinking, mut done) = (String::new(), String::new(), Vec::new());
    for p in pieces {
        match p {
            Piece::Content(t) => content.push_str(t),
            Piece::Reasoning(t) => thinking.push_str(t),
            Piece::CallStart { index, name } => {
                if calls.len() <= *index {
                    calls.resize(index + 1, Default::default());
                }
                calls[*index] = (name.clone(), String::new());
            }
            Piece::CallArgs { index, fragment } => {
                if let Some(c) = calls.get_mut(*index) {
                    c.1.push_str(fragment);
                }
            }
            Piece::CallEnd { index } => {
                if let Some((n, a)) = calls.get(*index) {
                    done.push(ollama_call(n, a));
                }
            }
            Piece::CallBroken { raw, .. } => content.push_str(raw),
        }
    }
    if content.is_empty() && thinking.is_empty() && done.is_empty() {
        return None;
    }
    let thinking = (!thinking.is_empty()).then_some(thinking);
    Some(ollama::Message { thinking, tool_calls: done, ..ollama::Message::assistant(content) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, params: Value) -> Value {
        json!({"type": "function", "function": {"name": name, "parameters": params}})
    }

    #[test]
    fn bad_tools_are_400s_naming_the_tool() {
        let bad = tool("f", json!({"type": "string", "pattern": "^a"}));
        let e = ChatOptions::new(Some(&[bad]), None, None).unwrap_err();
        assert!(e.contains("tools[0] (f)") && e.contains("pattern"), "{e}");
        let t = tool("f", json!({"type": "object"}));
        let e = ChatOptions::new(Some(&[t.clone(), t.clone()]), None, None).unwrap_err();
        assert!(e.contains("offered twice"), "{e}");
        let e = ChatOptions::new(
            Some(std::slice::from_ref(&t)),
            Some(&json!({"type": "function", "function": {"name": "g"}})),
            None,
        )
        .unwrap_err();
        assert!(e.contains("\"g\""), "{e}");
        let e = ChatOptions::new(None, Some(&json!("required")), None).unwrap_err();
        assert!(e.contains("no tools"), "{e}");
        let e = ChatOptions::new(Some(&[json!({"type": "retrieval"})]), None, None).unwrap_err();
        assert!(e.contains("tools[0].type"), "{e}");
    }

    #[test]
    fn string_arguments_in_history_become_objects() {
        let mut m = ChatMessage::new("assistant", "");
        m.extra.insert(
            "tool_calls".into(),
            json!([{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]),
        );
        m.extra.insert("thinking".into(), json!("hmm"));
        let mut ms = vec![m];
        history(&mut ms);
        assert_eq!(ms[0].extra["tool_calls"][0]["function"]["arguments"], json!({"x": 1}));
        assert_eq!(ms[0].extra["reasoning_content"], json!("hmm"));
    }

    #[test]
    fn whole_openai_messages_have_null_content_with_only_calls() {
        let o = engine::tools::ParsedOutput::parse(
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
            Some(Format::Hermes),
            &["f".to_string()],
            Reasoning::Off,
        );
        let (m, called) = openai_message(&o, Some(Format::Hermes));
        assert!(called);
        assert_eq!(m.content, None);
        assert_eq!(m.tool_calls[0].function.arguments, "{\"x\": 1}");
    }

    #[test]
    fn mistral_call_ids_are_the_nine_characters_its_templates_take_back() {
        let ids: Vec<String> = (0..1000).map(|_| call_id(Some(Format::Mistral))).collect();
        for id in &ids {
            assert!(id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        }
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
        assert!(call_id(Some(Format::Hermes)).starts_with("call_"));
    }
}
