//! Fill-in-the-middle prompts from a model's FIM tokens.
//!
//! The tokens come from the tokenizer ([`tokenizer::SpecialIds`]: the GGUF's
//! `tokenizer.ggml.fim_*_token_id` keys, else the known texts `<|fim_prefix|>`, `<PRE>`… as
//! llama.cpp finds them). Prompts are built from token ids, never by pasting the tokens' texts
//! into a string, so a prefix or suffix that contains `<|fim_middle|>` stays text.
//!
//! - [`infill_prompt`] is llama-server's `format_prompt_infill`: the repo-level layout
//!   (`[REP]myproject\n[SEP]file\nchunk…[SEP]filename\n`) when the vocabulary has those
//!   tokens, else each chunk after a `--- snippet ---` line; then `[PRE]prefix[SUF]suffix[MID]`
//!   with `prompt` after the prefix. The prefix keeps its last 3/4 of a 2048-token batch, the
//!   suffix its first 1/4 (less the prompt), the extra chunks what the context leaves past the
//!   batch, taken from their end — llama-server's defaults (`-b 2048`, `-n -1`).
//! - [`suffix_prompt`] is Ollama's FIM template for code models
//!   (`<|fim_prefix|>{prompt}<|fim_suffix|>{suffix}<|fim_middle|>`), built from this model's
//!   own FIM tokens.
//!
//! Generation stops at an end-of-generation token, which includes the FIM pad, repo and file
//! separator tokens as in llama.cpp (`tokenizer`'s EOG set). Cost: a few tokenizations and
//! vector copies per request.

use tokenizer::Tokenizer;

/// llama-server's default physical batch (`-b`), which bounds the prefix and suffix it keeps.
pub const N_BATCH: usize = 2048;

/// At most this many `input_extra` chunks.
pub const MAX_EXTRA: usize = 256;

/// A model's fill-in-the-middle tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FimTokens {
    pub pre: u32,
    pub suf: u32,
    pub mid: u32,
    /// The repository-name token of the repo-level layout (`<|fim_repo|>`), if any.
    pub rep: Option<u32>,
    /// The file separator of the repo-level layout (`<|file_sep|>`), if any.
    pub sep: Option<u32>,
}

impl FimTokens {
    /// `tok`'s FIM tokens, or what is missing ("prefix, middle").
    pub fn of(tok: &Tokenizer) -> Result<FimTokens, String> {
        let sp = tok.special_ids();
        match (sp.fim_pre, sp.fim_suf, sp.fim_mid) {
            (Some(pre), Some(suf), Some(mid)) => {
                Ok(FimTokens { pre, suf, mid, rep: sp.fim_rep, sep: sp.fim_sep })
            }
            (pre, suf, mid) => {
                let missing: Vec<&str> = [(pre, "prefix"), (suf, "suffix"), (mid, "middle")]
                    .into_iter()
                    .filter(|(t, _)| t.is_none())
                    .map(|(_, n)| n)
                    .collect();
                Err(missing.join(", "))
            }
        }
    }

    /// [`FimTokens::of`], or what to tell a client whose request names `field` (a suffix)
    /// of a model without them.
    pub fn required(tok: &Tokenizer, field: &str) -> Result<FimTokens, String> {
        FimTokens::of(tok).map_err(|missing| {
            format!(
                "{field}: this model cannot fill in the middle: its vocabulary has no FIM \
                 {missing} token (tokenizer.ggml.fim_*_token_id, or a known text such as \
                 <|fim_prefix|>); use a code model with FIM tokens, or send the request \
                 without {field}"
            )
        })
    }
}

/// One `input_extra` chunk: another file of the project.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Extra {
    /// The file's name (default `tmp`, as llama-server).
    pub filename: Option<String>,
    pub text: String,
}

/// Text as tokens, no BOS, special texts left as text (llama-server's `tokenize_mixed(..,
/// false, false)` and `common_tokenize(.., false, false)`).
fn plain(tok: &Tokenizer, s: &str) -> Vec<u32> {
    tok.encode(s, false, false)
}

/// llama-server's infill prompt (`format_prompt_infill` with `-b 2048 -n -1`, not SPM order)
/// for a context of `n_ctx` positions; `prompt` is tokenized with special texts parsed, as
/// llama-server tokenizes it.
pub fn infill_prompt(
    tok: &Tokenizer,
    fim: FimTokens,
    prefix: &str,
    suffix: &str,
    extra: &[Extra],
    prompt: &str,
    n_ctx: usize,
) -> Vec<u32> {
    let mut extra_tokens = Vec::new();
    if let Some(rep) = fim.rep {
        extra_tokens.push(rep);
        extra_tokens.extend(plain(tok, "myproject\n"));
    }
    for chunk in extra {
        let filename = chunk.filename.as_deref().unwrap_or("tmp");
        match fim.sep {
            Some(sep) => {
                extra_tokens.push(sep);
                extra_tokens.extend(plain(tok, &format!("{filename}\n")));
            }
            None => extra_tokens.extend(plain(tok, "\n\n--- snippet ---\n\n")),
        }
        extra_tokens.extend(plain(tok, &chunk.text));
    }
    if let Some(sep) = fim.sep {
        extra_tokens.push(sep);
        extra_tokens.extend(plain(tok, "filename\n"));
    }
    let prompt = tok.encode(prompt, false, true);
    let mut prefix = plain(tok, prefix);
    let mut suffix = plain(tok, suffix);
    let n_prefix_take = prefix.len().min(3 * (N_BATCH / 4));
    let n_suffix_take = suffix.len().min((N_BATCH / 4).saturating_sub(2 + prompt.len()));
    // n_ctx - n_batch - 2 * n_predict, with n_predict = -1.
    let n_extra_take = (n_ctx + 2).saturating_sub(N_BATCH).min(extra_tokens.len());
    prefix.drain(..prefix.len() - n_prefix_take);
    suffix.truncate(n_suffix_take);
    // llama-server's share for the extra context overflows a small context by a few tokens
    // when every part is full; it is cut to what leaves the prompt at most n_ctx - 1 tokens
    // (room for one generated token), so a full request is trimmed, not refused.
    let bos = usize::from(tok.add_bos() && tok.bos().is_some());
    let fixed = prefix.len() + suffix.len() + prompt.len() + 3 + bos;
    let n_extra_take = n_extra_take.min(n_ctx.saturating_sub(1 + fixed));

    let mut out = Vec::with_capacity(n_extra_take + prefix.len() + suffix.len() + prompt.len() + 4);
    out.extend_from_slice(&extra_tokens[extra_tokens.len() - n_extra_take..]);
    if tok.add_bos() {
        if let Some(bos) = tok.bos() {
            out.push(bos);
        }
    }
    out.push(fim.pre);
    out.extend(prefix);
    out.extend(prompt);
    out.push(fim.suf);
    out.extend(suffix);
    out.push(fim.mid);
    out
}

/// The prefix of a [`suffix_prompt`]: text, or token ids already (OpenAI's token prompt).
pub enum Prefix<'a> {
    Text(&'a str),
    Ids(&'a [u32]),
}

/// Ollama's FIM prompt for `suffix`: `[BOS]<PRE>{prefix}<SUF>{suffix}<MID>`, with the texts
/// tokenized as text (Ollama renders `<|fim_prefix|>{{ .Prompt }}<|fim_suffix|>{{ .Suffix
/// }}<|fim_middle|>` for Qwen2.5-Coder and tokenizes it; the same tokens unless the prompt
/// itself spells a special token).
pub fn suffix_prompt(tok: &Tokenizer, fim: FimTokens, prefix: Prefix, suffix: &str) -> Vec<u32> {
    let mut out = Vec::new();
    if tok.add_bos() {
        if let Some(bos) = tok.bos() {
            out.push(bos);
        }
    }
    out.push(fim.pre);
    match prefix {
        Prefix::Text(t) => out.extend(plain(tok, t)),
        Prefix::Ids(ids) => out.extend_from_slice(ids),
    }
    out.push(fim.suf);
    out.extend(plain(tok, suffix));
    out.push(fim.mid);
    out
}
