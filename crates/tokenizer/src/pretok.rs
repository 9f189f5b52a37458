//! Pre-tokenizers for byte-level BPE: split text into words the way llama.cpp does for each
//! `tokenizer.ggml.pre`, before merges run inside each word.
//!
//! A pre-tokenizer is a list of stages applied in turn, each splitting every piece further.
//! The hot patterns (GPT-2, Llama 3, Qwen2) are hand-written scanners over per-code-point class
//! bytes, O(n) with no allocation per word; rarer patterns run the `regex` crate on the same
//! "collapsed" text llama.cpp feeds to `std::regex`, so their quirks match too.

use std::ops::Range;

use crate::unicode::{ascii_lower, class_of, collapsed_byte, LETTER, NUMBER, WS};
use crate::TokenizerError;

/// The pre-tokenizer families llama.cpp distinguishes (`llama_vocab_pre_type`), for those snug
/// supports. Each `tokenizer.ggml.pre` name maps to one of these in [`PreType::from_name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreType {
    Default,
    Llama3,
    DeepseekLlm,
    DeepseekCoder,
    Falcon,
    Mpt,
    Starcoder,
    Gpt2,
    Refact,
    CommandR,
    Stablelm2,
    Qwen2,
    Olmo,
    Dbrx,
    Smaug,
    Poro,
    Chatglm4,
    Viking,
    Jais,
    Smollm,
    Codeshell,
    Bloom,
    Gpt3Finnish,
    Exaone,
    Minerva,
    /// o200k (GPT-4o, Phi-4-mini, Llama 4): words split at an ASCII lower-to-upper case change.
    Gpt4o,
}

/// What a `tokenizer.ggml.pre` name implies beyond its split rules (llama.cpp's `load`).
#[derive(Clone, Copy, Debug)]
pub struct PreInfo {
    pub pre: PreType,
    /// Whole words already in the vocab skip merging (Llama 3).
    pub ignore_merges: bool,
    /// Overrides the BPE default of no BOS (before `add_bos_token` is read).
    pub add_bos: Option<bool>,
    /// Detokenizer applies `clean_up_tokenization_spaces`.
    pub clean_spaces: bool,
    /// The BOS id is unset (ChatGLM).
    pub no_bos: bool,
}

/// Names accepted for `tokenizer.ggml.pre` (BPE vocabularies), as in the error message.
pub const KNOWN_PRE: &str = "default, llama3, llama-v3, llama-bpe, falcon3, falcon-h1, pixtral, \
midm-2.0, lfm2, deepseek-llm, deepseek-coder, falcon, mpt, starcoder, gpt-2, phi-2, jina-es, \
jina-de, gigachat, jina-v2-es, jina-v2-de, a.x-4.0, mellum, jina-v1-en, jina-v2-code, roberta-bpe, \
refact, command-r, qwen2, deepseek-r1-qwen, megrez, stablelm2, olmo, dbrx, smaug-bpe, poro-chat, \
chatglm-bpe, glm4, viking, jais, smollm, codeshell, bloom, gpt3-finnish, exaone, exaone4, minerva-7b, \
trillion, granite-docling, gpt-4o, llama4, kanana2, talkie";

impl PreType {
    /// Maps a `tokenizer.ggml.pre` value (BPE vocabularies) as llama.cpp does; an empty name
    /// means `default`.
    pub fn from_name(name: &str) -> Result<PreInfo, TokenizerError> {
        use PreType::*;
        let mut info = PreInfo {
            pre: Default,
            ignore_merges: false,
            add_bos: None,
            clean_spaces: true,
            no_bos: false,
        };
        info.pre = match name {
            "" | "default" => Default,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => {
                info.ignore_merges = true;
                info.add_bos = Some(true);
                Llama3
            }
            "deepseek-llm" => {
                info.clean_spaces = false;
                DeepseekLlm
            }
            "deepseek-coder" => {
                info.clean_spaces = false;
                DeepseekCoder
            }
            "falcon" => Falcon,
            "mpt" => Mpt,
            "starcoder" => Starcoder,
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "jina-v1-en" | "jina-v2-code"
            | "roberta-bpe" | "exaone4" => Gpt2,
            "trillion" | "granite-docling" => {
                info.clean_spaces = false;
                Gpt2
            }
            "refact" => Refact,
            "command-r" => {
                info.clean_spaces = false;
                CommandR
            }
            "qwen2" | "deepseek-r1-qwen" => {
                info.clean_spaces = false;
                Qwen2
            }
            "megrez" => Qwen2,
            "stablelm2" => Stablelm2,
            "olmo" => Olmo,
            "dbrx" => Dbrx,
            "smaug-bpe" => Smaug,
            "poro-chat" => {
                info.clean_spaces = false;
                Poro
            }
            "chatglm-bpe" | "glm4" => {
                info.no_bos = true;
                Chatglm4
            }
            "viking" => {
                info.clean_spaces = false;
                Viking
            }
            "jais" => Jais,
            "smollm" => {
                info.clean_spaces = false;
                Smollm
            }
            "codeshell" => Codeshell,
            "bloom" => Bloom,
            "gpt3-finnish" => Gpt3Finnish,
            "exaone" => Exaone,
            "minerva-7b" => Minerva,
            "gpt-4o" | "llama4" | "kanana2" | "talkie" => {
                info.clean_spaces = false;
                Gpt4o
            }
            other => {
                return Err(TokenizerError::UnknownPre { name: other.to_string() });
            }
        };
        Ok(info)
    }
}

/// One split stage.
#[derive(Debug)]
enum Stage {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` (llama.cpp's custom code).
    Gpt2,
    /// Llama 3's pattern with `\p{N}{1,3}` (llama.cpp's custom code).
    Llama3,
    /// Qwen2's pattern: Llama 3's with single digits; llama.cpp runs it through `std::regex`.
    Qwen2,
    /// o200k's pattern as llama.cpp rewrites and runs it (see [`split_gpt4o`]).
    Gpt4o,
    /// A `\p{..}` regex over the collapsed text (one byte per code point).
    Collapsed(regex::bytes::Regex),
    /// A regex over the code points, non-ASCII whitespace replaced by `\x0B`.
    Wide(regex::Regex),
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub struct PreTokenizer {
    stages: Vec<Stage>,
    needs_collapsed: bool,
    needs_wide: bool,
}

// The letters of deepseek-llm's word rule as in llama.cpp (cased letters of a few scripts, CJK
// excluded), written as escapes so no editor or normalizer can fold the compatibility letters.
const DEEPSEEK_LETTERS: &str = concat!(
    "\\s?[A-Za-z",
    "\\x{00B5}\\x{00C0}-\\x{00D6}\\x{00D8}-\\x{00F6}\\x{00F8}-\\x{01BA}\\x{01BC}-\\x{01BF}\\x{01C4}-\\x{0293}",
    "\\x{0295}-\\x{02AF}\\x{0370}-\\x{0373}\\x{0376}-\\x{0377}\\x{037B}-\\x{037D}\\x{037F}\\x{0386}",
    "\\x{0388}-\\x{038A}\\x{038C}\\x{038E}-\\x{03A1}\\x{03A3}-\\x{03F5}\\x{03F7}-\\x{0481}\\x{048A}-\\x{052F}",
    "\\x{0531}-\\x{0556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}",
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}",
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}",
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}",
    "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}",
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}",
    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}",
    "\\x{2183}-\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}-\\x{2CF3}\\x{A640}-\\x{A66D}",
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}",
    "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}",
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}",
    "]+"
);
const PORO: &str = " ?[^(\\s|.,!?…。，、।۔،)]+";

impl PreTokenizer {
    pub fn new(pre: PreType) -> Result<PreTokenizer, TokenizerError> {
        use PreType::*;
        enum S {
            Gpt2,
            Llama3,
            Qwen2,
            Gpt4o,
            C(&'static str),
            W(&'static str),
        }
        let spec: Vec<S> = match pre {
            Llama3 | Dbrx | Smaug | Chatglm4 => vec![S::Llama3],
            Qwen2 | Stablelm2 => vec![S::Qwen2],
            Gpt4o => vec![S::Gpt4o],
            Gpt2 | Mpt | Olmo | Jais => vec![S::Gpt2],
            Starcoder | Refact | CommandR | Smollm | Codeshell | Exaone | Minerva => {
                vec![S::C("\\p{N}"), S::Gpt2]
            }
            Falcon => vec![S::C("[\\p{P}\\$\\+<=>\\^~\\|`]+"), S::Gpt2, S::W("[0-9][0-9][0-9]")],
            DeepseekLlm => vec![
                S::W("[\\r\\n]"),
                S::W(DEEPSEEK_LETTERS),
                S::W("\\s?[!-/:-~！-／：-～‘-‟　-。]+"),
                S::W("\\s+$"),
                S::W("[一-龥ࠀ-一가-퟿]+"),
                S::C("\\p{N}+"),
            ],
            DeepseekCoder => vec![
                S::W("[\\r\\n]"),
                S::C("\\s?\\p{L}+"),
                S::C("\\s?\\p{P}+"),
                S::W("[一-龥ࠀ-一가-퟿]+"),
                S::C("\\p{N}"),
            ],
            Poro | Bloom | Gpt3Finnish => vec![S::W(PORO)],
            Viking => vec![S::W(PORO), S::C("\\p{N}")],
            Default => vec![
                S::C("[\\p{P}\\$\\+<=>\\^~\\|]+"),
                S::Gpt2,
                S::C("\\p{N}+"),
                S::W("[0-9][0-9][0-9]"),
            ],
        };
        let mut stages = Vec::with_capacity(spec.len());
        for s in spec {
            stages.push(match s {
                S::Gpt2 => Stage::Gpt2,
                S::Llama3 => Stage::Llama3,
                S::Qwen2 => Stage::Qwen2,
                S::Gpt4o => Stage::Gpt4o,
                S::C(expr) => {
                    let collapsed = collapse_regex(expr);
                    Stage::Collapsed(regex::bytes::Regex::new(&collapsed).map_err(|e| {
                        TokenizerError::Regex { pattern: expr.to_string(), message: e.to_string() }
                    })?)
                }
                S::W(expr) => Stage::Wide(regex::Regex::new(expr).map_err(|e| {
                    TokenizerError::Regex { pattern: expr.to_string(), message: e.to_string() }
                })?),
            });
        }
        let needs_collapsed = stages.iter().any(|s| matches!(s, Stage::Collapsed(_)));
        let needs_wide = stages.iter().any(|s| matches!(s, Stage::Wide(_)));
        Ok(PreTokenizer { stages, needs_collapsed, needs_wide })
    }

    /// Splits `text` into words; pushes their byte ranges (in order, covering `text`) to `out`.
    pub fn split(&self, text: &str, out: &mut Vec<Range<usize>>) {
        if text.is_empty() {
            return;
        }
        let mut cps: Vec<u32> = Vec::with_capacity(text.len());
        let mut cls: Vec<u8> = Vec::with_capacity(text.len());
        let mut byte_off: Vec<usize> = Vec::with_capacity(text.len() + 1);
        for (i, c) in text.char_indices() {
            cps.push(c as u32);
            cls.push(class_of(c));
            byte_off.push(i);
        }
        byte_off.push(text.len());
        let n = cps.len();

        // Single scanner stage: emit ranges directly.
        if self.stages.len() == 1 {
            if let Some(f) = scanner(&self.stages[0]) {
                let mut lens = Vec::with_capacity(n / 3 + 1);
                f(&cps, &cls, 0, n, &mut lens);
                push_ranges(&lens, &byte_off, out);
                return;
            }
        }

        let collapsed: Vec<u8> = if self.needs_collapsed {
            text.chars().zip(cls.iter()).map(|(c, &k)| collapsed_byte(c, k)).collect()
        } else {
            Vec::new()
        };
        // The wide text and the byte offset of each code point in it.
        let (wide, wide_off): (String, Vec<usize>) = if self.needs_wide {
            let mut w = String::with_capacity(text.len());
            let mut offs = Vec::with_capacity(n + 1);
            for (c, &k) in text.chars().zip(cls.iter()) {
                offs.push(w.len());
                if (c as u32) > 0x7F && k & WS != 0 {
                    w.push('\x0B');
                } else {
                    w.push(c);
                }
            }
            offs.push(w.len());
            (w, offs)
        } else {
            (String::new(), Vec::new())
        };

        let mut lens = vec![n];
        let mut next = Vec::with_capacity(n / 3 + 1);
        for stage in &self.stages {
            next.clear();
            let mut start = 0;
            for &len in &lens {
                let (ini, end) = (start, start + len);
                start = end;
                if let Some(f) = scanner(stage) {
                    f(&cps, &cls, ini, end, &mut next);
                    continue;
                }
                // Regex stages: matches and the gaps between them are pieces (std::regex_iterator).
                let mut prev = ini;
                let mut emit = |m_start: usize, m_end: usize, next: &mut Vec<usize>| {
                    if m_start > prev {
                        next.push(m_start - prev);
                    }
                    if m_end > m_start {
                        next.push(m_end - m_start);
                    }
                    prev = m_end;
                };
                match stage {
                    Stage::Collapsed(re) => {
                        for m in re.find_iter(&collapsed[ini..end]) {
                            emit(ini + m.start(), ini + m.end(), &mut next);
                        }
                    }
                    Stage::Wide(re) => {
                        let base = wide_off[ini];
                        for m in re.find_iter(&wide[base..wide_off[end]]) {
                            let s = cp_index(&wide_off, base + m.start());
                            let e = cp_index(&wide_off, base + m.end());
                            emit(s, e, &mut next);
                        }
                    }
                    _ => {}
                }
                if end > prev {
                    next.push(end - prev);
                }
            }
            std::mem::swap(&mut lens, &mut next);
        }
        push_ranges(&lens, &byte_off, out);
    }
}

type ScanFn = fn(&[u32], &[u8], usize, usize, &mut Vec<usize>);

fn scanner(stage: &Stage) -> Option<ScanFn> {
    match stage {
        Stage::Gpt2 => Some(split_gpt2),
        Stage::Llama3 => Some(split_llama3),
        Stage::Qwen2 => Some(split_qwen2),
        Stage::Gpt4o => Some(split_gpt4o),
        _ => None,
    }
}

fn cp_index(offs: &[usize], byte: usize) -> usize {
    offs.binary_search(&byte).unwrap_or_else(|i| i)
}

fn push_ranges(lens: &[usize], byte_off: &[usize], out: &mut Vec<Range<usize>>) {
    let mut start = 0;
    for &len in lens {
        if len == 0 {
            continue;
        }
        out.push(byte_off[start]..byte_off[start + len]);
        start += len;
    }
}

/// llama.cpp's translation of `\p{..}` classes to the collapsed byte alphabet, in `regex` syntax.
fn collapse_regex(expr: &str) -> String {
    const CATS: [(&str, &str); 10] = [
        ("\\p{N}", "\\xD10-9"),
        ("\\p{L}", "\\xD2A-Za-z"),
        ("\\p{P}", "\\xD3!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
        ("\\p{M}", "\\xD4"),
        ("\\p{S}", "\\xD5\\$\\+<->\\^`\\|"),
        ("\\p{Lu}", "\\xD2A-Za-z"),
        ("\\p{Ll}", "\\xD2A-Za-z"),
        ("\\p{Lt}", "\\xD2A-Za-z"),
        ("\\p{Lm}", "\\xD2A-Za-z"),
        ("\\p{Lo}", "\\xD2A-Za-z"),
    ];
    let b = expr.as_bytes();
    let mut out = String::from("(?-u)");
    let mut inside = false;
    let mut i = 0;
    'outer: while i < b.len() {
        if b[i] == b'[' && (i == 0 || b[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && b[i] == b']' && b[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        for (pat, class) in CATS {
            if expr[i..].starts_with(pat) {
                if !inside {
                    out.push('[');
                }
                out.push_str(class);
                if !inside {
                    out.push(']');
                }
                i += pat.len();
                continue 'outer;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

#[inline]
fn is_l(c: u8) -> bool {
    c & LETTER != 0
}
#[inline]
fn is_n(c: u8) -> bool {
    c & NUMBER != 0
}
#[inline]
fn is_ws(c: u8) -> bool {
    c & WS != 0
}
/// `[^\s\p{L}\p{N}]` for an in-range code point.
#[inline]
fn is_other(c: u8) -> bool {
    c != 0 && c & (LETTER | NUMBER | WS) == 0
}
#[inline]
fn is_crlf(cp: u32) -> bool {
    cp == '\r' as u32 || cp == '\n' as u32
}

/// Length of an English contraction (`'s 't 'm 'd 're 've 'll`) at `pos`, if any.
#[inline]
fn contraction(cps: &[u32], pos: usize, end: usize, fold_case: bool) -> usize {
    if cps[pos] != '\'' as u32 || pos + 1 >= end {
        return 0;
    }
    let low = |c: u32| if fold_case { ascii_lower(c) } else { c };
    let n1 = low(cps[pos + 1]);
    if [b's', b't', b'm', b'd'].iter().any(|&c| n1 == c as u32) {
        return 2;
    }
    if pos + 2 < end {
        let n2 = low(cps[pos + 2]);
        let pair = |a: u8, b: u8| n1 == a as u32 && n2 == b as u32;
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return 3;
        }
    }
    0
}

/// Whitespace rules shared by the three scanners: `\s*[\r\n]+` (when `crlf_rule`), then
/// `\s+(?!\S)`, then `\s+`. Returns the match length at `pos` (0 if not whitespace).
#[inline]
fn whitespace_run(cps: &[u32], cls: &[u8], pos: usize, end: usize, crlf_rule: bool) -> usize {
    let mut n = 0;
    let mut last_crlf = 0;
    while pos + n < end && is_ws(cls[pos + n]) {
        if crlf_rule && is_crlf(cps[pos + n]) {
            last_crlf = n + 1;
        }
        n += 1;
    }
    if last_crlf > 0 {
        return last_crlf;
    }
    if n > 1 && pos + n < end {
        return n - 1;
    }
    n
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn split_gpt2(cps: &[u32], cls: &[u8], ini: usize, end: usize, out: &mut Vec<usize>) {
    let flags = |p: usize| if p < end { cls[p] } else { 0 };
    let mut pos = ini;
    while pos < end {
        let c = cps[pos];
        let n = contraction(cps, pos, end, false);
        if n > 0 {
            out.push(n);
            pos += n;
            continue;
        }
        let sp = (c == ' ' as u32) as usize;
        let f2 = if sp == 1 { flags(pos + 1) } else { cls[pos] };
        let class_run = |test: fn(u8) -> bool| {
            let mut p = pos + sp;
            while test(flags(p)) {
                p += 1;
            }
            p - pos
        };
        let len = if is_l(f2) {
            class_run(is_l)
        } else if is_n(f2) {
            class_run(is_n)
        } else if is_other(f2) {
            class_run(is_other)
        } else {
            whitespace_run(cps, cls, pos, end, false).max(1)
        };
        out.push(len);
        pos += len;
    }
}

/// Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
fn split_llama3(cps: &[u32], cls: &[u8], ini: usize, end: usize, out: &mut Vec<usize>) {
    split_llama3_like(cps, cls, ini, end, out, 3, true)
}

/// Qwen2: as Llama 3 but `\p{N}` (one digit at a time) and case-sensitive `'[sS]` pairs, which
/// are the same thing for ASCII.
fn split_qwen2(cps: &[u32], cls: &[u8], ini: usize, end: usize, out: &mut Vec<usize>) {
    split_llama3_like(cps, cls, ini, end, out, 1, true)
}

fn split_llama3_like(
    cps: &[u32],
    cls: &[u8],
    ini: usize,
    end: usize,
    out: &mut Vec<usize>,
    max_digits: usize,
    fold_case: bool,
) {
    let flags = |p: usize| if p < end { cls[p] } else { 0 };
    let mut pos = ini;
    while pos < end {
        let c = cps[pos];
        let f = cls[pos];
        let n = contraction(cps, pos, end, fold_case);
        if n > 0 {
            out.push(n);
            pos += n;
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(is_crlf(c) || is_n(f)) && (is_l(f) || is_l(flags(pos + 1))) {
            let mut p = pos + 1;
            while is_l(flags(p)) {
                p += 1;
            }
            out.push(p - pos);
            pos = p;
            continue;
        }
        let len = rest_run(cps, cls, pos, end, max_digits, is_crlf);
        out.push(len);
        pos += len;
    }
}

/// o200k: `[^\r\n\p{L}\p{N}]?U*L+C?|[^\r\n\p{L}\p{N}]?U+L*C?|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`, with C the contractions `'[sS]`,
/// `'[tT]`, `'[rR][eE]`, `'[vV][eE]`, `'[mM]`, `'[lL][lL]`, `'[dD]`. The original's U and L are
/// upper- and lower-case letter classes; llama.cpp runs it over its collapsed text, where every
/// non-ASCII letter is one byte, so U is "a letter but not a-z", L "a letter but not A-Z", and
/// marks are not letters. A backtracking engine's first match of the letter alternatives is:
/// U* to the first a-z, then L+ on from there; a run with no a-z ends after its last non-ASCII
/// letter (A-Z after it start the next word); a run of A-Z only is one word.
fn split_gpt4o(cps: &[u32], cls: &[u8], ini: usize, end: usize, out: &mut Vec<usize>) {
    let flags = |p: usize| if p < end { cls[p] } else { 0 };
    let upper = |p: usize| is_l(flags(p)) && !(b'a' as u32..=b'z' as u32).contains(&cps[p]);
    let lower = |p: usize| is_l(flags(p)) && !(b'A' as u32..=b'Z' as u32).contains(&cps[p]);
    // End of the letter alternatives' match for a letter run starting at `s`.
    let word = |s: usize| {
        let mut k = s;
        while upper(k) {
            k += 1;
        }
        let e = if lower(k) {
            let mut e = k + 1;
            while lower(e) {
                e += 1;
            }
            e
        } else {
            // Only U letters: up to the last one that is also L (non-ASCII), else all of them.
            (s..k).rev().find(|&p| lower(p)).map_or(k, |p| p + 1)
        };
        if e < end {
            e + contraction(cps, e, end, true)
        } else {
            e
        }
    };
    let mut pos = ini;
    while pos < end {
        let (c, f) = (cps[pos], cls[pos]);
        if is_l(f) {
            let e = word(pos);
            out.push(e - pos);
            pos = e;
            continue;
        }
        if !(is_crlf(c) || is_n(f)) && is_l(flags(pos + 1)) {
            let e = word(pos + 1);
            out.push(e - pos);
            pos = e;
            continue;
        }
        let len = rest_run(cps, cls, pos, end, 3, |c| is_crlf(c) || c == '/' as u32);
        out.push(len);
        pos += len;
    }
}

/// The rules after the letter ones in the Llama 3 family and o200k: `\p{N}{1,max_digits}|
/// ?[^\s\p{L}\p{N}]+T*` (T: `[\r\n]`, o200k's `[\r\n/]`, as `tail` says), then the whitespace
/// rules. Returns the match length at `pos`, at least 1.
fn rest_run(
    cps: &[u32],
    cls: &[u8],
    pos: usize,
    end: usize,
    max_digits: usize,
    tail: fn(u32) -> bool,
) -> usize {
    let flags = |p: usize| if p < end { cls[p] } else { 0 };
    let f = cls[pos];
    if is_n(f) {
        let mut p = pos;
        while p < end && is_n(cls[p]) && p - pos < max_digits {
            p += 1;
        }
        return p - pos;
    }
    let sp = (cps[pos] == ' ' as u32) as usize;
    if is_other(if sp == 1 { flags(pos + 1) } else { f }) {
        let mut p = pos + sp;
        while is_other(flags(p)) {
            p += 1;
        }
        while p < end && tail(cps[p]) {
            p += 1;
        }
        return p - pos;
    }
    whitespace_run(cps, cls, pos, end, true).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: PreType, text: &str) -> Vec<String> {
        let p = PreTokenizer::new(pre).unwrap();
        let mut r = Vec::new();
        p.split(text, &mut r);
        r.into_iter().map(|r| text[r].to_string()).collect()
    }

    #[test]
    fn qwen2_splits_digits_one_at_a_time_and_keeps_leading_punct_on_words() {
        assert_eq!(
            words(PreType::Qwen2, "abc 1234 (x)"),
            ["abc", " ", "1", "2", "3", "4", " (", "x", ")"]
        );
        assert_eq!(
            words(PreType::Qwen2, "don't  go\n\n x"),
            ["don", "'t", " ", " go", "\n\n", " x"]
        );
    }

    #[test]
    fn llama3_groups_three_digits() {
        assert_eq!(words(PreType::Llama3, "12345"), ["123", "45"]);
    }

    #[test]
    fn gpt2_keeps_trailing_space_run_before_a_word() {
        assert_eq!(words(PreType::Gpt2, "a   b"), ["a", "  ", " b"]);
        assert_eq!(words(PreType::Gpt2, "x  "), ["x", "  "]);
    }

    #[test]
    fn gpt4o_splits_at_case_changes_as_llama_cpp_runs_it() {
        use PreType::Gpt4o;
        assert_eq!(words(Gpt4o, "HelloWorld HTTPServer"), ["Hello", "World", " HTTPServer"]);
        assert_eq!(words(Gpt4o, "Привет мир"), ["Привет", " мир"]);
        // No a-z in the run: it ends after its last non-ASCII letter.
        assert_eq!(words(Gpt4o, "ПриветWORLD ПриветWorld"), ["Привет", "WORLD", " ПриветWorld"]);
        assert_eq!(words(Gpt4o, "I'M don't"), ["I'M", " don't"]);
        assert_eq!(words(Gpt4o, "12345 a/b\n\n"), ["123", "45", " a", "/b", "\n\n"]);
        assert_eq!(words(Gpt4o, "x  (y)//\n"), ["x", " ", " (", "y", ")//\n"]);
        // Marks are not letters in llama.cpp's collapsed text.
        assert_eq!(words(Gpt4o, "नमस्ते"), ["नमस", "्त", "े"]);
    }

    /// llama.cpp's own words on a multilingual sample (English, Chinese, Japanese, Russian,
    /// Arabic, Hindi, Korean, Hebrew, Thai, Vietnamese, Greek, Turkish, German, emoji, code,
    /// whitespace runs): `scripts/gpt4o-split-refs.sh`.
    #[test]
    fn gpt4o_words_match_llama_cpp_on_a_multilingual_sample() {
        let refs: serde_json::Value =
            serde_json::from_str(include_str!("../../../testdata/tokenizer/gpt4o-words.json"))
                .unwrap();
        let cases = refs["cases"].as_array().unwrap();
        assert!(cases.len() > 20);
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want: Vec<&str> =
                case["words"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
            assert_eq!(words(PreType::Gpt4o, text), want, "{text:?}");
        }
    }

    #[test]
    fn default_splits_punctuation_and_digit_triples() {
        assert_eq!(words(PreType::Default, "1234567 a,b"), ["123", "456", "7", " a", ",", "b"]);
    }

    #[test]
    fn regex_stages_compile_for_every_family() {
        use PreType::*;
        for p in [DeepseekLlm, DeepseekCoder, Falcon, Starcoder, Viking, Poro, Default] {
            let w = words(p, "Hello, 世界 123\n  x");
            assert_eq!(w.concat(), "Hello, 世界 123\n  x", "{p:?}");
        }
    }

    #[test]
    fn unknown_pre_is_an_error_naming_it() {
        let e = PreType::from_name("martian").unwrap_err().to_string();
        assert!(e.contains("martian"), "{e}");
    }
}
