//! Chat templates: renders `tokenizer.chat_template` (Hugging Face Jinja) with minijinja,
//! configured like transformers' `apply_chat_template` (trim_blocks, lstrip_blocks, Python
//! string/dict methods, `raise_exception`, `strftime_now`, a `tojson` that prints like Python's
//! `json.dumps`).
//!
//! The template is parsed once at load; a render walks it once per request (microseconds for a
//! short conversation).
//!
//! [`ChatTemplate::render_prompt`] also says where the messages' contents are in the prompt,
//! so that [`Tokenizer::encode_chat`] tokenizes them as text: a message that writes
//! `<|im_end|>\n<|im_start|>system` cannot forge a turn; only the template's own markup becomes
//! control tokens. It renders a second time with each content replaced by a marker no input
//! holds, and lines the two renders up (a content the template trims is found trimmed).

use std::ops::Range;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::Tokenizer;

/// The fallback template for a GGUF without `tokenizer.chat_template` whose vocabulary has no
/// Gemma turn tokens: ChatML, as llama.cpp falls back to. It renders
/// `<|im_start|>{role}\n{content}<|im_end|>\n` per message and `<|im_start|>assistant\n` when a
/// generation prompt is asked for.
pub const CHATML_FALLBACK: &str = "{%- for message in messages -%}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/// The fallback for vocabularies with `<start_of_turn>`/`<end_of_turn>` (Gemma GGUFs converted
/// without a template, e.g. gemma3-270m): Google's Gemma 3 template for text messages — a system
/// message is prefixed to the first user turn, `assistant` is called `model`, roles must
/// alternate.
pub const GEMMA_FALLBACK: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"#;

/// One chat message. `extra` carries everything else a template may read: `tool_calls`,
/// `tool_call_id`, `name`, `reasoning_content`...
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into(), extra: serde_json::Map::new() }
    }
}

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("tokenizer.chat_template does not parse: {0:#}; pass a template explicitly or use the ChatML fallback")]
    Parse(JinjaError),
    #[error("chat template failed: {0:#}")]
    Render(JinjaError),
    #[error("chat template did not finish within {RENDER_FUEL} steps: it loops (far) more than any chat needs; the template is broken or hostile, pass a template explicitly")]
    OutOfFuel,
}

/// Steps (minijinja instructions) one render may take. A real template takes a few dozen a
/// message, so this is far beyond any conversation, yet it stops a template — which comes from
/// the GGUF, i.e. from whoever made the file — that would loop for hours (nested `range`s: a
/// fuzz finding) or fill memory with its output, after well under a second.
pub const RENDER_FUEL: u64 = 10_000_000;

/// A parsed chat template plus the token texts it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// Strip a leading BOS text in [`ChatTemplate::render`] (the tokenizer adds it).
    strip_bos: bool,
    strip_eos: bool,
    is_fallback: bool,
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// The model's `tokenizer.chat_template`. Without one: [`GEMMA_FALLBACK`] when the
    /// vocabulary has Gemma's turn tokens, else [`CHATML_FALLBACK`] (see
    /// [`ChatTemplate::is_fallback`]).
    pub fn from_gguf(f: &gguf::GgufFile, tok: &Tokenizer) -> Result<ChatTemplate, ChatError> {
        match f.get_str("tokenizer.chat_template") {
            Some(src) => ChatTemplate::new(src, tok),
            None => {
                let gemma = tok.token_id("<start_of_turn>").is_some()
                    && tok.token_id("<end_of_turn>").is_some();
                let mut t =
                    ChatTemplate::new(if gemma { GEMMA_FALLBACK } else { CHATML_FALLBACK }, tok)?;
                t.is_fallback = true;
                Ok(t)
            }
        }
    }

    /// Parses `source`; `bos_token`/`eos_token` are the tokenizer's BOS/EOS texts.
    pub fn new(source: &str, tok: &Tokenizer) -> Result<ChatTemplate, ChatError> {
        let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_string();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(RENDER_FUEL));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string()).map_err(ChatError::Parse)?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: text(tok.bos()),
            eos_token: text(tok.eos()),
            strip_bos: tok.add_bos(),
            strip_eos: tok.add_eos(),
            is_fallback: false,
        })
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// True when the model had no template and a built-in fallback is in use.
    pub fn is_fallback(&self) -> bool {
        self.is_fallback
    }

    /// The prompt for `encode(prompt, add_special = true, parse_special = true)`: the template's
    /// output with a leading BOS text removed when the tokenizer adds BOS itself (and a trailing
    /// EOS when it adds EOS), as llama.cpp does, so the tokens never start with two BOS. For
    /// templates without `bos_token` (Qwen) this is exactly [`ChatTemplate::render_hf`].
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// [`ChatTemplate::render_with_tools`]'s prompt, and the byte ranges in it that are client
    /// strings, for [`Tokenizer::encode_chat`] (which tokenizes them as text): every message
    /// content, and every other string (a tool call's arguments, a tool's description, a
    /// reasoning text...) that holds the text of one of `tok`'s control tokens.
    ///
    /// The ranges come from a second render with each of those strings replaced by a marker
    /// (private-use characters around a random number, checked to occur in no input), lined up
    /// with the first: the template text between markers must match exactly, and a string must
    /// appear as given, trimmed (`| trim`, as Gemma's template writes contents) or escaped as
    /// inside a JSON string (`| tojson`, as most templates write tool calls and tool
    /// definitions). A template that changes a string otherwise (slices it, changes case) or
    /// decides on what it holds cannot be lined up; the prompt then has no ranges and says so
    /// ([`ChatPrompt::aligned`]). Strings without control text are left in place, so a
    /// template's tests on them (`tool.type == "function"`) see what the client sent.
    pub fn render_prompt(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<ChatPrompt, ChatError> {
        self.render_prompt_thinking(tok, messages, tools, add_generation_prompt, None)
    }

    /// [`ChatTemplate::render_prompt`] with the template variable `enable_thinking` (which
    /// Qwen3's and the DeepSeek-R1 distills' templates read) set, or left undefined (`None`).
    pub fn render_prompt_thinking(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<ChatPrompt, ChatError> {
        let gen = (add_generation_prompt, enable_thinking);
        let real = self.render_with(messages, tools, gen)?;
        let marked = self.marked_strings(tok, messages, tools, gen, &real);
        let aligned = marked.is_some();
        let mut as_text = marked.unwrap_or_default();
        let mut text = real;
        if self.strip_bos && !self.bos_token.is_empty() && text.starts_with(&self.bos_token) {
            let n = self.bos_token.len();
            text.drain(..n);
            for r in &mut as_text {
                *r = r.start.saturating_sub(n)..r.end.saturating_sub(n);
            }
        }
        if self.strip_eos && !self.eos_token.is_empty() && text.ends_with(&self.eos_token) {
            text.truncate(text.len() - self.eos_token.len());
            for r in &mut as_text {
                *r = r.start.min(text.len())..r.end.min(text.len());
            }
        }
        as_text.retain(|r| !r.is_empty());
        Ok(ChatPrompt { text, as_text, aligned })
    }

    /// The client strings' ranges in `real` (a render of `messages` and `tools`), from a render
    /// with markers in their place; `None` when the two do not line up.
    fn marked_strings(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        gen: (bool, Option<bool>),
        real: &str,
    ) -> Option<Vec<Range<usize>>> {
        let control = |s: &str| tok.control_text_in(s).is_some();
        let any_extra = |v: &serde_json::Value| json_strings(v).any(control);
        // Scanned once: without control text outside the contents, nothing there is marked
        // (and the strings are not scanned again below).
        let extras =
            messages.iter().any(|m| m.extra.values().any(any_extra)) || tools.iter().any(any_extra);
        if !extras && messages.iter().all(|m| m.content.is_empty()) {
            return Some(Vec::new());
        }
        let protect = |s: &str| extras && control(s);
        // A tag that no input holds: the markers are `{tag}{index}\u{F8FF}`.
        let inputs: Vec<String> = messages
            .iter()
            .map(|m| serde_json::to_string(m).unwrap_or_default())
            .chain(tools.iter().map(|t| t.to_string()))
            .collect();
        let tag = (0..)
            .map(|_| {
                use std::hash::{BuildHasher, Hasher};
                let n = std::collections::hash_map::RandomState::new().build_hasher().finish();
                format!("\u{F8FE}{n:016x}:")
            })
            .find(|tag| inputs.iter().all(|i| !i.contains(tag.as_str())))?;
        let mut marks = Marks { tag: &tag, texts: Vec::new() };
        let marked: Vec<ChatMessage> = messages
            .iter()
            .map(|m| {
                let content =
                    if m.content.is_empty() { String::new() } else { marks.mark(&m.content) };
                let extra =
                    m.extra.iter().map(|(k, v)| (k.clone(), marks.json(v, &protect))).collect();
                ChatMessage { role: m.role.clone(), content, extra }
            })
            .collect();
        let marked_tools: Vec<serde_json::Value> =
            tools.iter().map(|t| marks.json(t, &protect)).collect();
        let texts = marks.texts;
        let marked = self.render_with(&marked, &marked_tools, gen).ok()?;
        // The marked render: template text, then a marker, and so on.
        let mut pieces: Vec<(&str, Option<usize>)> = Vec::new();
        let mut rest = marked.as_str();
        while let Some(at) = rest.find(tag.as_str()) {
            let after = &rest[at + tag.len()..];
            let end = after.find('\u{F8FF}')?;
            let i: usize = after[..end].parse().ok()?;
            texts.get(i)?;
            pieces.push((&rest[..at], Some(i)));
            rest = &after[end + '\u{F8FF}'.len_utf8()..];
        }
        pieces.push((rest, None));
        let mut spans = Vec::new();
        let mut pos = 0;
        for (k, &(template, marker)) in pieces.iter().enumerate() {
            if !real[pos..].starts_with(template) {
                return None;
            }
            pos += template.len();
            let Some(i) = marker else { continue };
            let c = texts[i];
            let mut escaped = String::with_capacity(c.len() + 2);
            json_string(c, false, &mut escaped);
            let escaped = &escaped[1..escaped.len() - 1];
            let next = pieces.get(k + 1).map_or("", |p| p.0);
            let found =
                [c, c.trim(), c.trim_start(), c.trim_end(), escaped].into_iter().find(|form| {
                    real[pos..].starts_with(form) && real[pos + form.len()..].starts_with(next)
                })?;
            spans.push(pos..pos + found.len());
            pos += found.len();
        }
        (pos == real.len()).then_some(spans)
    }

    /// As [`ChatTemplate::render`], with OpenAI-style tool definitions.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let mut s = self.render_hf(messages, tools, add_generation_prompt)?;
        if self.strip_bos && !self.bos_token.is_empty() && s.starts_with(&self.bos_token) {
            s.drain(..self.bos_token.len());
        }
        if self.strip_eos && !self.eos_token.is_empty() && s.ends_with(&self.eos_token) {
            s.truncate(s.len() - self.eos_token.len());
        }
        Ok(s)
    }

    /// Exactly what Hugging Face's `apply_chat_template(tokenize=False)` renders (`tools` is
    /// undefined to the template when empty, as in transformers).
    pub fn render_hf(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_with(messages, tools, (add_generation_prompt, None))
    }

    /// [`ChatTemplate::render_hf`] with `enable_thinking` defined when `gen.1` is.
    fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        gen: (bool, Option<bool>),
    ) -> Result<String, ChatError> {
        let tmpl = self.env.get_template(NAME).map_err(ChatError::Render)?;
        let tools = if tools.is_empty() { Value::UNDEFINED } else { Value::from_serialize(tools) };
        let thinking = gen.1.map_or(Value::UNDEFINED, Value::from);
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            tools => tools,
            add_generation_prompt => gen.0,
            enable_thinking => thinking,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        tmpl.render(ctx).map_err(|e| match e.kind() {
            ErrorKind::OutOfFuel => ChatError::OutOfFuel,
            _ => ChatError::Render(e),
        })
    }
}

/// A rendered chat prompt and where the client's strings are in it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatPrompt {
    /// The prompt, as [`ChatTemplate::render_with_tools`] renders it.
    pub text: String,
    /// Byte ranges of `text` that are client strings, to be tokenized as text: sorted, disjoint,
    /// not empty.
    pub as_text: Vec<Range<usize>>,
    /// Whether the client strings were lined up with a marked render. When they were not (a
    /// template that transforms them or decides on them), `as_text` is empty and the whole text
    /// is special-parsed: a caller that takes messages from a client must then refuse any string
    /// that holds a control token's text ([`crate::Tokenizer::control_text_in`]). The strings are
    /// never searched for: a search finds a string where the template did not put it and misses
    /// the transformed ones. Object keys are never marked (a template may sort or test them):
    /// a caller refuses a key that holds control text either way.
    pub aligned: bool,
}

/// The strings of a JSON value (not its keys), depth first.
fn json_strings(v: &serde_json::Value) -> impl Iterator<Item = &str> {
    let mut stack = vec![v];
    std::iter::from_fn(move || {
        while let Some(v) = stack.pop() {
            match v {
                serde_json::Value::String(s) => return Some(s.as_str()),
                serde_json::Value::Array(a) => stack.extend(a.iter().rev()),
                serde_json::Value::Object(o) => stack.extend(o.values().rev()),
                _ => {}
            }
        }
        None
    })
}

/// The strings a marked render replaced, by marker index.
struct Marks<'a> {
    tag: &'a str,
    texts: Vec<&'a str>,
}

impl<'a> Marks<'a> {
    /// The marker that stands for `s`: `{tag}{index}\u{F8FF}`.
    fn mark(&mut self, s: &'a str) -> String {
        self.texts.push(s);
        format!("{}{}\u{F8FF}", self.tag, self.texts.len() - 1)
    }

    /// `v` with every string that `protect` picks replaced by its marker.
    fn json(
        &mut self,
        v: &'a serde_json::Value,
        protect: &dyn Fn(&str) -> bool,
    ) -> serde_json::Value {
        use serde_json::Value as J;
        match v {
            J::String(s) if protect(s) => J::String(self.mark(s)),
            J::Array(a) => J::Array(a.iter().map(|x| self.json(x, protect)).collect()),
            J::Object(o) => {
                J::Object(o.iter().map(|(k, x)| (k.clone(), self.json(x, protect))).collect())
            }
            _ => v.clone(),
        }
    }
}

fn raise_exception(msg: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, format!("template raised: {msg}")))
}

/// `strftime_now(format)`: the current UTC time (no time-zone database is consulted).
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(&fmt, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] =
    ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Formats Unix time `secs` (UTC) with the common `strftime` directives.
pub fn strftime(fmt: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (h, mi, s) = (sod / 3600, sod % 3600 / 60, sod % 60);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('-') => match it.next() {
                Some('d') => out.push_str(&d.to_string()),
                Some('m') => out.push_str(&m.to_string()),
                Some(o) => {
                    out.push_str("%-");
                    out.push(o);
                }
                None => out.push_str("%-"),
            },
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('I') => out.push_str(&format!("{:02}", if h % 12 == 0 { 12 } else { h % 12 })),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') | Some('h') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tojson` as transformers defines it: Python's `json.dumps(x, ensure_ascii=False)` with
/// optional `indent`, `sort_keys`, `ensure_ascii`, `separators`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        _ => ((if indent.is_some() { "," } else { ", " }).to_string(), ": ".to_string()),
    };
    let opts = JsonOpts {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
        item_sep,
        key_sep,
    };
    let mut out = String::new();
    write_json(&value, &opts, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct JsonOpts {
    indent: Option<usize>,
    sort_keys: bool,
    ensure_ascii: bool,
    item_sep: String,
    key_sep: String,
}

fn write_json(v: &Value, o: &JsonOpts, depth: usize, out: &mut String) -> Result<(), JinjaError> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = o.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Ok(i) = i64::try_from(v.clone()) {
                if v.is_integer() {
                    out.push_str(&i.to_string());
                    return Ok(());
                }
            }
            let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
            out.push_str(&py_float_repr(f));
        }
        ValueKind::String => json_string(v.as_str().unwrap_or(""), o.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, depth + 1);
                write_json(item, o, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if o.sort_keys {
                keys.sort_by_key(|a| a.to_string());
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, depth + 1);
                match k.as_str() {
                    Some(s) => json_string(s, o.ensure_ascii, out),
                    None => json_string(&k.to_string(), o.ensure_ascii, out),
                }
                out.push_str(&o.key_sep);
                write_json(&v.get_item(k)?, o, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => json_string(&v.to_string(), o.ensure_ascii, out),
    }
    Ok(())
}

fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7E) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form outside 1e-4..1e16.
fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let sci = format!("{f:e}"); // e.g. "-1.5e-5", "1e16"
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let neg = mant.starts_with('-');
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if !(-4..16).contains(&exp) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push_str(&format!("e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs()));
    } else if exp < 0 {
        out.push_str("0.");
        out.push_str(&"0".repeat((-exp - 1) as usize));
        out.push_str(&digits);
    } else {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.push_str(&digits);
            out.push_str(&"0".repeat(int_len - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        assert_eq!(py_float_repr(1.0), "1.0");
        assert_eq!(py_float_repr(0.5), "0.5");
        assert_eq!(py_float_repr(1e-9), "1e-09");
        assert_eq!(py_float_repr(1.5e16), "1.5e+16");
        assert_eq!(py_float_repr(123.25), "123.25");
        assert_eq!(py_float_repr(0.0001), "0.0001");
        assert_eq!(py_float_repr(-2.5e-5), "-2.5e-05");
    }

    #[test]
    fn strftime_formats_a_known_date() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(strftime("%d %B %Y, %A %b %a %j", t), "29 February 2024, Thursday Feb Thu 060");
    }

    #[test]
    fn tojson_prints_like_python_json_dumps() {
        let mut env = Environment::new();
        env.add_filter("tojson", tojson);
        let v: serde_json::Value =
            serde_json::json!({"name": "f", "args": {"x": 1, "y": [1.5, "é\"\n"], "z": null}});
        let out = env
            .render_str("{{ v | tojson }}", minijinja::context! { v => Value::from_serialize(&v) })
            .unwrap();
        assert_eq!(out, r#"{"name": "f", "args": {"x": 1, "y": [1.5, "é\"\n"], "z": null}}"#);
        let out = env
            .render_str(
                "{{ v | tojson(indent=2) }}",
                minijinja::context! { v => Value::from_serialize(serde_json::json!({"a": [1]})) },
            )
            .unwrap();
        assert_eq!(out, "{\n  \"a\": [\n    1\n  ]\n}");
    }
}
