//! Embeddings: OpenAI's `POST /v1/embeddings`, Ollama's `POST /api/embed` and its legacy
//! `POST /api/embeddings`.
//!
//! Each input is tokenized as llama-server does (BOS/EOS as the model adds them, special texts
//! parsed), then the request's inputs run as one scheduler job ([`engine::scheduler`]'s `embed`
//! module: each input its own KV sequence, in turn in one slot, as prefill beside other
//! requests' decoding). The pooling is the server's (`--pooling`, else the file's
//! `{arch}.pooling_type`, else mean: [`engine::embed::pooling_for`]). Vectors are cut to
//! `dimensions` (Matryoshka truncation) and L2-normalised — except on the legacy
//! `/api/embeddings`, which Ollama answers unnormalised. An input longer than the context less
//! one is a 400 naming it, unless Ollama's `truncate` (default true) keeps its first tokens.
//!
//! Cost: a prefill of every input's tokens (no logits), the pooling adds, one JSON (or base64)
//! encode of the vectors, on the blocking pool. Bounds: at most [`MAX_INPUTS`] inputs, each at
//! most the context, and at most [`MAX_VALUES`] values in the answer (inputs × dimensions).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use model::config::Pooling;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::api::limits;
use crate::error::{body_bytes, from_json, ApiError, Style};
use crate::flags::CTX;
use crate::responses::ollama;
use crate::responses::openai::{self, EmbeddingList, EmbeddingUsage, Vector};
use crate::AppState;
use crate::Shared;
use engine::scheduler::{Event, FinishReason};

/// Inputs of one request at most (OpenAI's bound).
pub const MAX_INPUTS: usize = 2048;

/// Vector values one request may be answered at most (inputs × dimensions): 2^20 values are
/// about 21 MiB of JSON. Without it an 8 KB request of 2,048 identical inputs, computed once,
/// is answered with 2,048 copies: 38–66 MB of JSON.
pub const MAX_VALUES: usize = 1 << 20;

/// The values `req` would be answered with, if that is at most [`MAX_VALUES`].
fn check_values(style: Style, req: &Embed, n_embd: usize) -> Result<(), ApiError> {
    let dims = req.dimensions.unwrap_or(n_embd).min(n_embd);
    let values = req.inputs.len().saturating_mul(dims);
    if values > MAX_VALUES {
        let most = MAX_VALUES / dims.max(1);
        return Err(ApiError::bad_request(
            style,
            format!(
                "input has {} inputs of {dims} values each, {values} values in all; one request may be answered with at most {MAX_VALUES} values ({most} inputs at this size): split the list, or ask for fewer dimensions",
                req.inputs.len()
            ),
        ));
    }
    Ok(())
}

/// `value` as a JSON response, serialized on the blocking pool (a large list of vectors takes
/// tens of milliseconds to encode, which the runtime thread's streams must not wait for).
async fn json_off_thread<T: serde::Serialize + Send + 'static>(
    style: Style,
    value: T,
) -> Result<Response, ApiError> {
    let encoded = tokio::task::spawn_blocking(move || serde_json::to_vec(&value)).await;
    match encoded {
        Ok(Ok(bytes)) => Ok((
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            axum::body::Body::from(bytes),
        )
            .into_response()),
        Ok(Err(e)) => Err(ApiError::new(style, StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        Err(_) => Err(ApiError::new(
            style,
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding the answer failed",
        )),
    }
}

/// How the served model embeds: the pooling and the vector's width.
#[derive(Clone, Copy, Debug)]
pub struct Embedding {
    pub pooling: Pooling,
    pub n_embd: usize,
    /// The file names a pooling (an embedding model, in Ollama's sense: `/api/show` lists the
    /// `embedding` capability only then).
    pub from_file: bool,
}

/// One input: text, or token ids (OpenAI's token-array form).
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    Text(String),
    Ids(Vec<u32>),
}

/// An element of an input list as sent: a string, a token id, or a list of ids.
#[derive(Deserialize)]
#[serde(untagged)]
enum Item {
    Text(String),
    Id(u32),
    Ids(#[serde(deserialize_with = "ids")] Vec<u32>),
}

/// A list of token ids, at most [`limits::MAX_PROMPT_IDS`].
fn ids<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<u32>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of token ids")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u32>, A::Error> {
            let mut out = Vec::new();
            while let Some(t) = seq.next_element::<u32>()? {
                if out.len() == limits::MAX_PROMPT_IDS {
                    return Err(serde::de::Error::custom(limits::too_many(
                        "input",
                        limits::MAX_PROMPT_IDS,
                    )));
                }
                out.push(t);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(V)
}

/// `input`: a string, a list of strings, a list of token ids (one input) or a list of such
/// lists; at most [`MAX_INPUTS`] inputs.
fn inputs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Input>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<Input>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string, a list of strings, a list of token ids or a list of such lists")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Vec<Input>, E> {
            Ok(vec![Input::Text(v.to_string())])
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Vec<Input>, E> {
            Ok(vec![Input::Text(v)])
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Vec<Input>, A::Error> {
            let mut out = Vec::new();
            let mut one = Vec::new();
            while let Some(item) = seq.next_element::<Item>()? {
                if out.len() == MAX_INPUTS || one.len() == limits::MAX_PROMPT_IDS {
                    let max = if one.is_empty() { MAX_INPUTS } else { limits::MAX_PROMPT_IDS };
                    return Err(serde::de::Error::custom(limits::too_many("input", max)));
                }
                match item {
                    Item::Id(t) if out.is_empty() => one.push(t),
                    Item::Text(s) if one.is_empty() => out.push(Input::Text(s)),
                    Item::Ids(v) if one.is_empty() => out.push(Input::Ids(v)),
                    _ => {
                        return Err(serde::de::Error::custom(
                            "input mixes token ids with strings or lists: send one kind",
                        ))
                    }
                }
            }
            if !one.is_empty() {
                out.push(Input::Ids(one));
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

/// `input` as the spec describes it.
#[derive(JsonSchema)]
#[serde(untagged)]
#[schemars(rename = "EmbeddingInput")]
#[allow(dead_code)]
enum InputSchema {
    Text(String),
    Texts(#[schemars(length(max = 2048))] Vec<String>),
    Ids(Vec<u32>),
    IdLists(#[schemars(length(max = 2048))] Vec<Vec<u32>>),
}

/// `/v1/embeddings`' body.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "OpenAiEmbeddingRequest")]
pub struct OpenAiRequest {
    model: Option<String>,
    #[serde(deserialize_with = "inputs")]
    #[schemars(with = "InputSchema")]
    input: Vec<Input>,
    /// `float` (default) or `base64` (each vector's little-endian f32 bytes).
    #[schemars(extend("enum" = ["float", "base64", null]))]
    encoding_format: Option<String>,
    /// Keep the first this many values (then L2-normalise): at most the model's width.
    #[schemars(range(min = 1))]
    dimensions: Option<u64>,
    /// Accepted and unused (it labels the caller for OpenAI's monitoring).
    user: Option<String>,
}

/// `/api/embed`'s body.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "OllamaEmbedRequest")]
pub struct EmbedRequest {
    model: Option<String>,
    /// A string or a list of strings.
    #[serde(deserialize_with = "inputs")]
    #[schemars(with = "InputSchema")]
    input: Vec<Input>,
    /// Cut an input longer than the context to its first tokens (default); false: a 400.
    truncate: Option<bool>,
    #[schemars(range(min = 1))]
    dimensions: Option<u64>,
    /// Accepted for Ollama's clients (the model stays loaded for the server's life).
    keep_alive: Option<Value>,
    /// Accepted for Ollama's clients; sampling options do not change an embedding.
    options: Option<Value>,
}

/// `/api/embeddings`' (legacy) body.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "OllamaEmbeddingsRequest")]
pub struct LegacyRequest {
    model: Option<String>,
    prompt: String,
    keep_alive: Option<Value>,
    options: Option<Value>,
}

/// Which route: the answer's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    OpenAi { base64: bool },
    Ollama,
    Legacy,
}

/// An embedding request, decoded and validated as far as it can be without the model.
#[derive(Debug)]
pub struct Embed {
    pub model: Option<String>,
    pub inputs: Vec<Input>,
    pub dimensions: Option<usize>,
    pub truncate: bool,
    pub shape: Shape,
}

fn dims(style: Style, d: Option<u64>) -> Result<Option<usize>, ApiError> {
    match d {
        Some(0) => Err(ApiError::bad_request(style, "dimensions must be at least 1")),
        Some(d) => Ok(Some(d.min(usize::MAX as u64) as usize)),
        None => Ok(None),
    }
}

fn some_inputs(style: Style, inputs: Vec<Input>) -> Result<Vec<Input>, ApiError> {
    if inputs.is_empty() {
        return Err(ApiError::bad_request(style, "input is empty: send at least one text"));
    }
    Ok(inputs)
}

impl Embed {
    pub fn decode_openai(body: &[u8]) -> Result<Embed, ApiError> {
        let s = Style::OpenAi;
        let r: OpenAiRequest = from_json(s, body)?;
        let _ = r.user;
        let base64 = match r.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(ApiError::bad_request(
                    s,
                    format!("encoding_format must be \"float\" or \"base64\", not {other:?}"),
                ))
            }
        };
        Ok(Embed {
            model: r.model,
            inputs: some_inputs(s, r.input)?,
            dimensions: dims(s, r.dimensions)?,
            truncate: false,
            shape: Shape::OpenAi { base64 },
        })
    }

    pub fn decode_ollama(body: &[u8]) -> Result<Embed, ApiError> {
        let s = Style::Ollama;
        let r: EmbedRequest = from_json(s, body)?;
        let _ = (r.keep_alive, r.options);
        if r.input.iter().any(|i| matches!(i, Input::Ids(_))) {
            return Err(ApiError::bad_request(s, "input must be a string or a list of strings"));
        }
        Ok(Embed {
            model: r.model,
            inputs: some_inputs(s, r.input)?,
            dimensions: dims(s, r.dimensions)?,
            truncate: r.truncate.unwrap_or(true),
            shape: Shape::Ollama,
        })
    }

    pub fn decode_legacy(body: &[u8]) -> Result<Embed, ApiError> {
        let r: LegacyRequest = from_json(Style::Ollama, body)?;
        let _ = (r.keep_alive, r.options);
        Ok(Embed {
            model: r.model,
            inputs: vec![Input::Text(r.prompt)],
            dimensions: None,
            truncate: true,
            shape: Shape::Legacy,
        })
    }

    fn style(&self) -> Style {
        match self.shape {
            Shape::OpenAi { .. } => Style::OpenAi,
            Shape::Ollama | Shape::Legacy => Style::Ollama,
        }
    }

    /// The inputs as tokens: text tokenized as llama-server does, ids checked against the
    /// vocabulary; each at most the context less one (cut to that with `truncate`, else a 400
    /// naming the input).
    fn tokens(&self, app: &AppState) -> Result<Vec<Vec<u32>>, ApiError> {
        let style = self.style();
        let max = app.engine.n_ctx.saturating_sub(1);
        let n_vocab = app.tok.n_vocab();
        let hint = if self.shape == Shape::Ollama { " or send truncate: true" } else { "" };
        let mut out = Vec::with_capacity(self.inputs.len());
        for (i, input) in self.inputs.iter().enumerate() {
            let mut t = match input {
                Input::Text(s) => {
                    if !self.truncate {
                        app.check_text_len(style, s.len()).map_err(|mut e| {
                            e.message = format!("input[{i}]: {}{hint}", e.message);
                            e
                        })?;
                    }
                    app.tok.encode(s, true, true)
                }
                Input::Ids(ids) => {
                    if let Some(t) = ids.iter().find(|&&t| t as usize >= n_vocab) {
                        return Err(ApiError::bad_request(
                            style,
                            format!(
                                "input[{i}] has token id {t}, outside the vocabulary of {n_vocab}"
                            ),
                        ));
                    }
                    ids.clone()
                }
            };
            if t.is_empty() {
                return Err(ApiError::bad_request(
                    style,
                    format!("input[{i}] is empty: it has no tokens to embed"),
                ));
            }
            if t.len() > max {
                if !self.truncate {
                    return Err(ApiError::bad_request(
                        style,
                        format!(
                            "input[{i}] has {} tokens, more than the {max} an input may have in this server's context of {} ({CTX}); shorten it{hint}",
                            t.len(),
                            app.engine.n_ctx,
                        ),
                    )
                    .with_code("context_length_exceeded"));
                }
                t.truncate(max);
            }
            out.push(t);
        }
        Ok(out)
    }
}

/// `v`'s little-endian f32 bytes in base64 (RFC 4648, padded), as OpenAI's `encoding_format:
/// "base64"`.
pub fn base64_f32(v: &[f32]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut s = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= c.len() {
                s.push(A[(n >> shift) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// Runs `req` through the scheduler: each input's vector (cut and normalised as the route
/// wants) and the inputs' tokens (all of them, as usage counts them; identical inputs are
/// computed once).
async fn run(
    st: &std::sync::Arc<AppState>,
    body: Bytes,
    decode: fn(&[u8]) -> Result<Embed, ApiError>,
    style: Style,
) -> Result<(Embed, Vec<Vec<f32>>, usize, std::time::Duration), ApiError> {
    let t0 = std::time::Instant::now();
    let (ticket, (req, tokens), _) = st
        .prepare(style, body, move |app, body| {
            let req = decode(body)?;
            let n_embd = app.embedding.n_embd;
            if let Some(d) = req.dimensions.filter(|&d| d > n_embd) {
                return Err(ApiError::bad_request(
                    style,
                    format!("dimensions is {d}, but this model's vectors have {n_embd} values"),
                ));
            }
            check_values(style, &req, n_embd)?;
            let tokens = req.tokens(app)?;
            Ok(((req, tokens), Vec::new()))
        })
        .await?;
    let n_tokens = tokens.iter().map(Vec::len).sum();
    // Identical inputs are computed once: a list of one string repeated costs one input.
    let mut first: std::collections::HashMap<&[u32], usize> = Default::default();
    let which: Vec<usize> = tokens
        .iter()
        .map(|t| {
            let k = first.len();
            *first.entry(t.as_slice()).or_insert(k)
        })
        .collect();
    let mut unique = vec![Vec::new(); first.len()];
    for (t, i) in first {
        unique[i] = t.to_vec();
    }
    let n = unique.len();
    let e = st.embedding;
    let (mut events, mut vectors) = st
        .engine
        .embed_on(ticket, unique, e.pooling, e.n_embd)
        .map_err(|r| ApiError::refused(style, r))?;
    let l2 = req.shape != Shape::Legacy;
    let mut out = Vec::with_capacity(n);
    loop {
        match events.recv().await {
            Some(Event::Done(f)) if f.reason == FinishReason::Stop => {
                while let Ok(v) = vectors.try_recv() {
                    out.push(engine::embed::finish(v, req.dimensions, l2));
                }
                if out.len() != n {
                    break;
                }
                let all = which.iter().map(|&i| out[i].clone()).collect();
                return Ok((req, all, n_tokens, t0.elapsed()));
            }
            Some(Event::Failed(e)) => {
                return Err(ApiError::new(style, StatusCode::INTERNAL_SERVER_ERROR, e))
            }
            Some(Event::Text(_)) => {}
            Some(Event::Done(_)) | None => break,
        }
    }
    Err(ApiError::new(
        style,
        StatusCode::SERVICE_UNAVAILABLE,
        "the server stopped before the embeddings were done",
    ))
}

/// `POST /v1/embeddings`.
pub async fn openai(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let s = Style::OpenAi;
    let go = async {
        let (req, vecs, n_prompt, _) =
            run(&st, body_bytes(s, body)?, Embed::decode_openai, s).await?;
        let base64 = matches!(req.shape, Shape::OpenAi { base64: true });
        let data = vecs
            .into_iter()
            .enumerate()
            .map(|(index, v)| {
                let embedding =
                    if base64 { Vector::Base64(base64_f32(&v)) } else { Vector::Floats(v) };
                openai::Embedding { object: "embedding", index, embedding }
            })
            .collect();
        let list = EmbeddingList {
            object: "list",
            data,
            model: st.answer_model(req.model.as_deref()),
            usage: EmbeddingUsage { prompt_tokens: n_prompt, total_tokens: n_prompt },
        };
        json_off_thread(s, list).await
    };
    go.await.unwrap_or_else(IntoResponse::into_response)
}

fn ns(d: std::time::Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// `POST /api/embed`.
pub async fn ollama(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let s = Style::Ollama;
    let go = async {
        let (req, vecs, n_prompt, took) =
            run(&st, body_bytes(s, body)?, Embed::decode_ollama, s).await?;
        let answer = ollama::Embed {
            model: st.answer_model(req.model.as_deref()),
            embeddings: vecs,
            total_duration: ns(took),
            load_duration: 0,
            prompt_eval_count: n_prompt,
        };
        json_off_thread(s, answer).await
    };
    go.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /api/embeddings` (Ollama's legacy route): `{"embedding": [...]}`, not normalised.
pub async fn legacy(State(st): Shared, body: Result<Bytes, BytesRejection>) -> Response {
    let s = Style::Ollama;
    let go = async {
        let (_, mut vecs, _, _) = run(&st, body_bytes(s, body)?, Embed::decode_legacy, s).await?;
        let embedding = vecs.pop().unwrap_or_default();
        Ok::<_, ApiError>(axum::Json(ollama::Embedding { embedding }).into_response())
    };
    go.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn openai(body: &str) -> Result<Embed, ApiError> {
        Embed::decode_openai(body.as_bytes())
    }

    #[test]
    fn input_takes_a_string_strings_ids_and_lists_of_ids() {
        let t = |s: &str| Input::Text(s.to_string());
        assert_eq!(openai(r#"{"input": "a"}"#).unwrap().inputs, vec![t("a")]);
        assert_eq!(openai(r#"{"input": ["a", "b"]}"#).unwrap().inputs, vec![t("a"), t("b")]);
        assert_eq!(openai(r#"{"input": [1, 2]}"#).unwrap().inputs, vec![Input::Ids(vec![1, 2])]);
        assert_eq!(
            openai(r#"{"input": [[1], [2, 3]]}"#).unwrap().inputs,
            vec![Input::Ids(vec![1]), Input::Ids(vec![2, 3])]
        );
    }

    #[test]
    fn bad_inputs_and_fields_are_400s_naming_them() {
        for (body, word) in [
            (r#"{"input": ["a", 1]}"#, "input"),
            (r#"{"input": []}"#, "input"),
            (r#"{"input": "a", "encoding_format": "hex"}"#, "encoding_format"),
            (r#"{"input": "a", "dimensions": 0}"#, "dimensions"),
            (r#"{"input": {"a": 1}}"#, "input"),
            (r#"{}"#, "input"),
        ] {
            let e = openai(body).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.message.contains(word), "{body}: {}", e.message);
        }
        let e = Embed::decode_ollama(br#"{"input": [1, 2]}"#).unwrap_err();
        assert!(e.message.contains("input"), "{}", e.message);
        let too_many = format!(r#"{{"input": [{}]}}"#, vec!["\"a\""; MAX_INPUTS + 1].join(","));
        assert!(openai(&too_many).unwrap_err().message.contains("input"));
    }

    #[test]
    fn ollama_truncates_by_default_and_openai_never() {
        assert!(Embed::decode_ollama(br#"{"input": "a"}"#).unwrap().truncate);
        assert!(!Embed::decode_ollama(br#"{"input": "a", "truncate": false}"#).unwrap().truncate);
        assert!(!openai(r#"{"input": "a"}"#).unwrap().truncate);
        assert_eq!(Embed::decode_legacy(br#"{"prompt": "a"}"#).unwrap().shape, Shape::Legacy);
    }

    #[test]
    fn base64_is_the_little_endian_bytes() {
        // 1.0f32 = 00 00 80 3f; 2.0 = 00 00 00 40.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, 2.0]), "AACAPwAAAEA=");
        assert_eq!(base64_f32(&[]), "");
    }
}
