//! [`OutputParser`]: a model's output, as it streams, split into content, reasoning (a
//! `<think>…</think>` section at the start, or from the start when the prompt opened it) and
//! tool calls in the template's [`Format`], as [`Piece`]s a route turns into its deltas.
//!
//! Each piece of text is read once: a marker (`<think>`, `</think>`, `<tool_call>`…) split
//! across pieces is found because the parser holds back only the end of the text that could
//! still begin one, and whitespace it holds (a marker may follow it) is counted as held, so a
//! later piece's scan starts after it: the work is linear in the output, however it is split
//! (`held_whitespace_is_scanned_once` counts it); a call's JSON is walked a byte at a time
//! ([`CallScan`]), which streams its arguments as they arrive once its name is known. A call whose text does not parse (or names
//! a tool not offered) is given back as content ([`Piece::CallBroken`]), never an error. The
//! non-streamed answer is the same pieces gathered ([`ParsedOutput::gather`]), so both agree.

use super::Format;

/// Where the output's reasoning is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reasoning {
    /// No reasoning section: everything is content (or calls).
    Off,
    /// A `<think>…</think>` at the start of the output is reasoning.
    Tagged,
    /// The prompt ended with `<think>`: the output is reasoning up to `</think>`.
    Open,
}

/// Part of the output, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Content(String),
    Reasoning(String),
    /// Call `index` (0, 1, … in the answer) to the tool `name` begins.
    CallStart {
        index: usize,
        name: String,
    },
    /// More of call `index`'s arguments (JSON text; the fragments make up the whole).
    CallArgs {
        index: usize,
        fragment: String,
    },
    /// Call `index` is whole and valid (its arguments are all out).
    CallEnd {
        index: usize,
    },
    /// A call that did not parse: its text, given back as content; `index` if it was started.
    CallBroken {
        index: Option<usize>,
        raw: String,
    },
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before any text but whitespace (a `<think>` may open here).
    Start,
    Think,
    /// Content; `fresh`: nothing but whitespace since `</think>` or since the last call.
    Content {
        fresh: bool,
    },
    /// In a call (or, for Mistral, in the list of calls).
    Call,
}

/// The output parser; see the module docs.
pub struct OutputParser {
    format: Option<Format>,
    names: Vec<String>,
    state: State,
    reasoning: Reasoning,
    /// Text read but not yet given out (it may begin a marker).
    hold: String,
    /// How many of `hold`'s first bytes are known to be whitespace: the scans start after them
    /// (a marker never begins with whitespace), so held whitespace is looked at once.
    ws: usize,
    /// Reasoning whitespace held back (it is trimmed before `</think>`).
    think_ws: String,
    reasoning_started: bool,
    content_started: bool,
    scan: Option<CallScan>,
    /// Mistral's list: `[` read, between calls.
    list: Option<ListState>,
    /// The list's text not yet part of a call (given back if no call follows).
    list_raw: String,
    /// Calls started (the next one's index).
    n_started: usize,
    /// The open call is a bare object at the start (it ends with the object, not a tag).
    bare: bool,
    /// Bytes of held text the scans have looked at (the witness of their linear bound).
    scanned: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListState {
    /// After `[TOOL_CALLS]`, before `[`.
    Open,
    /// Inside the list, before a call or `]`.
    Item,
    /// After a call: `,` or `]`.
    After,
}

impl OutputParser {
    /// A parser for calls in `format` to the tools `names` (no format: no calls are parsed),
    /// with reasoning where `reasoning` says.
    pub fn new(format: Option<Format>, names: Vec<String>, reasoning: Reasoning) -> OutputParser {
        let state = match reasoning {
            Reasoning::Open => State::Think,
            _ => State::Start,
        };
        OutputParser {
            format,
            names,
            state,
            reasoning,
            hold: String::new(),
            ws: 0,
            think_ws: String::new(),
            reasoning_started: false,
            content_started: false,
            scan: None,
            list: None,
            list_raw: String::new(),
            n_started: 0,
            bare: false,
            scanned: 0,
        }
    }

    /// Reads `text` (the next piece of output) and appends what it settles to `out`.
    /// The call format this parser reads, if calls are expected.
    pub fn format(&self) -> Option<Format> {
        self.format
    }

    pub fn push(&mut self, text: &str, out: &mut Vec<Piece>) {
        self.hold.push_str(text);
        self.run(false, out);
    }

    /// The output ended: gives out everything held.
    pub fn finish(&mut self, out: &mut Vec<Piece>) {
        self.run(true, out);
        if let Some(scan) = self.scan.take() {
            out.push(Piece::CallBroken { index: scan.index, raw: scan.raw });
        }
        if self.list.take().is_some() && !self.list_raw.is_empty() {
            let raw = std::mem::take(&mut self.list_raw);
            out.push(Piece::CallBroken { index: None, raw });
        }
    }

    fn marker(&self) -> Option<&'static str> {
        match self.format {
            Some(Format::Hermes) => Some("<tool_call>"),
            Some(Format::Mistral) => Some("[TOOL_CALLS]"),
            Some(Format::Llama3) | None => None,
        }
    }

    fn run(&mut self, end: bool, out: &mut Vec<Piece>) {
        loop {
            let before = (self.hold.len(), self.state);
            match self.state {
                State::Start => {
                    self.scanned += self.hold.len() - self.ws;
                    let t = self.hold[self.ws..].trim_start();
                    self.ws = self.hold.len() - t.len();
                    if self.reasoning == Reasoning::Tagged && t.starts_with(THINK_OPEN) {
                        let skip = self.hold.len() - t.len() + THINK_OPEN.len();
                        self.drain(skip);
                        self.state = State::Think;
                    } else if self.reasoning == Reasoning::Tagged
                        && THINK_OPEN.starts_with(t)
                        && !end
                    {
                        return; // Only whitespace or a part of `<think>` so far.
                    } else {
                        self.state = State::Content { fresh: false };
                    }
                }
                State::Think => match self.scan_find(THINK_CLOSE) {
                    Some(at) => {
                        let text = self.drain(at + THINK_CLOSE.len());
                        self.reasoning_out(&text[..at], true, out);
                        self.state = State::Content { fresh: true };
                    }
                    None => {
                        let keep = if end { 0 } else { partial_suffix(&self.hold, THINK_CLOSE) };
                        let text = self.drain(self.hold.len() - keep);
                        self.reasoning_out(&text, end, out);
                        if end {
                            return;
                        }
                    }
                },
                State::Content { fresh } => {
                    let mut t = self.hold.as_str();
                    if fresh || !self.content_started {
                        // Whitespace after `</think>` or between calls is dropped; at the very
                        // start it is kept unless a call follows.
                        self.scanned += t.len() - self.ws;
                        let trimmed = t[self.ws..].trim_start();
                        self.ws = t.len() - trimmed.len();
                        if trimmed.is_empty() && !end {
                            return;
                        }
                        if self.format.is_some_and(Format::bare_start)
                            && !self.content_started
                            && trimmed.starts_with('{')
                        {
                            let n = t.len() - trimmed.len();
                            self.drain(n);
                            self.begin_call(String::new());
                            continue;
                        }
                        if fresh {
                            let n = t.len() - trimmed.len();
                            self.drain(n);
                            t = self.hold.as_str();
                        }
                    }
                    let marker = self.marker();
                    // Held whitespace was looked at already: the scans start after it.
                    let known = self.ws.min(t.len());
                    self.scanned += t.len() - known;
                    match marker.and_then(|m| t[known..].find(m).map(|at| (m, known + at))) {
                        Some((m, at)) => {
                            let text = self.drain(at + m.len());
                            self.content_out(text[..at].trim_end(), out);
                            self.begin_call(m.to_string());
                        }
                        None => {
                            // A marker begun, or whitespace a marker may follow (trimmed then).
                            let (keep, run) = match marker {
                                Some(m) if !end => {
                                    let p = partial_suffix(t, m);
                                    let head = &t[..t.len() - p];
                                    let known = known.min(head.len());
                                    let body = head[known..].trim_end();
                                    let run = match body.is_empty() {
                                        true => head.len(),
                                        false => head.len() - known - body.len(),
                                    };
                                    (p + run, run)
                                }
                                _ => (0, 0),
                            };
                            let text = self.drain(self.hold.len() - keep);
                            // What stays begins with the whitespace run (a marker does not).
                            self.ws = run;
                            if !text.is_empty() {
                                self.state = State::Content { fresh: false };
                            }
                            self.content_out(&text, out);
                            if keep > 0 || end {
                                return;
                            }
                        }
                    }
                }
                State::Call => self.call_step(end, out),
            }
            if self.hold.is_empty() && matches!(self.state, State::Content { .. } | State::Call) {
                return;
            }
            if (self.hold.len(), self.state) == before && !matches!(self.state, State::Start) {
                return;
            }
        }
    }

    fn reasoning_out(&mut self, text: &str, closed: bool, out: &mut Vec<Piece>) {
        let mut text = text;
        if !self.reasoning_started {
            text = text.trim_start();
        }
        let body = text.trim_end();
        let ws = &text[body.len()..];
        let mut s = String::new();
        if !body.is_empty() {
            s = std::mem::take(&mut self.think_ws);
            s.push_str(body);
        }
        if !closed {
            self.think_ws.push_str(ws);
        } else {
            self.think_ws.clear();
        }
        if !s.is_empty() {
            self.reasoning_started = true;
            out.push(Piece::Reasoning(s));
        }
    }

    fn content_out(&mut self, text: &str, out: &mut Vec<Piece>) {
        if text.is_empty() {
            return;
        }
        self.content_started = true;
        match out.last_mut() {
            Some(Piece::Content(c)) => c.push_str(text),
            _ => out.push(Piece::Content(text.to_string())),
        }
    }

    /// A call section begins after `marker` (already consumed).
    fn begin_call(&mut self, marker: String) {
        self.state = State::Call;
        self.bare = marker.is_empty();
        if self.format == Some(Format::Mistral) && !self.bare {
            self.list = Some(ListState::Open);
            self.scan = None;
            // The marker is given back with the first broken call, if any.
            self.list_raw = marker;
        } else {
            self.scan = Some(CallScan::new(marker, self.format));
        }
    }

    /// Moves a call (or a Mistral list) along over the held text.
    fn call_step(&mut self, end: bool, out: &mut Vec<Piece>) {
        if let Some(ls) = self.list {
            if self.scan.is_none() {
                self.scanned += self.hold.len() - self.ws;
                let t = self.hold[self.ws..].trim_start();
                let skipped = self.hold.len() - t.len();
                self.ws = skipped;
                let Some(c) = t.chars().next() else { return };
                let next = match (ls, c) {
                    (ListState::Open, '[') => Some(ListState::Item),
                    (ListState::Item, '{') => {
                        self.drain(skipped);
                        let raw = std::mem::take(&mut self.list_raw);
                        self.scan = Some(CallScan::new(raw, self.format));
                        return;
                    }
                    (ListState::After, ',') => Some(ListState::Item),
                    (ListState::After, ']') | (ListState::Item, ']') => None,
                    _ => {
                        // Not a list of calls: the rest is content.
                        let raw = std::mem::take(&mut self.list_raw);
                        self.list = None;
                        self.state = State::Content { fresh: false };
                        if !raw.is_empty() {
                            out.push(Piece::CallBroken { index: None, raw });
                        }
                        return;
                    }
                };
                let raw = self.drain(skipped + 1);
                self.list_raw.push_str(&raw);
                match next {
                    Some(s) => self.list = Some(s),
                    None => {
                        self.list = None;
                        self.list_raw.clear();
                        self.state = State::Content { fresh: true };
                    }
                }
                return;
            }
        }
        if self.scan.is_none() {
            self.state = State::Content { fresh: true };
            return;
        }
        // Hermes ends a call at its closing tag; JSON formats when the object closes.
        let close = (self.format == Some(Format::Hermes) && !self.bare).then_some("</tool_call>");
        let (take, closed_tag) = match close {
            Some(c) => match self.scan_find(c) {
                Some(at) => (at, Some(c)),
                None if end => (self.hold.len(), None),
                None => (self.hold.len() - partial_suffix(&self.hold, c), None),
            },
            None => (self.hold.len(), None),
        };
        let stop_at_done = close.is_none();
        self.scanned += take;
        let scan = self.scan.as_mut().expect("a call is open");
        let used =
            scan.feed(&self.hold[..take], stop_at_done, &self.names, &mut self.n_started, out);
        let object_done = scan.done();
        self.drain(used);
        if let Some(c) = closed_tag.filter(|_| used == take) {
            // The tag closes the call (whatever the object's state).
            self.drain(c.len());
            self.scan.as_mut().expect("a call is open").raw.push_str(c);
            let scan = self.scan.take().expect("a call is open");
            scan.end(&self.names, out);
            self.state = State::Content { fresh: true };
            return;
        }
        if object_done && close.is_none() {
            let scan = self.scan.take().expect("a call is open");
            scan.end(&self.names, out);
            match self.list {
                Some(_) => self.list = Some(ListState::After),
                None => self.state = State::Content { fresh: true },
            }
        }
    }
}

impl OutputParser {
    /// Takes the first `n` bytes of the held text.
    fn drain(&mut self, n: usize) -> String {
        self.ws = self.ws.saturating_sub(n);
        self.hold.drain(..n).collect()
    }

    /// Where `marker` is in the held text (which holds at most a marker's length from before).
    fn scan_find(&mut self, marker: &str) -> Option<usize> {
        self.scanned += self.hold.len();
        self.hold.find(marker)
    }
}

/// The length of the longest suffix of `s` that is a proper prefix of `marker` (the part of
/// a marker that may be completed by the next piece).
fn partial_suffix(s: &str, marker: &str) -> usize {
    let max = (marker.len() - 1).min(s.len());
    (1..=max)
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && marker.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

/// Where a call object's walk is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Walk {
    /// Before the `{` (whitespace may come first).
    Before,
    /// A key or `}`.
    Key,
    InKey {
        esc: bool,
    },
    Colon,
    /// A value's first byte.
    Value,
    /// Inside a value: nesting depth, inside a string, after a backslash.
    InValue {
        depth: u32,
        in_str: bool,
        esc: bool,
        prim: bool,
    },
    /// `,` or `}`.
    After,
    Done,
    /// Not a call object.
    Bad,
}

/// One call's JSON object walked a byte at a time: its `name`, and its arguments' raw text,
/// streamed once the name is known.
struct CallScan {
    /// Everything read for this call, marker included (given back if it does not parse).
    raw: String,
    walk: Walk,
    key: String,
    value: String,
    name: Option<String>,
    args_key: &'static str,
    /// The arguments' text so far, and how much of it was given out.
    args: String,
    args_sent: usize,
    args_done: bool,
    index: Option<usize>,
}

impl CallScan {
    fn new(marker: String, format: Option<Format>) -> CallScan {
        CallScan {
            raw: marker,
            walk: Walk::Before,
            key: String::new(),
            value: String::new(),
            name: None,
            args_key: format.map_or("arguments", Format::args_key),
            args: String::new(),
            args_sent: 0,
            args_done: false,
            index: None,
        }
    }

    fn done(&self) -> bool {
        matches!(self.walk, Walk::Done)
    }

    /// Walks `text`; returns the bytes used (all, or up to the object's end).
    fn feed(
        &mut self,
        text: &str,
        stop_at_done: bool,
        names: &[String],
        n_started: &mut usize,
        out: &mut Vec<Piece>,
    ) -> usize {
        let mut used = text.len();
        for (i, c) in text.char_indices() {
            if stop_at_done && matches!(self.walk, Walk::Done) {
                used = i;
                break;
            }
            self.step(c);
        }
        self.raw.push_str(&text[..used]);
        // The name, once whole and offered, starts the call; arguments follow as they come.
        if self.index.is_none() {
            if let Some(n) = self.name.as_ref().filter(|n| names.contains(n)) {
                self.index = Some(*n_started);
                *n_started += 1;
                out.push(Piece::CallStart { index: self.index.unwrap_or(0), name: n.clone() });
            }
        }
        if let Some(index) = self.index {
            if self.args.len() > self.args_sent {
                let fragment = self.args[self.args_sent..].to_string();
                self.args_sent = self.args.len();
                out.push(Piece::CallArgs { index, fragment });
            }
        }
        used
    }

    fn step(&mut self, c: char) {
        let ws = c.is_whitespace();
        self.walk = match self.walk {
            Walk::Before if ws => Walk::Before,
            Walk::Before if c == '{' => Walk::Key,
            Walk::Key if ws => Walk::Key,
            Walk::Key if c == '"' => {
                self.key.clear();
                Walk::InKey { esc: false }
            }
            Walk::Key if c == '}' => Walk::Done,
            Walk::InKey { esc: true } => {
                self.key.push(c);
                Walk::InKey { esc: false }
            }
            Walk::InKey { esc: false } if c == '\\' => Walk::InKey { esc: true },
            Walk::InKey { esc: false } if c == '"' => Walk::Colon,
            Walk::InKey { .. } => {
                self.key.push(c);
                Walk::InKey { esc: false }
            }
            Walk::Colon if ws => Walk::Colon,
            Walk::Colon if c == ':' => Walk::Value,
            Walk::Value if ws => Walk::Value,
            Walk::Value => {
                self.value.clear();
                let w = match c {
                    '{' | '[' => Walk::InValue { depth: 1, in_str: false, esc: false, prim: false },
                    '"' => Walk::InValue { depth: 0, in_str: true, esc: false, prim: false },
                    _ => Walk::InValue { depth: 0, in_str: false, esc: false, prim: true },
                };
                self.value_push(c);
                w
            }
            Walk::InValue { prim: true, .. } if ws || c == ',' || c == '}' => {
                self.value_end();
                match c {
                    ',' => Walk::Key,
                    '}' => Walk::Done,
                    _ => Walk::After,
                }
            }
            Walk::InValue { prim: true, .. } => {
                self.value_push(c);
                self.walk
            }
            Walk::InValue { depth, in_str: true, esc, .. } => {
                self.value_push(c);
                if esc {
                    Walk::InValue { depth, in_str: true, esc: false, prim: false }
                } else if c == '\\' {
                    Walk::InValue { depth, in_str: true, esc: true, prim: false }
                } else if c == '"' {
                    if depth == 0 {
                        self.value_end();
                        Walk::After
                    } else {
                        Walk::InValue { depth, in_str: false, esc: false, prim: false }
                    }
                } else {
                    self.walk
                }
            }
            Walk::InValue { depth, in_str: false, .. } => {
                self.value_push(c);
                let depth = match c {
                    '{' | '[' => depth + 1,
                    '}' | ']' => depth - 1,
                    _ => depth,
                };
                if depth == 0 {
                    self.value_end();
                    Walk::After
                } else {
                    Walk::InValue { depth, in_str: c == '"', esc: false, prim: false }
                }
            }
            Walk::After if ws => Walk::After,
            Walk::After if c == ',' => Walk::Key,
            Walk::After if c == '}' => Walk::Done,
            // Whitespace may follow the object before a closing tag.
            Walk::Done if ws => Walk::Done,
            _ => Walk::Bad,
        };
    }

    fn value_push(&mut self, c: char) {
        if self.key == self.args_key && !self.args_done {
            self.args.push(c);
        } else {
            self.value.push(c);
        }
    }

    fn value_end(&mut self) {
        if self.key == self.args_key {
            self.args_done = true;
        } else if self.key == "name" {
            self.name = serde_json::from_str::<String>(&self.value).ok();
        }
    }

    /// The call is over: a valid one is complete already; one that does not parse is given
    /// back as content.
    fn end(self, names: &[String], out: &mut Vec<Piece>) {
        let ok = self.done()
            && self.args_done
            && self.name.as_ref().is_some_and(|n| names.contains(n))
            && serde_json::from_str::<serde_json::Value>(&self.args).is_ok();
        match self.index {
            Some(index) if ok => out.push(Piece::CallEnd { index }),
            index => out.push(Piece::CallBroken { index, raw: self.raw }),
        }
    }
}

/// One call of a gathered answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments' JSON text as the model wrote it.
    pub arguments: String,
}

/// A whole answer: its content, reasoning and calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<ParsedCall>,
}

impl ParsedOutput {
    /// The pieces of a whole answer gathered (broken calls' text becomes content).
    pub fn gather(pieces: &[Piece]) -> ParsedOutput {
        let mut o = ParsedOutput::default();
        let mut by_index: Vec<Option<ParsedCall>> = Vec::new();
        for p in pieces {
            match p {
                Piece::Content(t) => o.content.push_str(t),
                Piece::Reasoning(t) => o.reasoning.push_str(t),
                Piece::CallStart { index, name } => {
                    if by_index.len() <= *index {
                        by_index.resize(index + 1, None);
                    }
                    by_index[*index] =
                        Some(ParsedCall { name: name.clone(), arguments: String::new() });
                }
                Piece::CallArgs { index, fragment } => {
                    if let Some(Some(c)) = by_index.get_mut(*index) {
                        c.arguments.push_str(fragment);
                    }
                }
                Piece::CallEnd { .. } => {}
                Piece::CallBroken { index, raw } => {
                    if let Some(i) = index {
                        if let Some(c) = by_index.get_mut(*i) {
                            *c = None;
                        }
                    }
                    o.content.push_str(raw);
                }
            }
        }
        o.calls = by_index.into_iter().flatten().collect();
        o
    }

    /// `text` parsed whole.
    pub fn parse(
        text: &str,
        format: Option<Format>,
        names: &[String],
        reasoning: Reasoning,
    ) -> ParsedOutput {
        let mut p = OutputParser::new(format, names.to_vec(), reasoning);
        let mut pieces = Vec::new();
        p.push(text, &mut pieces);
        p.finish(&mut pieces);
        ParsedOutput::gather(&pieces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["get_weather".to_string(), "get_time".to_string()]
    }

    /// `text` fed in two pieces split at every char boundary, and whole: all agree with `want`.
    fn check_splits(text: &str, format: Option<Format>, reasoning: Reasoning, want: &ParsedOutput) {
        let whole = ParsedOutput::parse(text, format, &names(), reasoning);
        assert_eq!(&whole, want, "whole: {text:?}");
        for (i, _) in text.char_indices().skip(1) {
            let mut p = OutputParser::new(format, names(), reasoning);
            let mut pieces = Vec::new();
            p.push(&text[..i], &mut pieces);
            p.push(&text[i..], &mut pieces);
            p.finish(&mut pieces);
            assert_eq!(&ParsedOutput::gather(&pieces), want, "split at {i}: {text:?}");
        }
        // And one char at a time.
        let mut p = OutputParser::new(format, names(), reasoning);
        let mut pieces = Vec::new();
        for c in text.chars() {
            p.push(&c.to_string(), &mut pieces);
        }
        p.finish(&mut pieces);
        assert_eq!(&ParsedOutput::gather(&pieces), want, "char by char: {text:?}");
    }

    fn out(content: &str, reasoning: &str, calls: &[(&str, &str)]) -> ParsedOutput {
        ParsedOutput {
            content: content.into(),
            reasoning: reasoning.into(),
            calls: calls
                .iter()
                .map(|(n, a)| ParsedCall { name: n.to_string(), arguments: a.to_string() })
                .collect(),
        }
    }

    #[test]
    fn hermes_calls_are_parsed_at_every_split() {
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\\"é\\\"\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let want =
            out("", "", &[("get_weather", "{\"city\": \"Paris \\\"é\\\"\"}"), ("get_time", "{}")]);
        check_splits(text, Some(Format::Hermes), Reasoning::Off, &want);
    }

    #[test]
    fn text_before_a_call_is_content_and_arguments_may_come_first() {
        let text = "Let me look.\n<tool_call>\n{\"arguments\": {\"zone\": \"utc\"}, \"name\": \"get_time\"}\n</tool_call>";
        let want = out("Let me look.", "", &[("get_time", "{\"zone\": \"utc\"}")]);
        check_splits(text, Some(Format::Hermes), Reasoning::Off, &want);
    }

    #[test]
    fn malformed_or_unknown_calls_are_content() {
        for text in [
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }}\n</tool_call>",
            "<tool_call>\n{\"name\": \"launch_rockets\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"get_weather\", \"argu",
            "<tool_call>not json</tool_call>",
        ] {
            let want = out(text, "", &[]);
            check_splits(text, Some(Format::Hermes), Reasoning::Off, &want);
        }
    }

    #[test]
    fn plain_text_is_content_unchanged() {
        for text in ["Hello there", "  indented\n", "a < b and [x]", "<tool", "<think"] {
            check_splits(text, Some(Format::Hermes), Reasoning::Off, &out(text, "", &[]));
        }
        // No format: a call's text is content.
        let t = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        check_splits(t, None, Reasoning::Off, &out(t, "", &[]));
    }

    #[test]
    fn llama3_json_is_a_call_only_at_the_start() {
        let text = " {\"name\": \"get_time\", \"parameters\": {\"zone\": \"cet\"}}";
        check_splits(
            text,
            Some(Format::Llama3),
            Reasoning::Off,
            &out("", "", &[("get_time", "{\"zone\": \"cet\"}")]),
        );
        let text = "Here: {\"name\": \"get_time\", \"parameters\": {}}";
        check_splits(text, Some(Format::Llama3), Reasoning::Off, &out(text, "", &[]));
    }

    #[test]
    fn a_bare_hermes_call_at_the_start_is_a_call() {
        let text = "{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}";
        check_splits(
            text,
            Some(Format::Hermes),
            Reasoning::Off,
            &out("", "", &[("get_time", "{\"zone\": \"utc\"}")]),
        );
        let text = "{\"answer\": 42}";
        check_splits(text, Some(Format::Hermes), Reasoning::Off, &out(text, "", &[]));
    }

    #[test]
    fn mistral_lists_calls() {
        let text = "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}, \"id\": \"abc123def\"}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]";
        let want = out(
            "",
            "",
            &[("get_time", "{\"zone\": \"utc\"}"), ("get_weather", "{\"city\": \"Oslo\"}")],
        );
        check_splits(text, Some(Format::Mistral), Reasoning::Off, &want);
    }

    #[test]
    fn reasoning_opened_by_the_output_is_split_off() {
        let text = "<think>\nThe user wants a greeting.\n</think>\n\nHello!";
        check_splits(
            text,
            Some(Format::Hermes),
            Reasoning::Tagged,
            &out("Hello!", "The user wants a greeting.", &[]),
        );
        // Not at the start: content.
        let text = "Hi <think>x</think> there";
        check_splits(text, Some(Format::Hermes), Reasoning::Tagged, &out(text, "", &[]));
        // Without a reasoning section the tags are content.
        let text = "<think>x</think>y";
        check_splits(text, None, Reasoning::Off, &out(text, "", &[]));
    }

    #[test]
    fn reasoning_opened_by_the_prompt_runs_to_the_close() {
        let text = "Check the weather first.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
        let want = out("", "Check the weather first.", &[("get_weather", "{\"city\": \"Rome\"}")]);
        check_splits(text, Some(Format::Hermes), Reasoning::Open, &want);
        // Cut before the close: all reasoning.
        check_splits("Still thinking  ", None, Reasoning::Open, &out("", "Still thinking", &[]));
    }

    #[test]
    fn arguments_stream_in_fragments_after_the_name() {
        let mut p = OutputParser::new(Some(Format::Hermes), names(), Reasoning::Off);
        let mut pieces = Vec::new();
        for s in [
            "<tool_call>\n{\"name\": \"get_wea",
            "ther\", \"arguments\": {\"ci",
            "ty\": \"Par",
            "is\"}}\n</tool_call>",
        ] {
            p.push(s, &mut pieces);
        }
        p.finish(&mut pieces);
        assert_eq!(
            pieces,
            vec![
                Piece::CallStart { index: 0, name: "get_weather".into() },
                Piece::CallArgs { index: 0, fragment: "{\"ci".into() },
                Piece::CallArgs { index: 0, fragment: "ty\": \"Par".into() },
                Piece::CallArgs { index: 0, fragment: "is\"}".into() },
                Piece::CallEnd { index: 0 },
            ]
        );
    }

    /// Whitespace fed a byte at a time where it is held (a `logit_bias` can force it): the
    /// parser looks at each held byte a bounded number of times, and still gives it out.
    #[test]
    fn held_whitespace_is_scanned_once() {
        const N: usize = 20_000;
        let cases: [(Option<Format>, Reasoning, &str); 6] = [
            (Some(Format::Hermes), Reasoning::Off, "Hi"),
            (Some(Format::Hermes), Reasoning::Open, "Hmm"),
            (Some(Format::Hermes), Reasoning::Off, ""),
            (Some(Format::Hermes), Reasoning::Tagged, ""),
            (
                Some(Format::Hermes),
                Reasoning::Off,
                "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>",
            ),
            (Some(Format::Mistral), Reasoning::Off, "[TOOL_CALLS]["),
        ];
        for (format, reasoning, lead) in cases {
            let mut p = OutputParser::new(format, names(), reasoning);
            let mut pieces = Vec::new();
            p.push(lead, &mut pieces);
            for _ in 0..N {
                p.push(" ", &mut pieces);
            }
            p.push("x", &mut pieces);
            p.finish(&mut pieces);
            assert!(p.scanned <= 4 * (N + lead.len() + 1), "{lead:?}: {} bytes scanned", p.scanned);
            let got = ParsedOutput::gather(&pieces);
            let text = format!("{lead}{}x", " ".repeat(N));
            assert_eq!(got, ParsedOutput::parse(&text, format, &names(), reasoning), "{lead:?}");
        }
    }

    #[test]
    fn partial_suffix_finds_a_marker_begun() {
        assert_eq!(partial_suffix("abc<tool", "<tool_call>"), 5);
        assert_eq!(partial_suffix("abc", "<tool_call>"), 0);
        assert_eq!(partial_suffix("é<", "<think>"), 1);
    }
}
