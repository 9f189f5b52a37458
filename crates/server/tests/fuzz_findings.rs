//! Inputs the fuzz target `server_requests` (`fuzz/`) stopped on, kept under
//! `tests/fixtures/fuzz/` (byte 0 picks the route, as in the target; the rest is the body) and
//! replayed through `server::requests::decode` with the outcome each must give.

use server::requests::{decode, BodyRoute, Decoded};

fn replay(file: &str) -> (BodyRoute, Result<Decoded, server::error::ApiError>) {
    let path = format!("{}/tests/fixtures/fuzz/{file}", env!("CARGO_MANIFEST_DIR"));
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let (&pick, body) = data.split_first().expect("a route byte and a body");
    let route = BodyRoute::ALL[pick as usize % BodyRoute::ALL.len()];
    (route, decode(route, body))
}

/// An /api/generate body whose unknown field `""` holds a string with invalid UTF-8. serde_json
/// skips unknown fields without checking their strings, so it decodes: the bytes are never
/// read. The target had asserted that whatever decodes is valid JSON throughout; that property
/// was wrong, the decoder was not.
#[test]
fn invalid_utf8_in_an_ignored_field_decodes_and_is_never_read() {
    let (route, r) = replay("invalid-utf8-in-ignored-field.json");
    assert_eq!(route, BodyRoute::Generate);
    match r {
        Ok(Decoded::Generate(g)) => {
            assert_eq!(g.prompt, "");
            assert!(!g.stream);
            assert_eq!(g.settings.max_tokens, Some(4));
        }
        other => panic!("expected a decoded generate request, got {other:?}"),
    }
}
