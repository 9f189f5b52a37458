//! The prefix cache's disk tier (issue 49) through `snug serve` on qwen2.5-coder-0.5b: a
//! ~900-token prompt answered, the server stopped (SIGTERM) and started again on the same
//! `--prefix-cache-dir`, the prompt asked again: the same greedy text, and at least 90% of the
//! prompt reported as cached tokens. Then every block file damaged between runs (bytes flipped,
//! files truncated, deleted): the same text again, no error, the damaged files counted as
//! dropped. `snug cache ls|clear` list and empty the folder.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::serve::Server;
use serde_json::{json, Value};

const ALIAS: &str = "qwen2.5-coder-0.5b";

/// About 900 tokens of code.
fn prompt() -> String {
    let mut p = String::from("// A table of small functions.\n");
    for i in 0..30 {
        p += &format!("fn f{i}(x: u32) -> u32 {{ x.wrapping_mul({}) + {} }}\n", i * 7 + 3, i * 13);
    }
    p + "// The next function, f30, is"
}

/// The greedy answer to the prompt and (prompt tokens, cached tokens).
fn complete(s: &Server) -> (String, u64, u64) {
    let body = json!({"prompt": prompt(), "max_tokens": 8, "temperature": 0});
    let (st, text) = s.send("POST", "/v1/completions", None, Some(&body.to_string())).unwrap();
    assert_eq!(st, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let u = &v["usage"];
    (
        v["choices"][0]["text"].as_str().unwrap().to_string(),
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    )
}

fn metric(s: &Server, name: &str) -> f64 {
    let (_, m) = s.get("/metrics").unwrap();
    let line = m.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}: {m}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn serve(model: &Path, dir: &str) -> Server {
    let args = ["--ctx", "2048", "--threads", "2", "--parallel", "1", "--prefix-cache-dir", dir];
    Server::start(model, &args)
}

fn stop(mut s: Server) {
    s.terminate();
    let (status, err) = s.wait_exit(Duration::from_secs(60)).expect("the server exits");
    assert!(status.success(), "{err}");
}

fn block_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "kv"))
        .collect();
    v.sort();
    v
}

fn snug(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_snug")).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_prompt_asked_again_after_a_restart_is_read_from_disk_and_damage_only_costs_time() {
    let model = common::model(ALIAS);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv");
    let dir_arg = dir.to_str().unwrap();

    let s = serve(&model, dir_arg);
    let (cold, n_prompt, cached) = complete(&s);
    assert!(n_prompt > 800, "{n_prompt} prompt tokens");
    assert_eq!(cached, 0, "a fresh directory holds nothing");
    stop(s);
    // Every full block of the prompt (and of the answer after it) is on disk.
    let n_files = block_files(&dir).len();
    assert!(n_files as u64 >= (n_prompt - 1) / 32, "{n_files} files");

    // A restart: the same answer, the prompt read back.
    let s = serve(&model, dir_arg);
    let (again, _, cached) = complete(&s);
    assert_eq!(again, cold);
    assert!(cached * 10 >= n_prompt * 9, "{cached} of {n_prompt} tokens cached");
    assert_eq!(metric(&s, "snug_prefix_disk_hits_total") as u64, cached / 32);
    stop(s);

    // Damage: a byte flipped in every third file, every third truncated, every third deleted
    // (files in name order, which is not chain order).
    for (i, f) in block_files(&dir).iter().enumerate() {
        match i % 3 {
            0 => {
                let mut b = std::fs::read(f).unwrap();
                let at = b.len() / 2 + i;
                b[at] ^= 0x40;
                std::fs::write(f, b).unwrap();
            }
            1 => {
                let b = std::fs::read(f).unwrap();
                std::fs::write(f, &b[..b.len() - 100]).unwrap();
            }
            _ => std::fs::remove_file(f).unwrap(),
        }
    }
    let s = serve(&model, dir_arg);
    let (damaged, _, cached) = complete(&s);
    assert_eq!(damaged, cold, "a damaged cache answers as a cold run");
    assert_eq!(cached, 0, "the first block is damaged or gone: nothing of the chain is used");
    // The chain stops at its first block: dropped if it was damaged, a miss if deleted.
    assert!(metric(&s, "snug_prefix_disk_dropped_total") <= 1.0);
    stop(s);

    // The blocks computed again were written again; `snug cache` lists and empties them.
    let ls = snug(&["cache", "ls", "--dir", dir_arg]);
    assert!(ls.contains(&format!(" {n_files} blocks")), "{ls}");
    let cleared = snug(&["cache", "clear", "--dir", dir_arg]);
    assert!(cleared.starts_with("deleted"), "{cleared}");
    assert!(block_files(&dir).is_empty());
}
