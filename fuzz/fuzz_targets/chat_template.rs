//! Fuzz chat-template rendering: arbitrary message lists (any roles, contents, tool calls with
//! any JSON arguments, names, tool results) and tool definitions through each real model's
//! template — Qwen2.5-coder's own (in its GGUF), the Gemma fallback gemma3-270m uses, and the
//! ChatML fallback. A render may fail (templates raise on roles that do not alternate), but
//! only with a `ChatError`, never a panic; whatever renders must tokenize.

#![no_main]

use libfuzzer_sys::{arbitrary, fuzz_target};
use snug_fuzz::{Message, Tool, Vocab};
use tokenizer::{ChatTemplate, CHATML_FALLBACK};

#[derive(arbitrary::Arbitrary, Debug)]
struct Input {
    template: u8,
    add_generation_prompt: bool,
    messages: Vec<Message>,
    tools: Vec<Tool>,
}

fuzz_target!(|input: Input| {
    let (vocab, chatml) = match input.template % 3 {
        0 => (Vocab::Bpe, false),
        1 => (Vocab::Spm, false),
        _ => (Vocab::Bpe, true),
    };
    let loaded = vocab.load();
    let template = if chatml {
        ChatTemplate::new(CHATML_FALLBACK, &loaded.tok)
    } else {
        ChatTemplate::from_gguf(&loaded.file, &loaded.tok)
    }
    .expect("the real templates parse");
    let messages: Vec<_> = input.messages.iter().map(|m| m.to_chat()).collect();
    let tools: Vec<_> = input.tools.iter().map(Tool::to_value).collect();
    let rendered = template.render_with_tools(&messages, &tools, input.add_generation_prompt);
    let hf = template.render_hf(&messages, &tools, input.add_generation_prompt);
    assert_eq!(rendered.is_ok(), hf.is_ok(), "render and render_hf disagree");
    if let Ok(prompt) = rendered {
        let _ = loaded.tok.encode(&prompt, true, true);
    }
    let _ = template.render(&messages, input.add_generation_prompt);
});
