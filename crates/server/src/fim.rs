//! llama-server's `POST /infill`: fill in the middle between `input_prefix` and
//! `input_suffix`, with other files of the project (`input_extra`) before them, in the prompt
//! layout llama-server builds ([`engine::fim::infill_prompt`]). A model without FIM tokens is a
//! 400 that names the missing ones. The answer runs through the scheduler like any completion
//! and comes back in llama-server's shape. Ollama's and OpenAI's `suffix` build their prompt
//! with [`engine::fim::suffix_prompt`] in their own handlers.
//!
//! The route is listed in the route table ([`crate::routes`]) with its request and answer
//! types. Cost: two tokenizations per request, then a completion.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use engine::fim::{infill_prompt, Extra, FimTokens};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::api::limits;
use crate::api::{collect, event_body, streamed, Knobs, Settings};
use crate::error::{body_bytes, from_json, ApiError, Style};
use crate::responses::llama::{
    InfillEnd, InfillRecord, LlamaError, LlamaErrorDetail, StopType, Timings,
};
use crate::responses::sse;
use crate::Shared;
use engine::scheduler::{Event, Finish, FinishReason};

const S: Style = Style::OpenAi;

/// At most this many `input_extra` chunks.
pub const MAX_EXTRA: usize = 256;

/// One `input_extra` chunk as the spec describes it.
#[derive(JsonSchema)]
#[schemars(rename = "InfillExtra")]
#[allow(dead_code)]
struct ExtraSchema {
    /// The file's name (default `tmp`, as llama-server).
    filename: Option<String>,
    text: String,
}

/// `POST /infill`'s body: llama-server's fields (text inputs; llama-server's token-array form
/// of `input_prefix` is not taken) and the sampling settings of its `/completion`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "InfillRequest")]
pub struct InfillRequest {
    model: Option<String>,
    /// The text before the cursor.
    input_prefix: String,
    /// The text after the cursor.
    input_suffix: String,
    /// Other files of the project, placed before the prefix (at most 256).
    #[serde(default, deserialize_with = "extra_list")]
    #[schemars(with = "Vec<ExtraSchema>", length(max = 256))]
    input_extra: Vec<Extra>,
    /// Text the answer starts with (placed after the prefix).
    #[serde(default)]
    prompt: String,
    /// Tokens to generate at most; -1 (default): until an end token or the context's end.
    n_predict: Option<i64>,
    #[serde(default)]
    stream: bool,
    temperature: Option<f32>,
    top_k: Option<i64>,
    #[schemars(range(min = 0, max = 1))]
    top_p: Option<f32>,
    #[schemars(range(min = 0, max = 1))]
    min_p: Option<f32>,
    /// Any integer from i64's minimum to u64's maximum.
    #[serde(default, deserialize_with = "limits::opt_seed")]
    #[schemars(with = "Option<i128>", extend("minimum" = -9223372036854775808i64, "maximum" = 18446744073709551615u64))]
    seed: Option<u64>,
    /// At most 16 strings of at most 256 bytes.
    #[serde(default, deserialize_with = "limits::opt_stops")]
    #[schemars(with = "Option<Vec<crate::api::StopString>>", length(max = 16))]
    stop: Option<Vec<String>>,
    #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true))]
    repeat_penalty: Option<f32>,
    #[schemars(range(min = -1))]
    repeat_last_n: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    /// snug's own: false turns speculative decoding off for this request (the answer is the
    /// same either way; only its speed differs).
    draft: Option<bool>,
}

/// `input_extra`, at most [`MAX_EXTRA`] chunks (refused while parsing past that).
fn extra_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Extra>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<Extra>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of {\"filename\": string, \"text\": string}")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Vec<Extra>, A::Error> {
            let mut out = Vec::new();
            while let Some(e) = seq.next_element::<Extra>()? {
                if out.len() == MAX_EXTRA {
                    return Err(serde::de::Error::custom(limits::too_many(
                        "input_extra",
                        MAX_EXTRA,
                    )));
                }
                out.push(e);
            }
            Ok(out)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Vec<Extra>, E> {
            Ok(Vec::new())
        }
    }
    d.deserialize_any(V)
}

/// `/infill`'s request, decoded and validated.
#[derive(Debug)]
pub struct Infill {
    pub model: Option<String>,
    pub prefix: String,
    pub suffix: String,
    pub extra: Vec<Extra>,
    pub prompt: String,
    pub stream: bool,
    pub settings: Settings,
}

impl Infill {
    pub fn decode(body: &[u8]) -> Result<Infill, ApiError> {
        let r: InfillRequest = from_json(S, body)?;
        let knobs = Knobs {
            temperature: r.temperature,
            top_k: r.top_k,
            top_p: r.top_p,
            min_p: r.min_p,
            seed: r.seed,
            repeat_penalty: r.repeat_penalty,
            repeat_last_n: r.repeat_last_n,
            presence_penalty: r.presence_penalty,
            frequency_penalty: r.frequency_penalty,
            draft: r.draft,
        };
        let max = match r.n_predict {
            Some(0) => return Err(ApiError::bad_request(S, "n_predict must be -1 or at least 1")),
            Some(n) if n > 0 => Some(n as usize),
            _ => None,
        };
        Ok(Infill {
            settings: Settings::new(S, &knobs, max, r.stop.unwrap_or_default())?,
            model: r.model,
            prefix: r.input_prefix,
            suffix: r.input_suffix,
            extra: r.input_extra,
            prompt: r.prompt,
            stream: r.stream,
        })
    }
}

/// llama-server's `stop_type`.
fn stop_type(r: FinishReason) -> StopType {
    match r {
        FinishReason::Stop => StopType::Eos,
        FinishReason::Length | FinishReason::ContextFull => StopType::Limit,
        FinishReason::Aborted => StopType::None,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The fields of llama-server's last record: counts, why it stopped, timings.
fn end(f: &Finish) -> InfillEnd {
    InfillEnd {
        stop_type: stop_type(f.reason),
        stopping_word: "",
        truncated: false,
        tokens_predicted: f.n_gen,
        tokens_evaluated: f.n_prompt,
        timings: Timings {
            prompt_n: f.n_prompt,
            prompt_ms: ms(f.prompt),
            predicted_n: f.n_gen,
            predicted_ms: ms(f.generation),
        },
    }
}

/// `POST /infill`: llama-server's answer shape (`content`, `stop`, `tokens_predicted`…), one
/// JSON object, or with `stream: true` SSE records `data: {"content": …, "stop": false}` and a
/// last one with `stop: true` (no `[DONE]`, as llama-server's non-OpenAI routes).
pub async fn infill(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let run = async {
        let (ticket, req, prompt) = st
            .prepare(S, body_bytes(S, body)?, |app, body| {
                let mut req = Infill::decode(body)?;
                let fim = FimTokens::required(&app.tok, "input_suffix")
                    .map_err(|m| ApiError::bad_request(S, m).with_code("fim_unsupported"))?;
                req.settings.fit(S, app.engine.n_ctx, app.tok.n_vocab())?;
                // The prefix, suffix and extra context are trimmed to fit; `prompt` is not.
                app.check_text_len(S, req.prompt.len())?;
                let prompt = infill_prompt(
                    &app.tok,
                    fim,
                    &req.prefix,
                    &req.suffix,
                    &req.extra,
                    &req.prompt,
                    app.engine.n_ctx,
                );
                Ok((req, prompt))
            })
            .await?;
        let model = st.answer_model(req.model.as_deref());
        let adapters = st.adapter_set(S, req.model.as_deref(), None).await?;
        let (rx, _) = st.submit(S, ticket, prompt, req.settings, adapters, None)?;
        let record = move |content: String, end: Option<InfillEnd>| InfillRecord {
            index: 0,
            content,
            tokens: Vec::new(),
            stop: end.is_some(),
            model: model.clone(),
            end,
        };
        if req.stream {
            let body = event_body(rx, move |ev| match ev {
                Event::Text(t) => sse(&record(t, None)),
                Event::Done(f) => sse(&record(String::new(), Some(end(&f)))),
                Event::Failed(message) => sse(&LlamaError {
                    error: LlamaErrorDetail { code: 500, message, kind: "server_error" },
                }),
            });
            return Ok(streamed("text/event-stream", body));
        }
        let (text, f) = collect(S, rx).await?;
        Ok::<_, ApiError>(axum::Json(record(text, Some(end(&f)))).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_infill_body_needs_prefix_and_suffix_and_names_what_is_missing() {
        let e = Infill::decode(br#"{"input_prefix": "a"}"#).unwrap_err();
        assert!(e.message.contains("input_suffix"), "{}", e.message);
        let e = Infill::decode(br#"{"input_prefix": "a", "input_suffix": "b", "n_predict": 0}"#)
            .unwrap_err();
        assert!(e.message.contains("n_predict"), "{}", e.message);
        let e = Infill::decode(
            br#"{"input_prefix":"a","input_suffix":"b","input_extra":[{"filename":"x"}]}"#,
        )
        .unwrap_err();
        assert!(e.message.contains("input_extra"), "{}", e.message);
        let ok = Infill::decode(
            br#"{"input_prefix":"a","input_suffix":"b","input_extra":[{"text":"t"}],"n_predict":-1}"#,
        )
        .unwrap();
        assert_eq!((ok.extra.len(), ok.settings.max_tokens), (1, None));
    }

    #[test]
    fn too_many_extra_chunks_are_refused_while_parsing() {
        let chunks = vec![r#"{"text":"x"}"#; MAX_EXTRA + 1].join(",");
        let body = format!(r#"{{"input_prefix":"a","input_suffix":"b","input_extra":[{chunks}]}}"#);
        let e = Infill::decode(body.as_bytes()).unwrap_err();
        assert!(e.message.contains("input_extra"), "{}", e.message);
    }
}
