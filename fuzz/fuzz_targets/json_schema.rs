//! Fuzz structured output: a JSON schema (the input up to its first NUL byte) compiled by
//! `engine::json_schema`, and an answer (the rest) read by `SchemaSet` byte by byte.
//! Compiling gives a schema or a message, never a panic; reading never panics. Each side is
//! checked against an independent validator of the same subset, written plainly over
//! `serde_json::Value`: an answer the checker calls complete parses as JSON and the validator
//! accepts it, and the compact text of any JSON value the validator accepts (when it holds no
//! float and no integer longer than the checker reads) is read to the end by the checker, unless the checker had as many readings open as
//! it follows (`MAX_READINGS`: past that it keeps the earliest branches of a union, by design).

#![no_main]

use engine::json::MAX_DIGITS;
use engine::json_schema::{Schema, SchemaSet, MAX_NEST, MAX_READINGS};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// Whether `v` satisfies `s` (a schema `Schema::compile` accepted; `root` resolves `$ref`s).
fn valid(root: &Value, s: &Value, v: &Value, depth: usize) -> bool {
    if depth > 64 {
        return false;
    }
    let o = match s {
        Value::Bool(b) => return *b,
        Value::Object(o) => o,
        _ => return false,
    };
    if let Some(r) = o.get("$ref").and_then(Value::as_str) {
        let target = if r == "#" { Some(root) } else { r.strip_prefix('#').and_then(|p| root.pointer(p)) };
        return target.is_some_and(|t| valid(root, t, v, depth + 1));
    }
    if let Some(c) = o.get("const") {
        return c == v;
    }
    if let Some(Value::Array(e)) = o.get("enum") {
        return e.contains(v);
    }
    for k in ["anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = o.get(k) {
            return alts.iter().any(|a| valid(root, a, v, depth + 1));
        }
    }
    let types: Vec<&str> = match o.get("type") {
        Some(Value::String(t)) => vec![t],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        None if o.contains_key("properties") || o.contains_key("additionalProperties") => vec!["object"],
        None if o.contains_key("items") => vec!["array"],
        _ => return true,
    };
    types.iter().any(|t| match (*t, v) {
        ("string", Value::String(x)) => {
            let n = x.chars().count() as u64;
            n >= o.get("minLength").and_then(Value::as_u64).unwrap_or(0)
                && n <= o.get("maxLength").and_then(Value::as_u64).unwrap_or(u64::MAX)
        }
        ("boolean", Value::Bool(_)) | ("null", Value::Null) => true,
        ("number", Value::Number(_)) => true,
        ("integer", Value::Number(n)) => n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() >= 9.2e18),
        ("array", Value::Array(a)) => {
            let n = a.len() as u64;
            let min = o.get("minItems").and_then(Value::as_u64).unwrap_or(0);
            let max = o.get("maxItems").and_then(Value::as_u64).unwrap_or(u64::MAX);
            let items = o.get("items").unwrap_or(&Value::Bool(true));
            n >= min && n <= max && a.iter().all(|x| valid(root, items, x, depth + 1))
        }
        ("object", Value::Object(m)) => {
            let props = o.get("properties").and_then(Value::as_object).filter(|p| !p.is_empty());
            let required: Vec<&str> =
                o.get("required").and_then(Value::as_array).map_or(vec![], |r| r.iter().filter_map(Value::as_str).collect());
            match props {
                Some(p) => {
                    required.iter().all(|k| m.contains_key(*k))
                        && m.iter().all(|(k, x)| p.get(k).is_some_and(|ps| valid(root, ps, x, depth + 1)))
                }
                None => match o.get("additionalProperties") {
                    None | Some(Value::Bool(true)) => true,
                    Some(Value::Bool(false)) => m.is_empty(),
                    Some(extra) => m.values().all(|x| valid(root, extra, x, depth + 1)),
                },
            }
        }
        _ => false,
    })
}

/// Containers open at the deepest point of `v` (the checker holds at most `MAX_NEST`).
fn nesting(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(nesting).max().unwrap_or(0),
        Value::Object(m) => 1 + m.values().map(nesting).max().unwrap_or(0),
        _ => 0,
    }
}

/// A float (whose compact text may differ from what was read), or an integer longer than the
/// checker reads (`engine::json::MAX_DIGITS`, as llama.cpp's grammars bound them).
fn has_float_or_long(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.is_f64() || n.to_string().trim_start_matches('-').len() > MAX_DIGITS as usize,
        Value::Array(a) => a.iter().any(has_float_or_long),
        Value::Object(m) => m.values().any(has_float_or_long),
        _ => false,
    }
}

fuzz_target!(|data: &[u8]| {
    let cut = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let (schema_text, answer) = (&data[..cut], data.get(cut + 1..).unwrap_or(&[]));
    let Ok(schema_value) = serde_json::from_slice::<Value>(schema_text) else { return };
    let Ok(schema) = Schema::compile(&schema_value) else { return };
    let mut p = SchemaSet::new();
    let mut read = 0;
    for &b in answer {
        if !p.push(&schema, b) {
            break;
        }
        read += 1;
        if p.is_complete() {
            assert!(p.can_end(&schema));
            // As the server sends it: bytes that are not UTF-8 become U+FFFD.
            let text = String::from_utf8_lossy(&answer[..read]);
            match serde_json::from_str::<Value>(&text) {
                Ok(v) => assert!(valid(&schema_value, &schema_value, &v, 0), "complete but invalid: {v}"),
                // JSON has no range for numbers; serde_json's f64 has (1e999 is valid JSON).
                Err(e) if e.to_string().starts_with("number out of range") => {}
                Err(e) => panic!("complete but not JSON ({e}): {text:?}"),
            }
        }
    }
    // The other way: whatever JSON the answer is, if the validator accepts it, the checker must.
    if let Ok(v) = serde_json::from_slice::<Value>(answer) {
        if valid(&schema_value, &schema_value, &v, 0) && !has_float_or_long(&v) && nesting(&v) < MAX_NEST {
            let compact = v.to_string();
            let mut p = SchemaSet::new();
            let mut capped = false;
            let read = compact.bytes().all(|b| {
                let ok = p.push(&schema, b);
                capped |= p.len() == MAX_READINGS;
                ok
            });
            assert!(capped || (read && p.can_end(&schema)), "valid but refused: {compact}");
        }
    }
});
