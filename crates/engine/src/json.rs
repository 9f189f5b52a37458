//! JSON mode (OpenAI's `response_format: {"type": "json_object"}`, Ollama's `format: "json"`):
//! the answer must be one JSON object. [`JsonPrefix`] is a byte-at-a-time JSON syntax checker
//! (RFC 8259) small enough to copy: the container stack is a bit per level in a `u128`, so the
//! scheduler tries every vocabulary token's bytes from the current state on a copy. [`JsonMask`]
//! does that once per sampled token and leaves the sampler only the tokens that keep the text a
//! prefix of some JSON object, and the end-of-generation tokens only once the object is closed.
//!
//! With a schema ([`JsonFormat::Schema`]), [`crate::json_schema::SchemaSet`] (one
//! [`crate::json_schema::SchemaPrefix`] unless a union leaves readings open) takes the checker's
//! place in the same mask.
//!
//! Cost: one pass over the vocabulary per sampled token, paid only by requests in JSON mode.
//! Inside a string (most of an answer) a token is allowed exactly when [`string_safe`] holds for
//! its bytes (and, in a string a schema bounds, its characters fit), so that pass reads one
//! precomputed record a token ([`JsonVocab`]: 4 bytes a token, built once per vocabulary, beside
//! the masked copy of the logits the sampler reads: together [`JsonVocab::heap_bytes`], which
//! the planner counts for a server); elsewhere the 256 bytes are tried once, then the second
//! bytes after each first byte that may come next, and a token failing either is refused
//! without copying the state: 0.2–1 ms a token on a 152 k vocabulary (BENCHMARKS.md).

use std::sync::Arc;

use crate::json_schema::{Schema, SchemaSet};
pub use crate::json_syntax::{
    string_safe, JsonPrefix, MAX_DEPTH, MAX_DIGITS, MAX_EXP_DIGITS, MAX_WS_RUN,
};

/// What a JSON-mode answer must be.
#[derive(Clone, Debug)]
pub enum JsonFormat {
    /// Any JSON object.
    Object,
    /// A JSON value the schema accepts ([`crate::json_schema`]).
    Schema(Arc<Schema>),
}

/// Which tokens may come next in JSON mode.
#[derive(Clone)]
pub struct JsonMask {
    check: Check,
}

// One per JSON-mode sequence, read on every token: the schema state stays inline.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Check {
    Object(JsonPrefix),
    Schema(Arc<Schema>, SchemaSet),
}

impl JsonMask {
    pub fn new(format: &JsonFormat) -> JsonMask {
        let check = match format {
            JsonFormat::Object => Check::Object(JsonPrefix::new()),
            JsonFormat::Schema(s) => Check::Schema(s.clone(), SchemaSet::new()),
        };
        JsonMask { check }
    }

    /// True once the answer is closed (the scheduler then ends it).
    pub fn is_complete(&self) -> bool {
        match &self.check {
            Check::Object(p) => p.is_complete(),
            Check::Schema(_, p) => p.is_complete(),
        }
    }

    /// Sets `logits[t]` to −∞ for every token `t` that cannot come next: `vocab` holds what the
    /// mask needs of each token ([`JsonVocab`]), `piece(t)` gives the bytes of the few tokens
    /// that pass its filters. End-of-generation tokens are allowed only once the answer may
    /// end, tokens with no bytes never. Returns whether any token is left.
    pub fn apply<'a>(
        &self,
        logits: &mut [f32],
        vocab: &JsonVocab,
        piece: impl Fn(u32) -> &'a [u8],
    ) -> bool {
        match &self.check {
            Check::Object(p) => vocab.mask(
                logits,
                p,
                |p, b| p.push_all(b),
                piece,
                p.in_plain_string().then_some(u32::MAX),
                p.is_complete(),
            ),
            Check::Schema(s, set) => match set.single(s) {
                Some(p) => vocab.mask(
                    logits,
                    p,
                    |p, b| p.push_all(s, b),
                    piece,
                    p.string_room(s),
                    p.can_end(s),
                ),
                None => vocab.mask(
                    logits,
                    set,
                    |p, b| p.push_all(s, b),
                    piece,
                    set.string_room(s),
                    set.can_end(s),
                ),
            },
        }
    }

    /// Moves the state past a sampled token's bytes (which [`JsonMask::apply`] allowed).
    pub fn accept(&mut self, bytes: &[u8]) {
        let ok = self.push(bytes);
        debug_assert!(ok, "a token the mask refused was sampled");
    }

    /// Moves the state past `bytes`; false (the state then undefined) when they cannot come
    /// next. For callers that try text on a clone ([`crate::tools`]).
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        match &mut self.check {
            Check::Object(p) => p.push_all(bytes),
            Check::Schema(s, p) => p.push_all(s, bytes),
        }
    }
}

/// What JSON mode's mask reads of each vocabulary token, built once per vocabulary so the pass
/// over it touches no tokenizer table: the first two bytes, whether the token ends the
/// generation, has no bytes or one, and is [`string_safe`]. It also holds the row of logits the
/// mask writes ([`JsonVocab::masked`]), so JSON mode's heap has this one owner.
pub struct JsonVocab {
    tokens: Vec<Facts>,
    /// The masked copy of the last row of logits, reused from token to token.
    row: Vec<f32>,
}

#[derive(Clone, Copy, Default)]
struct Facts {
    head: [u8; 2],
    flags: u8,
    /// Characters a string-safe token adds to a string (bytes that start one), at most 255
    /// (saturated: such a token is stepped instead).
    chars: u8,
}

impl Facts {
    const SAFE: u8 = 1;
    const EOG: u8 = 2;
    const EMPTY: u8 = 4;
    const ONE_BYTE: u8 = 8;
    /// Whole UTF-8 characters (what a length-bounded string may take without stepping).
    const UTF8: u8 = 16;
    /// An object may close inside the token with bytes after it: a `}` past its first byte, or
    /// a whitespace last byte (what JSON takes after a closed value), in two bytes or more.
    const CLOSE_INSIDE: u8 = 32;
}

impl JsonVocab {
    /// `n` tokens: `piece(t)` gives token `t`'s bytes (empty for control tokens, which an
    /// answer never holds), `eog(t)` says it ends the generation.
    pub fn new<'a>(n: usize, piece: impl Fn(u32) -> &'a [u8], eog: impl Fn(u32) -> bool) -> Self {
        let tokens = (0..n as u32)
            .map(|t| {
                let bytes = piece(t);
                let mut flags = 0;
                if eog(t) {
                    flags |= Facts::EOG;
                } else if string_safe(bytes) {
                    flags |= Facts::SAFE;
                }
                match bytes.len() {
                    0 => flags |= Facts::EMPTY,
                    1 => flags |= Facts::ONE_BYTE,
                    _ => {}
                }
                if std::str::from_utf8(bytes).is_ok() {
                    flags |= Facts::UTF8;
                }
                if let [_, rest @ ..] = bytes {
                    if rest.contains(&b'}') || rest.last().is_some_and(u8::is_ascii_whitespace) {
                        flags |= Facts::CLOSE_INSIDE;
                    }
                }
                let head =
                    [bytes.first().copied().unwrap_or(0), bytes.get(1).copied().unwrap_or(0)];
                let chars = bytes.iter().filter(|&&b| b & 0xC0 != 0x80).count().min(255) as u8;
                Facts { head, flags, chars }
            })
            .collect();
        JsonVocab { tokens, row: Vec::with_capacity(n) }
    }

    /// Heap a [`JsonVocab`] holds for `n_vocab` tokens: the table and the masked row.
    pub fn heap_bytes(n_vocab: usize) -> usize {
        n_vocab.saturating_mul(std::mem::size_of::<Facts>() + std::mem::size_of::<f32>())
    }

    /// `logits` with every token `mask` refuses at −∞, in this vocabulary's own row (no
    /// allocation after the first): the row to sample from, or `None` when no token is left.
    pub fn masked<'a>(
        &mut self,
        logits: &[f32],
        mask: &JsonMask,
        piece: impl Fn(u32) -> &'a [u8],
    ) -> Option<&[f32]> {
        let mut row = std::mem::take(&mut self.row);
        row.clear();
        row.extend_from_slice(logits);
        let any = mask.apply(&mut row, self, piece);
        self.row = row;
        any.then_some(&self.row[..])
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The tokens inside which an object may close with bytes after it (a `}` past the first
    /// byte, or a whitespace last byte): where what follows a closed value decides.
    pub fn close_inside(&self) -> impl Iterator<Item = u32> + '_ {
        let flagged = |(t, f): (usize, &Facts)| (f.flags & Facts::CLOSE_INSIDE != 0).then_some(t);
        self.tokens.iter().enumerate().filter_map(flagged).map(|t| t as u32)
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The same vocabulary with no token marked string-safe: every token stepped (tests).
    #[cfg(test)]
    pub(crate) fn without_string_flags(&self) -> JsonVocab {
        let tokens =
            self.tokens.iter().map(|f| Facts { flags: f.flags & !Facts::SAFE, ..*f }).collect();
        JsonVocab { tokens, row: Vec::new() }
    }

    /// The one pass over the vocabulary for a checker state `state` (`push_all` tries bytes on
    /// a copy), which may end here (`can_end`), and is inside a plain string that may take
    /// `in_string = Some(n)` more characters (`u32::MAX`: any number), or not (`None`).
    fn mask<'a, S: Copy>(
        &self,
        logits: &mut [f32],
        state: &S,
        push_all: impl Fn(&mut S, &[u8]) -> bool,
        piece: impl Fn(u32) -> &'a [u8],
        in_string: Option<u32>,
        can_end: bool,
    ) -> bool {
        // The bytes that may come next, tried once each, and outside strings, for each first
        // byte that may (a few: whitespace, punctuation, digits), the second bytes: a token
        // failing either is refused without its bytes or a copy of the state. A third of a BPE
        // vocabulary starts with a space, so the second filter is what keeps that pass cheap.
        let first: [bool; 256] = std::array::from_fn(|b| push_all(&mut { *state }, &[b as u8]));
        // On the stack (64 KB, only the tags written): no allocation per sampled token.
        let mut second: [Option<[bool; 256]>; 256] = [None; 256];
        let mut any = false;
        for (t, (l, f)) in logits.iter_mut().zip(&self.tokens).enumerate() {
            // A string-safe token cannot close the string: it fits or not by its characters
            // alone (in a bounded string, when they are whole UTF-8 ones; else it is stepped).
            let fits = match in_string {
                Some(room) if f.flags & Facts::SAFE != 0 && f.chars < u8::MAX => {
                    (room == u32::MAX || f.flags & Facts::UTF8 != 0).then_some(room)
                }
                _ => None,
            };
            let ok = if let Some(room) = fits {
                u32::from(f.chars) <= room
            } else if f.flags & Facts::EOG != 0 {
                can_end
            } else if f.flags & Facts::EMPTY != 0 || !first[f.head[0] as usize] {
                false
            } else if f.flags & Facts::ONE_BYTE != 0 {
                true
            } else if in_string.is_some() {
                // Inside a string the first bytes met are many (the tokens that close it).
                push_all(&mut { *state }, piece(t as u32))
            } else {
                let b0 = f.head[0];
                let next = second[b0 as usize].get_or_insert_with(|| {
                    let mut after = *state;
                    push_all(&mut after, &[b0]);
                    std::array::from_fn(|b| push_all(&mut { after }, &[b as u8]))
                });
                next[f.head[1] as usize] && push_all(&mut { *state }, piece(t as u32))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> bool {
        JsonPrefix::new().push_all(text.as_bytes())
    }

    fn complete(text: &str) -> bool {
        let mut s = JsonPrefix::new();
        s.push_all(text.as_bytes()) && s.is_complete()
    }

    #[test]
    fn whole_objects_are_complete() {
        for t in [
            r#"{}"#,
            r#"{"a": 1}"#,
            r#"{"a": [1, -2.5e+3, 0, 0.25, true, false, null, "x\"\u00e9"], "b": {"c": {}}}"#,
            "{\"emoji\": \"é ü\"}\n",
            r#"{"pair": "\ud83d\ude00 \uD83D\uDE00 \u00e9 \ud7ff \ue000"}"#,
        ] {
            assert!(complete(t), "{t}");
        }
    }

    #[test]
    fn prefixes_are_accepted_but_not_complete() {
        for t in [r#"{"#, r#"{"a"#, r#"{"a": "#, r#"{"a": [1, 2"#, r#"{"a": tr"#, r#"{"a": -"#] {
            assert!(ok(t), "{t}");
            assert!(!complete(t), "{t}");
        }
    }

    #[test]
    fn what_no_json_object_starts_with_is_refused() {
        for t in [
            "[1]",
            " {}",
            "{\"a\":                                  1}",
            "\"s\"",
            "Sure! {",
            "{a: 1}",
            "{\"a\" 1}",
            "{\"a\": 01}",
            "{\"a\": 1,}",
            "{\"a\": [1,]}",
            "{\"a\": tru }",
            "{\"a\": \"\u{1}\"}",
            "{\"a\": \"\\x\"}",
            "{\"a\": 1}}",
            "{\"a\": 1} x",
            "{\"a\": -}",
            "{\"a\": 1.}",
            "{\"a\": [}",
            r#"{"a": "\ud83d"}"#,
            r#"{"a": "\ude00"#,
            r#"{"a": "\ud83d\u0041"#,
            r#"{"a": "\ud83dx"#,
        ] {
            assert!(!ok(t), "{t}");
        }
    }

    #[test]
    fn number_parts_are_bounded() {
        let sixteen = "1".repeat(16);
        for (t, good) in [
            (format!("{{\"a\": {sixteen}}}"), true),
            (format!("{{\"a\": -{sixteen}.{sixteen}e-999}}"), true),
            (format!("{{\"a\": {sixteen}1"), false),
            (format!("{{\"a\": 0.{sixteen}1"), false),
            ("{\"a\": 1e1000".to_string(), false),
            (format!("{{\"a\": [{sixteen}, {sixteen}]}}"), true),
        ] {
            assert_eq!(ok(&t), good, "{t}");
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!("{{\"a\": {}", "[".repeat(MAX_DEPTH as usize - 1));
        assert!(ok(&deep));
        assert!(!ok(&format!("{deep}[")));
    }

    #[test]
    fn the_mask_allows_continuations_and_the_end_only_when_closed() {
        let pieces: [&[u8]; 5] = [b"{\"", b"a\":", b" 1}", b"hello", b""];
        let vocab = JsonVocab::new(5, |t| pieces[t as usize], |t| t == 4);
        let mut m = JsonMask::new(&JsonFormat::Object);
        let mut logits = [0.0; 5];
        assert!(m.apply(&mut logits, &vocab, |t| pieces[t as usize]));
        assert_eq!(logits.map(|l| l == 0.0), [true, false, false, false, false]);
        for piece in &pieces[..3] {
            m.accept(piece);
        }
        assert!(m.is_complete());
        let mut logits = [0.0; 5];
        assert!(m.apply(&mut logits, &vocab, |t| pieces[t as usize]));
        assert_eq!(logits.map(|l| l == 0.0), [false, false, false, false, true]);
    }

    /// `masked` leaves the logits alone, masks its own row, reuses it, and the heap it then holds
    /// is what `heap_bytes` tells the planner.
    #[test]
    fn the_masked_row_is_the_vocabularys_own_and_its_heap_is_counted() {
        let pieces: [&[u8]; 5] = [b"{\"", b"a\":", b" 1}", b"hello", b""];
        let mut vocab = JsonVocab::new(5, |t| pieces[t as usize], |t| t == 4);
        let m = JsonMask::new(&JsonFormat::Object);
        let logits = [0.5; 5];
        let row = vocab.masked(&logits, &m, |t| pieces[t as usize]).unwrap();
        assert_eq!(
            row.iter().map(|&l| l == 0.5).collect::<Vec<_>>(),
            [true, false, false, false, false]
        );
        assert_eq!(logits, [0.5; 5]);
        let first = vocab.row.as_ptr();
        vocab.masked(&logits, &m, |t| pieces[t as usize]).unwrap();
        assert_eq!(vocab.row.as_ptr(), first, "the row is reused, not reallocated");
        let held = vocab.tokens.capacity() * std::mem::size_of::<Facts>()
            + vocab.row.capacity() * std::mem::size_of::<f32>();
        assert_eq!(held, JsonVocab::heap_bytes(5));
        // A state no token continues: no row to sample from.
        let mut done = JsonMask::new(&JsonFormat::Object);
        for piece in &pieces[..3] {
            done.accept(piece);
        }
        let two: [&[u8]; 2] = [b"x", b" y"];
        let mut stuck = JsonVocab::new(2, |t| two[t as usize], |_| false);
        assert!(stuck.masked(&[0.0; 2], &done, |t| two[t as usize]).is_none());
    }

    /// Every filter of the pass (string flags, first and second bytes) decides as stepping each
    /// token's bytes from the state would.
    #[test]
    fn the_filters_decide_as_stepping_would() {
        let pieces: [&[u8]; 16] = [
            b"abc",
            b"\"",
            b"x\"}",
            b"\\n",
            b"\n",
            b" \xc3\xa9",
            b"\"\t",
            b"a\\",
            b" ",
            b" }",
            b" ,",
            b",\n",
            b"12",
            b"1",
            b"  \"",
            b"}\n",
        ];
        let vocab = JsonVocab::new(16, |t| pieces[t as usize], |_| false);
        for prefix in
            [&b"{\"k\": \"v"[..], b"{\"k", b"{\"k\": 1", b"{\"k\": \"v\"", b"{", b"{\"k\":"]
        {
            let mut m = JsonMask::new(&JsonFormat::Object);
            m.accept(prefix);
            let mut fast = [0.0; 16];
            m.apply(&mut fast, &vocab, |t| pieces[t as usize]);
            let mut state = JsonPrefix::new();
            assert!(state.push_all(prefix));
            let stepped = pieces.map(|p| {
                let mut s = state;
                s.push_all(p)
            });
            assert_eq!(fast.map(|l| l == 0.0), stepped, "after {:?}", std::str::from_utf8(prefix));
            let mut slow = [0.0; 16];
            m.apply(&mut slow, &vocab.without_string_flags(), |t| pieces[t as usize]);
            assert_eq!(fast, slow, "after {:?}", std::str::from_utf8(prefix));
        }
    }
}
