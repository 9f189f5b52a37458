//! Tool calls: which call format a chat template speaks ([`Format::detect`], from the template
//! text, as llama.cpp's `common/chat.cpp` picks its handler), the grammar a call is generated
//! under ([`ToolGrammar`], [`ToolMask`]) and the parser that splits a model's output into
//! content, reasoning and calls while it streams ([`OutputParser`]).
//!
//! A call is constrained as literal text and JSON: the format's opening (`<tool_call>\n`), then
//! one of the offered tools' heads (`{"name": "get_weather", "arguments": `, a choice among
//! literals, so only offered names can be written and each name picks its own arguments
//! schema), then the arguments under that tool's `parameters` schema (the JSON-schema mask of
//! [`crate::json_schema`]), then the closing (`}\n</tool_call>`). Under `tool_choice: "auto"`
//! the text is free until the format's trigger appears (matched a byte at a time, so nothing
//! is re-read), and the call is constrained from there; under `"required"` (or a named tool)
//! from the first token.
//!
//! Cost: a free token costs the trigger's byte steps (none per offered tool); a token inside a
//! call's literal parts one pass over the vocabulary comparing first bytes and, for the few
//! that match, a binary search among the heads; inside the arguments what JSON mode costs.

pub mod mask;
pub mod parse;

use std::sync::Arc;

use crate::json_schema::Schema;

pub use mask::ToolMask;
pub use parse::{OutputParser, ParsedCall, ParsedOutput, Piece, Reasoning};

/// How a template family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Hermes 2 Pro, Qwen2.5, Qwen3, QwQ: `<tool_call>\n{"name": f, "arguments": {..}}\n</tool_call>`,
    /// one block per call.
    Hermes,
    /// Llama 3.x: the whole answer is `{"name": f, "parameters": {..}}` (one call).
    Llama3,
    /// Mistral Nemo: `[TOOL_CALLS][{"name": f, "arguments": {..}}, ...]`.
    Mistral,
}

impl Format {
    /// The format a template's text speaks, by the markers llama.cpp looks for; `None` when the
    /// template does not render tools in a format snug knows.
    pub fn detect(template: &str) -> Option<Format> {
        if template.contains("<tool_call>") {
            Some(Format::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Some(Format::Mistral)
        } else if template.contains("<|start_header_id|>")
            && (template.contains("ipython") || template.contains("\"parameters\""))
        {
            Some(Format::Llama3)
        } else {
            None
        }
    }

    /// What opens the call section under `tool_choice: "required"` (the first call's opening).
    pub fn open(self) -> &'static str {
        match self {
            Format::Hermes => "<tool_call>\n",
            Format::Llama3 => "",
            Format::Mistral => "[TOOL_CALLS][",
        }
    }

    /// The text that starts a call under `tool_choice: "auto"`: the grammar starts once the
    /// output holds it. Llama 3's is anchored: only a `{` before any other text.
    pub fn trigger(self) -> (&'static str, bool) {
        match self {
            Format::Hermes => ("<tool_call>", false),
            Format::Llama3 => ("{", true),
            Format::Mistral => ("[TOOL_CALLS]", false),
        }
    }

    /// Whether a bare call object at the very start of the answer is a call too: Llama 3's
    /// only form, and what small Qwen models write without their tags (llama.cpp's Hermes
    /// handler triggers on a leading `{"` as well).
    pub fn bare_start(self) -> bool {
        matches!(self, Format::Hermes | Format::Llama3)
    }

    /// The key a call's arguments are under.
    pub fn args_key(self) -> &'static str {
        match self {
            Format::Llama3 => "parameters",
            Format::Hermes | Format::Mistral => "arguments",
        }
    }

    /// A call's head for tool `name`: everything before its arguments.
    pub fn head(self, name: &str) -> String {
        let name = serde_json::to_string(name).unwrap_or_default();
        format!("{{\"name\": {name}, \"{}\": ", self.args_key())
    }

    /// What follows a call's arguments.
    pub fn close(self) -> &'static str {
        match self {
            Format::Hermes => "}\n</tool_call>",
            Format::Llama3 | Format::Mistral => "}",
        }
    }

    /// What comes between two calls (`None`: one call at most).
    pub fn separator(self) -> Option<&'static str> {
        match self {
            Format::Hermes => Some("\n<tool_call>\n"),
            Format::Llama3 => None,
            Format::Mistral => Some(", "),
        }
    }

    /// What ends the call section (before the end of generation).
    pub fn end(self) -> &'static str {
        match self {
            Format::Hermes | Format::Llama3 => "",
            Format::Mistral => "]",
        }
    }
}

/// One offered tool: its name and its arguments' schema, compiled.
#[derive(Clone, Debug)]
pub struct Tool {
    pub name: String,
    pub parameters: Arc<Schema>,
}

/// When a call is constrained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// `tool_choice: "auto"`: from the format's trigger on.
    Lazy,
    /// `"required"` or a named tool: from the first token.
    Now,
}

/// What a request's calls are generated under: the format, the tools (only these names can be
/// written), when the grammar starts and how many calls may follow each other.
#[derive(Clone, Debug)]
pub struct ToolGrammar {
    pub format: Format,
    pub tools: Vec<Tool>,
    pub start: Start,
    /// At most this many calls (1 without `parallel_tool_calls`).
    pub max_calls: usize,
    /// The output's thinking section, which no call is made in: under `Open` the grammar
    /// waits for `</think>`; under `Tagged` with `Start::Lazy`, for the `</think>` of a
    /// `<think>` the output starts with.
    pub reasoning: Reasoning,
}

impl ToolGrammar {
    /// The per-sequence state that masks logits under this grammar.
    pub fn mask(self: &Arc<Self>) -> ToolMask {
        ToolMask::new(self.clone())
    }
}
