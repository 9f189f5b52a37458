//! OpenAI's Responses API answers: the `response` object, its output items, and each event of
//! a stream, as the `openai` SDK's stream state and the Agents SDK read them.
//!
//! A stream is `response.created` and `response.in_progress` (the response, no output yet),
//! per output item `response.output_item.added`, its parts and deltas
//! (`response.content_part.added`, `response.output_text.delta` / `.done`,
//! `response.content_part.done`; `response.function_call_arguments.delta` / `.done`;
//! `response.reasoning_text.delta` / `.done`) and `response.output_item.done`, then
//! `response.completed` (or `response.incomplete` at the token limit) with the whole response,
//! its items carrying the ids the stream gave them. Every event has a `sequence_number`.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

/// Token counts: `input_tokens_details.cached_tokens` of the prompt were read from the prefix
/// cache. Reasoning is not counted apart (`reasoning_tokens` is 0).
#[derive(Clone, Copy, Debug, Serialize, JsonSchema)]
#[schemars(rename = "ResponsesUsage")]
pub struct Usage {
    pub input_tokens: usize,
    pub input_tokens_details: InputDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputDetails,
    pub total_tokens: usize,
}

#[derive(Clone, Copy, Debug, Serialize, JsonSchema)]
#[schemars(rename = "ResponsesInputDetails")]
pub struct InputDetails {
    pub cached_tokens: usize,
}

#[derive(Clone, Copy, Debug, Serialize, JsonSchema)]
#[schemars(rename = "ResponsesOutputDetails")]
pub struct OutputDetails {
    pub reasoning_tokens: usize,
}

impl Usage {
    pub fn new(prompt: usize, cached: usize, output: usize) -> Usage {
        Usage {
            input_tokens: prompt,
            input_tokens_details: InputDetails { cached_tokens: cached.min(prompt) },
            output_tokens: output,
            output_tokens_details: OutputDetails { reasoning_tokens: 0 },
            total_tokens: prompt + output,
        }
    }
}

/// A piece of an output message.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[schemars(rename = "ResponsesOutputText")]
pub struct OutputText {
    /// Always `output_text`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    pub annotations: Vec<Value>,
    pub logprobs: Vec<Value>,
}

impl OutputText {
    pub fn new(text: String) -> OutputText {
        OutputText { kind: "output_text", text, annotations: Vec::new(), logprobs: Vec::new() }
    }
}

/// Reasoning text of a `reasoning` item.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[schemars(rename = "ResponsesReasoningText")]
pub struct ReasoningText {
    /// Always `reasoning_text`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
}

/// `in_progress` while streamed, `completed` when whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "ResponsesStatus")]
pub enum Status {
    InProgress,
    Completed,
    Incomplete,
}

/// One output item.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schemars(rename = "ResponsesOutputItem")]
pub enum Item {
    Message {
        id: String,
        status: Status,
        /// Always `assistant`.
        role: &'static str,
        content: Vec<OutputText>,
    },
    /// A call: `arguments` is the JSON text as generated.
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: Status,
    },
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<ReasoningText>,
        status: Status,
    },
}

/// Why a response is incomplete.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[schemars(rename = "ResponsesIncompleteDetails")]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: &'static str,
}

/// The `response` object (stateless: `store` is always false).
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[schemars(rename = "ResponsesResponse")]
pub struct Response {
    pub id: String,
    /// Always `response`.
    pub object: &'static str,
    pub created_at: u64,
    pub status: Status,
    pub model: String,
    pub output: Vec<Item>,
    pub usage: Option<Usage>,
    pub error: Option<Value>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub temperature: f32,
    pub top_p: f32,
    /// The request's `tool_choice` as sent (`auto` when absent).
    pub tool_choice: Value,
    /// The function tools in use, as sent.
    pub tools: Vec<Value>,
    /// `{"format": ...}` as sent (`{"format": {"type": "text"}}` when absent).
    pub text: Value,
    pub truncation: &'static str,
    pub metadata: Value,
}

/// One event of a streamed response. Item ids, output and content indices are those of the
/// response's `output`.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(tag = "type")]
#[schemars(rename = "ResponsesStreamEvent")]
pub enum Event {
    #[serde(rename = "response.created")]
    Created { sequence_number: u64, response: Response },
    #[serde(rename = "response.in_progress")]
    InProgress { sequence_number: u64, response: Response },
    #[serde(rename = "response.output_item.added")]
    ItemAdded { sequence_number: u64, output_index: usize, item: Item },
    #[serde(rename = "response.output_item.done")]
    ItemDone { sequence_number: u64, output_index: usize, item: Item },
    #[serde(rename = "response.content_part.added")]
    PartAdded {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputText,
    },
    #[serde(rename = "response.content_part.done")]
    PartDone {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputText,
    },
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.output_text.done")]
    TextDone {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningDelta {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningDone {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta { sequence_number: u64, item_id: String, output_index: usize, delta: String },
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        sequence_number: u64,
        item_id: String,
        output_index: usize,
        name: String,
        arguments: String,
    },
    #[serde(rename = "response.completed")]
    Completed { sequence_number: u64, response: Response },
    #[serde(rename = "response.incomplete")]
    Incomplete { sequence_number: u64, response: Response },
    /// The generation failed mid-stream.
    #[serde(rename = "error")]
    Error { sequence_number: u64, code: &'static str, message: String },
}

impl Event {
    /// The event's `type`, its SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Created { .. } => "response.created",
            Event::InProgress { .. } => "response.in_progress",
            Event::ItemAdded { .. } => "response.output_item.added",
            Event::ItemDone { .. } => "response.output_item.done",
            Event::PartAdded { .. } => "response.content_part.added",
            Event::PartDone { .. } => "response.content_part.done",
            Event::TextDelta { .. } => "response.output_text.delta",
            Event::TextDone { .. } => "response.output_text.done",
            Event::ReasoningDelta { .. } => "response.reasoning_text.delta",
            Event::ReasoningDone { .. } => "response.reasoning_text.done",
            Event::ArgumentsDelta { .. } => "response.function_call_arguments.delta",
            Event::ArgumentsDone { .. } => "response.function_call_arguments.done",
            Event::Completed { .. } => "response.completed",
            Event::Incomplete { .. } => "response.incomplete",
            Event::Error { .. } => "error",
        }
    }

    /// The event as an SSE record: `event: TYPE` and `data: {json}`.
    pub fn sse(&self) -> String {
        format!("event: {}\ndata: {}\n\n", self.name(), super::to_json(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_carry_their_type_and_sequence_number() {
        let e = Event::ArgumentsDelta {
            sequence_number: 4,
            item_id: "fc_1".into(),
            output_index: 0,
            delta: "{".into(),
        };
        assert_eq!(
            e.sse(),
            "event: response.function_call_arguments.delta\ndata: {\"type\":\
             \"response.function_call_arguments.delta\",\"sequence_number\":4,\"item_id\":\
             \"fc_1\",\"output_index\":0,\"delta\":\"{\"}\n\n"
        );
        let u = Usage::new(10, 8, 2);
        let j = super::super::to_json(&u);
        assert!(j.contains("\"input_tokens_details\":{\"cached_tokens\":8}"), "{j}");
    }
}
