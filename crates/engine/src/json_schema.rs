//! Structured output: the answer must be one JSON value that a JSON Schema accepts (OpenAI's
//! `response_format: {"type": "json_schema"}`, Ollama's `format: {schema}`).
//!
//! [`Schema::compile`] turns a schema into a graph of nodes once per request and refuses,
//! with a message that names the keyword, any schema it cannot enforce exactly: a keyword
//! outside the subset below, a `$ref` that leads back to itself before any bracket.
//! [`SchemaPrefix`] then reads the answer a byte at a time like [`JsonPrefix`], whose states it
//! reuses for the values the schema leaves free (strings, numbers, literals, anything under
//! `{}`); it is `Copy` (a fixed stack of [`MAX_NEST`] frames), so the mask tries each vocabulary
//! token on a copy.
//!
//! A union's branches are chosen by the value's first byte when that tells them apart (an
//! object or null, a string or a number). When it does not (two object types, as pydantic
//! writes `Union[A, B]`; an integer or a number), [`SchemaSet`] reads the answer with one
//! [`SchemaPrefix`] per branch still possible, up to [`MAX_READINGS`] at once, and drops each
//! as the answer rules it out; past that many, the earliest branches are kept (every answer
//! still matches the schema, the latest branches are just not offered then).
//!
//! The subset: `type` (one or a list), `properties` with `required` (keys in any order, each at
//! most once, no others), `additionalProperties` (a map when there are no properties), `items`
//! with `minItems`/`maxItems`, strings with `minLength`/`maxLength` (in characters, as JSON
//! Schema counts them: code points, an escape one), `enum` and `const` of strings, numbers,
//! booleans and null (which then decide alone),
//! `anyOf`/`oneOf`, and local `$ref`s into `$defs`/`definitions` (recursion included).
//! Annotations (`title`, `description`, `default`, `examples`, `format`, ...) are ignored.
//! Value ranges and patterns are refused rather than ignored: the answer would not always
//! satisfy them.
//!
//! Cost: the schema is compiled per request (its size is bounded by the request body). Per
//! sampled token the mask is [`crate::json`]'s pass over the vocabulary with a state of ~320
//! bytes, which the pass's byte filters copy only for the few tokens that pass them. A schema
//! with a union the first byte cannot decide is read through a [`SchemaSet`] instead, which the
//! pass copies whole (~2.6 KB): see BENCHMARKS.md for what that costs a token.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::json::{is_ws, Feed, JsonPrefix, MAX_WS_RUN};

/// Containers the schema describes that may be open at once (a free `{}` value nests inside
/// [`JsonPrefix`]'s own stack instead).
pub const MAX_NEST: usize = 16;

/// Properties of one object and values of one `enum` at most (each is a bit of a mask).
pub const MAX_CHOICES: usize = 64;

/// Nodes of one compiled schema at most.
pub const MAX_NODES: usize = 4096;

/// Readings of one answer a [`SchemaSet`] follows at once (branches of unions the answer has
/// not yet told apart).
pub const MAX_READINGS: usize = 8;

type NodeId = u16;

/// Keywords that only describe a value: accepted and ignored.
const ANNOTATIONS: [&str; 13] = [
    "title",
    "description",
    "default",
    "examples",
    "format",
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
    "readOnly",
    "writeOnly",
    "deprecated",
];

/// One part of a compiled schema.
#[derive(Clone, Debug)]
enum Node {
    /// Any JSON value.
    Any,
    Str,
    /// A string of `min..=max` characters.
    StrLen {
        min: u32,
        max: u32,
    },
    Num,
    Int,
    Bool,
    Null,
    /// One of these JSON texts (compact: the way `serde_json` writes the enum's values).
    Lit(Vec<Vec<u8>>),
    /// An object with these keys (their JSON text, quotes included) and value nodes, and the
    /// keys that must be present (a bit per key).
    Object {
        keys: Vec<Vec<u8>>,
        values: Vec<NodeId>,
        required: u64,
    },
    /// An object with any keys, each value of this node.
    Map(NodeId),
    Array {
        items: NodeId,
        min: u32,
        max: u32,
    },
    /// One of these nodes. Branches whose values start differently are told apart by the first
    /// byte; the others are read side by side ([`SchemaSet`]) until the answer tells them apart.
    OneOf(Vec<NodeId>),
    /// The same as another node (a `$ref`).
    Alias(NodeId),
}

/// 256 bits: the bytes a value may start with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ByteSet([u64; 4]);

impl ByteSet {
    fn of(bytes: &[u8]) -> ByteSet {
        let mut s = ByteSet::default();
        for &b in bytes {
            s.0[b as usize / 64] |= 1 << (b % 64);
        }
        s
    }
    fn has(&self, b: u8) -> bool {
        self.0[b as usize / 64] >> (b % 64) & 1 == 1
    }
    fn union(self, o: ByteSet) -> ByteSet {
        ByteSet(std::array::from_fn(|i| self.0[i] | o.0[i]))
    }
    fn meets(&self, o: &ByteSet) -> bool {
        (0..4).any(|i| self.0[i] & o.0[i] != 0)
    }
}

const NUMBER_START: &[u8] = b"-0123456789";

/// A compiled JSON schema (node 0 is the root).
#[derive(Debug)]
pub struct Schema {
    nodes: Vec<Node>,
    /// The bytes each node's values may start with.
    first: Vec<ByteSet>,
    /// Some union has branches a value's first byte does not tell apart (two object types, a
    /// string and a string enum, ...): answers are then read by several [`SchemaPrefix`]es.
    forks: bool,
}

/// Compiling: the whole schema document (for `$ref`s) and the nodes made so far.
struct Compiler<'a> {
    root: &'a Value,
    nodes: Vec<Node>,
    refs: HashMap<String, NodeId>,
}

fn err<T>(msg: impl Into<String>) -> Result<T, String> {
    Err(msg.into())
}

impl Schema {
    /// Compiles `schema`; the error says what is not supported and where.
    pub fn compile(schema: &Value) -> Result<Schema, String> {
        // Node 0 stands for the root (compiled after the nodes it holds).
        let mut c = Compiler { root: schema, nodes: vec![Node::Any], refs: HashMap::new() };
        let root = c.node(schema, "#", 0)?;
        c.nodes[0] = Node::Alias(root);
        let mut first = Vec::with_capacity(c.nodes.len());
        for id in 0..c.nodes.len() {
            first.push(first_bytes(&c.nodes, id as NodeId, &mut Vec::new())?);
        }
        let forks = c.nodes.iter().any(|node| match node {
            Node::OneOf(alts) => alts.iter().enumerate().any(|(i, a)| {
                alts[..i].iter().any(|b| first[*a as usize].meets(&first[*b as usize]))
            }),
            _ => false,
        });
        Ok(Schema { nodes: c.nodes, first, forks })
    }

    /// Calls `f` with each branch of `node` (past aliases and nested unions), in the schema's
    /// order, whose values may start with `b`; `node` itself if it is no union.
    fn branches(&self, node: NodeId, b: u8, f: &mut impl FnMut(NodeId)) {
        let (id, n) = self.node(node);
        match n {
            // Aliases and unions reach a byte-reading node without looping (compile checks).
            Node::OneOf(alts) => alts.iter().for_each(|&a| self.branches(a, b, f)),
            _ if self.first[id as usize].has(b) => f(id),
            _ => {}
        }
    }

    /// The node `id` stands for, past any aliases (which never form a cycle: compile checks).
    fn node(&self, mut id: NodeId) -> (NodeId, &Node) {
        loop {
            match &self.nodes[id as usize] {
                Node::Alias(to) => id = *to,
                n => return (id, n),
            }
        }
    }
}

/// The bytes node `id`'s values start with; an error if a union or alias reaches itself
/// before any byte is read (the checker would loop).
fn first_bytes(nodes: &[Node], id: NodeId, path: &mut Vec<NodeId>) -> Result<ByteSet, String> {
    if path.contains(&id) {
        return err("a $ref refers back to itself before any object or array opens");
    }
    Ok(match &nodes[id as usize] {
        // Any value: what the plain checker takes as a value's first byte (whitespace before a
        // value is read between values, never by a node).
        Node::Any => ByteSet::of(
            &(0..=255u8)
                .filter(|&b| !is_ws(b) && JsonPrefix::value().feed(b) == Feed::Took)
                .collect::<Vec<_>>(),
        ),
        Node::Str | Node::StrLen { .. } => ByteSet::of(b"\""),
        Node::Num | Node::Int => ByteSet::of(NUMBER_START),
        Node::Bool => ByteSet::of(b"tf"),
        Node::Null => ByteSet::of(b"n"),
        Node::Lit(texts) => {
            texts.iter().fold(ByteSet::default(), |s, t| s.union(ByteSet::of(&t[..1])))
        }
        Node::Object { .. } | Node::Map(_) => ByteSet::of(b"{"),
        Node::Array { .. } => ByteSet::of(b"["),
        Node::OneOf(alts) => {
            path.push(id);
            let mut s = ByteSet::default();
            for &a in alts {
                s = s.union(first_bytes(nodes, a, path)?);
            }
            path.pop();
            s
        }
        Node::Alias(to) => {
            path.push(id);
            let s = first_bytes(nodes, *to, path)?;
            path.pop();
            s
        }
    })
}

impl Compiler<'_> {
    fn push(&mut self, n: Node) -> Result<NodeId, String> {
        if self.nodes.len() >= MAX_NODES {
            return err(format!("the schema is too large (more than {MAX_NODES} parts)"));
        }
        self.nodes.push(n);
        Ok((self.nodes.len() - 1) as NodeId)
    }

    /// Compiles the schema `v` found at `at` (a JSON pointer, for messages).
    fn node(&mut self, v: &Value, at: &str, depth: usize) -> Result<NodeId, String> {
        if depth > 64 {
            return err(format!("{at}: the schema nests more than 64 levels"));
        }
        let o = match v {
            Value::Bool(true) => return self.push(Node::Any),
            Value::Bool(false) => return err(format!("{at}: the schema `false` accepts nothing")),
            Value::Object(o) => o,
            _ => return err(format!("{at}: a schema must be an object or a boolean")),
        };
        for k in o.keys() {
            let known = [
                "type",
                "properties",
                "required",
                "additionalProperties",
                "items",
                "minItems",
                "maxItems",
                "minLength",
                "maxLength",
                "enum",
                "const",
                "anyOf",
                "oneOf",
                "$ref",
            ];
            if !known.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) {
                return err(format!(
                    "{at}: the JSON schema keyword \"{k}\" is not supported (supported: type, \
                     properties, required, additionalProperties, items, minItems, maxItems, \
                     minLength, maxLength, enum, const, anyOf, oneOf, $ref into $defs)"
                ));
            }
        }
        if let Some(r) = o.get("$ref") {
            return self.reference(r, at, depth);
        }
        if let Some(c) = o.get("const") {
            return self.literals(std::slice::from_ref(c), at);
        }
        if let Some(e) = o.get("enum") {
            let Value::Array(vals) = e else { return err(format!("{at}/enum: must be an array")) };
            return self.literals(vals, at);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = o.get(key) {
                let Value::Array(alts) = alts else {
                    return err(format!("{at}/{key}: must be an array of schemas"));
                };
                if alts.is_empty() {
                    return err(format!("{at}/{key}: must not be empty"));
                }
                let ids = alts
                    .iter()
                    .enumerate()
                    .map(|(i, a)| self.node(a, &format!("{at}/{key}/{i}"), depth + 1))
                    .collect::<Result<Vec<_>, _>>()?;
                return self.push(Node::OneOf(ids));
            }
        }
        let types: Vec<&str> = match o.get("type") {
            None if o.contains_key("properties") || o.contains_key("additionalProperties") => {
                vec!["object"]
            }
            None if o.contains_key("items") => vec!["array"],
            None => {
                // A bound on strings or arrays alone would leave other values free and the
                // bounded ones unchecked: ask for the type instead of half-enforcing it.
                if let Some(k) = ["minLength", "maxLength", "minItems", "maxItems"]
                    .into_iter()
                    .find(|k| o.contains_key(*k))
                {
                    return err(format!(
                        "{at}: \"{k}\" needs a \"type\" (\"string\" or \"array\") beside it"
                    ));
                }
                return self.push(Node::Any);
            }
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) if !ts.is_empty() => ts
                .iter()
                .map(|t| t.as_str().ok_or_else(|| format!("{at}/type: must hold strings")))
                .collect::<Result<_, _>>()?,
            Some(_) => return err(format!("{at}/type: must be a string or a list of strings")),
        };
        let mut ids = Vec::new();
        let has_number = types.contains(&"number");
        for t in &types {
            let id = match *t {
                "string" => self.string(o, at)?,
                "number" => self.push(Node::Num)?,
                // An integer is also a number: `["number", "integer"]` is a number.
                "integer" if has_number => continue,
                "integer" => self.push(Node::Int)?,
                "boolean" => self.push(Node::Bool)?,
                "null" => self.push(Node::Null)?,
                "object" => self.object(o, at, depth)?,
                "array" => self.array(o, at, depth)?,
                other => return err(format!("{at}/type: unknown type \"{other}\"")),
            };
            ids.push(id);
        }
        match ids[..] {
            [one] => Ok(one),
            _ => self.push(Node::OneOf(ids)),
        }
    }

    fn reference(&mut self, r: &Value, at: &str, depth: usize) -> Result<NodeId, String> {
        let Some(r) = r.as_str() else { return err(format!("{at}/$ref: must be a string")) };
        if let Some(&id) = self.refs.get(r) {
            return Ok(id);
        }
        let target = r
            .strip_prefix('#')
            .and_then(|p| if p.is_empty() { Some(self.root) } else { self.root.pointer(p) })
            .ok_or_else(|| {
                format!("{at}/$ref: \"{r}\" is not a definition in this schema (only local refs such as #/$defs/Name)")
            })?;
        // Reserve the node first: a recursive schema refers to it while it is being compiled.
        let id = self.push(Node::Any)?;
        self.refs.insert(r.to_string(), id);
        let body = self.node(target, r, depth + 1)?;
        self.nodes[id as usize] = Node::Alias(body);
        Ok(id)
    }

    fn literals(&mut self, vals: &[Value], at: &str) -> Result<NodeId, String> {
        if vals.is_empty() || vals.len() > MAX_CHOICES {
            return err(format!("{at}: an enum needs 1 to {MAX_CHOICES} values"));
        }
        let mut texts: Vec<Vec<u8>> = Vec::new();
        for v in vals {
            if v.is_array() || v.is_object() {
                return err(format!(
                    "{at}: enum and const values must be strings, numbers, booleans or null"
                ));
            }
            let t = v.to_string().into_bytes();
            if !texts.contains(&t) {
                texts.push(t);
            }
        }
        self.push(Node::Lit(texts))
    }

    fn object(&mut self, o: &Map<String, Value>, at: &str, depth: usize) -> Result<NodeId, String> {
        let props = match o.get("properties") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => return err(format!("{at}/properties: must be an object")),
        };
        let extra = match o.get("additionalProperties") {
            None | Some(Value::Bool(false)) => None,
            Some(v) => Some(v),
        };
        let required: Vec<&str> = match o.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r
                .iter()
                .map(|k| k.as_str().ok_or_else(|| format!("{at}/required: must hold strings")))
                .collect::<Result<_, _>>()?,
            Some(_) => return err(format!("{at}/required: must be an array of strings")),
        };
        let Some(props) = props.filter(|p| !p.is_empty()) else {
            if let Some(k) = required.first() {
                return err(format!("{at}/required: \"{k}\" is not in properties"));
            }
            // No declared keys: a map of additionalProperties' values, or any object when that
            // is absent too (`false` alone leaves only `{}`).
            return match (extra, o.get("additionalProperties")) {
                (Some(v), _) => {
                    let id = self.node(v, &format!("{at}/additionalProperties"), depth + 1)?;
                    self.push(Node::Map(id))
                }
                (None, Some(_)) => {
                    self.push(Node::Object { keys: vec![], values: vec![], required: 0 })
                }
                (None, None) => {
                    let any = self.push(Node::Any)?;
                    self.push(Node::Map(any))
                }
            };
        };
        if extra.is_some() {
            return err(format!(
                "{at}: additionalProperties beside properties is not supported (set it to false, \
                 or leave properties out for a map)"
            ));
        }
        if props.len() > MAX_CHOICES {
            return err(format!("{at}/properties: at most {MAX_CHOICES} properties per object"));
        }
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for (k, v) in props {
            keys.push(Value::String(k.clone()).to_string().into_bytes());
            values.push(self.node(v, &format!("{at}/properties/{k}"), depth + 1)?);
        }
        let mut req = 0u64;
        for k in required {
            let i = props
                .keys()
                .position(|p| p == k)
                .ok_or_else(|| format!("{at}/required: \"{k}\" is not in properties"))?;
            req |= 1 << i;
        }
        self.push(Node::Object { keys, values, required: req })
    }

    fn array(&mut self, o: &Map<String, Value>, at: &str, depth: usize) -> Result<NodeId, String> {
        let items = match o.get("items") {
            None => self.push(Node::Any)?,
            Some(v @ (Value::Object(_) | Value::Bool(_))) => {
                self.node(v, &format!("{at}/items"), depth + 1)?
            }
            Some(_) => {
                return err(format!("{at}/items: must be one schema (tuples are not supported)"))
            }
        };
        let (min, max) = bounds(o, at, "minItems", "maxItems")?;
        if min > u16::MAX as u32 {
            return err(format!("{at}: minItems must be at most {}", u16::MAX));
        }
        self.push(Node::Array { items, min, max })
    }

    /// A string, with `minLength`/`maxLength` when the schema gives them.
    fn string(&mut self, o: &Map<String, Value>, at: &str) -> Result<NodeId, String> {
        match bounds(o, at, "minLength", "maxLength")? {
            (0, u32::MAX) => self.push(Node::Str),
            (min, max) => self.push(Node::StrLen { min, max }),
        }
    }
}

/// The bounds `lo`..=`hi` of `o` (0 and `u32::MAX` when absent), checked.
fn bounds(o: &Map<String, Value>, at: &str, lo: &str, hi: &str) -> Result<(u32, u32), String> {
    let bound = |k: &str, default: u32| -> Result<u32, String> {
        match o.get(k) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .map(|n| n.min(u32::MAX as u64) as u32)
                .ok_or_else(|| format!("{at}/{k}: must be a non-negative integer")),
        }
    };
    let (min, max) = (bound(lo, 0)?, bound(hi, u32::MAX)?);
    if min > max {
        return err(format!("{at}: {lo} must be at most {hi}"));
    }
    Ok((min, max))
}

/// A schema container that is open: its node, the items read (arrays) or the keys seen
/// (objects, a bit per declared key).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Frame {
    node: NodeId,
    count: u16,
    seen: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A value of `node` comes next (whitespace first, except at the very start).
    Value { node: NodeId },
    /// In a free value of `node` (any, string, number, integer, boolean, null), read by `free`.
    Free { node: NodeId },
    /// In one of `node`'s literal texts: the ones still possible, and the bytes matched.
    Lit { node: NodeId, cands: u64, at: u16 },
    /// In the open object right after `{`: a key or `}`.
    KeyOrClose,
    /// In the open object after `,`: a key.
    Key,
    /// In a declared key's text (the quote included): the keys still possible, bytes matched.
    KeyText { cands: u64, at: u16 },
    /// In a map's key, read by `free`.
    MapKey,
    /// After a key: `:`, then the value of declared key `prop` (the map's value for a map).
    Colon { prop: u8 },
    /// In the open array right after `[`: an item or `]`.
    ItemOrClose,
    /// In the open array after `,`: an item.
    Item,
    /// After a value in the open container: `,` or the closing bracket.
    AfterValue,
    /// The whole answer is read: only whitespace may follow.
    Done,
}

/// The state of an answer read so far against a [`Schema`] (which each call is given).
#[derive(Clone, Copy, Debug)]
pub struct SchemaPrefix {
    mode: Mode,
    frames: [Frame; MAX_NEST],
    depth: u8,
    free: JsonPrefix,
    /// Whitespace bytes in a row between the schema's tokens.
    ws: u8,
    started: bool,
    /// Which branch the next union whose branches the byte does not tell apart takes, in the
    /// order of [`Schema::branches`] ([`SchemaSet`] sets it; 0 otherwise).
    pick: u8,
    /// Characters read in the free string value being read (for `minLength`/`maxLength`).
    chars: u32,
    /// Where that string's UTF-8 stands (a bounded string must decode to what was counted).
    utf8: Utf8,
}

/// UTF-8 read a byte at a time in a length-bounded string: a byte may start a character or
/// continue one within the ranges RFC 3629 allows (no overlong forms, surrogates or values past
/// U+10FFFF), so the characters counted are exactly those the answer decodes to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Utf8 {
    /// Continuation bytes still expected, and the range of the next one.
    left: u8,
    lo: u8,
    hi: u8,
}

impl Utf8 {
    /// `Some(true)`: `b` starts a character; `Some(false)`: it continues one; `None`: no
    /// UTF-8 text continues with it.
    fn feed(&mut self, b: u8) -> Option<bool> {
        if self.left > 0 {
            if !(self.lo..=self.hi).contains(&b) {
                return None;
            }
            *self = Utf8 { left: self.left - 1, lo: 0x80, hi: 0xBF };
            return Some(false);
        }
        let (left, lo, hi) = match b {
            0x00..=0x7F => (0, 0x80, 0xBF),
            0xC2..=0xDF => (1, 0x80, 0xBF),
            0xE0 => (2, 0xA0, 0xBF),
            0xED => (2, 0x80, 0x9F),
            0xE1..=0xEF => (2, 0x80, 0xBF),
            0xF0 => (3, 0x90, 0xBF),
            0xF4 => (3, 0x80, 0x8F),
            0xF1..=0xF3 => (3, 0x80, 0xBF),
            _ => return None,
        };
        *self = Utf8 { left, lo, hi };
        Some(true)
    }
}

impl Default for SchemaPrefix {
    fn default() -> Self {
        SchemaPrefix {
            mode: Mode::Value { node: 0 },
            frames: [Frame::default(); MAX_NEST],
            depth: 0,
            free: JsonPrefix::value(),
            ws: 0,
            started: false,
            pick: 0,
            chars: 0,
            utf8: Utf8::default(),
        }
    }
}

impl SchemaPrefix {
    pub fn new() -> SchemaPrefix {
        SchemaPrefix::default()
    }

    /// True once the root value is closed.
    pub fn is_complete(&self) -> bool {
        self.mode == Mode::Done
    }

    /// True when the answer may end here: closed, or a root number or literal that is whole.
    pub fn can_end(&self, s: &Schema) -> bool {
        match self.mode {
            Mode::Done => true,
            Mode::Free { .. } => self.depth == 0 && self.free.can_end(),
            Mode::Lit { node, cands, at } => {
                self.depth == 0 && complete_literal(s, node, cands, at)
            }
            _ => false,
        }
    }

    /// Inside a free string (a string value or a map key), past any escape and between whole
    /// characters: how many more characters it may take (`u32::MAX` when unbounded, and then any
    /// bytes); `None` elsewhere.
    pub fn string_room(&self, s: &Schema) -> Option<u32> {
        if !self.free.in_plain_string() {
            return None;
        }
        match self.mode {
            Mode::Free { node } => match s.nodes[node as usize] {
                // Between whole characters only: inside one, tokens are stepped.
                Node::StrLen { max, .. } => {
                    (self.utf8.left == 0).then(|| max.saturating_sub(self.chars))
                }
                _ => Some(u32::MAX),
            },
            Mode::MapKey => Some(u32::MAX),
            _ => None,
        }
    }

    /// Feeds `bytes`; false (and the state is then unspecified) if they cannot continue an
    /// answer the schema accepts.
    pub fn push_all(&mut self, s: &Schema, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.push(s, b))
    }

    fn top(&mut self) -> &mut Frame {
        &mut self.frames[self.depth as usize - 1]
    }

    /// Ways byte `b` may be read here: the branches it could start of a union it does not
    /// decide, else 1.
    fn readings(&self, s: &Schema, b: u8) -> usize {
        let node = match self.mode {
            _ if is_ws(b) => return 1,
            Mode::Value { node } => node,
            Mode::ItemOrClose | Mode::Item if b != b']' => {
                match s.node(self.frames[self.depth as usize - 1].node).1 {
                    Node::Array { items, .. } => *items,
                    _ => return 1,
                }
            }
            _ => return 1,
        };
        if !matches!(s.node(node).1, Node::OneOf(_)) {
            return 1;
        }
        let mut n = 0;
        s.branches(node, b, &mut |_| n += 1);
        n.max(1)
    }

    /// One byte; false if no answer the schema accepts continues with it.
    pub fn push(&mut self, s: &Schema, b: u8) -> bool {
        let between = matches!(
            self.mode,
            Mode::Value { .. }
                | Mode::KeyOrClose
                | Mode::Key
                | Mode::Colon { .. }
                | Mode::ItemOrClose
                | Mode::Item
                | Mode::AfterValue
                | Mode::Done
        );
        if between && is_ws(b) {
            if self.ws == MAX_WS_RUN || !self.started {
                return false;
            }
            self.ws += 1;
            return true;
        }
        if between {
            self.ws = 0;
        }
        self.step(s, b)
    }

    fn value_done(&mut self) {
        self.mode = if self.depth == 0 { Mode::Done } else { Mode::AfterValue };
    }

    fn open(&mut self, node: NodeId, mode: Mode) -> bool {
        if self.depth as usize == MAX_NEST {
            return false;
        }
        self.frames[self.depth as usize] = Frame { node, count: 0, seen: 0 };
        self.depth += 1;
        self.mode = mode;
        true
    }

    /// Closes the open container with `b` if it may close here.
    fn close(&mut self, s: &Schema, b: u8) -> bool {
        let f = *self.top();
        let ok = match s.node(f.node).1 {
            Node::Object { required, .. } => b == b'}' && f.seen & required == *required,
            Node::Map(_) => b == b'}',
            Node::Array { min, .. } => b == b']' && f.count as u32 >= *min,
            _ => false,
        };
        if ok {
            self.depth -= 1;
            self.value_done();
        }
        ok
    }

    /// The first byte of a value of `node`.
    fn start(&mut self, s: &Schema, node: NodeId, b: u8) -> bool {
        self.started = true;
        let (id, n) = s.node(node);
        match n {
            Node::Any
            | Node::Str
            | Node::StrLen { .. }
            | Node::Num
            | Node::Int
            | Node::Bool
            | Node::Null => {
                if !s.first[id as usize].has(b) {
                    return false;
                }
                self.free = JsonPrefix::value();
                self.chars = 0;
                self.utf8 = Utf8::default();
                self.mode = Mode::Free { node: id };
                self.step(s, b)
            }
            Node::Lit(texts) => {
                let cands = narrow(texts, all(texts.len()), 0, b);
                self.mode = Mode::Lit { node: id, cands, at: 1 };
                cands != 0 && self.literal_progress(s)
            }
            Node::Object { .. } | Node::Map(_) => b == b'{' && self.open(id, Mode::KeyOrClose),
            Node::Array { .. } => b == b'[' && self.open(id, Mode::ItemOrClose),
            Node::OneOf(_) => {
                let (mut skip, mut chosen) = (self.pick, None);
                s.branches(id, b, &mut |a| match skip {
                    _ if chosen.is_some() => {}
                    0 => chosen = Some(a),
                    _ => skip -= 1,
                });
                self.pick = 0;
                chosen.is_some_and(|a| self.start(s, a, b))
            }
            Node::Alias(_) => unreachable!("Schema::node resolves aliases"),
        }
    }

    /// After a literal byte: the value is done once every text still possible is whole.
    fn literal_progress(&mut self, s: &Schema) -> bool {
        if let Mode::Lit { node, cands, at } = self.mode {
            let Node::Lit(texts) = s.node(node).1 else { return false };
            if (0..texts.len()).all(|i| cands >> i & 1 == 0 || texts[i].len() == at as usize) {
                self.value_done();
            }
        }
        true
    }

    /// The next item of the open array, if it may have one more.
    fn item(&mut self, s: &Schema, b: u8) -> bool {
        let f = self.top();
        let Node::Array { items, max, .. } = s.node(f.node).1 else { return false };
        if f.count as u32 >= *max || f.count == u16::MAX {
            return false;
        }
        f.count += 1;
        self.start(s, *items, b)
    }

    /// `"` opening a key of the open object (declared keys not yet seen, or a map's free key).
    fn key(&mut self, s: &Schema) -> bool {
        let f = *self.top();
        match s.node(f.node).1 {
            Node::Object { keys, .. } => {
                let cands = all(keys.len()) & !f.seen;
                self.mode = Mode::KeyText { cands, at: 1 };
                cands != 0
            }
            Node::Map(_) => {
                self.free = JsonPrefix::value();
                self.mode = Mode::MapKey;
                self.free.feed(b'"') == Feed::Took
            }
            _ => false,
        }
    }

    fn step(&mut self, s: &Schema, b: u8) -> bool {
        match self.mode {
            Mode::Done => false,
            Mode::Value { node } => self.start(s, node, b),
            Mode::Free { node } => {
                if matches!(s.nodes[node as usize], Node::Int)
                    && self.free.in_number()
                    && matches!(b, b'.' | b'e' | b'E')
                {
                    return false;
                }
                if let Node::StrLen { min, max } = s.nodes[node as usize] {
                    // In the string (not an escape's tail): the closing quote needs `min`
                    // characters and a whole last one; a byte that starts a character (a
                    // backslash starts an escape, which is one) needs room under `max`.
                    if self.free.in_plain_string() {
                        if b == b'"' && self.utf8.left == 0 {
                            if self.chars < min {
                                return false;
                            }
                        } else {
                            match self.utf8.feed(b) {
                                None => return false,
                                Some(true) if self.chars >= max => return false,
                                Some(true) => self.chars += 1,
                                Some(false) => {}
                            }
                        }
                    }
                }
                match self.free.feed(b) {
                    Feed::Took => {
                        if self.free.is_complete() {
                            self.value_done();
                        }
                        true
                    }
                    Feed::Ended => {
                        self.value_done();
                        self.push(s, b)
                    }
                    Feed::Refused => false,
                }
            }
            Mode::Lit { node, cands, at } => {
                let Node::Lit(texts) = s.node(node).1 else { return false };
                let next = narrow(texts, cands, at, b);
                if next != 0 {
                    self.mode = Mode::Lit { node, cands: next, at: at + 1 };
                    return self.literal_progress(s);
                }
                // A whole literal (a number such as 1 beside 10) ends before this byte.
                if complete_literal(s, node, cands, at) {
                    self.value_done();
                    return self.push(s, b);
                }
                false
            }
            Mode::KeyOrClose | Mode::Key => {
                if b == b'"' {
                    self.key(s)
                } else {
                    self.mode == Mode::KeyOrClose && self.close(s, b)
                }
            }
            Mode::KeyText { cands, at } => {
                let f = *self.top();
                let Node::Object { keys, .. } = s.node(f.node).1 else { return false };
                let next = narrow(keys, cands, at, b);
                if next == 0 {
                    return false;
                }
                // A key's text ends with its quote, so a whole key is the only one left.
                let whole = (0..keys.len())
                    .find(|&i| next >> i & 1 == 1 && keys[i].len() == at as usize + 1);
                self.mode = match whole {
                    Some(i) => {
                        self.top().seen |= 1 << i;
                        Mode::Colon { prop: i as u8 }
                    }
                    None => Mode::KeyText { cands: next, at: at + 1 },
                };
                true
            }
            Mode::MapKey => match self.free.feed(b) {
                Feed::Took => {
                    if self.free.is_complete() {
                        self.mode = Mode::Colon { prop: u8::MAX };
                    }
                    true
                }
                Feed::Ended | Feed::Refused => false,
            },
            Mode::Colon { prop } => {
                if b != b':' {
                    return false;
                }
                let node = match s.node(self.top().node).1 {
                    Node::Object { values, .. } => values[prop as usize],
                    Node::Map(v) => *v,
                    _ => return false,
                };
                self.mode = Mode::Value { node };
                true
            }
            Mode::ItemOrClose => (b == b']' && self.close(s, b)) || self.item(s, b),
            Mode::Item => self.item(s, b),
            Mode::AfterValue => {
                let f = *self.top();
                match (s.node(f.node).1, b) {
                    (Node::Object { keys, .. }, b',') => {
                        // Only when a declared key is left for what must follow.
                        let all = all(keys.len());
                        self.mode = Mode::Key;
                        all & !f.seen != 0
                    }
                    (Node::Map(_), b',') => {
                        self.mode = Mode::Key;
                        true
                    }
                    (Node::Array { max, .. }, b',') => {
                        self.mode = Mode::Item;
                        (f.count as u32) < *max
                    }
                    _ => self.close(s, b),
                }
            }
        }
    }
}

/// An answer read against a schema whose unions the first byte may not decide: one
/// [`SchemaPrefix`] per reading still possible (one alone for any other schema). `Copy`, like
/// the prefix, for the mask's trials.
#[derive(Clone, Copy, Debug)]
pub struct SchemaSet {
    readings: [SchemaPrefix; MAX_READINGS],
    n: u8,
}

impl Default for SchemaSet {
    fn default() -> Self {
        SchemaSet { readings: [SchemaPrefix::new(); MAX_READINGS], n: 1 }
    }
}

impl SchemaSet {
    pub fn new() -> SchemaSet {
        SchemaSet::default()
    }

    fn live(&self) -> &[SchemaPrefix] {
        &self.readings[..self.n as usize]
    }

    /// The one reading, when `s` has no union the first byte leaves open (the answer then never
    /// has more than one): the mask tries tokens on a copy of it alone.
    pub fn single(&self, s: &Schema) -> Option<&SchemaPrefix> {
        (!s.forks).then(|| &self.readings[0])
    }

    /// Readings still possible.
    pub fn len(&self) -> usize {
        self.n as usize
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// True once some reading has closed the root value.
    pub fn is_complete(&self) -> bool {
        self.live().iter().any(SchemaPrefix::is_complete)
    }

    /// True when the answer may end here under some reading.
    pub fn can_end(&self, s: &Schema) -> bool {
        self.live().iter().any(|p| p.can_end(s))
    }

    /// When every reading is inside a free string, past any escape: the most characters one
    /// of them may still take ([`SchemaPrefix::string_room`]), since a token that fits it
    /// continues that reading; `None` otherwise.
    pub fn string_room(&self, s: &Schema) -> Option<u32> {
        self.live().iter().map(|p| p.string_room(s)).try_fold(0, |m, r| Some(m.max(r?)))
    }

    /// Feeds `bytes`; false (and the state is then unspecified) if no reading continues.
    pub fn push_all(&mut self, s: &Schema, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.push(s, b))
    }

    /// One byte: each reading takes it (a union it starts forks the reading into one per
    /// branch the byte could start, up to [`MAX_READINGS`] in all); those that cannot are
    /// dropped. False if none is left.
    pub fn push(&mut self, s: &Schema, b: u8) -> bool {
        let n = self.n as usize;
        if !s.forks || (0..n).all(|i| self.readings[i].readings(s, b) == 1) {
            let mut kept = 0;
            for i in 0..n {
                let mut p = self.readings[i];
                if p.push(s, b) {
                    self.readings[kept] = p;
                    kept += 1;
                }
            }
            self.n = kept as u8;
            return kept > 0;
        }
        let old = self.readings;
        let mut kept = 0;
        for p in &old[..n] {
            for pick in 0..p.readings(s, b) {
                if kept == MAX_READINGS {
                    break;
                }
                let mut q = SchemaPrefix { pick: pick as u8, ..*p };
                if q.push(s, b) {
                    self.readings[kept] = q;
                    kept += 1;
                }
            }
        }
        self.n = kept as u8;
        kept > 0
    }
}

/// A mask of the first `n` choices (keys of an object, texts of an enum).
fn all(n: usize) -> u64 {
    (0..n).fold(0, |m, i| m | 1 << i)
}

/// The choices among `cands` whose text has byte `b` at `at`.
fn narrow(texts: &[Vec<u8>], cands: u64, at: u16, b: u8) -> u64 {
    (0..texts.len())
        .filter(|&i| cands >> i & 1 == 1 && texts[i].get(at as usize) == Some(&b))
        .fold(0, |m, i| m | 1 << i)
}

/// Whether one of the literal texts still possible (`cands`) is whole after `at` bytes.
fn complete_literal(s: &Schema, node: NodeId, cands: u64, at: u16) -> bool {
    let Node::Lit(texts) = s.node(node).1 else { return false };
    (0..texts.len()).any(|i| cands >> i & 1 == 1 && texts[i].len() == at as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(v: Value) -> Schema {
        Schema::compile(&v).unwrap()
    }

    fn ok(s: &Schema, text: &str) -> bool {
        SchemaSet::new().push_all(s, text.as_bytes())
    }

    fn complete(s: &Schema, text: &str) -> bool {
        let mut p = SchemaSet::new();
        p.push_all(s, text.as_bytes()) && p.is_complete()
    }

    /// What pydantic writes for a model with an enum, an optional field and a list.
    fn person() -> Schema {
        schema(json!({
            "$defs": {"Color": {"enum": ["red", "green"], "title": "Color", "type": "string"}},
            "title": "Person",
            "type": "object",
            "properties": {
                "name": {"type": "string", "title": "Name"},
                "age": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                "color": {"$ref": "#/$defs/Color", "description": "favourite"},
                "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null},
                "score": {"type": "number"},
                "ok": {"type": "boolean"}
            },
            "required": ["name", "age"]
        }))
    }

    #[test]
    fn answers_the_schema_accepts_are_complete() {
        let p = person();
        for t in [
            r#"{"name": "Ann", "age": 31}"#,
            r#"{"age":-3,"name":"x\"y"}"#,
            r#"{"name": "A", "age": 0, "tags": ["a", "b"], "color": "red", "nick": null}"#,
            "{\n  \"nick\": \"Al\",\n  \"name\": \"Al\",\n  \"age\": 7,\n  \"score\": -1.5e3,\n  \"ok\": true\n}",
            r#"{"name": "A", "age": 1, "tags": []}"#,
        ] {
            assert!(complete(&p, t), "{t}");
        }
        assert!(ok(&p, r#"{"name": "A", "ag"#) && !complete(&p, r#"{"name": "A", "age": 1"#));
    }

    #[test]
    fn what_the_schema_refuses_is_refused() {
        let p = person();
        // Each prefix is accepted and the byte after it is not.
        for (prefix, next) in [
            ("", " "),
            ("", "["),
            (r#"{"name": "A""#, "}"),
            (r#"{"name": "A", "#, r#""name"#),
            (r#"{"age": 3"#, "."),
            (r#"{"age": 3"#, "e"),
            (r#"{"color": "#, r#""blue"#),
            (r#"{"color": "#, "r"),
            (r#"{"tags": ["a", "b""#, ","),
            (r#"{"tags": ["a","#, "]"),
            (r#"{"tags": ["#, "1"),
            ("{", r#""extra"#),
            (r#"{"nick": "#, "5"),
            (r#"{"name": "A", "age": 1"#, ",}"),
            (r#"{"name": "A", "age": 1}"#, " x"),
            (r#"{"ok": "#, "y"),
        ] {
            assert!(ok(&p, prefix), "{prefix}");
            assert!(!ok(&p, &format!("{prefix}{next}")), "{prefix}{next}");
        }
    }

    #[test]
    fn numbers_and_literals_end_at_the_next_byte() {
        let n = schema(json!({"enum": [1, 10, "a"]}));
        let mut p = SchemaPrefix::new();
        assert!(p.push_all(&n, b"1") && p.can_end(&n) && !p.is_complete());
        assert!(p.clone().push_all(&n, b"0") && !p.clone().push_all(&n, b"2"));
        assert!(p.push_all(&n, b" ") && p.is_complete());
        assert!(complete(&n, "\"a\"") && !ok(&n, "\"b"));
        let i = schema(json!({"type": "integer"}));
        let mut p = SchemaPrefix::new();
        assert!(p.push_all(&i, b"-12") && p.can_end(&i) && !ok(&i, "1.5"));
        let obj = schema(json!({"type": "object", "properties": {"n": {"enum": [1, 10]}}}));
        assert!(complete(&obj, r#"{"n": 1}"#) && complete(&obj, r#"{"n":10}"#));
        assert!(!ok(&obj, r#"{"n": 100"#));
    }

    #[test]
    fn recursive_definitions_and_maps() {
        let tree = schema(json!({
            "$defs": {"Node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                "required": ["v"]
            }},
            "$ref": "#/$defs/Node"
        }));
        assert!(complete(&tree, r#"{"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3}]}"#));
        assert!(!ok(&tree, r#"{"v": 1, "kids": [{"kids": []}"#));
        let deep = "{\"v\": 0, \"kids\": [".repeat(MAX_NEST / 2);
        assert!(ok(&tree, &deep) && !ok(&tree, &format!("{deep}{{")));
        let map = schema(json!({"type": "object", "additionalProperties": {"type": "integer"}}));
        assert!(complete(&map, r#"{"a": 1, "b\n": 2}"#) && complete(&map, "{}"));
        assert!(!ok(&map, r#"{"a": "x""#));
        let any = schema(json!({"type": "object"}));
        assert!(complete(&any, r#"{"a": [1, {"b": null}], "c": "d"}"#));
        assert!(complete(&schema(json!(true)), "[1, 2]"));
    }

    /// What pydantic writes for `Union[Cat, Dog]` (two object types) inside a list, beside a
    /// string-or-enum and an integer-or-number: branches the first byte does not tell apart.
    #[test]
    fn unions_the_first_byte_does_not_decide_are_read_side_by_side() {
        let s = schema(json!({
            "$defs": {
                "Cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind", "lives"]},
                "Dog": {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}}, "required": ["kind"]}
            },
            "type": "object",
            "properties": {
                "pets": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]}},
                "word": {"anyOf": [{"enum": ["yes", "no"]}, {"type": "string"}]},
                "n": {"anyOf": [{"type": "integer"}, {"type": "number"}]}
            },
            "required": ["pets"]
        }));
        assert!(s.forks);
        for t in [
            r#"{"pets": [{"kind": "cat", "lives": 9}, {"good": true, "kind": "dog"}]}"#,
            r#"{"pets": [{"lives": 3, "kind": "cat"}], "word": "yes", "n": 2}"#,
            r#"{"pets": [], "word": "maybe", "n": -2.5}"#,
            r#"{"pets": [{"kind": "dog"}]}"#,
        ] {
            assert!(complete(&s, t), "{t}");
        }
        for t in [
            r#"{"pets": [{"kind": "cat"}]}"#,
            r#"{"pets": [{"kind": "dog", "lives": 1}]}"#,
            r#"{"pets": [{"kind": "cat", "good": true, "lives": 1}]}"#,
            r#"{"pets": [{"kind": "bird"}]}"#,
        ] {
            assert!(!complete(&s, t), "{t}");
        }
        // Both object readings are alive until the kind says which; then one is left.
        let mut p = SchemaSet::new();
        assert!(p.push_all(&s, br#"{"pets": [{"#));
        assert_eq!(p.len(), 2);
        assert!(p.push_all(&s, br#""kind": "d"#));
        assert_eq!(p.len(), 1);
        // Keys both types declare are offered while both are alive; a key only one declares
        // settles it.
        let mut p = SchemaSet::new();
        assert!(p.push_all(&s, br#"{"pets": [{"lives": 2"#));
        assert_eq!(p.len(), 1);
    }

    /// Lengths count characters as JSON Schema does: code points, an escape one (a surrogate
    /// pair one too).
    #[test]
    fn string_lengths_count_characters() {
        let s = schema(json!({"type": "object", "properties": {
            "a": {"type": "string", "minLength": 2, "maxLength": 4},
            "b": {"type": ["string", "null"], "maxLength": 1}
        }}));
        for (t, good) in [
            (r#"{"a": "ab"}"#, true),
            (r#"{"a": "abcd"}"#, true),
            (r#"{"a": "a"}"#, false),
            (r#"{"a": "abcde"}"#, false),
            ("{\"a\": \"é€😀x\"}", true),
            ("{\"a\": \"é€😀xy\"}", false),
            (r#"{"a": "\n\u00e9\ud83d\ude00x"}"#, true),
            (r#"{"a": "\n\u00e9\ud83d\ude00xy"}"#, false),
            (r#"{"b": null, "a": "xy"}"#, true),
            (r#"{"b": "z"}"#, true),
            (r#"{"b": "zz"}"#, false),
        ] {
            assert_eq!(complete(&s, t), good, "{t}");
        }
        // The closing quote waits for the minimum; the fifth character is refused at once.
        assert!(!ok(&s, r#"{"a": "a""#) && ok(&s, r#"{"a": "abcd"#) && !ok(&s, r#"{"a": "abcde"#));
        // Bytes count as the characters they decode to: a character split over two reads is
        // one, and what is not UTF-8 (a stray continuation byte, an overlong form, a surrogate,
        // a character cut by the closing quote) is refused rather than counted wrong.
        let bytes = |b: &[u8]| SchemaSet::new().push_all(&s, b);
        let mut p = SchemaSet::new();
        assert!(p.push_all(&s, b"{\"a\": \"x\xe2\x82") && p.push_all(&s, b"\xacyz\"}"));
        assert!(p.is_complete());
        for bad in [
            &b"{\"a\": \"x\x80"[..],
            b"{\"a\": \"x\xc0\xaf",
            b"{\"a\": \"x\xed\xa0\x80",
            b"{\"a\": \"xy\xe2\x82\"",
        ] {
            assert!(!bytes(bad), "{bad:?}");
        }
        for (v, why) in [
            (json!({"type": "string", "minLength": 3, "maxLength": 2}), "minLength"),
            (json!({"type": "string", "maxLength": -1}), "maxLength"),
            (json!({"maxLength": 2}), "needs a \"type\""),
            (json!({"minItems": 1}), "needs a \"type\""),
        ] {
            let e = Schema::compile(&v).unwrap_err();
            assert!(e.contains(why), "{v}: {e}");
        }
    }

    /// In a bounded string the mask offers a string-safe token only if its characters fit.
    #[test]
    fn the_mask_fits_tokens_to_a_strings_room() {
        use crate::json::{JsonFormat, JsonMask, JsonVocab};
        use std::sync::Arc;
        let pieces: [&[u8]; 7] =
            [b"\"", b"ab", "é€".as_bytes(), b"xyz", b"\"", b"q\xe2\x82", b"\xac"];
        let vocab = JsonVocab::new(7, |t| pieces[t as usize], |_| false);
        let s = Arc::new(schema(json!({"type": "string", "maxLength": 3})));
        let mut m = JsonMask::new(&JsonFormat::Schema(s));
        m.accept(b"\"a");
        let mut l = [0.0; 7];
        assert!(m.apply(&mut l, &vocab, |t| pieces[t as usize]));
        // Half a character (stepped, not read by its flags) fits; its other half alone does not.
        assert_eq!(l.map(|v| v == 0.0), [true, true, true, false, true, true, false]);
        m.accept(pieces[5]);
        let mut l = [0.0; 7];
        assert!(m.apply(&mut l, &vocab, |t| pieces[t as usize]));
        assert_eq!(l.map(|v| v == 0.0), [false, false, false, false, false, false, true]);
        // Two readings in strings with different room: a token fits if it fits either (the
        // unbounded one takes any bytes, as free strings do).
        let either =
            schema(json!({"anyOf": [{"type": "string", "maxLength": 1}, {"type": "string"}]}));
        let mut m = JsonMask::new(&JsonFormat::Schema(Arc::new(either)));
        m.accept(b"\"");
        let mut l = [0.0; 7];
        assert!(m.apply(&mut l, &vocab, |t| pieces[t as usize]));
        assert_eq!(l.map(|v| v == 0.0), [true; 7]);
    }

    /// Whatever the schema and the answer so far (unions alive, bounded strings, a character
    /// cut between tokens), the mask offers exactly the tokens whose bytes some reading takes,
    /// with its string-safe fast path and without it.
    #[test]
    fn the_mask_decides_as_stepping_would() {
        use crate::json::{JsonFormat, JsonMask, JsonVocab};
        use std::sync::Arc;
        let pieces: [&[u8]; 14] = [
            b"ab",
            b"abcdef",
            b"\"",
            b"x\"}",
            b"\\n",
            "é€".as_bytes(),
            b"q\xe2\x82",
            b"\xac",
            b" ",
            b"\"}",
            b"12",
            b"\", \"",
            b"\"kind\": \"",
            b"cat\"",
        ];
        let vocab = JsonVocab::new(14, |t| pieces[t as usize], |_| false);
        let slow_vocab = vocab.without_string_flags();
        let schemas = [
            json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 1, "maxLength": 4}, "b": {"type": "string"}}}),
            json!({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "string", "minLength": 5}, {"enum": ["abx"]}]}),
            json!({"type": "array", "items": {"anyOf": [
                {"type": "object", "properties": {"kind": {"const": "cat"}, "n": {"type": "string", "maxLength": 2}}},
                {"type": "object", "properties": {"kind": {"type": "string", "maxLength": 6}}}]}}),
        ];
        let prefixes: [&[u8]; 10] = [
            b"",
            b"{\"a\": \"",
            b"{\"a\": \"ab",
            b"{\"a\": \"abq\xe2\x82",
            b"{\"b\": \"x",
            b"\"",
            b"\"ab",
            b"[{\"kind\": \"",
            b"[{\"kind\": \"cat\", \"n\": \"",
            b"[{",
        ];
        for v in &schemas {
            let s = Arc::new(schema(v.clone()));
            for prefix in prefixes {
                let mut start = SchemaSet::new();
                if !start.push_all(&s, prefix) {
                    continue;
                }
                let mut m = JsonMask::new(&JsonFormat::Schema(s.clone()));
                m.accept(prefix);
                let (mut fast, mut slow) = ([0.0; 14], [0.0; 14]);
                m.apply(&mut fast, &vocab, |t| pieces[t as usize]);
                m.apply(&mut slow, &slow_vocab, |t| pieces[t as usize]);
                let stepped = pieces.map(|p| start.clone().push_all(&s, p));
                let what = format!("{v} after {:?}", String::from_utf8_lossy(prefix));
                assert_eq!(fast.map(|l| l == 0.0), stepped, "{what}");
                assert_eq!(fast, slow, "{what}");
            }
        }
    }

    /// Nine object types, all starting with `{`: the set keeps the first eight readings; every
    /// answer it takes still matches the schema.
    #[test]
    fn readings_past_the_cap_drop_the_latest_branches() {
        let alts: Vec<Value> = (0..MAX_READINGS + 1)
            .map(|i| json!({"type": "object", "properties": {format!("k{i}"): {"type": "null"}}, "required": [format!("k{i}")]}))
            .collect();
        let s = schema(json!({"anyOf": alts}));
        let mut p = SchemaSet::new();
        assert!(p.push(&s, b'{'));
        assert_eq!(p.len(), MAX_READINGS);
        assert!(complete(&s, r#"{"k0": null}"#) && complete(&s, r#"{"k7": null}"#));
        assert!(!ok(&s, r#"{"k8""#));
    }

    #[test]
    fn schemas_it_cannot_enforce_are_refused_with_the_reason() {
        for (v, why) in [
            (json!({"type": "string", "pattern": "^a"}), "pattern"),
            (json!({"type": "integer", "minimum": 0}), "minimum"),
            (
                json!({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}}, "$ref": "#/$defs/A"}),
                "itself",
            ),
            (json!({"$ref": "#/$defs/Missing"}), "not a definition"),
            (json!({"$ref": "https://example.com/s.json"}), "not a definition"),
            (json!({"type": "object", "properties": {"a": {}}, "required": ["b"]}), "\"b\""),
            (
                json!({"type": "object", "properties": {"a": {}}, "additionalProperties": true}),
                "additionalProperties",
            ),
            (json!({"type": "array", "items": [{"type": "string"}]}), "tuples"),
            (json!({"type": "array", "minItems": 3, "maxItems": 2}), "minItems"),
            (json!({"enum": [[1]]}), "enum"),
            (json!({"type": "date"}), "unknown type"),
            (json!(false), "accepts nothing"),
            (json!("string"), "object or a boolean"),
        ] {
            let e = Schema::compile(&v).unwrap_err();
            assert!(e.contains(why), "{v}: {e}");
        }
        let many: Map<String, Value> = (0..65).map(|i| (format!("k{i}"), json!({}))).collect();
        assert!(Schema::compile(&json!({"properties": many})).is_err());
    }

    #[test]
    fn the_mask_follows_the_schema_and_ends_only_on_a_whole_answer() {
        use crate::json::{JsonFormat, JsonMask, JsonVocab};
        use std::sync::Arc;
        let pieces: [&[u8]; 9] =
            [b"{\"", b"name", b"\": \"", b"Al", b"ice\"", b"x\"}", b"\\n", b"7", b""];
        let vocab = JsonVocab::new(9, |t| pieces[t as usize], |t| t == 8);
        let allowed = |m: &JsonMask| {
            let mut l = [0.0; 9];
            m.apply(&mut l, &vocab, |t| pieces[t as usize]);
            l.map(|v| v == 0.0)
        };
        let format = JsonFormat::Schema(Arc::new(person()));
        let mut m = JsonMask::new(&format);
        assert_eq!(allowed(&m), [true, false, false, false, false, false, false, false, false]);
        for t in [0, 1, 2, 3] {
            m.accept(pieces[t]);
        }
        // In the name's string (`{"` closes the name after a brace; `": "` and `x"}` leave the
        // object unfinished).
        assert_eq!(allowed(&m), [true, true, false, true, true, false, true, true, false]);
        let int = JsonFormat::Schema(Arc::new(schema(json!({"type": "integer"}))));
        let mut m = JsonMask::new(&int);
        m.accept(b"7");
        assert_eq!(allowed(&m), [false, false, false, false, false, false, false, true, true]);
        // A union of two object types: a token is offered when some reading takes it.
        let pets: [&[u8]; 6] = [b"{\"", b"kind\": \"", b"cat", b"dog", b"\"}", b""];
        let vocab = JsonVocab::new(6, |t| pets[t as usize], |t| t == 5);
        let allowed = |m: &JsonMask| {
            let mut l = [0.0; 6];
            m.apply(&mut l, &vocab, |t| pets[t as usize]);
            l.map(|v| v == 0.0)
        };
        let either = schema(json!({"anyOf": [
            {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]},
            {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"]}
        ]}));
        let mut m = JsonMask::new(&JsonFormat::Schema(Arc::new(either)));
        m.accept(pets[0]);
        m.accept(pets[1]);
        assert_eq!(allowed(&m), [false, false, true, true, false, false]);
        m.accept(pets[3]);
        assert_eq!(allowed(&m), [false, false, false, false, true, false]);
        m.accept(pets[4]);
        assert!(m.is_complete());
        assert_eq!(allowed(&m), [false, false, false, false, false, true]);
    }
}
