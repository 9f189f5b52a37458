//! The routes that take a body, and each one's decoding: the checks that need no model (JSON
//! shape, messages, prompt, sampling ranges, token limit), a pure function of the bytes, so the
//! fuzz target `server_requests` runs exactly what the handlers run. The route table
//! ([`crate::routes::table`]) takes these routes' paths from [`BodyRoute::path`].

use crate::agents::{messages, responses};
use crate::error::ApiError;
use crate::{ollama, openai};

/// The routes that take a body, by path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyRoute {
    ChatCompletions,
    Completions,
    Show,
    Chat,
    Generate,
    Pull,
    Messages,
    CountTokens,
    Responses,
}

impl BodyRoute {
    pub const ALL: [BodyRoute; 9] = [
        BodyRoute::ChatCompletions,
        BodyRoute::Completions,
        BodyRoute::Show,
        BodyRoute::Chat,
        BodyRoute::Generate,
        BodyRoute::Pull,
        BodyRoute::Messages,
        BodyRoute::CountTokens,
        BodyRoute::Responses,
    ];

    pub fn path(self) -> &'static str {
        match self {
            BodyRoute::ChatCompletions => "/v1/chat/completions",
            BodyRoute::Completions => "/v1/completions",
            BodyRoute::Show => "/api/show",
            BodyRoute::Chat => "/api/chat",
            BodyRoute::Generate => "/api/generate",
            BodyRoute::Pull => "/api/pull",
            BodyRoute::Messages => "/v1/messages",
            BodyRoute::CountTokens => "/v1/messages/count_tokens",
            BodyRoute::Responses => "/v1/responses",
        }
    }
}

/// A route's request, decoded and validated as far as it can be without the model.
#[derive(Debug)]
pub enum Decoded {
    ChatCompletions(openai::Chat),
    Completions(openai::Completion),
    Show(ollama::Show),
    Chat(ollama::Chat),
    Generate(ollama::Generate),
    Pull(ollama::Pull),
    Messages(messages::Decoded),
    Responses(responses::Decoded),
}

/// `body` as `route`'s request: the decoding and validation its handler runs first (a pure
/// function of the bytes, which is what the `server_requests` fuzz target drives).
pub fn decode(route: BodyRoute, body: &[u8]) -> Result<Decoded, ApiError> {
    Ok(match route {
        BodyRoute::ChatCompletions => Decoded::ChatCompletions(openai::Chat::decode(body)?),
        BodyRoute::Completions => Decoded::Completions(openai::Completion::decode(body)?),
        BodyRoute::Show => Decoded::Show(ollama::Show::decode(body)?),
        BodyRoute::Chat => Decoded::Chat(ollama::Chat::decode(body)?),
        BodyRoute::Generate => Decoded::Generate(ollama::Generate::decode(body)?),
        BodyRoute::Pull => Decoded::Pull(ollama::Pull::decode(body)?),
        BodyRoute::Messages => Decoded::Messages(messages::Decoded::decode(body)?),
        BodyRoute::CountTokens => Decoded::Messages(messages::Decoded::read(body)?),
        BodyRoute::Responses => Decoded::Responses(responses::Decoded::decode(body)?),
    })
}
