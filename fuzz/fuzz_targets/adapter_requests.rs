//! Fuzz the adapter routes' request checks (`server::adapters`): byte 0 picks a body —
//! `POST /v1/adapters`' `{"name", "file"}`, llama-server's `lora` list (`POST /lora-adapters`
//! and the `lora` field of a completion), or a raw adapter name (`DELETE /v1/adapters/{name}`,
//! `BASE:NAME`) — and the rest is the body. Nothing may panic, and:
//! - a file the checks accept is a regular file directly inside the adapter directory, never
//!   reached through `..`, a separator or a symlink that leads out (the fixture directory holds
//!   one of each kind of symlink);
//! - a name the checks accept has no path separator, NUL, `:` or whitespace, and no leading
//!   `.` or `-` (names are keys, not paths: `a..b` is a valid name);
//! - an accepted `lora` list has finite scales and each id once;
//! - a refusal is a 4xx with a message.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use server::adapters::{check_lora, check_name, open_confined, AddRequest, Confine, LoraScale};
use server::error::{from_json, ApiError, Style};

/// A directory with `a.gguf`, `inner.gguf` (a symlink to it), `out.gguf` (a symlink to a file
/// outside) and `up.gguf` (a symlink to the parent), beside a file `outside.gguf`.
fn fixture() -> &'static (PathBuf, PathBuf) {
    static DIR: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("snug-fuzz-adapters-{}", std::process::id()));
        let dir = root.join("loras");
        std::fs::create_dir_all(&dir).expect("fixture directory");
        std::fs::write(dir.join("a.gguf"), b"GGUF").expect("fixture file");
        std::fs::write(root.join("outside.gguf"), b"GGUF").expect("fixture file");
        for (name, target) in
            [("inner.gguf", dir.join("a.gguf")), ("out.gguf", root.join("outside.gguf"))]
        {
            let _ = std::os::unix::fs::symlink(target, dir.join(name));
        }
        let _ = std::os::unix::fs::symlink(&root, dir.join("up.gguf"));
        let canon = dir.canonicalize().expect("fixture directory resolves");
        (dir, canon)
    })
}

fn check_refusal(e: &ApiError) {
    let status = e.status.as_u16();
    assert!((400..500).contains(&status), "a bad body gave {status}: {e:?}");
    assert!(!e.message.is_empty(), "an error without a message");
}

fn check_file(dir: &Path, canon: &Path, file: &str) {
    match open_confined(dir, file) {
        Ok((_, p)) => {
            assert_eq!(p.parent(), Some(canon), "{file:?} was confined to {p:?}");
            assert!(p.is_file(), "{file:?} resolved to {p:?}, not a file");
            assert!(!file.contains(['/', '\\', '\0']) && !file.contains(".."), "{file:?} passed");
        }
        Err(Confine::Outside(m)) | Err(Confine::Missing(m)) => assert!(!m.is_empty()),
    }
}

/// Names are keys, never paths (files go through `open_confined`), but they appear in `BASE:NAME`,
/// URLs and logs: no separator, NUL, `:` or whitespace, no leading `.` or `-`, 1 to 64 bytes.
fn check_plain_name(name: &str) {
    if check_name(name).is_ok() {
        assert!((1..=64).contains(&name.len()), "{name:?} passed");
        assert!(!name.starts_with(['.', '-']), "{name:?} passed");
        let bad = |c: char| matches!(c, '/' | '\\' | '\0' | ':') || c.is_whitespace();
        assert!(!name.contains(bad), "{name:?} passed");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let (dir, canon) = fixture();
    match pick % 3 {
        0 => match from_json::<AddRequest>(Style::OpenAi, body) {
            Ok(req) => {
                check_file(dir, canon, &req.file);
                if let Some(name) = &req.name {
                    check_plain_name(name);
                }
            }
            Err(e) => check_refusal(&e),
        },
        1 => match from_json::<Vec<LoraScale>>(Style::OpenAi, body)
            .and_then(|l| check_lora(Style::OpenAi, &l).map(|()| l))
        {
            Ok(list) => {
                for (i, e) in list.iter().enumerate() {
                    assert!(e.scale.is_finite(), "lora[{i}] scale {} passed", e.scale);
                    assert!(list[..i].iter().all(|p| p.id != e.id), "id {} twice passed", e.id);
                }
            }
            Err(e) => check_refusal(&e),
        },
        _ => {
            let name = String::from_utf8_lossy(body);
            check_plain_name(&name);
            check_file(dir, canon, &name);
        }
    }
});
