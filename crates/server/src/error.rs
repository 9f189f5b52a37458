//! Errors in each API's own shape, and the first steps of reading a request body into one of
//! them: its bytes (a 413 past the size limit) and its JSON (a 400 naming the field at fault).
//! Every module that answers HTTP uses these; this one uses none of them but the bodies'
//! types ([`crate::responses`]) and the option names ([`crate::flags`]).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::flags::MAX_BODY;
use crate::responses::anthropic::AnthropicError;
use crate::responses::ollama::OllamaError;
use crate::responses::openai::{ErrorDetail, OpenAiError};

/// Which API's error shape a response takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// `{"error": {"message", "type", "code"}}`
    OpenAi,
    /// `{"error": "message"}`
    Ollama,
    /// `{"type": "error", "error": {"type", "message"}}` (Anthropic's Messages API)
    Anthropic,
}

impl Style {
    pub(crate) fn of_path(path: &str) -> Style {
        if path.starts_with("/api/") {
            Style::Ollama
        } else if path.starts_with("/v1/messages") {
            Style::Anthropic
        } else {
            Style::OpenAi
        }
    }
}

/// An error response: the status, what was wrong and what to do, in the API's shape.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`.
    pub kind: &'static str,
    /// OpenAI's `code`.
    pub code: Option<&'static str>,
    pub style: Style,
    /// Seconds, sent as `Retry-After`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(style: Style, status: StatusCode, message: impl Into<String>) -> ApiError {
        let kind = match status.as_u16() {
            401 => "authentication_error",
            429 => "rate_limit_error",
            500.. => "server_error",
            _ => "invalid_request_error",
        };
        ApiError { status, message: message.into(), kind, code: None, style, retry_after: None }
    }

    pub fn bad_request(style: Style, message: impl Into<String>) -> ApiError {
        ApiError::new(style, StatusCode::BAD_REQUEST, message)
    }

    /// A body past the size limit (413).
    pub fn too_large(style: Style) -> ApiError {
        let msg = format!("the request body is larger than this server accepts ({MAX_BODY})");
        ApiError::new(style, StatusCode::PAYLOAD_TOO_LARGE, msg).with_code("invalid_body")
    }

    pub(crate) fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// A body that is not the JSON the route takes: malformed, or a field of the wrong type or
    /// past its bound ([`crate::api::limits`]).
    pub fn json(style: Style, e: serde_json::Error) -> ApiError {
        let what = match e.classify() {
            serde_json::error::Category::Data => "a field of the request body is not valid",
            _ => "the request body is not valid JSON for this route",
        };
        ApiError::bad_request(style, format!("{what}: {e}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = match self.style {
            Style::OpenAi => {
                let error = ErrorDetail {
                    message: self.message,
                    kind: self.kind,
                    param: None,
                    code: self.code,
                };
                (self.status, axum::Json(OpenAiError { error })).into_response()
            }
            Style::Ollama => {
                (self.status, axum::Json(OllamaError { error: self.message })).into_response()
            }
            Style::Anthropic => {
                let body = AnthropicError::new(self.status.as_u16(), self.message);
                (self.status, axum::Json(body)).into_response()
            }
        };
        if let Some(s) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// A request body's bytes, or the error in the route's shape (413 past the size limit).
pub fn body_bytes(style: Style, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::too_large(style);
        }
        let msg = format!("reading the request body: {}", r.body_text());
        ApiError::new(style, r.status(), msg).with_code("invalid_body")
    })
}

/// A request body parsed as `T`, or a 400 in the route's shape that names the field at fault
/// (`at options.seed: …`) where the parse knows it.
pub fn from_json<T: for<'de> Deserialize<'de>>(style: Style, body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let v = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let mut err = ApiError::json(style, e.into_inner());
        if path != "." && !path.is_empty() {
            err.message = format!("at {path}: {}", err.message);
        }
        err
    })?;
    de.end().map_err(|e| ApiError::json(style, e))?;
    Ok(v)
}

/// `messages` if there is at least one.
pub fn some_messages(
    style: Style,
    messages: Vec<tokenizer::ChatMessage>,
) -> Result<Vec<tokenizer::ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request(style, "messages is empty: send at least one message"));
    }
    Ok(messages)
}
