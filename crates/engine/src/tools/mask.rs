//! [`ToolMask`]: one sequence's place in its [`ToolGrammar`], and the logits mask it implies.
//!
//! Phases: free text (watching for the trigger under `tool_choice: "auto"`), a choice among
//! literal texts (a call's opening and head per offered tool; after a call, the separator and
//! the next heads, or the section's end), the arguments (a [`JsonMask`] under the chosen tool's
//! schema), the call's closing literal, done. The trigger is matched with a KMP automaton, a
//! byte step each, so free text costs no re-reading however long it grows.
//!
//! Cost per constrained token: one pass over the vocabulary. In a choice, a token passes when
//! its bytes are a prefix of a live candidate's rest (a first-byte filter, then a scan of the
//! live candidates, which the head's own bytes narrow to one within a name), or cover a call
//! head's rest and start its arguments; in the arguments it is JSON mode's pass, plus a walk
//! through the grammar for the tokens inside which the arguments may close (those ending in
//! whitespace or holding a `}` past their first byte, listed once per vocabulary by
//! [`JsonVocab`]: a few thousand of a 152k vocabulary).

use std::sync::Arc;

use super::{Reasoning, Start, ToolGrammar};
use crate::json::{JsonFormat, JsonMask, JsonVocab};

/// What completing a candidate text leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Then {
    /// The arguments of tool `i`.
    Call(usize),
    /// The end of the call section: only the end of generation may follow.
    End,
    /// The next choice (after a call's closing text).
    Next,
}

#[derive(Clone, Debug)]
struct Cand {
    text: Vec<u8>,
    then: Then,
}

#[derive(Clone)]
enum Phase {
    /// Free text; `matched` bytes of the trigger are matched (`Lazy` only); `started`: some
    /// text other than whitespace was written (an anchored trigger can no longer fire).
    Free { matched: usize, started: bool },
    /// One of `cands` (sorted by text), of which `live` still match the `at` bytes written.
    Choice { cands: Arc<[Cand]>, live: Vec<u16>, at: usize },
    /// The arguments of tool `tool`.
    Args { json: Box<JsonMask> },
    /// The section is closed: only the end of generation.
    Done,
    /// The output left the grammar (a trigger followed by text no call starts with): free
    /// text from here on, parsed as content.
    Off,
}

/// Where the output is relative to its thinking section, which the grammar leaves alone.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Think {
    /// Past it, or there is none: the phases run.
    Out,
    /// At the start, `held` (whitespace, then the first `at` bytes of `<think>`) written so
    /// far: the output may be opening the section.
    Opening { held: Vec<u8>, at: usize },
    /// Inside it, `matched` bytes of `</think>` matched.
    In { matched: usize },
}

const THINK_OPEN: &[u8] = b"<think>";
const THINK_CLOSE: &[u8] = b"</think>";

/// A sequence's state under a [`ToolGrammar`].
#[derive(Clone)]
pub struct ToolMask {
    grammar: Arc<ToolGrammar>,
    think: Think,
    phase: Phase,
    /// Calls whose arguments are done.
    n_calls: usize,
    /// The trigger's KMP failure table.
    fail: Vec<usize>,
    /// The call is a bare object at the start (no opening or closing tags; one call).
    bare: bool,
}

impl ToolMask {
    pub fn new(grammar: Arc<ToolGrammar>) -> ToolMask {
        let trigger = grammar.format.trigger().0.as_bytes();
        let fail = kmp_table(trigger);
        let think = match (grammar.reasoning, grammar.start) {
            (Reasoning::Open, _) => Think::In { matched: 0 },
            (Reasoning::Tagged, Start::Lazy) => Think::Opening { held: Vec::new(), at: 0 },
            // A forced call starts at once; the parser reads no thinking before it.
            (Reasoning::Tagged, Start::Now) | (Reasoning::Off, _) => Think::Out,
        };
        let mut m = ToolMask { phase: Phase::Off, think, n_calls: 0, fail, grammar, bare: false };
        m.phase = match m.grammar.start {
            Start::Lazy => Phase::Free { matched: 0, started: false },
            Start::Now => m.first_choice(""),
        };
        m
    }

    /// Whether the next token is constrained (false in free text and in the thinking section).
    pub fn constrains(&self) -> bool {
        self.think == Think::Out && !matches!(self.phase, Phase::Free { .. } | Phase::Off)
    }

    /// True once the call section is closed (the scheduler then ends the answer).
    pub fn is_complete(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Calls generated under the grammar so far.
    pub fn n_calls(&self) -> usize {
        self.n_calls
    }

    /// The choice of the first call's opening and heads, after `prefix` (the part of the
    /// opening a trigger already wrote).
    fn first_choice(&self, prefix: &str) -> Phase {
        let g = &self.grammar;
        let open = g.format.open();
        let mut cands: Vec<Cand> = g
            .tools
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let whole = format!("{open}{}", g.format.head(&t.name));
                let rest = whole.strip_prefix(prefix)?;
                Some(Cand { text: rest.as_bytes().to_vec(), then: Then::Call(i) })
            })
            .collect();
        cands.sort_by(|a, b| a.text.cmp(&b.text));
        choice(cands)
    }

    /// The heads alone, for a bare call object at the start.
    fn first_choice_bare(&self) -> Phase {
        let g = &self.grammar;
        let mut cands: Vec<Cand> = g
            .tools
            .iter()
            .enumerate()
            .map(|(i, t)| Cand { text: g.format.head(&t.name).into_bytes(), then: Then::Call(i) })
            .collect();
        cands.sort_by(|a, b| a.text.cmp(&b.text));
        choice(cands)
    }

    /// After a call: the next call's separator and heads (while calls are left), or the end.
    fn next_choice(&self) -> Phase {
        let g = &self.grammar;
        if self.bare {
            return Phase::Done;
        }
        let mut cands = vec![Cand { text: g.format.end().as_bytes().to_vec(), then: Then::End }];
        if let Some(sep) = g.format.separator().filter(|_| self.n_calls < g.max_calls) {
            for (i, t) in g.tools.iter().enumerate() {
                let text = format!("{sep}{}", g.format.head(&t.name)).into_bytes();
                cands.push(Cand { text, then: Then::Call(i) });
            }
        }
        if cands.len() == 1 && cands[0].text.is_empty() {
            return Phase::Done;
        }
        cands.sort_by(|a, b| a.text.cmp(&b.text));
        choice(cands)
    }

    /// A call's closing text, then the next choice.
    fn close_choice(&self) -> Phase {
        choice(vec![Cand { text: self.close_text().to_vec(), then: Then::Next }])
    }

    fn args(&self, tool: usize) -> Phase {
        let schema = self.grammar.tools[tool].parameters.clone();
        Phase::Args { json: Box::new(JsonMask::new(&JsonFormat::Schema(schema))) }
    }

    /// Sets every token that cannot come next to −∞ (only meaningful while
    /// [`ToolMask::constrains`]); `raw(t)` is a token's text as the output holds it,
    /// `json_piece(t)` what JSON may take of it (empty for control tokens), `eog(t)` whether it
    /// ends the generation. Returns whether any token is left.
    pub fn apply<'a>(
        &self,
        logits: &mut [f32],
        vocab: &JsonVocab,
        raw: impl Fn(u32) -> &'a [u8],
        json_piece: impl Fn(u32) -> &'a [u8],
        eog: impl Fn(u32) -> bool,
    ) -> bool {
        match &self.phase {
            Phase::Free { .. } | Phase::Off => logits.iter().any(|l| *l > f32::NEG_INFINITY),
            Phase::Args { json } => self.apply_args(json, logits, vocab, raw, json_piece),
            Phase::Done => {
                let mut any = false;
                for (t, l) in logits.iter_mut().enumerate() {
                    if eog(t as u32) {
                        any |= *l > f32::NEG_INFINITY;
                    } else {
                        *l = f32::NEG_INFINITY;
                    }
                }
                any
            }
            Phase::Choice { cands, live, at } => {
                let can_end = live.iter().any(|&c| {
                    cands[c as usize].then == Then::End && cands[c as usize].text.len() == *at
                });
                let mut first = [false; 256];
                for &c in live {
                    if let Some(&b) = cands[c as usize].text.get(*at) {
                        first[b as usize] = true;
                    }
                }
                let mut any = false;
                for (t, l) in logits.iter_mut().enumerate() {
                    let t = t as u32;
                    let ok = if eog(t) {
                        can_end
                    } else {
                        let bytes = raw(t);
                        !bytes.is_empty()
                            && first[bytes[0] as usize]
                            && live.iter().any(|&c| self.fits(&cands[c as usize], *at, bytes))
                    };
                    if ok {
                        any |= *l > f32::NEG_INFINITY;
                    } else {
                        *l = f32::NEG_INFINITY;
                    }
                }
                any
            }
        }
    }

    /// The arguments' mask: JSON's, except for tokens inside which the arguments close. JSON
    /// reads what follows the closing byte as trailing whitespace (which it allows) or as text
    /// past the value (which it refuses), but what follows is the call's closing text: `"}\n`
    /// must be refused there (the grammar would leave the call) and `"}}` allowed. Only the
    /// tokens [`JsonVocab::close_inside`] lists can be either (every format's closing text
    /// starts with `}`), so only those are walked through the whole grammar.
    fn apply_args<'a>(
        &self,
        json: &JsonMask,
        logits: &mut [f32],
        vocab: &JsonVocab,
        raw: impl Fn(u32) -> &'a [u8],
        json_piece: impl Fn(u32) -> &'a [u8],
    ) -> bool {
        debug_assert_eq!(self.close_text()[0], b'}');
        let suspects: Vec<(u32, f32)> =
            vocab.close_inside().map(|t| (t, logits[t as usize])).collect();
        json.apply(logits, vocab, &json_piece);
        for (t, logit) in suspects {
            let bytes = json_piece(t);
            if closes_within(json, bytes).is_some_and(|end| end < bytes.len()) {
                logits[t as usize] = if self.takes(raw(t)) { logit } else { f32::NEG_INFINITY };
            }
        }
        logits.iter().any(|l| *l > f32::NEG_INFINITY)
    }

    /// Whether `bytes` may follow `at` bytes of candidate `c`: a prefix of its rest, or its
    /// whole rest followed by what the grammar takes after it (the tool's arguments).
    fn fits(&self, c: &Cand, at: usize, bytes: &[u8]) -> bool {
        let rest = &c.text[at..];
        rest.starts_with(bytes)
            || (matches!(c.then, Then::Call(_)) && bytes.starts_with(rest) && self.takes(bytes))
    }

    /// Whether the grammar takes every byte of `bytes` (tried on a copy).
    fn takes(&self, bytes: &[u8]) -> bool {
        let mut m = self.clone();
        m.accept_phases(bytes) && !matches!(m.phase, Phase::Off)
    }

    /// What follows a call's arguments.
    fn close_text(&self) -> &'static [u8] {
        if self.bare {
            b"}"
        } else {
            self.grammar.format.close().as_bytes()
        }
    }

    /// Moves past a sampled token's text (its raw bytes; an end-of-generation token is not
    /// passed).
    pub fn accept(&mut self, bytes: &[u8]) {
        match std::mem::replace(&mut self.think, Think::Out) {
            Think::Out => {
                self.accept_phases(bytes);
            }
            Think::In { mut matched } => {
                for (k, &b) in bytes.iter().enumerate() {
                    // `</think>` has no border but the empty one: a mismatch restarts the match.
                    matched = if b == THINK_CLOSE[matched] {
                        matched + 1
                    } else {
                        usize::from(b == THINK_CLOSE[0])
                    };
                    if matched == THINK_CLOSE.len() {
                        // Whitespace closing the section in the same token is not the call's.
                        self.accept_phases(bytes[k + 1..].trim_ascii_start());
                        return;
                    }
                }
                self.think = Think::In { matched };
            }
            Think::Opening { mut held, mut at } => {
                for (k, &b) in bytes.iter().enumerate() {
                    if at == 0 && b.is_ascii_whitespace() {
                        held.push(b);
                    } else if THINK_OPEN.get(at) == Some(&b) {
                        held.push(b);
                        at += 1;
                        if at == THINK_OPEN.len() {
                            self.think = Think::In { matched: 0 };
                            return self.accept(&bytes[k + 1..]);
                        }
                    } else {
                        // Not a thinking section: what was held is ordinary output.
                        held.extend_from_slice(&bytes[k..]);
                        self.accept_phases(&held);
                        return;
                    }
                }
                self.think = Think::Opening { held, at };
            }
        }
    }

    /// Moves past `bytes` outside the thinking section; false when some of them fall outside
    /// the grammar (it leaves it, or they follow the section's close).
    fn accept_phases(&mut self, bytes: &[u8]) -> bool {
        let mut bytes = bytes;
        // Each pass consumes some bytes or leaves the loop.
        loop {
            let phase = std::mem::replace(&mut self.phase, Phase::Off);
            self.phase = match phase {
                // Nothing more is constrained: the rest of the bytes are plain text.
                Phase::Off | Phase::Done => {
                    self.phase = phase;
                    return bytes.is_empty();
                }
                Phase::Free { mut matched, mut started } => {
                    let (trigger, anchored) = self.grammar.format.trigger();
                    let trigger = trigger.as_bytes();
                    let mut fired = None;
                    let bare = self.grammar.format.bare_start() && !anchored;
                    for (k, &b) in bytes.iter().enumerate() {
                        if bare && !started && !b.is_ascii_whitespace() {
                            started = true;
                            if b == b'{' {
                                // A bare call object at the start (no tags).
                                self.bare = true;
                                let p = self.first_choice_bare();
                                let Phase::Choice { cands, live, .. } = p else { return false };
                                self.phase = narrow(cands, live, 0, &bytes[k..]);
                                return true;
                            }
                        }
                        if anchored {
                            if started {
                                break;
                            }
                            if b.is_ascii_whitespace() {
                                continue;
                            }
                            started = true;
                        }
                        while matched > 0 && trigger[matched] != b {
                            matched = self.fail[matched - 1];
                        }
                        if trigger[matched] == b {
                            matched += 1;
                        }
                        if matched == trigger.len() {
                            fired = Some(k + 1);
                            break;
                        }
                    }
                    match fired {
                        None => {
                            self.phase = Phase::Free { matched, started };
                            return true;
                        }
                        Some(k) => {
                            bytes = &bytes[k..];
                            let written = std::str::from_utf8(trigger).unwrap_or("");
                            let open = self.grammar.format.open();
                            // The trigger is (a prefix of) the opening, or of the head itself.
                            let prefix = if open.starts_with(written) { written } else { "" };
                            let mut p = self.first_choice(prefix);
                            if prefix.is_empty() {
                                // Anchored `{`: the head's own first byte was the trigger.
                                if let Phase::Choice { cands, live, .. } = p {
                                    p = narrow(cands, live, 0, trigger);
                                }
                            }
                            p
                        }
                    }
                }
                Phase::Choice { cands, live, at } => {
                    // A candidate whose whole rest the bytes cover: taken, and what is left of
                    // the bytes goes on to what follows it.
                    let covered = live.iter().copied().find(|&c| {
                        let rest = &cands[c as usize].text[at..];
                        !rest.is_empty() && bytes.starts_with(rest)
                    });
                    let Some(c) = covered else {
                        self.phase = narrow(cands, live, at, bytes);
                        return true;
                    };
                    let cand = &cands[c as usize];
                    bytes = &bytes[cand.text.len() - at..];
                    match cand.then {
                        Then::Call(i) => self.args(i),
                        Then::End => Phase::Done,
                        Then::Next => self.next_choice(),
                    }
                }
                Phase::Args { mut json } => {
                    // Byte by byte: the arguments may close inside the token.
                    let mut used = bytes.len();
                    let mut ok = true;
                    for (k, &b) in bytes.iter().enumerate() {
                        if !json.push(&[b]) {
                            ok = false;
                            used = k;
                            break;
                        }
                        if json.is_complete() {
                            used = k + 1;
                            break;
                        }
                    }
                    if !ok {
                        self.phase = Phase::Off;
                        return false;
                    }
                    bytes = &bytes[used..];
                    if json.is_complete() {
                        self.n_calls += 1;
                        self.close_choice()
                    } else {
                        Phase::Args { json }
                    }
                }
            };
            if bytes.is_empty() {
                return true;
            }
        }
    }
}

/// A choice among `cands` (sorted), all live.
fn choice(cands: Vec<Cand>) -> Phase {
    let live = (0..cands.len() as u16).collect();
    Phase::Choice { cands: cands.into(), live, at: 0 }
}

/// The choice after `bytes` more were written inside it: the candidates whose rest starts with
/// them (none: the output left the grammar).
fn narrow(cands: Arc<[Cand]>, live: Vec<u16>, at: usize, bytes: &[u8]) -> Phase {
    let live: Vec<u16> =
        live.into_iter().filter(|&c| cands[c as usize].text[at..].starts_with(bytes)).collect();
    if live.is_empty() {
        return Phase::Off;
    }
    Phase::Choice { cands, live, at: at + bytes.len() }
}

/// Where `json`'s value closes inside `bytes` (the count of bytes up to its closing byte), if
/// it does before a byte it refuses.
fn closes_within(json: &JsonMask, bytes: &[u8]) -> Option<usize> {
    let mut json = json.clone();
    for (k, &b) in bytes.iter().enumerate() {
        if !json.push(&[b]) {
            return None;
        }
        if json.is_complete() {
            return Some(k + 1);
        }
    }
    None
}

/// KMP's failure function: for each prefix length `i + 1`, the longest proper border.
fn kmp_table(p: &[u8]) -> Vec<usize> {
    let mut fail = vec![0; p.len()];
    let mut k = 0;
    for i in 1..p.len() {
        while k > 0 && p[i] != p[k] {
            k = fail[k - 1];
        }
        if p[i] == p[k] {
            k += 1;
        }
        fail[i] = k;
    }
    fail
}

#[cfg(test)]
mod tests {
    use super::super::{Format, Tool};
    use super::*;
    use crate::json_schema::Schema;

    fn grammar(format: Format, start: Start, max_calls: usize) -> Arc<ToolGrammar> {
        thinking(format, start, max_calls, Reasoning::Off)
    }

    fn thinking(
        format: Format,
        start: Start,
        max_calls: usize,
        reasoning: Reasoning,
    ) -> Arc<ToolGrammar> {
        let schema = |v: serde_json::Value| Arc::new(Schema::compile(&v).unwrap());
        let tools = vec![
            Tool {
                name: "get_weather".into(),
                parameters: schema(serde_json::json!({"type": "object",
                    "properties": {"city": {"type": "string"}}, "required": ["city"]})),
            },
            Tool {
                name: "get_time".into(),
                parameters: schema(serde_json::json!({"type": "object",
                    "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]})),
            },
        ];
        Arc::new(ToolGrammar { format, tools, start, max_calls, reasoning })
    }

    /// A toy vocabulary: every byte, some words, and an end token (id = last).
    fn vocab() -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
        for w in [
            "<tool_call>",
            "</tool_call>",
            "{\"",
            "name",
            "\":",
            " \"",
            "get",
            "_weather",
            "_time",
            "\",",
            " {\"",
            "city",
            "Paris",
            "\"}",
            "}}",
            "[TOOL_CALLS]",
            "arguments",
            "Hello",
            "utc",
            "}\n",
            "\"}\n",
            "\"}}",
            "\"}}\n",
            " }",
        ] {
            v.push(w.as_bytes().to_vec());
        }
        v.push(Vec::new()); // end of generation
        v
    }

    /// The tokens `mask` allows next, as texts.
    fn allowed(mask: &ToolMask, v: &[Vec<u8>]) -> Vec<String> {
        let jv = JsonVocab::new(v.len(), |t| &v[t as usize], |t| t as usize == v.len() - 1);
        let mut logits = vec![0.0; v.len()];
        mask.apply(
            &mut logits,
            &jv,
            |t| &v[t as usize],
            |t| &v[t as usize],
            |t| t as usize == v.len() - 1,
        );
        (0..v.len())
            .filter(|&t| logits[t] == 0.0)
            .map(|t| {
                if t == v.len() - 1 {
                    "<EOG>".to_string()
                } else {
                    String::from_utf8_lossy(&v[t]).into_owned()
                }
            })
            .collect()
    }

    /// Feeds `text` greedily: at each step the longest allowed token that `text` continues
    /// with; panics if none.
    fn feed(mask: &mut ToolMask, v: &[Vec<u8>], text: &str) {
        let mut rest = text.as_bytes();
        while !rest.is_empty() {
            let ok = allowed(mask, v);
            let tok = ok
                .iter()
                .filter(|t| *t != "<EOG>" && rest.starts_with(t.as_bytes()))
                .max_by_key(|t| t.len())
                .unwrap_or_else(|| {
                    panic!("no allowed token continues {:?}", String::from_utf8_lossy(rest))
                })
                .clone();
            mask.accept(tok.as_bytes());
            rest = &rest[tok.len()..];
        }
    }

    #[test]
    fn required_hermes_allows_only_offered_names_and_their_arguments() {
        let v = vocab();
        let mut m = grammar(Format::Hermes, Start::Now, 1).mask();
        assert!(m.constrains());
        assert_eq!(allowed(&m, &v), vec!["<", "<tool_call>"]);
        feed(&mut m, &v, "<tool_call>\n{\"name\": \"get_");
        let next = allowed(&m, &v);
        assert!(next.contains(&"w".to_string()) && next.contains(&"t".to_string()), "{next:?}");
        assert!(!next.contains(&"x".to_string()));
        feed(&mut m, &v, "time\", \"arguments\": ");
        // get_time's schema: zone is an enum, so "city" may not be written.
        feed(&mut m, &v, "{\"zone\": \"");
        let next = allowed(&m, &v);
        assert!(next.contains(&"u".to_string()) && !next.contains(&"P".to_string()), "{next:?}");
        feed(&mut m, &v, "utc\"}");
        assert_eq!(m.n_calls(), 1);
        feed(&mut m, &v, "}\n</tool_call>");
        // One call at most: done, the scheduler ends the answer.
        assert!(m.is_complete());
    }

    #[test]
    fn a_token_inside_which_the_arguments_close_must_go_on_with_the_call() {
        let v = vocab();
        for (format, bare_start) in [(Format::Hermes, false), (Format::Hermes, true)] {
            let mut m = grammar(format, Start::Lazy, 1).mask();
            if bare_start {
                m.accept(b"{");
                feed(&mut m, &v, "\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc");
            } else {
                m.accept(b"<tool_call>");
                feed(&mut m, &v, "\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc");
            }
            let next = allowed(&m, &v);
            // JSON alone would take `"}\n` (trailing whitespace) and refuse `"}}`; the call's
            // closing `}` is what follows the arguments.
            assert!(!next.contains(&"\"}\n".to_string()), "{next:?}");
            assert!(next.contains(&"\"}}".to_string()), "{next:?}");
            assert_eq!(next.contains(&"\"}}\n".to_string()), !bare_start, "{next:?}");
            m.accept(b"\"}}");
            assert_eq!(m.n_calls(), 1);
            assert!(m.constrains() || m.is_complete());
        }
    }

    #[test]
    fn random_walks_under_the_mask_never_leave_the_grammar() {
        // Every token the mask allows keeps the output inside the grammar, whatever the order
        // of choices: walks that pick uniformly among the allowed tokens, for each format.
        let v = vocab();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for format in [Format::Hermes, Format::Llama3, Format::Mistral] {
            for walk in 0..300 {
                let mut m = grammar(format, Start::Now, 1 + walk % 3).mask();
                let mut text = Vec::new();
                for _ in 0..200 {
                    let ok = allowed(&m, &v);
                    assert!(!ok.is_empty(), "{format:?}: nothing allowed after {:?}", lossy(&text));
                    let t = &ok[next() as usize % ok.len()];
                    if t == "<EOG>" {
                        // The mask ends the answer only after a whole call.
                        assert!(m.n_calls() >= 1, "{format:?}: EOG inside {:?}", lossy(&text));
                        break;
                    }
                    m.accept(t.as_bytes());
                    text.extend_from_slice(t.as_bytes());
                    assert!(
                        m.constrains() || m.is_complete(),
                        "{format:?}: {:?} left the grammar",
                        lossy(&text)
                    );
                }
            }
        }
    }

    fn lossy(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    #[test]
    fn bytes_after_the_calls_close_are_plain_text() {
        // One token may close the section and carry more: the mask takes the rest as text
        // (it once looped on it for good).
        let v = vocab();
        let mut m = grammar(Format::Hermes, Start::Now, 1).mask();
        feed(
            &mut m,
            &v,
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}",
        );
        m.accept(b"\n</tool_call>\n\nmore");
        assert!(m.is_complete());
        m.accept(b" and more");
        assert!(m.is_complete());
    }

    #[test]
    fn a_token_may_cover_the_head_and_start_the_arguments() {
        let v = vocab();
        let mut m = grammar(Format::Hermes, Start::Now, 1).mask();
        feed(&mut m, &v, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\":");
        assert!(allowed(&m, &v).contains(&" {\"".to_string()));
        m.accept(b" {\"");
        feed(&mut m, &v, "city\": \"Paris\"}");
        assert_eq!(m.n_calls(), 1);
    }

    #[test]
    fn parallel_hermes_calls_follow_each_other_or_end() {
        let v = vocab();
        let mut m = grammar(Format::Hermes, Start::Now, 4).mask();
        feed(&mut m, &v, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"cet\"}}\n</tool_call>");
        let next = allowed(&m, &v);
        assert_eq!(next, vec!["\n", "<EOG>"]);
        feed(&mut m, &v, "\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}}\n</tool_call>");
        assert_eq!(m.n_calls(), 2);
        assert!(allowed(&m, &v).contains(&"<EOG>".to_string()));
    }

    #[test]
    fn a_trigger_inside_the_thinking_section_does_not_start_a_call() {
        let v = vocab();
        // The output opens the section itself (Qwen3): a trigger inside it is reasoning text.
        let mut m = thinking(Format::Hermes, Start::Lazy, 1, Reasoning::Tagged).mask();
        for piece in ["\n<thi", "nk>I could write <tool_call> here", " </thi", "nk>\n\n"] {
            m.accept(piece.as_bytes());
            assert!(!m.constrains(), "after {piece:?}");
        }
        m.accept(b"<tool_call>");
        assert!(m.constrains());
        assert_eq!(allowed(&m, &v), vec!["\n"]);
        // Without a section at the start, the trigger fires at once, even where it shares
        // `<t` with `<think>`.
        let mut m = thinking(Format::Hermes, Start::Lazy, 1, Reasoning::Tagged).mask();
        m.accept(b"<t");
        assert!(!m.constrains());
        m.accept(b"ool_call>");
        assert!(m.constrains());
    }

    #[test]
    fn a_required_call_waits_for_a_section_the_prompt_opened() {
        let v = vocab();
        // DeepSeek-R1's way: the prompt ends with `<think>`, so the output starts inside it.
        let mut m = thinking(Format::Hermes, Start::Now, 1, Reasoning::Open).mask();
        m.accept(b"plan: call <tool_call> get_time </");
        assert!(!m.constrains());
        m.accept(b"think>\n");
        assert!(m.constrains());
        feed(
            &mut m,
            &v,
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}",
        );
        assert_eq!(m.n_calls(), 1);
    }

    #[test]
    fn lazy_hermes_is_free_until_the_trigger_even_split_across_tokens() {
        let v = vocab();
        let mut m = grammar(Format::Hermes, Start::Lazy, 1).mask();
        assert!(!m.constrains());
        for piece in ["Let me check. <tool", "_ca", "ll"] {
            m.accept(piece.as_bytes());
            assert!(!m.constrains());
        }
        m.accept(b">");
        assert!(m.constrains());
        assert_eq!(allowed(&m, &v), vec!["\n"]);
        feed(
            &mut m,
            &v,
            "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        );
        assert!(m.is_complete());
    }

    #[test]
    fn a_bare_hermes_call_at_the_start_is_constrained() {
        let v = vocab();
        let mut m = grammar(Format::Hermes, Start::Lazy, 4).mask();
        m.accept(b"\n{\"");
        assert!(m.constrains());
        feed(&mut m, &v, "name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}");
        // Bare: one call, no tags.
        assert!(m.is_complete());
        let mut m = grammar(Format::Hermes, Start::Lazy, 4).mask();
        m.accept(b"Sure {");
        assert!(!m.constrains());
    }

    #[test]
    fn a_trigger_followed_by_no_call_leaves_the_grammar() {
        let mut m = grammar(Format::Hermes, Start::Lazy, 1).mask();
        m.accept(b"<tool_call>oops");
        assert!(!m.constrains() && !m.is_complete());
    }

    #[test]
    fn llama3_lazy_triggers_only_on_a_leading_brace() {
        let v = vocab();
        let mut m = grammar(Format::Llama3, Start::Lazy, 1).mask();
        m.accept(b"Sure {");
        assert!(!m.constrains());
        let mut m = grammar(Format::Llama3, Start::Lazy, 1).mask();
        m.accept(b" \n{\"");
        assert!(m.constrains());
        feed(&mut m, &v, "name\": \"get_time\", \"parameters\": {\"zone\": \"utc\"}}");
        assert!(m.is_complete());
    }

    #[test]
    fn mistral_calls_are_an_array() {
        let v = vocab();
        let mut m = grammar(Format::Mistral, Start::Now, 2).mask();
        feed(
            &mut m,
            &v,
            "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}",
        );
        let next = allowed(&m, &v);
        assert_eq!(next, vec![",", "]"]);
        feed(&mut m, &v, ", {\"name\": \"get_time\", \"arguments\": {\"zone\": \"cet\"}}");
        // Two calls, the most allowed: only the end.
        assert_eq!(allowed(&m, &v), vec!["]"]);
        feed(&mut m, &v, "]");
        assert!(m.is_complete());
    }

    #[test]
    fn kmp_table_is_the_border_function() {
        assert_eq!(kmp_table(b"abab"), vec![0, 0, 1, 2]);
        assert_eq!(kmp_table(b"<tool_call>"), vec![0; 11]);
        assert_eq!(kmp_table(b"aaab"), vec![0, 1, 2, 0]);
    }
}
