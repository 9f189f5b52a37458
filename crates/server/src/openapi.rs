//! `GET /openapi.json`: an OpenAPI 3.0 description of every route.
//!
//! Request bodies are the handlers' own request structs, described by `schemars` from their
//! serde definitions (field names, types, which are required) and their `#[schemars(...)]`
//! ranges, so the spec follows the code; the paths table and the response shapes are written
//! here, next to nothing else, and the schemathesis test (`crates/cli/tests/serve_schema.rs`)
//! checks every response the server gives against them. Error bodies take the shape of the
//! route's API ([`Style::of_path`]). Bearer authentication is declared only when the server
//! was started with an API key (without one, no request needs the header, and the spec says
//! so). Routes of modules beside the core APIs (fill-in-the-middle, embeddings) are described by
//! those modules and registered by the crate root ([`register`]) before the first document is
//! built, so they depend on this module and not the reverse. Cost: the document is built once,
//! on the first request for it (~20 KB).

use std::sync::OnceLock;

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{json, Map, Value};

use crate::error::Style;
use crate::requests::BodyRoute;
use crate::{adapters, ollama, openai};

/// The document of a server that requires an API key (`auth`) or not, built on first use.
pub fn document(auth: bool) -> &'static str {
    static DOCS: [OnceLock<String>; 2] = [OnceLock::new(), OnceLock::new()];
    DOCS[auth as usize].get_or_init(|| build(auth).to_string())
}

/// A route: method, path, what it does, its request body, its success responses and the error
/// statuses it may answer besides 401 (every route but `/health` takes the API key).
struct Route {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    body: Option<Value>,
    ok: Value,
    errors: &'static [u16],
}

/// Statuses a generation route may answer: a bad body, an unknown model, a body past the size
/// limit, a full queue, a failed computation, a stopped scheduler.
const GENERATION_ERRORS: &[u16] = &[400, 404, 413, 429, 500, 503];

/// The routes a supervisor probes, which take no key.
const PROBES: [&str; 2] = ["/health", "/ready"];

/// A `POST` route described by a module beside the core APIs: path, summary, the request
/// body's schema and the 200 answer's content (by media type).
pub struct ExtraRoute {
    pub path: &'static str,
    pub summary: &'static str,
    pub body: Value,
    pub ok: Value,
}

/// The registered describer of the extra routes (set once, by [`crate::router`]).
static EXTRA: OnceLock<fn(&mut SchemaGenerator) -> Vec<ExtraRoute>> = OnceLock::new();

/// Registers the describer of the routes beside the core APIs; the first registration stays.
pub fn register(describe: fn(&mut SchemaGenerator) -> Vec<ExtraRoute>) {
    let _ = EXTRA.set(describe);
}

pub fn schema_of<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
    g.subschema_for::<T>().to_value()
}

fn json_body(schema: Value) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": schema}}})
}

fn ok(description: &str, content: Value) -> Value {
    json!({"200": {"description": description, "content": content}})
}

pub fn json_content(schema: Value) -> Value {
    json!({"application/json": {"schema": schema}})
}

/// A JSON answer, or with `"stream": true` a stream of `stream_type`.
pub fn json_or_stream(schema: Value, stream_type: &str) -> Value {
    json!({
        "application/json": {"schema": schema},
        stream_type: {"schema": {"type": "string"}},
    })
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn routes(g: &mut SchemaGenerator) -> Vec<Route> {
    let mut all = core_routes(g);
    for e in EXTRA.get().map(|f| f(g)).unwrap_or_default() {
        all.push(Route {
            method: "post",
            path: e.path,
            summary: e.summary,
            body: Some(json_body(e.body)),
            ok: ok("The answer", e.ok),
            errors: GENERATION_ERRORS,
        });
    }
    all
}

fn core_routes(g: &mut SchemaGenerator) -> Vec<Route> {
    let body = |r: BodyRoute, g: &mut SchemaGenerator| {
        Some(json_body(match r {
            BodyRoute::ChatCompletions => schema_of::<openai::ChatRequest>(g),
            BodyRoute::Completions => schema_of::<openai::CompletionRequest>(g),
            BodyRoute::Show => schema_of::<ollama::ShowRequest>(g),
            BodyRoute::Chat => schema_of::<ollama::ChatRequest>(g),
            BodyRoute::Generate => schema_of::<ollama::GenerateRequest>(g),
            BodyRoute::Pull => schema_of::<ollama::PullRequest>(g),
        }))
    };
    let post = |r: BodyRoute, summary, ok, errors, g: &mut SchemaGenerator| Route {
        method: "post",
        path: r.path(),
        summary,
        body: body(r, g),
        ok,
        errors,
    };
    let get =
        |path, summary, ok| Route { method: "get", path, summary, body: None, ok, errors: &[] };
    vec![
        post(
            BodyRoute::ChatCompletions,
            "OpenAI chat completion (SSE ending in `data: [DONE]` with `stream: true`)",
            ok("The answer", json_or_stream(schema_ref("ChatCompletion"), "text/event-stream")),
            GENERATION_ERRORS,
            g,
        ),
        post(
            BodyRoute::Completions,
            "OpenAI text completion (SSE ending in `data: [DONE]` with `stream: true`)",
            ok("The answer", json_or_stream(schema_ref("TextCompletion"), "text/event-stream")),
            GENERATION_ERRORS,
            g,
        ),
        get("/v1/models", "The served model", ok("Models", json_content(schema_ref("ModelList")))),
        get("/", "Ollama's liveness text", ok("`Ollama is running`", json!({"text/plain": {"schema": {"type": "string"}}}))),
        get("/api/version", "The Ollama version this API follows", ok("Version", json_content(json!({"type": "object", "required": ["version"], "properties": {"version": {"type": "string"}}})))),
        get("/api/tags", "Models available", ok("Models", json_content(schema_ref("OllamaTags")))),
        get("/api/ps", "Models loaded", ok("Models", json_content(schema_ref("OllamaPs")))),
        post(BodyRoute::Show, "A model's details", ok("Details", json_content(schema_ref("OllamaShow"))), &[400, 404, 413], g),
        post(
            BodyRoute::Chat,
            "Ollama chat (NDJSON records unless `stream: false`)",
            ok("The answer", json_or_stream(schema_ref("OllamaChatRecord"), "application/x-ndjson")),
            GENERATION_ERRORS,
            g,
        ),
        post(
            BodyRoute::Generate,
            "Ollama generate (NDJSON records unless `stream: false`; an empty prompt only answers that the model is loaded)",
            ok("The answer", json_or_stream(schema_ref("OllamaGenerateRecord"), "application/x-ndjson")),
            GENERATION_ERRORS,
            g,
        ),
        post(
            BodyRoute::Pull,
            "Fetch a known model into the cache (NDJSON progress records unless `stream: false`)",
            ok("Progress, then `{\"status\": \"success\"}`", json_or_stream(schema_ref("OllamaPullRecord"), "application/x-ndjson")),
            &[400, 404, 409, 413, 500, 502],
            g,
        ),
        Route {
            errors: &[503],
            ..get("/health", "Liveness: 200 while the scheduler runs (no API key needed); 503 once it has stopped, so a supervisor restarts the server. While the model loads, before this document is served, it answers 200 `{\"status\": \"loading\"}` and every other route 503", ok("Alive", json_content(schema_ref("Health"))))
        },
        Route {
            errors: &[503],
            ..get("/ready", "Readiness: 200 once the model is loaded and the scheduler serves (no API key needed); 503 while loading, draining after SIGTERM, or once the scheduler has stopped", ok("Ready", json_content(schema_ref("Ready"))))
        },
        Route {
            method: "post",
            path: "/v1/load_lora_adapter",
            summary: "vLLM's: register an adapter file of the server's --lora-dir under `lora_name` (again from the same file: 200)",
            body: Some(json_body(schema_of::<adapters::LoadRequest>(g))),
            ok: ok("Registered", json!({"text/plain": {"schema": {"type": "string"}}})),
            errors: &[400, 404, 409, 413],
        },
        Route {
            method: "post",
            path: "/v1/unload_lora_adapter",
            summary: "vLLM's: unregister an adapter (requests running on it finish on it)",
            body: Some(json_body(schema_of::<adapters::UnloadRequest>(g))),
            ok: ok("Unregistered", json!({"text/plain": {"schema": {"type": "string"}}})),
            errors: &[400, 404, 413],
        },
        get("/metrics", "Prometheus metrics (OpenMetrics text): snug's own (`snug_…`) and the model-server protocol's under vLLM's names (`vllm:…`)", ok("Metrics", json!({"application/openmetrics-text": {"schema": {"type": "string"}}}))),
        get("/openapi.json", "This document", ok("OpenAPI 3.0", json_content(json!({"type": "object"})))),
        get("/ui/memory", "The memory picture the page /ui shows: the plan's numbers, what the server holds now, the bar's segments and the bar as SVG (the page itself is HTML, not part of this API)", ok("Memory", json_content(json!({"type": "object", "required": ["model", "plan", "live", "segments", "svg"]})))),
        get("/v1/adapters", "The registered LoRA adapters (request one with `model: BASE:NAME`)", ok("Adapters", json_content(schema_ref("AdapterList")))),
        Route {
            method: "post",
            path: "/v1/adapters",
            summary: "Register an adapter file of the server's --lora-dir (a file name, not a path)",
            body: Some(json_body(schema_of::<adapters::AddRequest>(g))),
            ok: json!({"201": {"description": "Registered (cold: loaded on first use)", "content": json_content(schema_ref("Adapter"))}}),
            errors: &[400, 404, 409, 413],
        },
        Route {
            method: "delete",
            path: "/v1/adapters/{name}",
            summary: "Unregister an adapter (requests running on it finish on it)",
            body: None,
            ok: json!({"204": {"description": "Unregistered"}}),
            errors: &[404],
        },
        get("/lora-adapters", "llama-server's adapter list: ids for a request's `lora` field, default scales", ok("Adapters", json_content(json!({"type": "array", "items": schema_ref("LoraAdapter")})))),
        Route {
            method: "post",
            path: "/lora-adapters",
            summary: "llama-server's: set the default scales of the adapters listed by id",
            body: Some(json_body(json!({"type": "array", "items": schema_of::<adapters::LoraScale>(g)}))),
            ok: ok("Set", json_content(json!({"type": "object", "required": ["success"], "properties": {"success": {"type": "boolean"}}}))),
            errors: &[400, 404, 413],
        },
    ]
}

fn error_response(style: Style, status: u16) -> Value {
    let schema = match style {
        Style::OpenAi => schema_ref("OpenAiError"),
        Style::Ollama => schema_ref("OllamaError"),
    };
    let mut r = json!({
        "description": match status {
            400 => "The request is not valid for this route: the message says what and how to fix it",
            401 => "The API key is missing or wrong",
            403 => "Refused: a Host that is not this server's, a browser Origin not on --allowed-origins, or an admin route without the admin key (or --allow-admin)",
            404 => "The model or adapter is not served here (or not known, for pull; or no such adapter file)",
            409 => "An adapter of that name is already registered (or as many as the server keeps are), or a pull is running: retry after `Retry-After` seconds",
            413 => "The body is larger than the server accepts",
            415 => "The body was not sent as `Content-Type: application/json`",
            502 => "The package index failed the pull (the message says how)",
            429 => "Every sequence is running and the queue is full: retry after `Retry-After` seconds",
            500 => "The model failed to answer, or this request hit an internal error (the message says why; other requests go on)",
            _ => "The server is stopping, or its scheduler has stopped",
        },
        "content": {"application/json": {"schema": schema}},
    });
    if status == 429 || status == 409 || status == 503 {
        r["headers"] =
            json!({"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}});
    }
    r
}

fn build(auth: bool) -> Value {
    let mut g = SchemaSettings::openapi3().into_generator();
    let mut paths = Map::new();
    for r in routes(&mut g) {
        let style = Style::of_path(r.path);
        let mut responses = r.ok.as_object().cloned().unwrap_or_default();
        let probe = PROBES.contains(&r.path);
        let unauthorized: &[u16] = if auth && !probe { &[401] } else { &[] };
        // Every route refuses a foreign Host or Origin (and the admin routes, administration
        // when it is off); every POST a body not sent as JSON (`access`), and any POST while
        // the server drains (`replica`).
        let access: &[u16] = if r.method == "post" { &[403, 415, 503] } else { &[403] };
        for &status in r.errors.iter().chain(unauthorized).chain(access) {
            responses.insert(status.to_string(), error_response(style, status));
        }
        let mut op = json!({
            "summary": r.summary,
            "operationId": format!("{}{}", r.method, r.path.replace(['/', '.'], "_")),
            "responses": responses,
        });
        if let Some(b) = r.body {
            op["requestBody"] = b;
        }
        if auth && probe {
            op["security"] = json!([]);
        }
        if r.path.contains("{name}") {
            op["parameters"] = json!([{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}]);
        }
        let entry = paths.entry(r.path).or_insert_with(|| json!({}));
        entry[r.method] = op;
    }
    let mut schemas = g.take_definitions(true);
    schemas.extend(response_schemas());
    let mut doc = json!({
        "openapi": "3.0.3",
        "info": {
            "title": "snug serve",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "OpenAI- and Ollama-compatible APIs of snug, a CPU runtime for GGUF models.",
        },
        "paths": paths,
        "components": {"schemas": schemas},
    });
    if auth {
        doc["components"]["securitySchemes"] =
            json!({"bearer": {"type": "http", "scheme": "bearer"}});
        doc["security"] = json!([{"bearer": []}]);
    }
    doc
}

/// The answers' shapes (the handlers build them with `json!`).
fn response_schemas() -> Map<String, Value> {
    let int = json!({"type": "integer", "minimum": 0});
    let string = json!({"type": "string"});
    let nullable_string = json!({"type": "string", "nullable": true});
    let obj = |required: &[&str], props: Value| json!({"type": "object", "required": required, "properties": props});
    let usage = obj(
        &["prompt_tokens", "completion_tokens", "total_tokens"],
        json!({"prompt_tokens": int, "completion_tokens": int, "total_tokens": int}),
    );
    // `abort`: cut short by a drain whose grace period ran out (`replica`).
    let finish = json!({"type": "string", "enum": ["stop", "length", "abort"]});
    let chat_finish = json!({"type": "string", "enum": ["stop", "length", "abort", "tool_calls"]});
    // A call as OpenAI sends it (`arguments` a JSON text) and as Ollama does (an object).
    let openai_call = obj(
        &["id", "type", "function"],
        json!({
            "id": string, "type": {"type": "string", "enum": ["function"]},
            "function": obj(&["name", "arguments"], json!({"name": string, "arguments": string})),
        }),
    );
    let ollama_call = obj(
        &["function"],
        json!({"function": obj(&["name", "arguments"], json!({
            "name": string, "arguments": {"type": "object", "nullable": true},
        }))}),
    );
    let completion = |choice: Value| {
        obj(
            &["id", "object", "created", "model", "choices", "usage"],
            json!({
                "id": string, "object": string, "created": int, "model": string,
                "system_fingerprint": string,
                "choices": {"type": "array", "items": choice},
                "usage": usage,
            }),
        )
    };
    let chat_choice = obj(
        &["index", "message", "finish_reason"],
        json!({
            "index": int,
            // `content` is null when the answer is only calls; `reasoning_content` is the
            // thinking section, apart unless the request keeps the raw text (`tools`).
            "message": obj(&["role", "content"], json!({
                "role": string, "content": nullable_string, "reasoning_content": string,
                "tool_calls": {"type": "array", "items": openai_call},
            })),
            "logprobs": {"nullable": true},
            "finish_reason": chat_finish,
        }),
    );
    let text_choice = obj(
        &["index", "text", "finish_reason"],
        json!({"index": int, "text": string, "logprobs": {"nullable": true}, "finish_reason": finish}),
    );
    let details = obj(
        &["format", "family", "parameter_size", "quantization_level"],
        json!({
            "parent_model": string, "format": string, "family": string,
            "families": {"type": "array", "items": string},
            "parameter_size": string, "quantization_level": string,
        }),
    );
    let model_row = |extra: Value| {
        let mut props = json!({
            "name": string, "model": string, "size": int, "digest": string, "details": details,
            "modified_at": string,
        });
        if let (Some(p), Some(e)) = (props.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        obj(&["name", "model", "size", "digest", "details"], props)
    };
    let models = |row: Value| obj(&["models"], json!({"models": {"type": "array", "items": row}}));
    let record = |answer: (&str, Value)| {
        let mut props = json!({
            "model": string, "created_at": string, "done": {"type": "boolean"},
            "done_reason": string,
            "total_duration": int, "load_duration": int, "prompt_eval_count": int,
            "prompt_eval_duration": int, "eval_count": int, "eval_duration": int,
        });
        props[answer.0] = answer.1;
        obj(&["model", "created_at", "done", answer.0], props)
    };
    let entries = [
        (
            "OpenAiError",
            obj(
                &["error"],
                json!({"error": obj(&["message", "type", "code"], json!({
                    "message": string, "type": string, "param": nullable_string,
                    "code": nullable_string,
                }))}),
            ),
        ),
        ("OllamaError", obj(&["error"], json!({"error": string}))),
        ("ChatCompletion", completion(chat_choice)),
        ("TextCompletion", completion(text_choice)),
        (
            "ModelList",
            obj(
                &["object", "data"],
                json!({"object": string, "data": {"type": "array", "items": obj(
                    &["id", "object", "created", "owned_by"],
                    json!({"id": string, "object": string, "created": int, "owned_by": string}),
                )}}),
            ),
        ),
        ("OllamaTags", models(model_row(json!({})))),
        (
            "OllamaPs",
            models(model_row(json!({
                "expires_at": string, "size_vram": int, "context_length": int,
            }))),
        ),
        (
            "OllamaShow",
            obj(
                &["modelfile", "template", "details", "model_info"],
                json!({
                    "modelfile": string, "parameters": string, "template": string,
                    "details": details, "model_info": {"type": "object"},
                    "capabilities": {"type": "array", "items": string}, "modified_at": string,
                }),
            ),
        ),
        (
            "OllamaChatRecord",
            record((
                "message",
                obj(
                    &["role", "content"],
                    json!({
                        "role": string, "content": string, "thinking": string,
                        "tool_calls": {"type": "array", "items": ollama_call},
                    }),
                ),
            )),
        ),
        ("OllamaGenerateRecord", {
            let mut r = record(("response", string.clone()));
            r["properties"]["thinking"] = string.clone();
            r
        }),
        (
            "OllamaPullRecord",
            obj(
                &["status"],
                json!({"status": string, "digest": string, "total": int, "completed": int}),
            ),
        ),
        (
            "Adapter",
            obj(
                &[
                    "name",
                    "model",
                    "file",
                    "rank",
                    "alpha",
                    "bytes_hot",
                    "tier",
                    "leases",
                    "default_scale",
                ],
                json!({
                    "name": string, "model": string, "file": string, "rank": int,
                    "alpha": {"type": "number"}, "bytes_hot": int,
                    "tier": {"type": "string", "enum": ["hot", "warm", "cold"]},
                    "leases": int, "default_scale": {"type": "number"},
                }),
            ),
        ),
        (
            "AdapterList",
            obj(
                &["object", "data"],
                json!({"object": string, "data": {"type": "array", "items": schema_ref("Adapter")}}),
            ),
        ),
        (
            "LoraAdapter",
            obj(
                &["id", "path", "scale"],
                json!({"id": int, "path": string, "name": string, "scale": {"type": "number"}}),
            ),
        ),
        (
            "Health",
            obj(
                &["status", "model", "uptime_seconds"],
                json!({"status": string, "model": string, "uptime_seconds": int}),
            ),
        ),
        ("Ready", obj(&["status", "model"], json!({"status": string, "model": string}))),
    ];
    entries.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        serde_json::from_str(document(true)).expect("the document is JSON")
    }

    /// Every `$ref` in `v`.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r.clone());
                }
                m.values().for_each(|x| refs(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }

    #[test]
    fn every_reference_resolves_and_every_body_route_has_its_schema() {
        let d = doc();
        let mut all = Vec::new();
        refs(&d, &mut all);
        assert!(all.len() > 10);
        for r in all {
            let name = r.strip_prefix("#/components/schemas/").expect("a local schema");
            assert!(d["components"]["schemas"][name].is_object(), "{r} does not resolve");
        }
        for r in BodyRoute::ALL {
            let body = &d["paths"][r.path()]["post"]["requestBody"]["content"]["application/json"];
            assert!(body["schema"]["$ref"].is_string(), "{} has no request schema", r.path());
        }
    }

    #[test]
    fn request_schemas_state_what_the_decoder_checks() {
        let d = doc();
        let s = &d["components"]["schemas"];
        assert_eq!(s["OpenAiChatRequest"]["required"], json!(["messages"]));
        assert_eq!(s["OpenAiChatRequest"]["properties"]["messages"]["minItems"], 1);
        assert_eq!(s["OpenAiCompletionRequest"]["required"], json!(["prompt"]));
        let top_p = &s["OpenAiChatRequest"]["properties"]["top_p"];
        assert_eq!((top_p["minimum"].as_f64(), top_p["maximum"].as_f64()), (Some(0.0), Some(1.0)));
        assert_eq!(s["OllamaOptions"]["properties"]["repeat_penalty"]["exclusiveMinimum"], true);
    }

    #[test]
    fn errors_take_the_shape_of_their_api() {
        let d = doc();
        let err = |path: &str, status: &str| {
            d["paths"][path]["post"]["responses"][status]["content"]["application/json"]["schema"]
                ["$ref"]
                .clone()
        };
        assert_eq!(err("/v1/chat/completions", "400"), "#/components/schemas/OpenAiError");
        assert_eq!(err("/api/chat", "404"), "#/components/schemas/OllamaError");
        assert!(d["paths"]["/health"]["get"]["responses"]["401"].is_null());
        assert!(d["paths"]["/ready"]["get"]["responses"]["401"].is_null());
        assert!(d["paths"]["/ready"]["get"]["responses"]["503"].is_object());
        let load = &d["paths"]["/v1/load_lora_adapter"]["post"];
        assert!(load["responses"]["200"].is_object() && load["responses"]["503"].is_object());
        let s = &d["components"]["schemas"];
        assert_eq!(s["LoadLoraAdapterRequest"]["required"], json!(["lora_name", "lora_path"]));
        assert!(d["paths"]["/metrics"]["get"]["responses"]["401"].is_object());
    }

    #[test]
    fn adapter_routes_and_the_lora_field_are_described() {
        let d = doc();
        let p = &d["paths"];
        assert!(p["/v1/adapters"]["get"].is_object() && p["/lora-adapters"]["get"].is_object());
        assert!(p["/v1/adapters"]["post"]["responses"]["201"].is_object());
        assert!(p["/v1/adapters"]["post"]["responses"]["409"].is_object());
        let del = &p["/v1/adapters/{name}"]["delete"];
        assert!(del["responses"]["204"].is_object() && del["responses"]["404"].is_object());
        assert_eq!(del["parameters"][0]["in"], "path");
        let s = &d["components"]["schemas"];
        assert_eq!(s["AdapterAddRequest"]["required"], json!(["file"]));
        assert!(s["OpenAiChatRequest"]["properties"]["lora"].is_object());
        assert_eq!(s["LoraScale"]["required"], json!(["id", "scale"]));
    }

    /// Schemathesis found it: a server without an API key documented bearer authentication as
    /// required, and then accepted every request without the header.
    #[test]
    fn authentication_is_documented_only_when_a_key_is_required() {
        let open: Value = serde_json::from_str(document(false)).expect("JSON");
        assert!(open["security"].is_null() && open["components"]["securitySchemes"].is_null());
        assert!(open["paths"]["/metrics"]["get"]["responses"]["401"].is_null());
        let keyed = doc();
        assert_eq!(keyed["security"], json!([{"bearer": []}]));
        assert_eq!(keyed["paths"]["/health"]["get"]["security"], json!([]));
    }
}
