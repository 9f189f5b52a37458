//! The page for people, `/ui`, in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`) driven by PyPI `selenium` (`serve_ui.py`; scripts/test.sh installs all
//! three) on `snug serve` of qwen2.5-coder-0.5b with an API key. The driver checks that the page
//! asks for the key, that the memory bar's segments carry the plan's numbers, that a chat
//! message streams its answer with its speed underneath, and that the running-requests figure
//! moves while a second client streams. Here: the page itself needs no key and its data does,
//! and the plan the server shows is `snug plan`'s for the same configuration. Also
//! `snug plan --svg / --html`, which write the same picture without a server.
//!
//! Bounded: a context of 512, answers of at most 40 tokens, the second client stopped once the
//! figure moved; about 20 s on 2 vCPUs.

mod common;

use std::ffi::OsStr;
use std::process::Command;

use common::serve::Server;

const ALIAS: &str = "qwen2.5-coder-0.5b";
/// The configuration both the server and `snug plan` are asked for (the prefix cache's disk
/// tier off, as the other serve tests run).
const CONFIG: [&str; 10] = [
    "--parallel",
    "2",
    "--ctx",
    "512",
    "--threads",
    "2",
    "--ram",
    "2G",
    "--prefix-cache-disk",
    "0",
];
const KEY: &str = "ui-test-key";

/// `snug plan MODEL CONFIG --json [extra]`.
fn plan_json(model: &std::path::Path, extra: &[&OsStr]) -> serde_json::Value {
    let mut args: Vec<&OsStr> = vec![OsStr::new("plan"), model.as_os_str()];
    args.extend(CONFIG.iter().map(OsStr::new));
    args.extend(extra);
    args.push(OsStr::new("--json"));
    common::snug_json(&args)
}

fn tool(name: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_page_shows_the_plan_streams_a_chat_and_follows_the_load() {
    for t in ["chromium", "chromedriver"] {
        assert!(
            tool(t),
            "{t} is missing: `apt-get install -y chromium chromium-driver` (scripts/test.sh installs it)"
        );
    }
    let model = common::model(ALIAS);
    let mut args = CONFIG.to_vec();
    args.extend(["--api-key", KEY]);
    let server = Server::start(&model, &args);

    // The page holds no data: it needs no key (a browser cannot send one when it opens a URL);
    // its data does.
    let (status, page) = server.get("/ui").expect("GET /ui");
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("<title>snug</title>") && page.contains("/ui/memory"));
    let (status, body) = server.get("/ui/memory").expect("GET /ui/memory");
    assert_eq!(status, 401, "/ui/memory answered without the key: {body}");

    // The plan the server shows is the planner's for the same configuration.
    let (status, body) = server.send("GET", "/ui/memory", Some(KEY), None).expect("/ui/memory");
    assert_eq!(status, 200, "{body}");
    let mem: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let plan = &mem["plan"];
    let want = plan_json(&model, &[]);
    let b = &want["breakdown"];
    let sum = |a: &str, c: &str| b[a].as_u64().unwrap() + b[c].as_u64().unwrap();
    assert_eq!(plan["weights"], b["weights"], "{plan} vs {b}");
    assert_eq!(plan["kv"], b["kv"], "{plan} vs {b}");
    assert_eq!(plan["total"], b["total"], "{plan} vs {b}");
    assert_eq!(plan["scratch"].as_u64(), Some(sum("arena", "logits")), "{plan} vs {b}");
    assert_eq!(plan["process"].as_u64(), Some(sum("tokenizer", "overhead")), "{plan} vs {b}");
    assert_eq!(plan["budget"], want["budget_bytes"]);

    let shot = std::env::temp_dir().join(format!("snug-ui-{}.png", std::process::id()));
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve_ui.py"))
        .args(["check", &server.url(), KEY])
        .arg(&shot)
        .output()
        .expect("python3 runs");
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        !stderr.contains("No module named 'selenium'"),
        "selenium is missing: `python3 -m pip install selenium` (scripts/test.sh installs it)"
    );
    assert!(out.status.success(), "the browser test failed:\n{stdout}\n{stderr}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok ")).count(), 4, "{stdout}");
    let png = std::fs::read(&shot).expect("the screenshot under load");
    let _ = std::fs::remove_file(&shot);
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());
    println!("{stdout}");
}

#[test]
fn snug_plan_writes_the_same_picture_without_a_server() {
    let model = common::model(ALIAS);
    let dir = std::env::temp_dir().join(format!("snug-plan-svg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let (svg, html) = (dir.join("plan.svg"), dir.join("plan.html"));
    let want = plan_json(
        &model,
        &[OsStr::new("--svg"), svg.as_os_str(), OsStr::new("--html"), html.as_os_str()],
    );
    let svg = std::fs::read_to_string(&svg).expect("the SVG was written");
    let html = std::fs::read_to_string(&html).expect("the HTML was written");
    let _ = std::fs::remove_dir_all(&dir);
    let b = &want["breakdown"];
    let seg = |key: &str| -> u64 {
        let needle = format!("data-key=\"{key}\" data-bytes=\"");
        let at = svg.find(&needle).unwrap_or_else(|| panic!("no {key} segment in {svg}"));
        let rest = &svg[at + needle.len()..];
        rest[..rest.find('"').unwrap()].parse().unwrap()
    };
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(seg("weights"), b["weights"].as_u64().unwrap());
    // No server: the whole KV cache is free.
    assert_eq!(seg("kv_free"), b["kv"].as_u64().unwrap());
    assert_eq!(seg("kv_used") + seg("kv_cached"), 0);
    let bar: u64 = [
        "weights",
        "kv_used",
        "kv_cached",
        "kv_free",
        "adapters_hot",
        "adapters_free",
        "scratch",
        "process",
        "headroom",
        "unused",
    ]
    .into_iter()
    .map(seg)
    .sum();
    assert_eq!(bar, want["budget_bytes"].as_u64().unwrap(), "the bar is the budget");
    assert!(html.starts_with("<!doctype html>") && html.contains(svg.trim_end()));
}
