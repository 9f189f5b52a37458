//! What the fuzz targets share: the vocabularies they run against, each loaded once per process,
//! and the structured inputs of the chat-template target.
//!
//! The vocabularies are small tokenizer-only GGUFs committed under `fuzz/fixtures/` (cut from the
//! real models by `fixtures/make_vocab_fixtures.py`), so a fresh checkout fuzzes without a model
//! download. `SNUG_FUZZ_BPE` / `SNUG_FUZZ_SPM` point a run at any other GGUF instead (e.g. the
//! full `~/.cache/snug/models/qwen2.5-coder-0.5b.gguf`); the corpus is the same either way.

use std::path::PathBuf;
use std::sync::OnceLock;

use gguf::GgufFile;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use tokenizer::{ChatMessage, Tokenizer};

/// The two tokenizer algorithms snug implements, each with a real model's vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vocab {
    /// Byte-level BPE, `qwen2` pre-tokenizer (qwen2.5-coder), with its chat template.
    Bpe,
    /// SentencePiece with byte fallback and thousands of control tokens (gemma3-270m; no
    /// template in the GGUF, so the Gemma fallback renders its chats).
    Spm,
}

/// A vocabulary file parsed, and its tokenizer.
pub struct Loaded {
    pub file: GgufFile,
    pub tok: Tokenizer,
}

impl Vocab {
    fn path(self) -> PathBuf {
        let (var, file) = match self {
            Vocab::Bpe => ("SNUG_FUZZ_BPE", "bpe-qwen2.5-coder.gguf"),
            Vocab::Spm => ("SNUG_FUZZ_SPM", "spm-gemma3.gguf"),
        };
        std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(file)
        })
    }

    /// The vocabulary, loaded on first use. A missing or unreadable file is a setup error, not
    /// a finding: the panic says which file and how to make it.
    pub fn load(self) -> &'static Loaded {
        static BPE: OnceLock<Loaded> = OnceLock::new();
        static SPM: OnceLock<Loaded> = OnceLock::new();
        let cell = match self {
            Vocab::Bpe => &BPE,
            Vocab::Spm => &SPM,
        };
        cell.get_or_init(|| {
            let path = self.path();
            let file = GgufFile::open(&path).unwrap_or_else(|e| {
                panic!("fuzz vocabulary {}: {e} (see fuzz/README.md, Fixtures)", path.display())
            });
            let tok = Tokenizer::from_gguf(&file)
                .unwrap_or_else(|e| panic!("fuzz vocabulary {}: {e}", path.display()));
            Loaded { file, tok }
        })
    }
}

/// Nested JSON deeper than this is cut to `null`: request bodies reach the templates through
/// serde_json, whose parser refuses nesting past 128, so deeper values cannot occur.
const MAX_JSON_DEPTH: usize = 8;

/// An arbitrary JSON value (tool-call arguments, tool parameter schemas).
#[derive(Arbitrary, Debug)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub fn to_value(&self, depth: usize) -> serde_json::Value {
        use serde_json::Value as V;
        if depth >= MAX_JSON_DEPTH {
            return V::Null;
        }
        match self {
            Json::Null => V::Null,
            Json::Bool(b) => V::Bool(*b),
            Json::Int(i) => V::from(*i),
            Json::Float(f) => serde_json::Number::from_f64(*f).map_or(V::Null, V::Number),
            Json::Str(s) => V::String(s.clone()),
            Json::Arr(a) => V::Array(a.iter().map(|j| j.to_value(depth + 1)).collect()),
            Json::Obj(o) => {
                V::Object(o.iter().map(|(k, j)| (k.clone(), j.to_value(depth + 1))).collect())
            }
        }
    }
}

/// A role: mostly the ones templates branch on, sometimes anything.
#[derive(Arbitrary, Debug)]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
    Other(String),
}

/// One tool call as OpenAI clients send it (`{"type": "function", "function": {...}}`), or the
/// bare `{name, arguments}` some clients send, or any JSON at all.
#[derive(Arbitrary, Debug)]
pub enum ToolCall {
    Function { id: Option<String>, name: String, arguments: Json, arguments_as_string: bool },
    Bare { name: String, arguments: Json },
    Any(Json),
}

/// A chat message with the optional fields templates read.
#[derive(Arbitrary, Debug)]
pub struct Message {
    pub role: Role,
    pub content: String,
    pub tool_calls: Option<Vec<ToolCall>>,
    pub name: Option<String>,
    pub tool_call_id: Option<String>,
    pub reasoning_content: Option<String>,
}

/// A tool definition: a name, a description and a parameter schema.
#[derive(Arbitrary, Debug)]
pub struct Tool {
    pub name: String,
    pub description: String,
    pub parameters: Json,
}

impl Message {
    pub fn to_chat(&self) -> ChatMessage {
        use serde_json::json;
        let role = match &self.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Other(s) => s,
        };
        let mut m = ChatMessage::new(role, self.content.clone());
        if let Some(calls) = &self.tool_calls {
            let calls: Vec<serde_json::Value> = calls
                .iter()
                .map(|c| match c {
                    ToolCall::Function { id, name, arguments, arguments_as_string } => {
                        let args = arguments.to_value(1);
                        let args =
                            if *arguments_as_string { json!(args.to_string()) } else { args };
                        json!({"id": id, "type": "function",
                               "function": {"name": name, "arguments": args}})
                    }
                    ToolCall::Bare { name, arguments } => {
                        json!({"name": name, "arguments": arguments.to_value(1)})
                    }
                    ToolCall::Any(j) => j.to_value(0),
                })
                .collect();
            m.extra.insert("tool_calls".into(), calls.into());
        }
        for (key, v) in [
            ("name", &self.name),
            ("tool_call_id", &self.tool_call_id),
            ("reasoning_content", &self.reasoning_content),
        ] {
            if let Some(v) = v {
                m.extra.insert(key.into(), v.clone().into());
            }
        }
        m
    }
}

impl Tool {
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::json!({"type": "function", "function": {"name": self.name,
            "description": self.description, "parameters": self.parameters.to_value(1)}})
    }
}
