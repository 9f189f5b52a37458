//! llama-server's answers on the routes snug takes from it: `/infill` (its `/completion`
//! record) and `/lora-adapters`.
//!
//! An infill record carries `content` (all of it, or the piece a stream event adds); the last
//! adds why it stopped, the counts and the timings (ms), and a failed stream ends with
//! llama-server's error object.

use schemars::JsonSchema;
use serde::Serialize;

/// llama-server's `stop_type`: an end token, the token limit, or none (cut short).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "InfillStopType")]
pub enum StopType {
    Eos,
    Limit,
    None,
}

/// `POST /infill`: one record of the stream, or the whole answer.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "InfillRecord")]
pub struct InfillRecord {
    pub index: u32,
    pub content: String,
    /// Always empty (llama-server's field for the token ids, which snug does not send).
    pub tokens: Vec<u32>,
    pub stop: bool,
    pub model: String,
    #[serde(flatten)]
    pub end: Option<InfillEnd>,
}

/// The last record's fields.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "InfillEnd")]
pub struct InfillEnd {
    pub stop_type: StopType,
    pub stopping_word: &'static str,
    pub truncated: bool,
    pub tokens_predicted: usize,
    pub tokens_evaluated: usize,
    pub timings: Timings,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "InfillTimings")]
pub struct Timings {
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
}

/// A failure in the middle of an infill stream.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "LlamaError")]
pub struct LlamaError {
    pub error: LlamaErrorDetail,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "LlamaErrorDetail")]
pub struct LlamaErrorDetail {
    pub code: u16,
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// `GET /lora-adapters`: an adapter, its id for a request's `lora` field and default scale.
#[derive(Debug, Serialize, JsonSchema)]
pub struct LoraAdapter {
    pub id: usize,
    pub path: String,
    pub name: String,
    pub scale: f64,
}

/// `POST /lora-adapters`' answer.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "LoraSuccess")]
pub struct Success {
    pub success: bool,
}
