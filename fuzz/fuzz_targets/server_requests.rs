//! Fuzz the server's request decoding (`server::requests::decode`): byte 0 picks a route that takes
//! a body (`/v1/chat/completions`, `/v1/completions`, `/api/show`, `/api/chat`,
//! `/api/generate`, `/api/pull`, `/v1/messages`, `/v1/messages/count_tokens`,
//! `/v1/responses`), the rest is the body, through the same decoding and
//! validation the route's handler runs before it meets the model. Nothing may panic or
//! overflow, and:
//! - what a request decodes to is valid: sampling settings pass
//!   `SamplerParams::validate`, the token limit is not 0, a chat has messages, show and pull
//!   name a model;
//! - a refusal is a 4xx with a message, and renders as a JSON body in the route's error shape
//!   (`{"error": {"message", "type", "code"}}` for OpenAI, `{"error": "…"}` for Ollama,
//!   `{"type": "error", "error": {"type", "message"}}` for Anthropic).

#![no_main]

use futures_util::FutureExt;
use libfuzzer_sys::fuzz_target;
use server::api::Settings;
use server::error::{ApiError, Style};
use server::requests::{decode, BodyRoute, Decoded};

fn check_settings(s: &Settings) {
    assert!(s.sampling.validate().is_ok(), "decoded settings do not validate: {s:?}");
    assert_ne!(s.max_tokens, Some(0), "a token limit of 0 was accepted");
}

fn check_error(route: BodyRoute, e: ApiError) {
    let status = e.status.as_u16();
    assert!((400..500).contains(&status), "{route:?}: a bad body gave {status}: {e:?}");
    assert!(!e.message.is_empty(), "{route:?}: an error without a message");
    let style = e.style;
    let resp = axum::response::IntoResponse::into_response(e);
    assert_eq!(resp.status().as_u16(), status);
    // The body is already in memory: reading it never waits.
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .now_or_never()
        .expect("an in-memory body is ready")
        .expect("an in-memory body reads");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("an error body is JSON");
    match style {
        Style::OpenAi => assert!(v["error"]["message"].is_string(), "{v}"),
        Style::Ollama => assert!(v["error"].is_string(), "{v}"),
        Style::Anthropic => {
            assert!(v["type"] == "error" && v["error"]["message"].is_string(), "{v}")
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let route = BodyRoute::ALL[pick as usize % BodyRoute::ALL.len()];
    match decode(route, body) {
        Err(e) => check_error(route, e),
        // Not asserted: that a body which decodes is valid JSON throughout. serde_json skips
        // the values of unknown fields without checking their strings' UTF-8, so a body with
        // invalid UTF-8 inside an ignored field decodes (harmless: the bytes are never read).
        Ok(d) => {
            match d {
                Decoded::ChatCompletions(c) => {
                    assert!(!c.messages.is_empty());
                    check_settings(&c.settings);
                }
                Decoded::Completions(c) => check_settings(&c.settings),
                Decoded::Chat(c) => {
                    assert!(!c.messages.is_empty());
                    check_settings(&c.settings);
                }
                Decoded::Generate(g) => check_settings(&g.settings),
                Decoded::Show(s) => assert!(!s.model.is_empty()),
                Decoded::Pull(p) => assert!(!p.model.is_empty()),
                Decoded::Messages(m) => {
                    assert!(!m.messages.is_empty());
                    check_settings(&m.settings);
                }
                Decoded::Responses(r) => {
                    assert!(!r.messages.is_empty());
                    check_settings(&r.settings);
                }
            }
        }
    }
});
