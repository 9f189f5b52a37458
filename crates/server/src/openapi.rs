//! `GET /openapi.json`: an OpenAPI 3.0 description of every route, built from the route table
//! ([`crate::routes::table`]) and the types each route reads and answers.
//!
//! Design: a route's entry ([`Op`]) names its request type and its answer types, and `schemars`
//! describes them from their serde definitions: requests as they deserialize (which fields are
//! required, and their `#[schemars(...)]` ranges), answers as they serialize (a field left out
//! when empty is optional, one written as `null` is required and nullable). The handlers send
//! those same types ([`crate::responses`]), so the spec follows the code; the schemathesis test
//! (`crates/cli/tests/serve_schema.rs`) checks every answer the server gives against it. A
//! stream is described as its media type (SSE or NDJSON text) with `x-itemSchema` (OpenAPI
//! 3.2's `itemSchema`) naming the type of each event or line. Error bodies take the shape of
//! the route's API ([`Style::of_path`]). Bearer authentication is declared only when the server
//! was started with an API key (without one, no request needs the header, and the spec says
//! so). Cost: the document is built once per server, on the first request for it (~100 KB).

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{json, Map, Value};

use crate::error::Style;
use crate::responses::anthropic::AnthropicError;
use crate::responses::ollama::OllamaError;
use crate::responses::openai::OpenAiError;

/// A type's schema (a `$ref` into `components/schemas` for a named type).
pub type SchemaFn = fn(&mut SchemaGenerator) -> Value;

pub fn schema_of<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
    g.subschema_for::<T>().to_value()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Delete,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Get => "get",
            Method::Post => "post",
            Method::Delete => "delete",
        }
    }
}

/// A successful answer's body.
pub enum Body {
    /// None (204).
    Empty,
    /// Text of this media type (`text/plain`, OpenMetrics).
    Text(&'static str),
    Json(SchemaFn),
    /// One JSON object, or with `"stream": true` a stream of `media` whose events or lines are
    /// each an `item`.
    JsonOrStream {
        whole: SchemaFn,
        media: &'static str,
        item: SchemaFn,
    },
}

/// A route's successful answer: its status, what it means, its body.
pub struct Answer {
    pub status: u16,
    pub description: &'static str,
    pub body: Body,
}

impl Answer {
    /// A 200 with a `T`.
    pub fn json<T: JsonSchema>(description: &'static str) -> Answer {
        Answer { status: 200, description, body: Body::Json(schema_of::<T>) }
    }

    /// A 200 with a `T`, or with `"stream": true` a stream of `media` in items of `I`.
    pub fn stream<T: JsonSchema, I: JsonSchema>(
        description: &'static str,
        media: &'static str,
    ) -> Answer {
        let body = Body::JsonOrStream { whole: schema_of::<T>, media, item: schema_of::<I> };
        Answer { status: 200, description, body }
    }

    /// A 200 with text of `media`.
    pub fn text(description: &'static str, media: &'static str) -> Answer {
        Answer { status: 200, description, body: Body::Text(media) }
    }

    /// A 201 with the `T` created.
    pub fn created<T: JsonSchema>(description: &'static str) -> Answer {
        Answer { status: 201, description, body: Body::Json(schema_of::<T>) }
    }

    /// A 204.
    pub fn no_content(description: &'static str) -> Answer {
        Answer { status: 204, description, body: Body::Empty }
    }
}

/// A route as the document describes it: method, path, what it does, its request body, its
/// success answer and the error statuses it may answer besides those every route may (401
/// with a key, 403, and on a `POST` 415 and 503: [`document`]).
pub struct Op {
    pub method: Method,
    pub path: &'static str,
    pub summary: &'static str,
    pub request: Option<SchemaFn>,
    pub answer: Answer,
    pub errors: &'static [u16],
}

/// Statuses a generation route may answer: a bad body, an unknown model, a body past the size
/// limit, a full queue, a failed computation, a stopped scheduler.
pub const GENERATION_ERRORS: &[u16] = &[400, 404, 413, 429, 500, 503];

/// The routes a supervisor probes, which take no key.
const PROBES: [&str; 2] = ["/health", "/ready"];

/// The `content` of an answer's `body`, its schemas from `resp` (the serialize contract).
fn content(body: &Body, resp: &mut SchemaGenerator) -> Option<Value> {
    Some(match body {
        Body::Empty => return None,
        Body::Text(media) => json!({ *media: {"schema": {"type": "string"}} }),
        Body::Json(f) => json!({"application/json": {"schema": f(resp)}}),
        Body::JsonOrStream { whole, media, item } => json!({
            "application/json": {"schema": whole(resp)},
            // Before OpenAPI 3.2 `schema` describes one event of a stream: its data alone, or,
            // where the stream names its events (`event: response.created`), the event's
            // fields. `x-itemSchema` is what each event's data holds.
            *media: {
                "schema": {"anyOf": [
                    {"type": "string"},
                    {"type": "object", "properties": {
                        "event": {"type": "string"}, "data": {"type": "string"},
                        "id": {"type": "string"}, "retry": {"type": "integer"}}},
                ]},
                "x-itemSchema": item(resp),
            },
        }),
    })
}

fn error_response(schema: &Value, status: u16) -> Value {
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

/// The document of `ops` for a server that requires an API key (`auth`) or not.
pub fn document(ops: &[Op], auth: bool) -> Value {
    let mut req = SchemaSettings::openapi3().for_deserialize().into_generator();
    let mut resp = SchemaSettings::openapi3().for_serialize().into_generator();
    let errors = [
        (Style::OpenAi, schema_of::<OpenAiError>(&mut resp)),
        (Style::Ollama, schema_of::<OllamaError>(&mut resp)),
        (Style::Anthropic, schema_of::<AnthropicError>(&mut resp)),
    ];
    let mut paths = Map::new();
    for r in ops {
        let style = Style::of_path(r.path);
        let error_schema = &errors.iter().find(|(s, _)| *s == style).expect("every style").1;
        let mut ok = json!({"description": r.answer.description});
        if let Some(c) = content(&r.answer.body, &mut resp) {
            ok["content"] = c;
        }
        let mut responses = Map::new();
        responses.insert(r.answer.status.to_string(), ok);
        let probe = PROBES.contains(&r.path);
        let unauthorized: &[u16] = if auth && !probe { &[401] } else { &[] };
        // Every route refuses a foreign Host or Origin (and the admin routes, administration
        // when it is off); every POST a body not sent as JSON (`access`), and any POST while
        // the server drains (`replica`).
        let access: &[u16] = if r.method == Method::Post { &[403, 415, 503] } else { &[403] };
        for &status in r.errors.iter().chain(unauthorized).chain(access) {
            responses.insert(status.to_string(), error_response(error_schema, status));
        }
        let method = r.method.name();
        let mut op = json!({
            "summary": r.summary,
            "operationId": format!("{method}{}", r.path.replace(['/', '.'], "_")),
            "responses": responses,
        });
        if let Some(f) = r.request {
            op["requestBody"] =
                json!({"required": true, "content": {"application/json": {"schema": f(&mut req)}}});
        }
        if auth && probe {
            op["security"] = json!([]);
        }
        if r.path.contains("{name}") {
            op["parameters"] = json!([{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}]);
        }
        let entry = paths.entry(r.path).or_insert_with(|| json!({}));
        entry[method] = op;
    }
    let mut schemas = req.take_definitions(true);
    for (name, schema) in resp.take_definitions(true) {
        // A request type and an answer type of one name would describe one of them wrongly.
        let clash = schemas.get(&name).is_some_and(|s| *s != schema);
        assert!(!clash, "two types are named {name} in the OpenAPI schemas: rename one");
        schemas.insert(name, schema);
    }
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
