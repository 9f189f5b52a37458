//! Chat templates rendered as Hugging Face's `apply_chat_template` would: the real Qwen2.5
//! template (plain, with tools and tool calls) and the Gemma fallback for gemma3-270m, whose GGUF
//! carries no template.

mod common;

use common::{load, real_model, refdata_dir};
use serde_json::json;
use tokenizer::{ChatMessage, ChatTemplate};

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

#[test]
fn qwen_template_adds_its_default_system_prompt() {
    let (f, tok) = load(&real_model("qwen2.5-coder-0.5b"));
    let t = ChatTemplate::from_gguf(&f, &tok).unwrap();
    assert!(!t.is_fallback());
    let out = t.render(&[msg("user", "Write a haiku about memory.")], true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nWrite a haiku about memory.<|im_end|>\n<|im_start|>assistant\n"
    );
    // The rendered prompt tokenizes with its control tokens (qwen adds no BOS).
    let ids = tok.encode(&t.render(&[msg("user", "hi")], true).unwrap(), true, true);
    assert_eq!(ids[0], tok.token_id("<|im_start|>").unwrap());
}

#[test]
fn qwen_template_renders_tools_and_tool_calls_like_transformers() {
    let (f, tok) = load(&real_model("qwen2.5-coder-0.5b"));
    let t = ChatTemplate::from_gguf(&f, &tok).unwrap();
    let tools = [
        json!({"type": "function", "function": {"name": "get_weather", "description": "Get weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}),
    ];
    let mut call = msg("assistant", "");
    call.extra.insert(
        "tool_calls".into(),
        json!([{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]),
    );
    let messages = [
        msg("system", "You are a coder."),
        msg("user", "What is the weather in Paris?"),
        call,
        msg("tool", "{\"temp\": 21}"),
        msg("assistant", "It is 21 degrees."),
    ];
    let out = t.render_hf(&messages, &tools, false).unwrap();
    assert_eq!(t.render_with_tools(&messages, &tools, false).unwrap(), out);
    let want = concat!(
        "<|im_start|>system\nYou are a coder.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n",
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n",
        r#"{"type": "function", "function": {"name": "get_weather", "description": "Get weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#,
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n",
        "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n",
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n",
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n",
        "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n",
        "<|im_start|>assistant\nIt is 21 degrees.<|im_end|>\n",
    );
    assert_eq!(out, want);
}

#[test]
fn gemma3_without_a_template_falls_back_to_gemma_turns() {
    let (f, tok) = load(&real_model("gemma3-270m"));
    let t = ChatTemplate::from_gguf(&f, &tok).unwrap();
    assert!(t.is_fallback());
    let messages = [
        msg("system", "Be brief."),
        msg("user", " Hi "),
        msg("assistant", "Hello!"),
        msg("user", "More"),
    ];
    let out = t.render_hf(&messages, &[], true).unwrap();
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n\
         <start_of_turn>user\nMore<end_of_turn>\n<start_of_turn>model\n"
    );
    // render drops the template's <bos> because the tokenizer adds it: exactly one BOS.
    assert_eq!(t.render(&messages, true).unwrap(), out["<bos>".len()..]);
    let ids = tok.encode(&t.render(&messages, true).unwrap(), true, true);
    assert_eq!(ids[0], tok.bos().unwrap());
    assert_eq!(ids[1], tok.token_id("<start_of_turn>").unwrap());
    assert_ne!(ids[1], tok.bos().unwrap());
    // Roles out of order: the template's raise_exception becomes an error naming the rule.
    let err = t.render(&[msg("assistant", "x")], false).unwrap_err().to_string();
    assert!(err.contains("Conversation roles must alternate"), "{err}");
}

#[test]
fn chatml_fallback_and_template_helpers() {
    let (_f, tok) = load(&refdata_dir().join("tiny/tiny-qwen2.gguf"));
    let t = ChatTemplate::new(tokenizer::CHATML_FALLBACK, &tok).unwrap();
    assert_eq!(
        t.render(&[msg("user", "hi")], true).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    let t = ChatTemplate::new(
        "{{ strftime_now('%Y') | length }} {{ messages[0].content.upper() }} {{ eos_token }} \
         {% if messages[0].content.startswith('a') %}yes{% endif %}",
        &tok,
    )
    .unwrap();
    assert_eq!(t.render(&[msg("user", "abc")], false).unwrap(), "4 ABC <|im_end|> yes");
    assert!(ChatTemplate::new("{% if %}", &tok).is_err());
}
