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
//! Cost: the schema is compiled per request, in work linear in the schema: each value of the
//! document is read once per `$ref` path that names it, and the graph of unions and `$ref`s is
//! then walked once (each node and edge once, however many paths share it), resolving aliases
//! and flattening each union into its distinct branches ([`MAX_UNION_BRANCHES`] at most). All of
//! it counts against [`MAX_COMPILE_STEPS`]; past that, or past [`MAX_NODES`] nodes, the schema is
//! refused with a message. At a value start the mask looks at a union's flattened branches only,
//! so a shared graph of `$ref`s costs a byte what a flat union of its branches does. Per
//! sampled token the mask is [`crate::json`]'s pass over the vocabulary with a state of ~320
//! bytes, which the pass's byte filters copy only for the few tokens that pass them. A schema
//! with a union the first byte cannot decide is read through a [`SchemaSet`] instead, which the
//! pass copies whole (~2.6 KB): see BENCHMARKS.md for what that costs a token.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::json_syntax::{is_ws, Feed, JsonPrefix, MAX_WS_RUN};

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

/// Distinct branches one union may have once the unions and `$ref`s inside it are flattened: a
/// larger union is refused ("union too large"). The mask tries each branch a byte could start
/// at a value start, so this bounds that work per byte.
pub const MAX_UNION_BRANCHES: usize = 64;

/// Work units compiling one schema may take (a schema value read, a union branch or a
/// flattened branch gathered): past it the schema is refused as too complex. A schema written
/// by hand or by pydantic takes a few hundred to a few thousand.
pub const MAX_COMPILE_STEPS: usize = 1 << 20;

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
    /// The node each node stands for past any aliases (itself when it is no alias).
    target: Vec<NodeId>,
    /// For each union, its branches flattened once at compile time: the nodes that are neither
    /// unions nor aliases that it reaches through nested unions and aliases, each once, in the
    /// schema's order (at most [`MAX_UNION_BRANCHES`]); empty for other nodes.
    leaves: Vec<Vec<NodeId>>,
    /// The bytes each node's values may start with.
    first: Vec<ByteSet>,
    /// Some union has branches a value's first byte does not tell apart (two object types, a
    /// string and a string enum, ...): answers are then read by several [`SchemaPrefix`]es.
    forks: bool,
}

/// Compiling: the whole schema document (for `$ref`s), the nodes made so far and the work
/// spent.
struct Compiler<'a> {
    root: &'a Value,
    nodes: Vec<Node>,
    refs: HashMap<String, NodeId>,
    budget: Budget,
}

/// The work left of [`MAX_COMPILE_STEPS`].
struct Budget(usize);

impl Budget {
    fn spend(&mut self, n: usize) -> Result<(), String> {
        match self.0.checked_sub(n) {
            Some(left) => {
                self.0 = left;
                Ok(())
            }
            None => err(format!(
                "the schema is too complex to compile (more than {MAX_COMPILE_STEPS} steps)"
            )),
        }
    }
}

/// Where a schema value sits in the document, for messages: written out only when a message
/// needs it, so a long key costs nothing per value under it.
#[derive(Clone, Copy)]
enum At<'a> {
    /// The root (`#`) or a `$ref`'s target (the reference as written).
    Root(&'a str),
    /// A member of the value at the parent.
    Key(&'a At<'a>, &'a str),
    /// An element of an array member of the value at the parent.
    Item(&'a At<'a>, &'a str, usize),
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Root(r) => f.write_str(r),
            At::Key(parent, k) => write!(f, "{parent}/{k}"),
            At::Item(parent, k, i) => write!(f, "{parent}/{k}/{i}"),
        }
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, String> {
    Err(msg.into())
}

impl Schema {
    /// Compiles `schema`; the error says what is not supported and where.
    pub fn compile(schema: &Value) -> Result<Schema, String> {
        // Node 0 stands for the root (compiled after the nodes it holds).
        let mut c = Compiler {
            root: schema,
            nodes: vec![Node::Any],
            refs: HashMap::new(),
            budget: Budget(MAX_COMPILE_STEPS),
        };
        let root = c.node(schema, &At::Root("#"), 0)?;
        c.nodes[0] = Node::Alias(root);
        let Flat { target, leaves } = flatten(&c.nodes, &mut c.budget)?;
        let any = ByteSet::of(
            &(0..=255u8)
                .filter(|&b| !is_ws(b) && JsonPrefix::value().feed(b) == Feed::Took)
                .collect::<Vec<_>>(),
        );
        // Nodes that read bytes first, then unions (from their flattened branches), then aliases.
        let mut first: Vec<ByteSet> = c.nodes.iter().map(|n| own_first_bytes(n, any)).collect();
        for (id, l) in leaves.iter().enumerate() {
            if matches!(c.nodes[id], Node::OneOf(_)) {
                first[id] = l.iter().fold(ByteSet::default(), |s, &a| s.union(first[a as usize]));
            }
        }
        for id in 0..c.nodes.len() {
            first[id] = first[target[id] as usize];
        }
        // A union forks when a branch's first bytes meet those of the branches before it.
        let forks = leaves.iter().any(|l| {
            let mut seen = ByteSet::default();
            l.iter().any(|&a| {
                let meets = seen.meets(&first[a as usize]);
                seen = seen.union(first[a as usize]);
                meets
            })
        });
        Ok(Schema { nodes: c.nodes, target, leaves, first, forks })
    }

    /// Calls `f` with each branch of `node` (its flattened branches, in the schema's order),
    /// whose values may start with `b`; `node` itself if it is no union.
    fn branches(&self, node: NodeId, b: u8, f: &mut impl FnMut(NodeId)) {
        let (id, n) = self.node(node);
        match n {
            Node::OneOf(_) => {
                for &a in &self.leaves[id as usize] {
                    #[cfg(test)]
                    BRANCH_VISITS.with(|v| v.set(v.get() + 1));
                    if self.first[a as usize].has(b) {
                        f(a)
                    }
                }
            }
            _ if self.first[id as usize].has(b) => f(id),
            _ => {}
        }
    }

    /// The node `id` stands for, past any aliases (resolved at compile time).
    fn node(&self, id: NodeId) -> (NodeId, &Node) {
        let t = self.target[id as usize];
        (t, &self.nodes[t as usize])
    }
}

#[cfg(test)]
thread_local! {
    /// Union branches [`Schema::branches`] looked at on this thread (tests count the mask's work).
    static BRANCH_VISITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The bytes the values of a node that reads bytes itself start with (`any`: those of any
/// value); empty for unions and aliases, which [`Schema::compile`] fills in after.
fn own_first_bytes(n: &Node, any: ByteSet) -> ByteSet {
    match n {
        // Any value: what the plain checker takes as a value's first byte (whitespace before a
        // value is read between values, never by a node).
        Node::Any => any,
        Node::Str | Node::StrLen { .. } => ByteSet::of(b"\""),
        Node::Num | Node::Int => ByteSet::of(NUMBER_START),
        Node::Bool => ByteSet::of(b"tf"),
        Node::Null => ByteSet::of(b"n"),
        Node::Lit(texts) => {
            texts.iter().fold(ByteSet::default(), |s, t| s.union(ByteSet::of(&t[..1])))
        }
        Node::Object { .. } | Node::Map(_) => ByteSet::of(b"{"),
        Node::Array { .. } => ByteSet::of(b"["),
        Node::OneOf(_) | Node::Alias(_) => ByteSet::default(),
    }
}

/// What [`flatten`] finds: each node's alias target and each union's flattened branches.
struct Flat {
    target: Vec<NodeId>,
    leaves: Vec<Vec<NodeId>>,
}

/// Resolves every alias to the node it stands for and flattens every union into the nodes
/// that read bytes it reaches (deduplicated, in the schema's order), visiting each node and
/// each union or alias edge once, however many paths of a shared graph lead to it: a
/// depth-first walk with colours, iterative so a long chain of `$ref`s cannot overflow the
/// stack. A union or alias that reaches itself before any byte is read is an error (the checker
/// would loop), and so is a union of more than [`MAX_UNION_BRANCHES`] branches.
fn flatten(nodes: &[Node], budget: &mut Budget) -> Result<Flat, String> {
    const WHITE: u8 = 0;
    const GREY: u8 = 1;
    const BLACK: u8 = 2;
    let n = nodes.len();
    let mut colour = vec![WHITE; n];
    let mut target: Vec<NodeId> = (0..n as NodeId).collect();
    let mut leaves: Vec<Vec<NodeId>> = vec![Vec::new(); n];
    // The union a branch was last gathered for (deduplication without a set per union).
    let mut gathered = vec![NodeId::MAX; n];
    let edges = |id: usize| -> &[NodeId] {
        match &nodes[id] {
            Node::OneOf(alts) => alts,
            Node::Alias(to) => std::slice::from_ref(to),
            _ => &[],
        }
    };
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for start in 0..n {
        if colour[start] != WHITE {
            continue;
        }
        colour[start] = GREY;
        stack.push((start, 0));
        while let Some(&mut (id, ref mut next)) = stack.last_mut() {
            let out = edges(id);
            if let Some(&to) = out.get(*next) {
                *next += 1;
                budget.spend(1)?;
                match colour[to as usize] {
                    GREY => {
                        return err("a $ref refers back to itself before any object or array opens")
                    }
                    WHITE => {
                        colour[to as usize] = GREY;
                        stack.push((to as usize, 0));
                    }
                    _ => {}
                }
                continue;
            }
            stack.pop();
            colour[id] = BLACK;
            match &nodes[id] {
                Node::Alias(to) => target[id] = target[*to as usize],
                Node::OneOf(alts) => {
                    let mut mine = Vec::new();
                    for &a in alts {
                        let t = target[a as usize];
                        let from: &[NodeId] = match nodes[t as usize] {
                            Node::OneOf(_) => &leaves[t as usize],
                            _ => std::slice::from_ref(&target[a as usize]),
                        };
                        budget.spend(from.len())?;
                        for &leaf in from {
                            if gathered[leaf as usize] != id as NodeId {
                                gathered[leaf as usize] = id as NodeId;
                                if mine.len() == MAX_UNION_BRANCHES {
                                    return err(format!(
                                        "a union is too large: more than {MAX_UNION_BRANCHES} \
                                         distinct branches once nested anyOf/oneOf and $refs are \
                                         expanded"
                                    ));
                                }
                                mine.push(leaf);
                            }
                        }
                    }
                    leaves[id] = mine;
                }
                _ => {}
            }
        }
    }
    Ok(Flat { target, leaves })
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
    fn node(&mut self, v: &Value, at: &At, depth: usize) -> Result<NodeId, String> {
        self.budget.spend(1)?;
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
                    .map(|(i, a)| self.node(a, &At::Item(at, key, i), depth + 1))
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

    fn reference(&mut self, r: &Value, at: &At, depth: usize) -> Result<NodeId, String> {
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
        let body = self.node(target, &At::Root(r), depth + 1)?;
        self.nodes[id as usize] = Node::Alias(body);
        Ok(id)
    }

    fn literals(&mut self, vals: &[Value], at: &At) -> Result<NodeId, String> {
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

    fn object(&mut self, o: &Map<String, Value>, at: &At, depth: usize) -> Result<NodeId, String> {
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
                    let id = self.node(v, &At::Key(at, "additionalProperties"), depth + 1)?;
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
            values.push(self.node(v, &At::Key(&At::Key(at, "properties"), k), depth + 1)?);
        }
        let mut req = 0u64;
        self.budget.spend(required.len())?;
        for k in required {
            let i = props
                .keys()
                .position(|p| p == k)
                .ok_or_else(|| format!("{at}/required: \"{k}\" is not in properties"))?;
            req |= 1 << i;
        }
        self.push(Node::Object { keys, values, required: req })
    }

    fn array(&mut self, o: &Map<String, Value>, at: &At, depth: usize) -> Result<NodeId, String> {
        let items = match o.get("items") {
            None => self.push(Node::Any)?,
            Some(v @ (Value::Object(_) | Value::Bool(_))) => {
                self.node(v, &At::Key(at, "items"), depth + 1)?
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
    fn string(&mut self, o: &Map<String, Value>, at: &At) -> Result<NodeId, String> {
        match bounds(o, at, "minLength", "maxLength")? {
            (0, u32::MAX) => self.push(Node::Str),
            (min, max) => self.push(Node::StrLen { min, max }),
        }
    }
}

/// The bounds `lo`..=`hi` of `o` (0 and `u32::MAX` when absent), checked.
fn bounds(o: &Map<String, Value>, at: &At, lo: &str, hi: &str) -> Result<(u32, u32), String> {
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

    /// `$defs` chained as `d{i} = anyOf[k × $ref d{i+1}]`, `d{l}` a string: a schema of a few
    /// KB with k^l paths from the root to the string (the audit's H1).
    fn diamond(l: usize, k: usize) -> Value {
        let mut defs = Map::new();
        for i in 0..l {
            let alts: Vec<Value> =
                (0..k).map(|_| json!({"$ref": format!("#/$defs/d{}", i + 1)})).collect();
            defs.insert(format!("d{i}"), json!({"anyOf": alts}));
        }
        defs.insert(format!("d{l}"), json!({"type": "string"}));
        json!({"$ref": "#/$defs/d0", "$defs": defs})
    }

    /// A shared graph of `$ref`s compiles in time linear in the schema (each node and edge once)
    /// and its unions are flattened at compile time, so the mask's work per byte is bounded by
    /// the flattened branches, not the paths (before: compile and every value-start byte walked
    /// all k^l paths: minutes to hours for these two).
    #[test]
    fn a_dag_of_refs_compiles_and_masks_in_linear_work() {
        use crate::json::{JsonFormat, JsonMask, JsonVocab};
        use std::sync::Arc;
        for (l, k) in [(24, 2), (20, 3), (31, 2)] {
            let v = diamond(l, k);
            let t = std::time::Instant::now();
            let s = Arc::new(Schema::compile(&v).unwrap());
            // Generous: linear work here is well under a millisecond.
            assert!(t.elapsed().as_secs() < 2, "compile took {:?}", t.elapsed());
            // Every path ends at the one string: one branch, no fork.
            let (id, _) = s.node(0);
            assert_eq!(s.leaves[id as usize].len(), 1);
            assert!(!s.forks);
            // An array of that union: every item starts a value of it.
            let arr =
                json!({"type": "array", "items": {"$ref": "#/$defs/d0"}, "$defs": v["$defs"]});
            let arr = Arc::new(Schema::compile(&arr).unwrap());
            let pieces: [&[u8]; 8] = [b"[", b"\"", b"ab", b"\",", b" ", b"\"]", b"]", b""];
            let vocab = JsonVocab::new(8, |t| pieces[t as usize], |t| t == 7);
            for (schema, answer) in
                [(&s, &[1usize, 2, 2, 1][..]), (&arr, &[0, 1, 2, 3, 4, 1, 3, 1, 2, 5][..])]
            {
                BRANCH_VISITS.with(|c| c.set(0));
                let mut m = JsonMask::new(&JsonFormat::Schema(schema.clone()));
                for &t in answer {
                    let mut l = [0.0f32; 8];
                    assert!(m.apply(&mut l, &vocab, |t| pieces[t as usize]));
                    assert_eq!(l[t], 0.0, "token {t} refused");
                    m.accept(pieces[t]);
                }
                assert!(m.is_complete());
                // Each trial of a byte at a value start looks at the union's one branch: a few
                // thousand visits for the whole answer (256 first bytes, the second bytes after
                // the few that may come first, the tokens tried), not k^l per byte.
                let visits = BRANCH_VISITS.with(|c| c.get());
                assert!(visits < 50_000, "l={l} k={k}: {visits} branch visits");
            }
        }
    }

    /// A union's flattened branches are capped; the compile work is budgeted; a long key does not
    /// make every value under it pay for its path (each used to format the whole path).
    #[test]
    fn unions_and_compile_work_are_bounded() {
        let alts: Vec<Value> = (0..=MAX_UNION_BRANCHES)
            .map(|i| json!({"type": "object", "properties": {format!("k{i}"): {}}}))
            .collect();
        let e = Schema::compile(&json!({"anyOf": alts})).unwrap_err();
        assert!(e.contains("union is too large"), "{e}");
        // The same 65 branches reached through two nested unions.
        let (a, b) = alts.split_at(30);
        let e = Schema::compile(&json!({"anyOf": [{"anyOf": a}, {"anyOf": b}]})).unwrap_err();
        assert!(e.contains("union is too large"), "{e}");
        // 64 branches, each named twice: fine.
        let mut defs = Map::new();
        for (i, a) in alts[..64].iter().enumerate() {
            defs.insert(format!("a{i}"), a.clone());
        }
        let refs: Vec<Value> =
            (0..128).map(|i| json!({"$ref": format!("#/$defs/a{}", i % 64)})).collect();
        assert!(Schema::compile(&json!({"anyOf": refs, "$defs": defs})).is_ok());
        // A million references to one definition: past the budget, refused at once.
        let many: Vec<Value> =
            (0..MAX_COMPILE_STEPS).map(|_| json!({"$ref": "#/$defs/x"})).collect();
        let v = json!({"anyOf": many, "$defs": {"x": {"type": "string"}}});
        let t = std::time::Instant::now();
        let e = Schema::compile(&v).unwrap_err();
        assert!(e.contains("too complex"), "{e}");
        assert!(t.elapsed().as_secs() < 2, "{:?}", t.elapsed());
        // A 2 MB key above 50 000 references to one definition: the path is written only for a
        // message (before: 100 GB of path strings copied).
        let alts: Vec<Value> = (0..50_000).map(|_| json!({"$ref": "#/$defs/x"})).collect();
        let mut props = Map::new();
        props.insert("k".repeat(2 << 20), json!({"anyOf": alts}));
        let v = json!({"type": "object", "properties": props, "$defs": {"x": {"type": "string"}}});
        let t = std::time::Instant::now();
        assert!(Schema::compile(&v).is_ok());
        assert!(t.elapsed().as_secs() < 2, "{:?}", t.elapsed());
        // Messages still say where.
        let e = Schema::compile(&json!({"properties": {"a": {"anyOf": [{"type": "date"}]}}}))
            .unwrap_err();
        assert!(e.starts_with("#/properties/a/anyOf/0/type:"), "{e}");
        let e = Schema::compile(&json!({"$ref": "#/$defs/A", "$defs": {"A": {"items": [1]}}}))
            .unwrap_err();
        assert!(e.starts_with("#/$defs/A/items:"), "{e}");
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
