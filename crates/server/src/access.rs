//! Who may do what: the checks [`crate::api`]'s guard runs on every routed request before its
//! handler, as pure functions of the request's head.
//!
//! - **Host** (DNS rebinding): on a loopback address, a request whose `Host` is not
//!   `localhost`, `127.0.0.1`, `[::1]` or the `--host` value (any port) is refused. A web page
//!   that rebinds its own name to 127.0.0.1 still sends its own name as `Host`.
//! - **Origin** (cross-site requests): a request carrying a browser `Origin` is refused unless
//!   `--allowed-origins` lists it (`*`: any) or it is the server's own page (`http://` + the
//!   request's `Host`, which passed the check above: the `/ui` page's chat). Off loopback no
//!   `Host` is refused, so a rebinding page's own name would pass as "its own page": there the
//!   exemption holds only for a `Host` that is an IP literal (no DNS name, nothing to rebind)
//!   or the `--host` value, or when the server has an API key (which a foreign page lacks). A
//!   request without an `Origin` is not from a web page.
//! - **Content type**: a `POST` must say `Content-Type: application/json`. A web page can only
//!   send other types without a CORS preflight ("simple" requests), and the server grants no
//!   preflight to an origin not listed, so a page cannot post to it behind the user's back.
//! - **Keys**: `--api-key` is needed on every route but the probes `/health` and `/ready` and
//!   the page `/ui` (which holds no data; its calls send the key); the admin routes (adding
//!   and removing adapters, vLLM's load and unload routes, default scales, pulls) need `--admin-key`, or, without one,
//!   `--allow-admin` opens them to whoever may use the API. Keys are compared as SHA-256
//!   digests, in time independent of where they differ; the scheme `Bearer` in any case, or
//!   Anthropic's `x-api-key` header.
//!
//! Cost per request: a few header lookups and, with a key, one SHA-256 of the key sent.

use axum::http::{header, HeaderMap, Method};
use sha2::{Digest, Sha256};

use crate::flags;

/// The access rules a server runs with.
#[derive(Clone, Debug, Default)]
pub struct Access {
    api_key: Option<[u8; 32]>,
    admin_key: Option<[u8; 32]>,
    allow_admin: bool,
    /// `Host` names accepted (lower case, no port); empty: any (not bound to loopback).
    hosts: Vec<String>,
    /// `Origin`s accepted (lower case); `*` accepts any.
    origins: Vec<String>,
    /// The `--host` value as a `Host` name (lower case, IPv6 in brackets).
    named: Option<String>,
}

/// What a request may not do, and so its refusal.
#[derive(Debug, PartialEq, Eq)]
pub enum Denied {
    /// 403: the `Host` is not this server's (DNS rebinding).
    Host(String),
    /// 403: a browser origin not on `--allowed-origins`.
    Origin(String),
    /// 401: no key, or the wrong one.
    Key,
    /// 403: an admin route while administration is off, or without the admin key.
    Admin { keyed: bool },
    /// 415: a body that does not say it is JSON.
    ContentType(String),
}

impl Denied {
    pub fn status(&self) -> u16 {
        match self {
            Denied::Key => 401,
            Denied::ContentType(_) => 415,
            _ => 403,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Denied::Host(_) => "host_not_allowed",
            Denied::Origin(_) => "origin_not_allowed",
            Denied::Key => "invalid_api_key",
            Denied::Admin { .. } => "admin_disabled",
            Denied::ContentType(_) => "unsupported_media_type",
        }
    }
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denied::Host(h) => write!(f, "Host {h:?} is not this server's: a server on a loopback address answers only to localhost, 127.0.0.1, [::1] and its {} (this refuses DNS-rebinding web pages); connect by one of those names", flags::HOST),
            Denied::Origin(o) => write!(f, "requests from the web origin {o:?} are refused: start the server with {} {o} to let pages of that origin call it", flags::ALLOWED_ORIGINS),
            Denied::Key => write!(f, "this server requires an API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)"),
            Denied::Admin { keyed: true } => write!(f, "this route administers the server (adapters, default scales, pulls): send the admin key ({}) as `Authorization: Bearer <admin key>`", flags::ADMIN_KEY),
            Denied::Admin { keyed: false } => write!(f, "this route administers the server (adapters, default scales, pulls) and administration is off: start the server with {} KEY (or SNUG_ADMIN_KEY) and send that key, or with {}", flags::ADMIN_KEY, flags::ALLOW_ADMIN),
            Denied::ContentType(t) => write!(f, "the request body must be JSON sent with `Content-Type: application/json` (got {t}); with curl add -H 'Content-Type: application/json'"),
        }
    }
}

/// A key a server may be started with: 1 to 256 visible ASCII characters (what an HTTP header
/// can carry unchanged), else why not.
pub fn check_key(what: &str, key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > 256 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{what} must be 1 to 256 visible ASCII characters (no spaces or non-ASCII letters): a client could never send it"
        ));
    }
    Ok(())
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// `a == b` in time independent of where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The token of an `Authorization: Bearer TOKEN` header (scheme in any case).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The key of an `x-api-key: KEY` header (Anthropic's clients send the key so).
fn api_key(headers: &HeaderMap) -> Option<&str> {
    Some(headers.get("x-api-key")?.to_str().ok()?.trim())
}

/// `host` without its port, lower case (`[::1]:8080` → `[::1]`, `Local:1` → `local`).
fn host_name(host: &str) -> String {
    let h = host.trim();
    let name = if h.starts_with('[') {
        h.find(']').map_or(h, |i| &h[..=i])
    } else {
        match h.rsplit_once(':') {
            Some((n, port)) if port.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => h,
        }
    };
    name.to_ascii_lowercase()
}

/// Whether `method` on `route` (a matched route pattern) administers the server.
pub fn is_admin(method: &Method, route: &str) -> bool {
    matches!(
        (method.as_str(), route),
        ("POST", "/v1/adapters")
            | ("DELETE", "/v1/adapters/{name}")
            | ("POST", "/lora-adapters")
            | ("POST", "/api/pull")
            | ("POST", "/v1/load_lora_adapter")
            | ("POST", "/v1/unload_lora_adapter")
    )
}

impl Access {
    /// The rules: `host` is the `--host` value and `loopback` whether the server listens on a
    /// loopback address (only then is `Host` checked). Keys must pass [`check_key`].
    pub fn new(
        api_key: Option<&str>,
        admin_key: Option<&str>,
        allow_admin: bool,
        host: &str,
        loopback: bool,
        origins: &[String],
    ) -> Access {
        let mut hosts = Vec::new();
        let given = host.trim();
        let given = if given.contains(':') && !given.starts_with('[') {
            format!("[{given}]")
        } else {
            given.to_string()
        }
        .to_ascii_lowercase();
        if loopback {
            hosts = ["localhost", "127.0.0.1", "[::1]"].map(String::from).to_vec();
            hosts.push(given.clone());
        }
        Access {
            api_key: api_key.map(digest),
            admin_key: admin_key.map(digest),
            allow_admin,
            hosts,
            origins: origins
                .iter()
                .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
                .collect(),
            named: Some(given),
        }
    }

    /// Whether a page served under `host` (the request's `Host`, which passed the Host check)
    /// is this server's own: on loopback any accepted name; off loopback (where any name is
    /// accepted, so a DNS-rebinding page's name would be too) only an IP literal or the
    /// `--host` value, unless an API key guards every route anyway.
    fn own_page(&self, host: &str) -> bool {
        if !self.hosts.is_empty() || self.api_key.is_some() {
            return true;
        }
        let name = host_name(host);
        let bare = name.trim_start_matches('[').trim_end_matches(']');
        bare.parse::<std::net::IpAddr>().is_ok() || self.named.as_deref() == Some(name.as_str())
    }

    /// Whether `origin` may call this server from a web page.
    pub fn origin_allowed(&self, origin: &str) -> bool {
        let o = origin.trim().trim_end_matches('/').to_ascii_lowercase();
        self.origins.iter().any(|a| a == "*" || *a == o)
    }

    /// Checks a request to `route` (its pattern) by its method and head; `/health` needs no key
    /// and has no body.
    pub fn check(&self, method: &Method, route: &str, headers: &HeaderMap) -> Result<(), Denied> {
        let text = |h: header::HeaderName| {
            headers.get(h).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        if !self.hosts.is_empty() {
            if let Some(h) = text(header::HOST) {
                if !self.hosts.contains(&host_name(&h)) {
                    return Err(Denied::Host(h));
                }
            }
        }
        if let Some(o) = text(header::ORIGIN) {
            let own = text(header::HOST).is_some_and(|h| same_origin(&o, &h) && self.own_page(&h));
            if !own && !self.origin_allowed(&o) {
                return Err(Denied::Origin(o));
            }
        }
        if route == "/health" || route == "/ready" || route == "/ui" {
            return Ok(());
        }
        let sent = bearer(headers).or_else(|| api_key(headers)).map(digest);
        let is = |k: &Option<[u8; 32]>| matches!((k, &sent), (Some(k), Some(s)) if same(k, s));
        let admin = is(&self.admin_key);
        if self.api_key.is_some() && !admin && !is(&self.api_key) {
            return Err(Denied::Key);
        }
        if is_admin(method, route) && !admin {
            match self.admin_key {
                Some(_) => return Err(Denied::Admin { keyed: true }),
                None if !self.allow_admin => return Err(Denied::Admin { keyed: false }),
                None => {}
            }
        }
        Ok(())
    }
}

/// The content-type check of a body route (every `POST` row of the route table: the router's
/// guard decides which, so a new route inherits it): `Content-Type: application/json`, any
/// case, parameters allowed.
pub fn json_body(headers: &HeaderMap) -> Result<(), Denied> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let json = ct.as_deref().is_some_and(|t| {
        t.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    });
    if !json {
        let got = ct.map_or("no Content-Type".to_string(), |t| format!("{t:?}"));
        return Err(Denied::ContentType(got));
    }
    Ok(())
}

/// Whether a browser `Origin` is the server's own page: `http://` and the `Host` it was asked
/// for (any case).
fn same_origin(origin: &str, host: &str) -> bool {
    let o = origin.trim().trim_end_matches('/').as_bytes();
    o.split_at_checked("http://".len()).is_some_and(|(scheme, rest)| {
        scheme.eq_ignore_ascii_case(b"http://") && rest.eq_ignore_ascii_case(host.trim().as_bytes())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn head(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const JSON: (&str, &str) = ("content-type", "application/json; charset=utf-8");

    #[test]
    fn loopback_answers_only_to_its_own_names() {
        let a = Access::new(None, None, false, "127.0.0.1", true, &[]);
        let get = |host: &str| a.check(&Method::GET, "/v1/models", &head(&[("host", host)]));
        for ok in ["localhost", "LOCALHOST:8080", "127.0.0.1:1", "[::1]:8080", "[::1]"] {
            assert_eq!(get(ok), Ok(()), "{ok}");
        }
        for bad in ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "x", "[::2]"] {
            assert!(matches!(get(bad), Err(Denied::Host(_))), "{bad}");
        }
        // Not on loopback: any name (the machine's own names are not known here).
        let open = Access::new(None, None, false, "0.0.0.0", false, &[]);
        assert_eq!(
            open.check(&Method::GET, "/v1/models", &head(&[("host", "evil.example")])),
            Ok(())
        );
        // The --host value itself, an IPv6 one in brackets.
        let v6 = Access::new(None, None, false, "::1", true, &[]);
        assert_eq!(v6.check(&Method::GET, "/", &head(&[("host", "[::1]:9")])), Ok(()));
    }

    #[test]
    fn the_own_page_is_not_cross_origin() {
        let a = Access::new(Some("k"), None, false, "127.0.0.1", true, &[]);
        let page = |origin: &str, host: &str| {
            let h =
                head(&[("origin", origin), ("host", host), JSON, ("authorization", "Bearer k")]);
            a.check(&Method::POST, "/v1/chat/completions", &h)
        };
        assert_eq!(page("http://127.0.0.1:8080", "127.0.0.1:8080"), Ok(()));
        assert_eq!(page("HTTP://LocalHost:8080/", "localhost:8080"), Ok(()));
        assert!(matches!(page("http://127.0.0.1:9999", "127.0.0.1:8080"), Err(Denied::Origin(_))));
        assert!(matches!(page("https://127.0.0.1:8080", "127.0.0.1:8080"), Err(Denied::Origin(_))));
        // The page needs no key; its data does.
        assert_eq!(a.check(&Method::GET, "/ui", &head(&[("host", "127.0.0.1")])), Ok(()));
        let memory = a.check(&Method::GET, "/ui/memory", &head(&[("host", "127.0.0.1")]));
        assert_eq!(memory, Err(Denied::Key));
    }

    #[test]
    fn off_loopback_a_rebound_name_is_not_the_own_page() {
        let chat = |a: &Access, host: &str| {
            let h = head(&[("origin", &format!("http://{host}")), ("host", host), JSON]);
            a.check(&Method::POST, "/v1/chat/completions", &h)
        };
        let open = Access::new(None, None, false, "0.0.0.0", false, &[]);
        let rebound = chat(&open, "evil.example:8080");
        assert!(matches!(rebound, Err(Denied::Origin(_))), "{rebound:?}");
        assert_eq!(chat(&open, "192.168.1.20:8080"), Ok(()));
        assert_eq!(chat(&open, "[fe80::1]:8080"), Ok(()));
        let named = Access::new(None, None, false, "box.lan", false, &[]);
        assert_eq!(chat(&named, "box.lan:8080"), Ok(()));
        assert!(chat(&named, "evil.example:8080").is_err());
        // With a key every route needs it, which a foreign page does not have.
        let keyed = Access::new(Some("k"), None, false, "0.0.0.0", false, &[]);
        assert_eq!(chat(&keyed, "evil.example:8080"), Err(Denied::Key));
    }

    #[test]
    fn browser_origins_need_listing() {
        let a =
            Access::new(None, None, false, "127.0.0.1", true, &["http://app.example:3000/".into()]);
        let get = |o: &str| a.check(&Method::GET, "/v1/models", &head(&[("origin", o)]));
        assert_eq!(get("http://app.example:3000"), Ok(()));
        assert!(matches!(get("http://evil.example"), Err(Denied::Origin(_))));
        assert!(matches!(get("null"), Err(Denied::Origin(_))));
        assert_eq!(a.check(&Method::GET, "/v1/models", &HeaderMap::new()), Ok(()));
        let any = Access::new(None, None, false, "127.0.0.1", true, &["*".into()]);
        assert_eq!(any.check(&Method::GET, "/", &head(&[("origin", "http://x")])), Ok(()));
    }

    #[test]
    fn posts_must_say_json() {
        let a = Access::new(None, None, false, "127.0.0.1", true, &[]);
        let post = |h: &[(&'static str, &str)]| {
            a.check(&Method::POST, "/api/chat", &head(h)).and_then(|()| json_body(&head(h)))
        };
        assert_eq!(post(&[JSON]), Ok(()));
        assert_eq!(post(&[("content-type", "Application/JSON")]), Ok(()));
        for bad in ["text/plain", "application/x-www-form-urlencoded", "application/jsonx"] {
            assert!(matches!(post(&[("content-type", bad)]), Err(Denied::ContentType(_))), "{bad}");
        }
        assert!(matches!(post(&[]), Err(Denied::ContentType(_))));
    }

    #[test]
    fn keys_and_admin() {
        let auth = |k: &str| ("authorization", format!("bEaReR  {k} "));
        let a = Access::new(Some("user-key"), Some("admin-key"), false, "h", false, &[]);
        let run = |m: &Method, route: &str, k: Option<&str>| {
            let h = match k {
                Some(k) => {
                    let (n, v) = auth(k);
                    head(&[(n, &v), JSON])
                }
                None => head(&[JSON]),
            };
            a.check(m, route, &h)
        };
        assert_eq!(run(&Method::GET, "/v1/models", Some("user-key")), Ok(()));
        assert_eq!(run(&Method::GET, "/v1/models", Some("admin-key")), Ok(()));
        assert_eq!(run(&Method::GET, "/v1/models", Some("user-kez")), Err(Denied::Key));
        assert_eq!(run(&Method::GET, "/v1/models", None), Err(Denied::Key));
        assert_eq!(run(&Method::GET, "/health", None), Ok(()));
        assert_eq!(
            run(&Method::POST, "/api/pull", Some("user-key")),
            Err(Denied::Admin { keyed: true })
        );
        assert_eq!(run(&Method::POST, "/api/pull", Some("admin-key")), Ok(()));
        assert_eq!(run(&Method::DELETE, "/v1/adapters/{name}", Some("admin-key")), Ok(()));
        assert_eq!(run(&Method::GET, "/v1/adapters", Some("user-key")), Ok(()));
        let off = Access::new(None, None, false, "h", false, &[]);
        let pull = |a: &Access| a.check(&Method::POST, "/lora-adapters", &head(&[JSON]));
        assert_eq!(pull(&off), Err(Denied::Admin { keyed: false }));
        assert_eq!(pull(&Access::new(None, None, true, "h", false, &[])), Ok(()));
    }

    #[test]
    fn anthropic_clients_send_the_key_as_x_api_key() {
        let a = Access::new(Some("user-key"), None, false, "h", false, &[]);
        let post = |h: &[(&'static str, &str)]| a.check(&Method::POST, "/v1/messages", &head(h));
        assert_eq!(post(&[("x-api-key", "user-key"), JSON]), Ok(()));
        assert_eq!(post(&[("x-api-key", "user-kez"), JSON]), Err(Denied::Key));
        // The JSON-body rule is the route table's (`routes::access_verdict`), on top of the key.
        let verdict = |h: &[(&'static str, &str)]| {
            crate::routes::access_verdict(&a, &Method::POST, "/v1/messages", &head(h))
        };
        assert!(matches!(verdict(&[("x-api-key", "user-key")]), Err(Denied::ContentType(_))));
        assert_eq!(verdict(&[("x-api-key", "user-key"), JSON]), Ok(()));
    }

    #[test]
    fn keys_must_be_sendable() {
        assert!(check_key("--api-key", "abc-DEF_123.~").is_ok());
        for bad in ["", "a b", "clé", "a\tb", &"x".repeat(257)] {
            assert!(check_key("--api-key", bad).is_err(), "{bad:?}");
        }
    }
}
