//! What the fuzz targets (`fuzz/`, see its README) found in the tokenizer and chat templates,
//! replayed with what it must now give.

mod common;

use std::path::PathBuf;

use common::load;
use serde_json::json;
use tokenizer::{ChatError, ChatMessage, ChatTemplate};

/// The fuzz fixture with Qwen2.5-coder's real chat template (committed, no download needed).
fn qwen_fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/fixtures/bpe-qwen2.5-coder.gguf")
}

/// `vocab_from_gguf`: a GGUF's `tokenizer.chat_template` is code from whoever made the file.
/// Nested loops of 10^5 × 200 steps rendered 20 MB for seconds (10^5 × 10^5: for hours, and
/// 10 GB of output) before renders were given a budget of steps.
#[test]
fn a_chat_template_that_loops_for_ages_is_stopped_with_a_typed_error() {
    let (_, tok) = load(&qwen_fixture());
    let bomb = "{% for a in range(100000) %}{% for b in range(200) %}x{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(bomb, &tok).unwrap();
    let e = t.render(&[ChatMessage::new("user", "hi")], true).unwrap_err();
    assert!(matches!(e, ChatError::OutOfFuel), "{e:?}");
    assert!(e.to_string().contains("pass a template explicitly"), "{e}");
}

/// The budget is far beyond real chats: 2,000 messages with tool calls and tool results through
/// Qwen's template, with tools defined.
#[test]
fn the_render_budget_leaves_room_for_long_real_conversations() {
    let (f, tok) = load(&qwen_fixture());
    let t = ChatTemplate::from_gguf(&f, &tok).unwrap();
    let tools = [json!({"type": "function", "function": {"name": "f", "description": "d",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}})];
    let mut messages = vec![ChatMessage::new("system", "You are a coder.")];
    for i in 0..500 {
        messages.push(ChatMessage::new("user", format!("question {i}")));
        let mut call = ChatMessage::new("assistant", "");
        call.extra.insert(
            "tool_calls".into(),
            json!([{"type": "function", "function": {"name": "f", "arguments": {"x": i}}}]),
        );
        messages.push(call);
        messages.push(ChatMessage::new("tool", format!("result {i}")));
        messages.push(ChatMessage::new("assistant", format!("answer {i}")));
    }
    let out = t.render_with_tools(&messages, &tools, true).unwrap();
    assert!(out.contains("answer 499"));
}
