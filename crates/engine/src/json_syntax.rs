//! The JSON syntax checker under JSON mode and schemas: [`JsonPrefix`] takes an answer a byte at
//! a time and says whether it is still a prefix of some JSON object (RFC 8259), with bounds on
//! depth, whitespace runs and digits that keep a model from spending its budget on them. It is
//! small enough to copy (the container stack is a bit per level in a `u128`), so [`crate::json`]
//! tries every vocabulary token's bytes on a copy, and [`crate::json_schema`] runs one under
//! each schema reading.

/// Containers nested deeper than this are refused (the stack is one bit per level).
pub const MAX_DEPTH: u32 = 128;

/// Whitespace bytes in a row outside strings at most (a line break and its indentation), so a
/// model cannot fill its token budget with blanks; llama.cpp's JSON grammar bounds it likewise.
pub const MAX_WS_RUN: u8 = 32;

/// Digits a number's integer part and its fraction may have each, and its exponent: past them a
/// model stuck on one digit (`1000000…`) would run to its token limit and leave the answer
/// unparsable. llama.cpp's JSON grammars bound numbers the same way (16 integer digits).
pub const MAX_DIGITS: u8 = 16;
pub const MAX_EXP_DIGITS: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Before the top-level object: the answer starts with `{`.
    Start,
    /// A value is expected (after `:`, `[` or `,` in an array).
    Value,
    /// In an array right after `[`: a value or `]`.
    ValueOrClose,
    /// In an object: a key string is expected (after `,`).
    Key,
    /// In an object right after `{`: a key or `}`.
    KeyOrClose,
    /// After a key: `:`.
    Colon,
    /// After a value inside a container: `,` or the closing bracket.
    AfterValue,
    /// Inside a string; `key` says whether it is an object key.
    Str { key: bool },
    /// After a backslash in a string.
    Escape { key: bool },
    /// In a `\uXXXX` escape with this many hex digits left.
    Hex { key: bool, left: u8, u: Utf16 },
    /// After a high surrogate's `\uXXXX`: `\` (`slash` false) and `u` must follow, then the
    /// low surrogate.
    Pair { key: bool, slash: bool },
    /// In a number; the part we are in.
    Num(Num),
    /// In `true`, `false` or `null`: the literal and how many bytes are matched.
    Lit { word: u8, at: u8 },
    /// The top-level object is closed: only whitespace may follow.
    Done,
}

/// What a `\uXXXX` escape may be, decided by its first two digits: surrogates come in pairs
/// (a lone one is valid JSON grammar but no character, and most parsers refuse it), so a high
/// surrogate (`D800`–`DBFF`) must be followed by a low one (`DC00`–`DFFF`) and a low one is
/// refused anywhere else. Refusing at the second digit leaves no dead end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Utf16 {
    /// A first escape: any code unit but a low surrogate.
    Unit,
    /// A first escape whose first digit is `d`.
    UnitD,
    /// A high surrogate: the pair's second escape follows.
    High,
    /// The pair's second escape: a low surrogate.
    Low,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Num {
    /// After `-`.
    Minus,
    /// After a leading `0`.
    Zero,
    /// In the integer digits.
    Int,
    /// After `.`.
    Dot,
    /// In the fraction digits.
    Frac,
    /// After `e`/`E`.
    Exp,
    /// After the exponent's sign.
    ExpSign,
    /// In the exponent digits.
    ExpInt,
}

impl Num {
    /// Whether a number may end in this part (not after `-`, `.`, `e` or the exponent's sign).
    fn can_end(self) -> bool {
        !matches!(self, Num::Minus | Num::Dot | Num::Exp | Num::ExpSign)
    }
}

const WORDS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// What [`JsonPrefix::feed`] did with a byte of a single value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Feed {
    /// The byte is part of the value.
    Took,
    /// The value was already whole (a number ends only at the byte after it): the byte is not
    /// part of it, and the state is the finished value's.
    Ended,
    /// The byte cannot continue the value.
    Refused,
}

/// The state of a JSON text read so far: `Copy`, so trying a token is a copy and a few steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonPrefix {
    mode: Mode,
    /// Bit `i` set: level `i` is an object (clear: an array).
    stack: u128,
    depth: u32,
    /// Whitespace bytes in a row outside strings.
    ws: u8,
    /// Digits read in the part of a number the reader is in ([`MAX_DIGITS`]).
    digits: u8,
}

impl Default for JsonPrefix {
    fn default() -> Self {
        JsonPrefix { mode: Mode::Start, stack: 0, depth: 0, ws: 0, digits: 0 }
    }
}

/// True if `bytes` can stand anywhere inside a JSON string: no quote, backslash or control
/// character (and not empty). Such a token keeps a string open whatever came before it.
pub fn string_safe(bytes: &[u8]) -> bool {
    !bytes.is_empty() && bytes.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\')
}

pub(crate) fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl JsonPrefix {
    pub fn new() -> JsonPrefix {
        JsonPrefix::default()
    }

    /// A checker for one JSON value of any kind (the schema checker's free values), fed from
    /// the value's first byte on through [`JsonPrefix::feed`].
    pub(crate) fn value() -> JsonPrefix {
        JsonPrefix { mode: Mode::Value, ..JsonPrefix::default() }
    }

    /// True once the top-level object is closed.
    pub fn is_complete(&self) -> bool {
        self.mode == Mode::Done
    }

    /// True when the text read so far is a whole value: closed, or a number that may end here.
    pub(crate) fn can_end(&self) -> bool {
        match self.mode {
            Mode::Done => true,
            Mode::Num(n) => self.depth == 0 && n.can_end(),
            _ => false,
        }
    }

    /// True while a number is being read at the top level (the schema checker's integers).
    pub(crate) fn in_number(&self) -> bool {
        matches!(self.mode, Mode::Num(_)) && self.depth == 0
    }

    /// True inside a string, past any escape.
    pub(crate) fn in_plain_string(&self) -> bool {
        matches!(self.mode, Mode::Str { .. })
    }

    /// One byte of a single value ([`JsonPrefix::value`]): unlike [`JsonPrefix::push`], a byte
    /// after the whole value (whitespace included) is left to the caller.
    pub(crate) fn feed(&mut self, b: u8) -> Feed {
        if self.mode == Mode::Done {
            return Feed::Ended;
        }
        let before = *self;
        let took = self.push(b);
        // A top-level number ends at the first byte that does not continue it: `push` then
        // moves to `Done` and reads the byte as what follows. Here that byte is the caller's.
        if before.in_number() && (!took || self.mode == Mode::Done) {
            if before.can_end() {
                *self = JsonPrefix { mode: Mode::Done, ..before };
                return Feed::Ended;
            }
            return Feed::Refused;
        }
        if took {
            Feed::Took
        } else {
            Feed::Refused
        }
    }

    /// Feeds `bytes`; false (and the state is then unspecified) if they cannot continue a JSON
    /// object.
    pub fn push_all(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.push(b))
    }

    fn in_object(&self) -> bool {
        self.depth > 0 && (self.stack >> (self.depth - 1)) & 1 == 1
    }

    fn open(&mut self, object: bool) -> bool {
        if self.depth >= MAX_DEPTH {
            return false;
        }
        if object {
            self.stack |= 1 << self.depth;
        } else {
            self.stack &= !(1 << self.depth);
        }
        self.depth += 1;
        self.mode = if object { Mode::KeyOrClose } else { Mode::ValueOrClose };
        true
    }

    /// A value ended: back in the enclosing container, or done at the top.
    fn value_done(&mut self) {
        self.mode = if self.depth == 0 { Mode::Done } else { Mode::AfterValue };
    }

    fn close(&mut self, b: u8) -> bool {
        let want = if self.in_object() { b'}' } else { b']' };
        if b != want {
            return false;
        }
        self.depth -= 1;
        self.value_done();
        true
    }

    /// The first byte of a value.
    fn start_value(&mut self, b: u8) -> bool {
        match b {
            b'{' => self.open(true),
            b'[' => self.open(false),
            b'"' => {
                self.mode = Mode::Str { key: false };
                true
            }
            b'-' => {
                self.mode = Mode::Num(Num::Minus);
                true
            }
            b'0' => {
                self.mode = Mode::Num(Num::Zero);
                true
            }
            b'1'..=b'9' => {
                self.mode = Mode::Num(Num::Int);
                self.digits = 1;
                true
            }
            _ => match WORDS.iter().position(|w| w[0] == b) {
                Some(w) => {
                    self.mode = Mode::Lit { word: w as u8, at: 1 };
                    true
                }
                None => false,
            },
        }
    }

    /// One byte; false if it cannot continue a JSON object.
    pub fn push(&mut self, b: u8) -> bool {
        let in_str = matches!(
            self.mode,
            Mode::Str { .. } | Mode::Escape { .. } | Mode::Hex { .. } | Mode::Pair { .. }
        );
        if !in_str && is_ws(b) {
            if self.ws == MAX_WS_RUN || self.mode == Mode::Start {
                return false;
            }
            self.ws += 1;
        } else {
            self.ws = 0;
        }
        self.step(b)
    }

    fn step(&mut self, b: u8) -> bool {
        match self.mode {
            Mode::Start => b == b'{' && self.open(true),
            Mode::Done => is_ws(b),
            Mode::Value => is_ws(b) || self.start_value(b),
            Mode::ValueOrClose => is_ws(b) || (b == b']' && self.close(b)) || self.start_value(b),
            Mode::Key | Mode::KeyOrClose => {
                if is_ws(b) {
                    true
                } else if b == b'"' {
                    self.mode = Mode::Str { key: true };
                    true
                } else {
                    self.mode == Mode::KeyOrClose && b == b'}' && self.close(b)
                }
            }
            Mode::Colon => {
                if b == b':' {
                    self.mode = Mode::Value;
                }
                is_ws(b) || b == b':'
            }
            Mode::AfterValue => {
                if is_ws(b) {
                    true
                } else if b == b',' {
                    self.mode = if self.in_object() { Mode::Key } else { Mode::Value };
                    true
                } else {
                    (b == b'}' || b == b']') && self.close(b)
                }
            }
            Mode::Str { key } => match b {
                b'"' => {
                    if key {
                        self.mode = Mode::Colon;
                    } else {
                        self.value_done();
                    }
                    true
                }
                b'\\' => {
                    self.mode = Mode::Escape { key };
                    true
                }
                // Control characters must be escaped; UTF-8 bytes pass (the text is valid UTF-8
                // by construction of the tokens' bytes once joined).
                0x00..=0x1f => false,
                _ => true,
            },
            Mode::Escape { key } => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                    self.mode = Mode::Str { key };
                    true
                }
                b'u' => {
                    self.mode = Mode::Hex { key, left: 4, u: Utf16::Unit };
                    true
                }
                _ => false,
            },
            Mode::Hex { key, left, u } => {
                let Some(d) = (b as char).to_digit(16) else { return false };
                let u = match (left, u, d) {
                    (4, Utf16::Unit, 0xd) => Utf16::UnitD,
                    (4, Utf16::Low, d) if d != 0xd => return false,
                    (3, Utf16::UnitD, 0x8..=0xb) => Utf16::High,
                    (3, Utf16::UnitD, 0xc..) => return false,
                    (3, Utf16::UnitD, _) => Utf16::Unit,
                    (3, Utf16::Low, d) if d < 0xc => return false,
                    (_, u, _) => u,
                };
                self.mode = match (left, u) {
                    (1, Utf16::High) => Mode::Pair { key, slash: false },
                    (1, _) => Mode::Str { key },
                    _ => Mode::Hex { key, left: left - 1, u },
                };
                true
            }
            Mode::Pair { key, slash } => {
                self.mode = match (slash, b) {
                    (false, b'\\') => Mode::Pair { key, slash: true },
                    (true, b'u') => Mode::Hex { key, left: 4, u: Utf16::Low },
                    _ => return false,
                };
                true
            }
            Mode::Lit { word, at } => {
                let w = WORDS[word as usize];
                if w[at as usize] != b {
                    return false;
                }
                if at as usize + 1 == w.len() {
                    self.value_done();
                } else {
                    self.mode = Mode::Lit { word, at: at + 1 };
                }
                true
            }
            Mode::Num(n) => self.number(n, b),
        }
    }

    fn number(&mut self, n: Num, b: u8) -> bool {
        let digit = b.is_ascii_digit();
        let next = match (n, b) {
            (Num::Minus, b'0') => Some(Num::Zero),
            (Num::Minus, _) if digit => Some(Num::Int),
            (Num::Int, _) if digit => Some(Num::Int),
            (Num::Zero | Num::Int, b'.') => Some(Num::Dot),
            (Num::Zero | Num::Int | Num::Frac | Num::ExpInt, _) if digit && n != Num::Zero => {
                Some(n)
            }
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Some(Num::Exp),
            (Num::Dot | Num::Frac, _) if digit => Some(Num::Frac),
            (Num::Exp, b'+' | b'-') => Some(Num::ExpSign),
            (Num::Exp | Num::ExpSign | Num::ExpInt, _) if digit => Some(Num::ExpInt),
            _ => None,
        };
        // A digit part may hold so many digits; then the number ends (or the byte is refused).
        let next = next.filter(|&m| {
            let most = match m {
                Num::Int | Num::Frac => MAX_DIGITS,
                Num::ExpInt => MAX_EXP_DIGITS,
                _ => return true,
            };
            let digits = if m == n { self.digits + 1 } else { 1 };
            self.digits = digits;
            digits <= most
        });
        if let Some(n) = next {
            self.mode = Mode::Num(n);
            return true;
        }
        // The number may end here: the byte then belongs to what follows it.
        if !n.can_end() {
            return false;
        }
        self.value_done();
        self.step(b)
    }
}
