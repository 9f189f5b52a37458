//! OpenAI's answers: chat and text completions whole and as stream chunks, their choices,
//! tool calls and log-probabilities, the model list, embeddings and the error body.
//!
//! A whole answer and a chunk share the head (`id`, `object`, `created`, `model`,
//! `system_fingerprint`); a chunk carries `usage` only in the last one, when the request asked
//! for it (`stream_options.include_usage`). In a delta every field is left out unless set, as
//! OpenAI streams them; `logprobs` and `finish_reason` are always there, `null` until known.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

/// Why a chat answer ended: OpenAI's reasons, and vLLM's `abort` for one the server cut short
/// (a drain whose grace ran out).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OpenAiChatFinish")]
pub enum ChatFinish {
    Stop,
    Length,
    Abort,
    ToolCalls,
}

/// Why a text completion ended (no tools on this route).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OpenAiTextFinish")]
pub enum TextFinish {
    Stop,
    Length,
    Abort,
}

impl From<TextFinish> for ChatFinish {
    fn from(f: TextFinish) -> ChatFinish {
        match f {
            TextFinish::Stop => ChatFinish::Stop,
            TextFinish::Length => ChatFinish::Length,
            TextFinish::Abort => ChatFinish::Abort,
        }
    }
}

/// Token counts: the prompt after the template, and the tokens generated; of the prompt's,
/// `prompt_tokens_details.cached_tokens` were read from the prefix cache.
#[derive(Clone, Copy, Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiUsage")]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// The prompt tokens the prefix cache held (not computed again).
#[derive(Clone, Copy, Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiPromptTokensDetails")]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt: usize, cached: usize, generated: usize) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: generated,
            total_tokens: prompt + generated,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: cached },
        }
    }
}

/// What a whole answer and every chunk of one request share.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiHead")]
pub struct Head {
    pub id: String,
    /// `chat.completion`, `chat.completion.chunk` or `text_completion`.
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
}

/// A whole chat answer (`chat.completion`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct ChatCompletion {
    #[serde(flatten)]
    pub head: Head,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

/// One chunk of a streamed chat answer (`chat.completion.chunk`); `choices` is empty in the
/// last one, which carries `usage`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ChatCompletionChunk {
    #[serde(flatten)]
    pub head: Head,
    pub choices: Vec<DeltaChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A whole text completion (`text_completion`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct TextCompletion {
    #[serde(flatten)]
    pub head: Head,
    pub choices: Vec<TextChoice>,
    pub usage: Usage,
}

/// One chunk of a streamed text completion (`text_completion`), as [`ChatCompletionChunk`].
#[derive(Debug, Serialize, JsonSchema)]
pub struct TextCompletionChunk {
    #[serde(flatten)]
    pub head: Head,
    pub choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A whole chat answer's choice.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiChatChoice")]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: ChatFinish,
}

/// The answer's message: `content` is null when the answer is only calls; `reasoning_content`
/// is the thinking section, apart unless the request keeps the raw text.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiAssistantMessage")]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

impl AssistantMessage {
    /// Plain text, no calls, no reasoning apart.
    pub fn text(content: String) -> AssistantMessage {
        AssistantMessage {
            role: "assistant",
            content: Some(content),
            reasoning_content: None,
            tool_calls: Vec::new(),
        }
    }
}

/// A whole call: `arguments` is a JSON text, as OpenAI sends it.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiToolCall")]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    pub function: FunctionCall,
}

/// A call's kind: only functions.
#[derive(Clone, Copy, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OpenAiCallKind")]
pub enum FunctionKind {
    Function,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiCallFunction")]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// A streamed chat choice.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiDeltaChoice")]
pub struct DeltaChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<ChatFinish>,
}

/// What a chunk adds to the message; the first chunk says the role.
#[derive(Debug, Default, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiDelta")]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<DeltaCall>,
}

impl Delta {
    /// The first chunk's: the role and empty content.
    pub fn role() -> Delta {
        Delta { role: Some("assistant"), content: Some(String::new()), ..Delta::default() }
    }

    pub fn content(text: String) -> Delta {
        Delta { content: Some(text), ..Delta::default() }
    }
}

/// A streamed call: its `id`, `type` and name once, then its arguments in fragments.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiDeltaCall")]
pub struct DeltaCall {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<FunctionKind>,
    pub function: DeltaFunction,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiDeltaFunction")]
pub struct DeltaFunction {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// A text completion's choice, whole (`finish_reason` set) or streamed (null until the last).
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiTextChoice")]
pub struct TextChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<LegacyLogprobs>,
    pub finish_reason: Option<TextFinish>,
}

/// A chat choice's `logprobs` (`refusal` is always null).
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiChatLogprobs")]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
    pub refusal: Option<String>,
}

/// A generated token: its text (invalid UTF-8 replaced), log-probability and bytes, and the
/// most likely alternatives.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiTokenLogprob")]
pub struct TokenLogprob {
    #[serde(flatten)]
    pub token: TopLogprob,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiTopLogprob")]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
}

/// A text completion's `logprobs`: parallel lists, the alternatives as `{token: logprob}`, the
/// offsets in characters of the generated text.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiLegacyLogprobs")]
pub struct LegacyLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f64>,
    #[schemars(with = "Vec<std::collections::BTreeMap<String, f64>>")]
    pub top_logprobs: Vec<Map<String, Value>>,
    pub text_offset: Vec<usize>,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelEntry>,
}

/// The served model, or an adapter on it (`parent`: the base).
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiModel")]
pub struct ModelEntry {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// `POST /v1/embeddings`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiEmbeddingList")]
pub struct EmbeddingList {
    pub object: &'static str,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiEmbedding")]
pub struct Embedding {
    pub object: &'static str,
    pub index: usize,
    pub embedding: Vector,
}

/// A vector as floats, or with `encoding_format: "base64"` the base64 of its little-endian
/// `f32`s.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "OpenAiVector")]
pub enum Vector {
    Floats(
        #[serde(serialize_with = "super::wide")]
        #[schemars(with = "Vec<f64>")]
        Vec<f32>,
    ),
    Base64(String),
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiEmbeddingUsage")]
pub struct EmbeddingUsage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

/// An error: what was wrong and what to do, OpenAI's `type`, and a `code` snug sets where a
/// client may act on it (`param` is always null).
#[derive(Debug, Serialize, JsonSchema)]
pub struct OpenAiError {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiErrorDetail")]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

/// A failure in the middle of a stream, sent as the last event before `data: [DONE]` (the
/// status line has gone out already).
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiStreamError")]
pub struct StreamError {
    pub error: StreamErrorDetail,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "OpenAiStreamErrorDetail")]
pub struct StreamErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub code: Option<&'static str>,
}

impl StreamError {
    pub fn server(message: String) -> StreamError {
        StreamError { error: StreamErrorDetail { message, kind: "server_error", code: None } }
    }
}
