//! OpenAI's API: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`.
//!
//! Streaming is SSE: one `data: {chunk}` per text piece, a last chunk with `finish_reason`, with
//! `stream_options.include_usage` a chunk with empty `choices` and the `usage`, then
//! `data: [DONE]`. `usage` counts are exact: the prompt's tokens after the chat template, the
//! tokens generated (an end-of-generation token is not counted). Not supported (400): `n` > 1;
//! `logprobs` (chat: `logprobs: true` and `top_logprobs` 0..=20; completions: `logprobs: N`,
//! 0..=20) returns each generated token's log-probability in OpenAI's shapes, streamed and not
//! ([`crate::logprobs`] says which distribution). `response_format: {"type": "json_object"}` is
//! JSON mode ([`engine::json`]); `json_schema` holds the answer to its schema
//! ([`engine::json_schema`]; a schema outside the subset it enforces is a 400). `logit_bias`
//! is added to the logits before sampling (log-probabilities stay the model's own). Fields
//! snug reads but cannot honour are 400s naming them, never dropped: `best_of` ≠ 1, `echo`,
//! `functions`/`function_call`, `modalities` other than text, `audio`,
//! `prediction`; temperatures outside [0, 2]. Every list and number is bounded
//! ([`crate::api::limits`]). A body is parsed twice (route fields, then [`Common`]) rather than
//! through `serde(flatten)`, which would buffer it whole as a `Content` tree. A completion's
//! `suffix` fills in the middle, as Ollama's OpenAI route does ([`engine::fim::suffix_prompt`]).
//! Every body sent is one of [`crate::responses::openai`]'s types, the ones `/openapi.json`
//! describes.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use engine::scheduler::{Event, Finish, FinishReason, JobAdapters, Ticket};
use engine::JsonFormat;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use tokenizer::ChatMessage;

use crate::adapters::LoraScale;
use crate::api::limits::{self, MAX_LORA_SCALE, MAX_TEMPERATURE};
use crate::api::{collect, event_body, streamed, Knobs, Names, Settings, Stop};
use crate::error::{body_bytes, from_json, some_messages, ApiError, Style};
use crate::logprobs::{self, Rendering};
use crate::responses;
use crate::responses::openai::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatFinish, ChatLogprobs,
    Delta, DeltaChoice, Head, LegacyLogprobs, ModelEntry, ModelList, StreamError, TextChoice,
    TextCompletion, TextCompletionChunk, TextFinish, Usage,
};
use crate::tools::ChatOptions;
use crate::unix_now;
use crate::Shared;

const S: Style = Style::OpenAi;

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[schemars(rename = "OpenAiStreamOptions")]
pub struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The fields both completion routes take. Sampling ranges are checked by
/// `SamplerParams::validate` (a 400 naming the field); the schema states them for clients. Lists
/// are capped while parsing ([`limits`]). A field snug reads but cannot honour is a 400 naming
/// it (`best_of` other than 1, `functions`, a `function_call` that demands a call, `modalities`
/// other than text, `audio`, `prediction`), never silently dropped; `user` is accepted and
/// unused (it only labels the caller for OpenAI's own monitoring).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[schemars(rename = "OpenAiCommon")]
pub struct Common {
    model: Option<String>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    #[schemars(range(min = 1))]
    max_tokens: Option<u64>,
    #[schemars(range(min = 1))]
    max_completion_tokens: Option<u64>,
    /// 0 (greedy) to 2, OpenAI's range.
    #[schemars(range(min = 0, max = 2))]
    temperature: Option<f32>,
    #[schemars(range(min = 0, max = 1))]
    top_p: Option<f32>,
    top_k: Option<i64>,
    #[schemars(range(min = 0, max = 1))]
    min_p: Option<f32>,
    /// Any integer from i64's minimum to u64's maximum.
    #[serde(default, deserialize_with = "limits::opt_seed")]
    #[schemars(with = "Option<i128>", extend("minimum" = -9223372036854775808i64, "maximum" = 18446744073709551615u64))]
    seed: Option<u64>,
    stop: Option<Stop>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true))]
    repeat_penalty: Option<f32>,
    /// snug's own: false turns speculative decoding off for this request (the answer is the
    /// same either way; only its speed differs).
    draft: Option<bool>,
    /// Choices per request: only 1.
    #[schemars(range(min = 1, max = 1))]
    n: Option<u32>,
    /// Only 1 (one choice, sampled once).
    #[schemars(range(min = 1, max = 1))]
    best_of: Option<u32>,
    /// Added to the logits of the tokens named (ids as strings) before sampling: -100 in effect
    /// bans a token, 100 forces it. At most 1024 entries.
    #[serde(default, deserialize_with = "limits::opt_logit_bias")]
    #[schemars(with = "Option<std::collections::BTreeMap<String, LogitBias>>")]
    logit_bias: Option<Vec<(u32, f32)>>,
    /// Accepted and unused: it labels the end user for OpenAI's abuse monitoring.
    #[allow(dead_code)]
    user: Option<String>,
    /// LoRA adapters by id (`GET /lora-adapters`) and scale, llama-server's field: only these
    /// apply. At most 64 entries, scales within ±8.
    #[serde(default, deserialize_with = "limits::opt_lora")]
    #[schemars(length(max = 64))]
    pub lora: Option<Vec<LoraScale>>,
    /// `{"type": "json_object"}`: the answer is one JSON object (JSON mode);
    /// `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`: one JSON value
    /// the schema accepts ([`engine::json_schema`] says which schemas; others are a 400);
    /// `{"type": "text"}`: no constraint.
    response_format: Option<ResponseFormat>,
    /// Functions the model may call (chat only): `{"type": "function", "function": {"name",
    /// "description", "parameters"}}`, at most 64. The call is generated under the tool's
    /// `parameters` schema ([`engine::json_schema`]; one it cannot enforce is a 400 naming the
    /// tool); a template without a known call format is a 400.
    #[serde(default, deserialize_with = "limits::opt_tools")]
    #[schemars(length(max = 64))]
    tools: Option<Vec<Value>>,
    /// `"none"` (tools shown, no call), `"auto"` (the default: the call is constrained once the
    /// model starts one), `"required"` (a call from the first token), or
    /// `{"type": "function", "function": {"name": ...}}` (a call to that tool).
    #[schemars(with = "Option<ToolChoice>")]
    tool_choice: Option<Value>,
    /// More than one call per answer (default true); false: one call at most.
    parallel_tool_calls: Option<bool>,
    /// `"none"`: a reasoning model's `<think>` section stays in `content` as generated;
    /// `"auto"`/`"deepseek"` (the default): it goes to `reasoning_content`.
    #[schemars(with = "Option<ReasoningFormat>")]
    reasoning_format: Option<String>,
    /// The deprecated form of `tools`: refused when not empty.
    #[serde(default, deserialize_with = "limits::opt_tools")]
    #[schemars(length(max = 0))]
    functions: Option<Vec<Value>>,
    /// The deprecated form of `tool_choice`: `"none"` or `"auto"`.
    #[schemars(with = "Option<FunctionCall>")]
    function_call: Option<Value>,
    /// Only `["text"]`: snug answers in text.
    #[serde(default, deserialize_with = "limits::opt_tools")]
    #[schemars(with = "Option<Vec<TextModality>>")]
    modalities: Option<Vec<Value>>,
    /// Audio output is not supported: must be absent or null.
    #[schemars(with = "Option<()>")]
    audio: Option<Value>,
    /// Predicted outputs are not supported: must be absent or null.
    #[schemars(with = "Option<()>")]
    prediction: Option<Value>,
}

/// A `logit_bias` value as the schema states it.
#[derive(JsonSchema)]
#[schemars(rename = "OpenAiLogitBias")]
#[allow(dead_code)]
struct LogitBias(#[schemars(range(min = -100, max = 100))] f32);

/// `modalities` as snug takes it: text only.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OpenAiModality")]
#[allow(dead_code)]
enum TextModality {
    Text,
}

/// `tool_choice` as the spec describes it.
#[derive(JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "OpenAiToolChoice")]
#[allow(dead_code)]
enum ToolChoice {
    Mode(ToolChoiceMode),
    Named(NamedToolChoice),
}

#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OpenAiToolChoiceMode")]
#[allow(dead_code)]
enum ToolChoiceMode {
    None,
    Auto,
    Required,
}

#[derive(JsonSchema)]
#[schemars(rename = "OpenAiNamedToolChoice")]
#[allow(dead_code)]
struct NamedToolChoice {
    #[serde(rename = "type")]
    kind: FunctionType,
    function: FunctionName,
}

#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OpenAiFunctionType")]
#[allow(dead_code)]
enum FunctionType {
    Function,
}

#[derive(JsonSchema)]
#[schemars(rename = "OpenAiFunctionName")]
#[allow(dead_code)]
struct FunctionName {
    name: String,
}

/// `reasoning_format` as the schema states it.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OpenAiReasoningFormat")]
#[allow(dead_code)]
enum ReasoningFormat {
    None,
    Auto,
    Deepseek,
}

/// The deprecated `function_call` as the spec describes it.
#[derive(JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OpenAiFunctionCall")]
#[allow(dead_code)]
enum FunctionCall {
    None,
    Auto,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "OpenAiResponseFormat")]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    kind: ResponseFormatType,
    /// With `json_schema`: the schema.
    json_schema: Option<JsonSchemaFormat>,
}

/// OpenAI's `response_format.json_schema`. `strict` is accepted and always in force: the answer
/// is held to the schema (or the request refused).
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "OpenAiJsonSchemaFormat")]
#[allow(dead_code)]
struct JsonSchemaFormat {
    name: Option<String>,
    description: Option<String>,
    schema: Option<Value>,
    strict: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OpenAiResponseFormatType")]
enum ResponseFormatType {
    Text,
    JsonObject,
    JsonSchema,
}

/// A chat message as the schema describes it (the handler reads it from JSON by hand, to say
/// which part is wrong): a role and a string, null or a list of text parts; other fields
/// (`name`, `tool_calls`…) go to the template.
#[derive(JsonSchema)]
#[allow(dead_code)]
#[schemars(rename = "OpenAiMessage")]
struct MessageSchema {
    role: String,
    content: Option<ContentSchema>,
}

#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
#[schemars(rename = "OpenAiContent")]
enum ContentSchema {
    Text(String),
    Parts(Vec<TextPart>),
}

#[derive(JsonSchema)]
#[allow(dead_code)]
#[schemars(rename = "OpenAiTextPart")]
struct TextPart {
    #[schemars(rename = "type")]
    kind: TextPartType,
    text: String,
}

#[derive(JsonSchema)]
#[allow(dead_code)]
#[schemars(rename = "OpenAiTextPartType")]
enum TextPartType {
    #[serde(rename = "text")]
    Text,
}

/// A completion's prompt as the schema describes it: a string, a list of one string, or token
/// ids.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
#[schemars(rename = "OpenAiPrompt")]
enum PromptSchema {
    Text(String),
    One([String; 1]),
    Ids(#[schemars(length(max = 262144))] Vec<u32>),
}

/// The chat route's own fields. A body is read twice, into these and into [`Common`] (each
/// skips what the other reads without allocating), instead of through `#[serde(flatten)]`,
/// which would buffer every common field as a `Content` tree first and lose the field names
/// of its errors.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ChatFields {
    #[serde(deserialize_with = "limits::messages")]
    #[schemars(with = "Vec<MessageSchema>", length(min = 1, max = 4096))]
    messages: Vec<Value>,
    /// Return each generated token's log-probability.
    logprobs: Option<bool>,
    /// Most likely alternatives per token (needs `logprobs: true`).
    #[schemars(range(max = 20))]
    top_logprobs: Option<u32>,
}

/// `/v1/chat/completions`' body as the spec describes it.
#[derive(JsonSchema)]
#[schemars(rename = "OpenAiChatRequest")]
#[allow(dead_code)]
pub struct ChatRequest {
    #[serde(flatten)]
    fields: ChatFields,
    #[serde(flatten)]
    common: Common,
}

/// The completion route's own fields (read beside [`Common`], as [`ChatFields`]).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CompletionFields {
    #[schemars(with = "PromptSchema")]
    prompt: Prompt,
    /// Return each generated token's log-probability and this many alternatives.
    #[schemars(range(max = 20))]
    logprobs: Option<u32>,
    /// Only `false`: the prompt is not echoed.
    #[schemars(extend("enum" = [false, null]))]
    echo: Option<bool>,
    /// Text after the completion: fill in the middle between `prompt` and this (needs a
    /// model with FIM tokens).
    suffix: Option<String>,
}

/// `/v1/completions`' body as the spec describes it.
#[derive(JsonSchema)]
#[schemars(rename = "OpenAiCompletionRequest")]
#[allow(dead_code)]
pub struct CompletionRequest {
    #[serde(flatten)]
    fields: CompletionFields,
    #[serde(flatten)]
    common: Common,
}

/// `/v1/chat/completions`' request, decoded and validated.
#[derive(Debug)]
pub struct Chat {
    pub common: Common,
    pub messages: Vec<ChatMessage>,
    pub settings: Settings,
    /// Alternatives per token when log-probabilities are asked for.
    pub logprobs: Option<usize>,
}

impl Chat {
    /// The settings and messages, for [`crate::AppState::prepare_chat`].
    fn parts(&mut self) -> (&mut Settings, &[ChatMessage]) {
        (&mut self.settings, &self.messages)
    }

    pub fn decode(body: &[u8]) -> Result<Chat, ApiError> {
        let req: ChatFields = from_json(S, body)?;
        let common: Common = from_json(S, body)?;
        let settings = settings(&common)?;
        let mut settings = settings;
        settings.chat = ChatOptions::new(
            common.tools.as_deref(),
            common.tool_choice.as_ref(),
            common.parallel_tool_calls,
        )
        .map_err(|e| ApiError::bad_request(S, e))?;
        settings.chat.raw_reasoning = match common.reasoning_format.as_deref() {
            None | Some("auto") | Some("deepseek") => false,
            Some("none") => true,
            Some(other) => {
                return Err(ApiError::bad_request(
                    S,
                    format!(
                        "reasoning_format {other:?} is not one of \"none\", \"auto\", \"deepseek\""
                    ),
                ))
            }
        };
        if !settings.chat.tools.is_empty() && settings.json.is_some() {
            return Err(ApiError::bad_request(
                S,
                "response_format cannot be combined with tools: a call is already held to its \
                 tool's schema; send one or the other",
            ));
        }
        let mut messages = req.messages.into_iter().map(message).collect::<Result<Vec<_>, _>>()?;
        crate::tools::history(&mut messages);
        let messages = some_messages(S, messages)?;
        let logprobs =
            crate::logprobs::asked(req.logprobs == Some(true), req.top_logprobs, "top_logprobs")
                .map_err(|e| ApiError::bad_request(S, e))?;
        Ok(Chat { common, messages, settings, logprobs })
    }
}

/// A completion's prompt: text to tokenize, or token ids (checked against the vocabulary when
/// the model is at hand). Read without buffering: a string, a list of one string, or at most
/// [`limits::MAX_PROMPT_IDS`] ids, each kept as a `u32` as it is parsed.
#[derive(Debug)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

const PROMPT_SHAPE: &str = "prompt must be a string, a list of one string, or a list of token ids";

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Prompt, D::Error> {
        use serde::de::{Error, SeqAccess, Visitor};
        /// One element of a prompt list: a string or a token id.
        enum Elem {
            Text(String),
            Id(u32),
        }
        impl<'de> Deserialize<'de> for Elem {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Elem, D::Error> {
                struct E;
                impl Visitor<'_> for E {
                    type Value = Elem;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a string or a token id")
                    }
                    fn visit_str<X: Error>(self, v: &str) -> Result<Elem, X> {
                        Ok(Elem::Text(v.to_string()))
                    }
                    fn visit_u64<X: Error>(self, v: u64) -> Result<Elem, X> {
                        u32::try_from(v).map(Elem::Id).map_err(|_| {
                            X::custom(format!("prompt token id {v} is outside any vocabulary"))
                        })
                    }
                    fn visit_i64<X: Error>(self, v: i64) -> Result<Elem, X> {
                        Err(X::custom(format!("prompt token id {v} is negative")))
                    }
                }
                d.deserialize_any(E)
            }
        }
        struct P;
        impl<'de> Visitor<'de> for P {
            type Value = Prompt;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(PROMPT_SHAPE)
            }
            fn visit_str<X: Error>(self, v: &str) -> Result<Prompt, X> {
                Ok(Prompt::Text(v.to_string()))
            }
            fn visit_string<X: Error>(self, v: String) -> Result<Prompt, X> {
                Ok(Prompt::Text(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
                let mut ids = Vec::new();
                match seq.next_element::<Elem>()? {
                    None => return Ok(Prompt::Ids(ids)),
                    Some(Elem::Text(t)) => {
                        return match seq.next_element::<serde::de::IgnoredAny>()? {
                            None => Ok(Prompt::Text(t)),
                            Some(_) => Err(A::Error::custom(
                                "prompt lists of more than one string are not supported: send one prompt per request",
                            )),
                        }
                    }
                    Some(Elem::Id(t)) => ids.push(t),
                }
                while let Some(e) = seq.next_element::<Elem>()? {
                    let Elem::Id(t) = e else { return Err(A::Error::custom(PROMPT_SHAPE)) };
                    if ids.len() == limits::MAX_PROMPT_IDS {
                        return Err(A::Error::custom(limits::too_many(
                            "prompt",
                            limits::MAX_PROMPT_IDS,
                        )));
                    }
                    ids.push(t);
                }
                Ok(Prompt::Ids(ids))
            }
        }
        d.deserialize_any(P)
    }
}

/// `/v1/completions`' request, decoded and validated.
#[derive(Debug)]
pub struct Completion {
    pub common: Common,
    pub prompt: Prompt,
    pub settings: Settings,
    /// Alternatives per token when log-probabilities are asked for.
    pub logprobs: Option<usize>,
    /// Fill in the middle between the prompt and this (absent when empty).
    pub suffix: Option<String>,
}

impl Completion {
    pub fn decode(body: &[u8]) -> Result<Completion, ApiError> {
        let req: CompletionFields = from_json(S, body)?;
        let common: Common = from_json(S, body)?;
        if req.echo == Some(true) {
            return Err(ApiError::bad_request(
                S,
                "echo is not supported: the answer never repeats the prompt; send echo false or leave it out",
            ));
        }
        if common.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::bad_request(
                S,
                "tools are for /v1/chat/completions: a completion has no template to show them",
            ));
        }
        let settings = settings(&common)?;
        let prompt = req.prompt;
        let logprobs = crate::logprobs::asked(req.logprobs.is_some(), req.logprobs, "logprobs")
            .map_err(|e| ApiError::bad_request(S, e))?;
        let suffix = req.suffix.filter(|s| !s.is_empty());
        Ok(Completion { common, prompt, settings, logprobs, suffix })
    }
}

/// Whether a `tool_choice` (or `function_call`) demands a call: anything but absent, `"none"`
/// or `"auto"`.
fn demands_call(v: &Option<Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::String(t)) => t != "none" && t != "auto",
        Some(_) => true,
    }
}

/// The fields snug reads but cannot honour, each a 400 naming it.
fn refuse_unsupported(c: &Common) -> Result<(), ApiError> {
    let bad = |m: &str| Err(ApiError::bad_request(S, m.to_string()));
    if c.n.is_some_and(|n| n != 1) {
        return bad("n must be 1: this server returns one choice per request");
    }
    if c.best_of.is_some_and(|n| n != 1) {
        return bad("best_of must be 1: this server samples one answer per request");
    }
    let listed = |l: &Option<Vec<Value>>| l.as_ref().is_some_and(|t| !t.is_empty());
    if listed(&c.functions) || demands_call(&c.function_call) {
        return bad("functions (the deprecated form of tools) are not supported: send them as \
             `tools` (and `tool_choice`)");
    }
    if c.modalities.as_ref().is_some_and(|m| m.iter().any(|x| x.as_str() != Some("text"))) {
        return bad("modalities may only be [\"text\"]: snug answers in text");
    }
    if c.audio.as_ref().is_some_and(|a| !a.is_null()) {
        return bad("audio output is not supported: leave `audio` out");
    }
    if c.prediction.as_ref().is_some_and(|a| !a.is_null()) {
        return bad("predicted outputs are not supported: leave `prediction` out");
    }
    if c.temperature.is_some_and(|t| !(0.0..=MAX_TEMPERATURE).contains(&t)) {
        return bad("temperature must be between 0 (greedy) and 2");
    }
    if let Some(l) = &c.lora {
        if let Some(i) = l.iter().position(|e| e.scale.abs() > MAX_LORA_SCALE) {
            return Err(ApiError::bad_request(
                S,
                format!(
                    "lora[{i}].scale is {}; a scale must be within ±{MAX_LORA_SCALE}",
                    l[i].scale
                ),
            ));
        }
    }
    Ok(())
}

/// Checks `n`, the unsupported fields, the sampling settings and the token limit.
fn settings(c: &Common) -> Result<Settings, ApiError> {
    refuse_unsupported(c)?;
    let knobs = Knobs {
        temperature: c.temperature,
        top_k: c.top_k,
        top_p: c.top_p,
        min_p: c.min_p,
        seed: c.seed,
        repeat_penalty: c.repeat_penalty,
        presence_penalty: c.presence_penalty,
        frequency_penalty: c.frequency_penalty,
        draft: c.draft,
        ..Default::default()
    };
    if let Some(l) = &c.lora {
        crate::adapters::check_lora(S, l)?;
    }
    let max = c.max_completion_tokens.or(c.max_tokens).map(|n| n.min(usize::MAX as u64) as usize);
    let mut s = Settings::new(S, &knobs, max, Stop::into_vec(c.stop.clone()))?;
    s.logit_bias = c.logit_bias.clone().unwrap_or_default();
    s.json = match c.response_format.as_ref() {
        None => None,
        Some(f) => match f.kind {
            ResponseFormatType::Text => None,
            ResponseFormatType::JsonObject => Some(JsonFormat::Object),
            ResponseFormatType::JsonSchema => {
                let schema =
                    f.json_schema.as_ref().and_then(|j| j.schema.as_ref()).ok_or_else(|| {
                        ApiError::bad_request(
                        S,
                        "response_format json_schema needs json_schema.schema (the JSON schema \
                         the answer must follow)",
                    )
                    })?;
                Some(crate::api::json_schema(S, schema)?)
            }
        },
    };
    Ok(s)
}

fn finish_reason(r: FinishReason) -> TextFinish {
    match r {
        FinishReason::Stop => TextFinish::Stop,
        FinishReason::Length | FinishReason::ContextFull => TextFinish::Length,
        // vLLM's word for a request the server ended (here: a drain's grace ran out).
        FinishReason::Aborted => TextFinish::Abort,
    }
}

/// A chat's finish: `tool_calls` when it stopped after making a call.
fn chat_finish(r: FinishReason, called: bool) -> ChatFinish {
    match r {
        FinishReason::Stop if called => ChatFinish::ToolCalls,
        r => finish_reason(r).into(),
    }
}

fn usage(f: &Finish) -> Usage {
    Usage::new(f.n_prompt, f.n_cached, f.n_gen)
}

fn next_id(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{:x}{:06x}", unix_now(), N.fetch_add(1, Ordering::Relaxed))
}

/// A message's text: a string, or the `text` of its content parts.
fn message(v: Value) -> Result<ChatMessage, ApiError> {
    let Value::Object(mut m) = v else {
        return Err(ApiError::bad_request(
            S,
            "each message must be an object with role and content",
        ));
    };
    let role = match m.remove("role") {
        Some(Value::String(r)) => r,
        _ => {
            return Err(ApiError::bad_request(
                S,
                "a message has no role (system, user, assistant…)",
            ))
        }
    };
    let content = match m.remove("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (ty, _) => {
                        return Err(ApiError::bad_request(
                            S,
                            format!("content part of type {ty:?} is not supported: this model reads text parts only"),
                        ))
                    }
                }
            }
            text
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                S,
                "message content must be a string or a list of text parts",
            ))
        }
    };
    Ok(ChatMessage { role, content, extra: m })
}

/// Queues the prompt with the request's settings on `adapters`; with `logprobs`, their
/// rendering too.
fn start(
    st: &crate::AppState,
    ticket: Ticket,
    s: Settings,
    prompt: Vec<u32>,
    adapters: JobAdapters,
    logprobs: Option<usize>,
) -> Result<(tokio::sync::mpsc::UnboundedReceiver<Event>, Option<Rendering>), ApiError> {
    let (rx, lp) = st.submit(S, ticket, prompt, s, adapters, logprobs)?;
    Ok((rx, lp.map(|lp| Rendering::new(lp, st.tok.clone()))))
}

/// Which route: the object names and how a piece of text sits in a choice.
#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Text,
}

impl Kind {
    fn id_prefix(self) -> &'static str {
        match self {
            Kind::Chat => "chatcmpl",
            Kind::Text => "cmpl",
        }
    }

    fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }
}

/// What every answer and chunk of one request shares: the chunks' head, and the route.
struct Frames {
    kind: Kind,
    head: Head,
}

impl Frames {
    /// A chat chunk of `choice` as a server-sent event.
    fn chat(&self, choice: DeltaChoice) -> String {
        let head = self.head.clone();
        responses::sse(&ChatCompletionChunk { head, choices: vec![choice], usage: None })
    }

    /// A text completion's chunk of `choice` as a server-sent event.
    fn text(&self, choice: TextChoice) -> String {
        let head = self.head.clone();
        responses::sse(&TextCompletionChunk { head, choices: vec![choice], usage: None })
    }

    /// The head of the whole answer.
    fn whole(self) -> Head {
        Head { object: self.kind.object(false), ..self.head }
    }

    /// The chunk a chat stream opens with: the role.
    fn role(&self) -> String {
        self.chat(delta(Delta::role(), None, None))
    }

    /// The stream's end: the usage chunk when asked for (no choices), then `[DONE]`.
    fn end(&self, f: &Finish, include_usage: bool) -> String {
        let mut out = String::new();
        if include_usage {
            let (head, usage) = (self.head.clone(), Some(usage(f)));
            out += &match self.kind {
                Kind::Chat => responses::sse(&ChatCompletionChunk { head, choices: vec![], usage }),
                Kind::Text => responses::sse(&TextCompletionChunk { head, choices: vec![], usage }),
            };
        }
        out + "data: [DONE]\n\n"
    }
}

/// A streamed chat choice.
fn delta(delta: Delta, logprobs: Option<ChatLogprobs>, finish: Option<ChatFinish>) -> DeltaChoice {
    DeltaChoice { index: 0, delta, logprobs, finish_reason: finish }
}

/// A text completion's choice.
fn text_choice(
    text: String,
    logprobs: Option<LegacyLogprobs>,
    f: Option<TextFinish>,
) -> TextChoice {
    TextChoice { index: 0, text, logprobs, finish_reason: f }
}

/// A failure mid-stream: an error event, then `[DONE]`.
fn failed(e: String) -> String {
    responses::sse(&StreamError::server(e)) + "data: [DONE]\n\n"
}

#[allow(clippy::too_many_arguments)]
async fn respond(
    st: &crate::AppState,
    ticket: Ticket,
    kind: Kind,
    c: &Common,
    settings: Settings,
    prompt: Vec<u32>,
    logprobs: Option<usize>,
    mut parser: Option<engine::tools::OutputParser>,
) -> Result<Response, ApiError> {
    let adapters = st.adapter_set(S, c.model.as_deref(), c.lora.as_deref()).await?;
    let (rx, mut lp) = start(st, ticket, settings, prompt, adapters, logprobs)?;
    let format = parser.as_ref().and_then(|p| p.format());
    let head = Frames {
        kind,
        head: Head {
            id: next_id(kind.id_prefix()),
            object: kind.object(true),
            created: unix_now(),
            model: st.answer_model(c.model.as_deref()),
            system_fingerprint: "snug",
        },
    };
    let include_usage = c.stream_options.as_ref().is_some_and(|o| o.include_usage);
    if let Some(mut parser) = parser.take_if(|_| c.stream) {
        // Content, reasoning and calls as their own deltas ([`crate::tools`]).
        let (mut first, mut called) = (true, Vec::new());
        let body = event_body(rx, move |ev| {
            let (pieces, done) = match ev {
                Event::Text(t) => (crate::tools::pieces(&mut parser, Some(&t)), None),
                Event::Done(f) => (crate::tools::pieces(&mut parser, None), Some(f)),
                Event::Failed(e) => return failed(e),
            };
            let mut out = String::new();
            if std::mem::take(&mut first) {
                out += &head.role();
            }
            for d in crate::tools::openai_deltas(&pieces, format, &mut called) {
                out += &head.chat(delta(d, logprobs::take_chat(&mut lp), None));
            }
            if let Some(f) = done {
                let reason = chat_finish(f.reason, called.iter().any(|&c| c));
                let last = delta(Delta::default(), logprobs::take_chat(&mut lp), Some(reason));
                out += &head.chat(last);
                out += &head.end(&f, include_usage);
            }
            out
        });
        return Ok(streamed("text/event-stream", body));
    }
    if c.stream {
        let mut first = matches!(kind, Kind::Chat);
        let body = event_body(rx, move |ev| match ev {
            Event::Text(t) => {
                let mut out = String::new();
                if std::mem::take(&mut first) {
                    out += &head.role();
                }
                out + &match kind {
                    Kind::Chat => {
                        let lp = logprobs::take_chat(&mut lp);
                        head.chat(delta(Delta::content(t), lp, None))
                    }
                    Kind::Text => {
                        let lp = logprobs::take_legacy(&mut lp);
                        head.text(text_choice(t, lp, None))
                    }
                }
            }
            Event::Done(f) => {
                let reason = finish_reason(f.reason);
                let last = match kind {
                    Kind::Chat => {
                        let lp = logprobs::take_chat(&mut lp);
                        head.chat(delta(Delta::default(), lp, Some(reason.into())))
                    }
                    Kind::Text => {
                        let lp = logprobs::take_legacy(&mut lp);
                        head.text(text_choice(String::new(), lp, Some(reason)))
                    }
                };
                last + &head.end(&f, include_usage)
            }
            Event::Failed(e) => failed(e),
        });
        return Ok(streamed("text/event-stream", body));
    }
    let (text, f) = collect(S, rx).await?;
    if let Kind::Text = kind {
        let lp = logprobs::take_legacy(&mut lp);
        let choices = vec![text_choice(text, lp, Some(finish_reason(f.reason)))];
        let answer = TextCompletion { head: head.whole(), choices, usage: usage(&f) };
        return Ok(axum::Json(answer).into_response());
    }
    let (message, called) = match parser {
        Some(mut parser) => {
            let mut pieces = crate::tools::pieces(&mut parser, Some(&text));
            pieces.extend(crate::tools::pieces(&mut parser, None));
            crate::tools::openai_message(&engine::tools::ParsedOutput::gather(&pieces), format)
        }
        None => (AssistantMessage::text(text), false),
    };
    let choice = ChatChoice {
        index: 0,
        message,
        logprobs: logprobs::take_chat(&mut lp),
        finish_reason: chat_finish(f.reason, called),
    };
    let answer = ChatCompletion { head: head.whole(), choices: vec![choice], usage: usage(&f) };
    Ok(axum::Json(answer).into_response())
}

pub async fn chat(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let run = async {
        let body = body_bytes(S, body)?;
        let (ticket, req, prompt) =
            st.prepare_chat(S, Names::Served, body, Chat::decode, Chat::parts).await?;
        let parser = req.settings.chat.parser();
        respond(&st, ticket, Kind::Chat, &req.common, req.settings, prompt, req.logprobs, parser)
            .await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn completions(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let run = async {
        let (ticket, req, prompt) = st
            .prepare(S, body_bytes(S, body)?, |app, body| {
                let mut req = Completion::decode(body)?;
                req.settings.fit(S, app.engine.n_ctx, app.tok.n_vocab())?;
                let fim = match &req.suffix {
                    Some(_) => {
                        Some(engine::fim::FimTokens::required(&app.tok, "suffix").map_err(|m| {
                            ApiError::bad_request(S, m).with_code("fim_unsupported")
                        })?)
                    }
                    None => None,
                };
                let suffix = req.suffix.as_deref().unwrap_or("");
                app.check_text_len(S, suffix.len())?;
                let prompt = match std::mem::replace(&mut req.prompt, Prompt::Ids(Vec::new())) {
                    Prompt::Text(s) => {
                        app.check_text_len(S, s.len() + suffix.len())?;
                        match fim {
                            Some(f) => engine::fim::suffix_prompt(
                                &app.tok,
                                f,
                                engine::fim::Prefix::Text(&s),
                                suffix,
                            ),
                            None => app.tok.encode(&s, true, true),
                        }
                    }
                    Prompt::Ids(ids) => {
                        let n_vocab = app.tok.n_vocab();
                        if let Some(t) = ids.iter().find(|&&t| t as usize >= n_vocab) {
                            return Err(ApiError::bad_request(
                                S,
                                format!(
                                    "prompt token id {t} is outside the vocabulary of {n_vocab}"
                                ),
                            ));
                        }
                        match fim {
                            Some(f) => engine::fim::suffix_prompt(
                                &app.tok,
                                f,
                                engine::fim::Prefix::Ids(&ids),
                                suffix,
                            ),
                            None => ids,
                        }
                    }
                };
                Ok((req, prompt))
            })
            .await?;
        respond(&st, ticket, Kind::Text, &req.common, req.settings, prompt, req.logprobs, None)
            .await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// The served model, then each registered adapter as `BASE:ADAPTER` (with `parent`: the base).
pub async fn models(State(st): Shared) -> Response {
    let row = |id: String, parent: Option<String>| ModelEntry {
        id,
        object: "model",
        created: st.card.modified,
        owned_by: "snug",
        parent,
    };
    let mut data = vec![row(st.card.name.clone(), None)];
    for a in st.adapters.list() {
        data.push(row(st.adapters.model_name(&a.name), Some(st.card.name.clone())));
    }
    axum::Json(ModelList { object: "list", data }).into_response()
}
