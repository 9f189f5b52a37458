//! The bodies the server answers, as types: every JSON body a route sends (whole answers, each
//! record of a stream, errors) is one of these structs, serialized by the handler and described
//! in `/openapi.json` by the same type (`schemars`, [`crate::openapi`]), so the spec cannot
//! drift from what is sent. One file per API shape: [`openai`], [`ollama`], [`anthropic`], [`llama`]
//! (llama-server's own routes) and [`snug`] (probes and adapter administration).
//!
//! The wire format is the one the handlers wrote with `json!` before: fields in the same order,
//! a field that was left out when empty is `skip_serializing_if`, one that was `null` is an
//! `Option` without it, and floats the models give as `f32` are written widened to `f64`, as a
//! `serde_json::Value` writes them (`0.1f32` is `0.10000000149011612`), by [`wide`] and
//! [`wide_rows`] or by `f64` fields. Cost: none over `json!`: a struct serializes straight to
//! the text, without building a `Value` tree first. This module uses nothing of the crate.

pub mod anthropic;
pub mod llama;
pub mod oai_responses;
pub mod ollama;
pub mod openai;
pub mod snug;

use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;

/// `v` as one line of JSON. The types here cannot fail to serialize (no map has keys that are
/// not strings), so a failure would be a bug; it writes an empty object rather than panic.
pub fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "{}".into())
}

/// One server-sent event: `data: {json}` and the blank line.
pub fn sse<T: Serialize>(v: &T) -> String {
    format!("data: {}\n\n", to_json(v))
}

/// One NDJSON record: `{json}` and a newline.
pub fn ndjson<T: Serialize>(v: &T) -> String {
    format!("{}\n", to_json(v))
}

/// `f32` values written as `f64` (see the module doc).
pub fn wide<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|&x| x as f64))
}

/// Rows of `f32` values written as `f64` (see the module doc).
pub fn wide_rows<S: Serializer>(rows: &[Vec<f32>], s: S) -> Result<S::Ok, S::Error> {
    struct Row<'a>(&'a [f32]);
    impl Serialize for Row<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            wide(self.0, s)
        }
    }
    let mut seq = s.serialize_seq(Some(rows.len()))?;
    for r in rows {
        seq.serialize_element(&Row(r))?;
    }
    seq.end()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Serialize)]
    struct Floats {
        #[serde(serialize_with = "wide")]
        one: Vec<f32>,
        #[serde(serialize_with = "wide_rows")]
        rows: Vec<Vec<f32>>,
    }

    use super::ollama::{ChatRecord, DoneReason, GenerateRecord, Message, Stats};
    use super::openai::{
        ChatCompletionChunk as Chunk, Delta, DeltaCall, DeltaChoice, DeltaFunction, ErrorDetail,
        FunctionKind, OpenAiError, StreamError, Usage,
    };

    /// The bodies as the handlers wrote them with `json!` before they were typed: the same
    /// text, field for field.
    #[test]
    fn bodies_are_the_text_json_wrote() {
        let error = ErrorDetail { message: "m".into(), kind: "x", param: None, code: Some("c") };
        assert_eq!(
            to_json(&OpenAiError { error }),
            json!({"error": {"message": "m", "type": "x", "param": null, "code": "c"}}).to_string()
        );
        assert_eq!(
            to_json(&StreamError::server("e".into())),
            json!({"error": {"message": "e", "type": "server_error", "code": null}}).to_string()
        );
        let head = super::openai::Head {
            id: "i".into(),
            object: "chat.completion.chunk",
            created: 1,
            model: "m".into(),
            system_fingerprint: "snug",
        };
        let chunk = |choices: Vec<DeltaChoice>, usage| Chunk { head: head.clone(), choices, usage };
        let head = json!({"id": "i", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "system_fingerprint": "snug"});
        let with = |extra: serde_json::Value| {
            let mut v = head.clone();
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            v.to_string()
        };
        let role =
            DeltaChoice { index: 0, delta: Delta::role(), logprobs: None, finish_reason: None };
        assert_eq!(
            to_json(&chunk(vec![role], None)),
            with(json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                "logprobs": null, "finish_reason": null}]}))
        );
        let call = Delta {
            tool_calls: vec![DeltaCall {
                index: 0,
                id: Some("c".into()),
                kind: Some(FunctionKind::Function),
                function: DeltaFunction { name: Some("f".into()), arguments: String::new() },
            }],
            ..Delta::default()
        };
        let call = DeltaChoice { index: 0, delta: call, logprobs: None, finish_reason: None };
        assert_eq!(
            to_json(&chunk(vec![call], None)),
            with(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c",
                "type": "function", "function": {"name": "f", "arguments": ""}}]},
                "logprobs": null, "finish_reason": null}]}))
        );
        assert_eq!(
            to_json(&chunk(Vec::new(), Some(Usage::new(2, 0, 3)))),
            with(json!({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3,
                "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}}}))
        );
        let stats = Stats {
            total_duration: 6,
            load_duration: 1,
            prompt_eval_count: 2,
            prompt_eval_duration: 2,
            eval_count: 3,
            eval_duration: 3,
        };
        let end = ChatRecord {
            model: "m".into(),
            created_at: "t".into(),
            done: true,
            message: Message::assistant(String::new()),
            done_reason: Some(DoneReason::Stop),
            stats: Some(stats),
        };
        assert_eq!(
            to_json(&end),
            json!({"model": "m", "created_at": "t", "done": true,
                "message": {"role": "assistant", "content": ""}, "done_reason": "stop",
                "total_duration": 6, "load_duration": 1, "prompt_eval_count": 2,
                "prompt_eval_duration": 2, "eval_count": 3, "eval_duration": 3})
            .to_string()
        );
        let load = GenerateRecord {
            model: "m".into(),
            created_at: "t".into(),
            done: true,
            response: String::new(),
            thinking: None,
            done_reason: Some(DoneReason::Load),
            stats: None,
        };
        assert_eq!(
            to_json(&load),
            json!({"model": "m", "created_at": "t", "done": true, "response": "",
                "done_reason": "load"})
            .to_string()
        );
    }

    #[test]
    fn floats_are_written_as_json_values_write_them() {
        let (one, rows) = (vec![0.1f32, -2.5, f32::NAN], vec![vec![0.3f32], vec![]]);
        let typed = to_json(&Floats { one: one.clone(), rows: rows.clone() });
        assert_eq!(typed, json!({"one": one, "rows": rows}).to_string());
        assert!(typed.contains("0.10000000149011612") && typed.contains("null"), "{typed}");
    }
}
