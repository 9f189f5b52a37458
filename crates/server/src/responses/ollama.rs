//! Ollama's answers: chat and generate records (each NDJSON line of a stream, and the whole
//! answer, which is the last record with all the text), the model lists, `show`, `version`,
//! pull progress, embeddings and the error body.
//!
//! A record that ends the answer adds `done_reason` and the counts and durations (nanoseconds);
//! the others leave them out. `thinking` and `tool_calls` are left out when empty.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

/// Why an answer ended; `load` answers an empty generate (the model is loaded).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OllamaDoneReason")]
pub enum DoneReason {
    Stop,
    Length,
    Abort,
    Load,
}

/// The last record's counts and durations (ns).
#[derive(Clone, Copy, Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaStats")]
pub struct Stats {
    pub total_duration: u64,
    pub load_duration: u64,
    pub prompt_eval_count: usize,
    pub prompt_eval_duration: u64,
    pub eval_count: usize,
    pub eval_duration: u64,
}

/// `POST /api/chat`: one record of the stream, or the whole answer.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaChatRecord")]
pub struct ChatRecord {
    pub model: String,
    pub created_at: String,
    pub done: bool,
    pub message: Message,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done_reason: Option<DoneReason>,
    #[serde(flatten)]
    pub stats: Option<Stats>,
}

/// The assistant's message: text, the thinking section apart, whole calls.
#[derive(Debug, Default, Serialize, JsonSchema)]
#[schemars(rename = "OllamaAssistantMessage")]
pub struct Message {
    pub role: &'static str,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

impl Message {
    pub fn assistant(content: String) -> Message {
        Message { role: "assistant", content, ..Message::default() }
    }
}

/// A whole call: `arguments` is the object the model wrote (null if it did not parse).
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaToolCall")]
pub struct ToolCall {
    pub function: Function,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaFunction")]
pub struct Function {
    pub name: String,
    #[schemars(with = "Option<Map<String, Value>>")]
    pub arguments: Value,
}

/// `POST /api/generate`: one record of the stream, or the whole answer.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaGenerateRecord")]
pub struct GenerateRecord {
    pub model: String,
    pub created_at: String,
    pub done: bool,
    pub response: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done_reason: Option<DoneReason>,
    #[serde(flatten)]
    pub stats: Option<Stats>,
}

/// A chat or generate record.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Record {
    Chat(ChatRecord),
    Generate(GenerateRecord),
}

/// `GET /api/version`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaVersion")]
pub struct Version {
    pub version: &'static str,
}

/// A model's details, as the lists and `show` give them.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaDetails")]
pub struct Details {
    pub parent_model: String,
    pub format: &'static str,
    pub family: String,
    pub families: Vec<String>,
    pub parameter_size: String,
    pub quantization_level: String,
}

/// `GET /api/tags`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaTags")]
pub struct Tags {
    pub models: Vec<TagModel>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaTagModel")]
pub struct TagModel {
    pub name: String,
    pub model: String,
    pub modified_at: String,
    pub size: u64,
    pub digest: String,
    pub details: Details,
}

/// `GET /api/ps`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaPs")]
pub struct Ps {
    pub models: Vec<PsModel>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaPsModel")]
pub struct PsModel {
    pub name: String,
    pub model: String,
    pub size: u64,
    pub digest: String,
    pub details: Details,
    pub expires_at: String,
    pub size_vram: u64,
    pub context_length: usize,
}

/// `POST /api/show`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaShow")]
pub struct Show {
    pub modelfile: String,
    pub parameters: &'static str,
    pub template: String,
    pub details: Details,
    pub model_info: Map<String, Value>,
    pub capabilities: Vec<&'static str>,
    pub modified_at: String,
}

/// `POST /api/pull`: a progress record (`digest`, `total`, `completed` while a layer is
/// pulled), and last `{"status": "success"}`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaPullRecord")]
pub struct PullRecord {
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed: Option<u64>,
}

impl PullRecord {
    pub fn status(status: &str) -> PullRecord {
        PullRecord { status: status.to_string(), digest: None, total: None, completed: None }
    }
}

/// `POST /api/embed`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaEmbed")]
pub struct Embed {
    pub model: String,
    #[serde(serialize_with = "super::wide_rows")]
    #[schemars(with = "Vec<Vec<f64>>")]
    pub embeddings: Vec<Vec<f32>>,
    pub total_duration: u64,
    pub load_duration: u64,
    pub prompt_eval_count: usize,
}

/// `POST /api/embeddings` (the legacy route).
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OllamaEmbedding")]
pub struct Embedding {
    #[serde(serialize_with = "super::wide")]
    #[schemars(with = "Vec<f64>")]
    pub embedding: Vec<f32>,
}

/// An error, and a failure in the middle of a stream: the message.
#[derive(Debug, Serialize, JsonSchema)]
pub struct OllamaError {
    pub error: String,
}
