//! Anthropic's Messages API answers: the whole `message`, each event of a stream, the token
//! count and the error body, as the `anthropic` SDK reads them.
//!
//! A stream is `message_start` (the message with no content yet), then per content block
//! `content_block_start`, its deltas (`text_delta`, `thinking_delta`, `input_json_delta`) and
//! `content_block_stop`, then `message_delta` (`stop_reason`, `stop_sequence`, the final usage)
//! and `message_stop`; a `ping` follows `message_start`. Each is an SSE record with
//! `event: TYPE` and `data: {json}` whose `type` repeats it.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

/// Why the answer ended, in Anthropic's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "AnthropicStopReason")]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
    ToolUse,
}

/// Token counts with Anthropic's meaning: `input_tokens` are the prompt tokens computed,
/// `cache_read_input_tokens` those read from the prefix cache (their sum is the prompt);
/// snug writes no cache entry a client pays for, so `cache_creation_input_tokens` is 0.
#[derive(Clone, Copy, Debug, Serialize, JsonSchema)]
#[schemars(rename = "AnthropicUsage")]
pub struct Usage {
    pub input_tokens: usize,
    pub cache_creation_input_tokens: usize,
    pub cache_read_input_tokens: usize,
    pub output_tokens: usize,
}

impl Usage {
    /// A prompt of `prompt` tokens of which `cached` were cached, and `output` generated.
    pub fn new(prompt: usize, cached: usize, output: usize) -> Usage {
        let cached = cached.min(prompt);
        Usage {
            input_tokens: prompt - cached,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
            output_tokens: output,
        }
    }
}

/// One block of an answer's `content`.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schemars(rename = "AnthropicContentBlock")]
pub enum Block {
    Text {
        text: String,
    },
    /// The model's reasoning; `signature` is empty (a local model signs nothing, and snug
    /// reads thinking blocks sent back without checking it).
    Thinking {
        thinking: String,
        signature: String,
    },
    /// A call: `input` is the arguments object as generated (keys in the model's order).
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// A whole answer (`"type": "message"`); in `message_start`, the same with empty `content`
/// and no `stop_reason` yet.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[schemars(rename = "AnthropicMessage")]
pub struct Message {
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Always `assistant`.
    pub role: &'static str,
    pub model: String,
    pub content: Vec<Block>,
    pub stop_reason: Option<StopReason>,
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

/// A delta of a content block being streamed.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schemars(rename = "AnthropicDelta")]
pub enum Delta {
    TextDelta { text: String },
    ThinkingDelta { thinking: String },
    SignatureDelta { signature: String },
    InputJsonDelta { partial_json: String },
}

/// `message_delta`'s `delta`.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[schemars(rename = "AnthropicMessageDeltaBody")]
pub struct MessageDeltaBody {
    pub stop_reason: Option<StopReason>,
    pub stop_sequence: Option<String>,
}

/// One event of a streamed answer.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schemars(rename = "AnthropicStreamEvent")]
pub enum Event {
    MessageStart { message: Message },
    Ping,
    ContentBlockStart { index: usize, content_block: Block },
    ContentBlockDelta { index: usize, delta: Delta },
    ContentBlockStop { index: usize },
    MessageDelta { delta: MessageDeltaBody, usage: Usage },
    MessageStop,
    Error { error: ErrorBody },
}

impl Event {
    /// The event's `type`, its SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            Event::MessageStart { .. } => "message_start",
            Event::Ping => "ping",
            Event::ContentBlockStart { .. } => "content_block_start",
            Event::ContentBlockDelta { .. } => "content_block_delta",
            Event::ContentBlockStop { .. } => "content_block_stop",
            Event::MessageDelta { .. } => "message_delta",
            Event::MessageStop => "message_stop",
            Event::Error { .. } => "error",
        }
    }

    /// The event as an SSE record: `event: TYPE` and `data: {json}`.
    pub fn sse(&self) -> String {
        format!("event: {}\ndata: {}\n\n", self.name(), super::to_json(self))
    }
}

/// `/v1/messages/count_tokens`' answer: the prompt's tokens, what `input_tokens` plus
/// `cache_read_input_tokens` of the same request add up to.
#[derive(Clone, Copy, Debug, Serialize, JsonSchema)]
#[schemars(rename = "AnthropicTokenCount")]
pub struct TokenCount {
    pub input_tokens: usize,
}

/// What went wrong: Anthropic's error `type` (by status) and the message.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[schemars(rename = "AnthropicErrorBody")]
pub struct ErrorBody {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub message: String,
}

/// The error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub struct AnthropicError {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub error: ErrorBody,
}

impl AnthropicError {
    /// The body of an error answered with HTTP `status`.
    pub fn new(status: u16, message: String) -> AnthropicError {
        let kind = match status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            500.. => "api_error",
            _ => "invalid_request_error",
        };
        AnthropicError { kind: "error", error: ErrorBody { kind, message } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_are_tagged_as_the_sdk_reads_them() {
        let e = Event::ContentBlockStart {
            index: 1,
            content_block: Block::ToolUse { id: "t".into(), name: "f".into(), input: json!({}) },
        };
        assert_eq!(
            e.sse(),
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\
             \"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\n"
        );
        let d = Event::ContentBlockDelta {
            index: 0,
            delta: Delta::InputJsonDelta { partial_json: "{\"a\"".into() },
        };
        assert!(super::super::to_json(&d).contains("\"type\":\"input_json_delta\""));
        assert_eq!(super::super::to_json(&Event::MessageStop), "{\"type\":\"message_stop\"}");
    }

    #[test]
    fn usage_splits_the_prompt_into_computed_and_cached() {
        let u = Usage::new(100, 96, 7);
        assert_eq!((u.input_tokens, u.cache_read_input_tokens, u.output_tokens), (4, 96, 7));
        let e = AnthropicError::new(400, "bad".into());
        assert_eq!(
            super::super::to_json(&e),
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}})
                .to_string()
        );
    }
}
