//! Reading `tokenizer.ggml.*` metadata into a [`Tokenizer`]: token tables, attributes, special
//! ids, the end-of-generation set and llama.cpp's text-based fix-ups, in llama.cpp's order.
//!
//! Runs once per model load: O(n_vocab) hashing plus one detokenized piece per token (about
//! 30 ms for Gemma's 262k tokens).

use gguf::GgufFile;

use crate::bpe::Bpe;
use crate::pretok::{PreTokenizer, PreType};
use crate::texts::{PushError, TokenTexts};
use crate::unicode::byte_to_char_table;
use crate::{Algo, Tokenizer, TokenizerError};

/// llama.cpp token attribute bits (`llama_token_attr`).
pub mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

/// GGUF `tokenizer.ggml.token_type` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
}

impl TokenType {
    fn attr(v: i64) -> u16 {
        match v {
            1 => attr::NORMAL,
            2 => attr::UNKNOWN,
            3 => attr::CONTROL,
            4 => attr::USER_DEFINED,
            5 => attr::UNUSED,
            6 => attr::BYTE,
            _ => 0,
        }
    }
}

/// Special token ids (`None` when the vocabulary has no such token).
#[derive(Clone, Debug, Default)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] =
    &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

fn key_id(f: &GgufFile, key: &str) -> Option<u64> {
    f.get_u64(key)
}

pub(crate) fn load(f: &GgufFile) -> Result<Tokenizer, TokenizerError> {
    let model = f.get_str("tokenizer.ggml.model").ok_or(TokenizerError::MissingModel)?.to_string();
    let pre_name = f.get_str("tokenizer.ggml.pre").unwrap_or("").to_string();
    let is_bpe = match model.as_str() {
        "gpt2" => true,
        "llama" => false,
        other => return Err(TokenizerError::UnknownModel(other.to_string())),
    };

    let texts_raw = f.get_array("tokenizer.ggml.tokens").and_then(|a| a.as_str_array()).ok_or(
        TokenizerError::BadKey {
            key: "tokenizer.ggml.tokens",
            what: "expected an array of strings".into(),
        },
    )?;
    let n = texts_raw.len();
    if n == 0 || n > u32::MAX as usize / 2 {
        return Err(TokenizerError::BadKey {
            key: "tokenizer.ggml.tokens",
            what: format!("{n} tokens"),
        });
    }

    let scores = match f.get_array("tokenizer.ggml.scores") {
        None => Vec::new(),
        Some(a) => {
            let vals: Vec<f32> = match a.as_f32s() {
                Some(v) => v.iter().take(n).copied().collect(),
                None => a
                    .iter_i64s()
                    .ok_or(TokenizerError::BadKey {
                        key: "tokenizer.ggml.scores",
                        what: "expected f32 or i32 values".into(),
                    })?
                    .take(n)
                    .map(|x| x as f32)
                    .collect(),
            };
            if vals.len() < n {
                return Err(TokenizerError::BadKey {
                    key: "tokenizer.ggml.scores",
                    what: format!("{} scores for {n} tokens", a.len()),
                });
            }
            vals
        }
    };

    let mut attrs = vec![attr::NORMAL; n];
    if let Some(a) = f.get_array("tokenizer.ggml.token_type") {
        let types = a.iter_i64s().ok_or(TokenizerError::BadKey {
            key: "tokenizer.ggml.token_type",
            what: "expected integers".into(),
        })?;
        if types.len() < n {
            return Err(TokenizerError::BadKey {
                key: "tokenizer.ggml.token_type",
                what: format!("{} types for {n} tokens", types.len()),
            });
        }
        for (a, t) in attrs.iter_mut().zip(types) {
            *a = TokenType::attr(t);
        }
    }

    let mut texts = TokenTexts::with_capacity(n, texts_raw.text_len());
    for (i, t) in texts_raw.iter().enumerate() {
        let empty;
        let t = if t.is_empty() {
            empty = format!("[EMPTY_{i}]");
            empty.as_str()
        } else {
            t
        };
        match texts.push(t) {
            Ok(_) => {}
            Err(PushError::Full) => {
                return Err(TokenizerError::BadKey {
                    key: "tokenizer.ggml.tokens",
                    what: "token text exceeds 4 GiB".into(),
                })
            }
            Err(PushError::Duplicate(first)) => {
                return Err(TokenizerError::DuplicateToken {
                    text: t.to_string(),
                    first,
                    second: i as u32,
                })
            }
        }
    }
    let find = |s: &str| texts.find(s);

    // Per-model defaults (llama.cpp `load`), then metadata.
    let mut sp = SpecialIds::default();
    let (mut add_bos, mut add_space_prefix, clean_spaces, algo);
    let mut add_eos = false;
    if is_bpe {
        let info = PreType::from_name(&pre_name)?;
        sp.bos = if info.no_bos { None } else { Some(11) };
        sp.eos = Some(11);
        add_bos = info.add_bos.unwrap_or(false);
        add_space_prefix = false;
        clean_spaces = info.clean_spaces;
        let merges = f.get_array("tokenizer.ggml.merges").and_then(|a| a.as_str_array()).ok_or(
            TokenizerError::BadKey {
                key: "tokenizer.ggml.merges",
                what: "a gpt2 vocabulary needs its merges".into(),
            },
        )?;
        let bpe = Bpe::new(merges.iter(), n as u32, &find, info.ignore_merges);
        algo = Algo::Bpe { bpe, pre: PreTokenizer::new(info.pre)? };
    } else {
        sp.bos = Some(1);
        sp.eos = Some(2);
        sp.unk = Some(0);
        add_bos = true;
        add_space_prefix = true;
        clean_spaces = false;
        algo = Algo::Spm;
    }
    if let Some(v) = f.get_bool("tokenizer.ggml.add_space_prefix") {
        add_space_prefix = v;
    }
    for id in [&mut sp.bos, &mut sp.eos, &mut sp.unk] {
        if id.is_some_and(|i| i as usize >= n) {
            *id = None;
        }
    }
    let set = |key: &str, slot: &mut Option<u32>| {
        if let Some(v) = key_id(f, key) {
            if (v as usize) < n {
                *slot = Some(v as u32);
            }
        }
    };
    set("tokenizer.ggml.bos_token_id", &mut sp.bos);
    set("tokenizer.ggml.eos_token_id", &mut sp.eos);
    set("tokenizer.ggml.eot_token_id", &mut sp.eot);
    set("tokenizer.ggml.eom_token_id", &mut sp.eom);
    set("tokenizer.ggml.unknown_token_id", &mut sp.unk);
    set("tokenizer.ggml.seperator_token_id", &mut sp.sep);
    set("tokenizer.ggml.padding_token_id", &mut sp.pad);
    set("tokenizer.ggml.mask_token_id", &mut sp.mask);
    set("tokenizer.ggml.fim_pre_token_id", &mut sp.fim_pre);
    set("tokenizer.ggml.fim_suf_token_id", &mut sp.fim_suf);
    set("tokenizer.ggml.fim_mid_token_id", &mut sp.fim_mid);
    set("tokenizer.ggml.fim_pad_token_id", &mut sp.fim_pad);
    set("tokenizer.ggml.fim_rep_token_id", &mut sp.fim_rep);
    set("tokenizer.ggml.fim_sep_token_id", &mut sp.fim_sep);
    // Deprecated names, read last as llama.cpp does.
    set("tokenizer.ggml.prefix_token_id", &mut sp.fim_pre);
    set("tokenizer.ggml.suffix_token_id", &mut sp.fim_suf);
    set("tokenizer.ggml.middle_token_id", &mut sp.fim_mid);
    if let Some(v) = f.get_bool("tokenizer.ggml.add_bos_token") {
        add_bos = v;
    }
    if let Some(v) = f.get_bool("tokenizer.ggml.add_eos_token") {
        add_eos = v;
    }
    if add_bos && sp.bos.is_none() {
        return Err(TokenizerError::MissingSpecial {
            flag: "tokenizer.ggml.add_bos_token",
            id_key: "tokenizer.ggml.bos_token_id",
        });
    }
    if add_eos && sp.eos.is_none() {
        return Err(TokenizerError::MissingSpecial {
            flag: "tokenizer.ggml.add_eos_token",
            id_key: "tokenizer.ggml.eos_token_id",
        });
    }

    // Text-detected special tokens; llama.cpp forces them to CONTROL.
    let detect = |slot: &mut Option<u32>, cands: &[&str], attrs: &mut [u16]| {
        if slot.is_some() {
            return;
        }
        if let Some(id) = cands.iter().find_map(|c| find(c)) {
            *slot = Some(id);
            attrs[id as usize] |= attr::CONTROL;
        }
    };
    detect(&mut sp.eot, EOT_TEXTS, &mut attrs);
    detect(&mut sp.eom, EOM_TEXTS, &mut attrs);
    detect(&mut sp.fim_pre, FIM_PRE_TEXTS, &mut attrs);
    detect(&mut sp.fim_suf, FIM_SUF_TEXTS, &mut attrs);
    detect(&mut sp.fim_mid, FIM_MID_TEXTS, &mut attrs);
    detect(&mut sp.fim_pad, FIM_PAD_TEXTS, &mut attrs);
    detect(&mut sp.fim_rep, FIM_REP_TEXTS, &mut attrs);
    detect(&mut sp.fim_sep, FIM_SEP_TEXTS, &mut attrs);

    // Control tokens named "unused" are unused.
    for (t, a) in texts.iter().zip(attrs.iter_mut()) {
        if *a & attr::CONTROL != 0 && t.contains("unused") {
            *a |= attr::UNUSED;
        }
    }

    // End-of-generation set.
    let mut eog: Vec<u32> = [sp.fim_pad, sp.fim_rep, sp.fim_sep].into_iter().flatten().collect();
    for t in EOG_TEXTS {
        if let Some(id) = find(t) {
            eog.push(id);
            attrs[id as usize] |= attr::CONTROL;
        }
    }
    // gpt-oss renders these always.
    for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(id) = find(t) {
            attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    eog.extend([sp.eos, sp.eot, sp.eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    // o200k_harmony: "<|end|>" is not an end of generation when "<|return|>" and "<|call|>" exist.
    let has = |eog: &[u32], t: &str| find(t).is_some_and(|id| eog.binary_search(&id).is_ok());
    if has(&eog, "<|end|>")
        && ((has(&eog, "<|return|>") && has(&eog, "<|call|>"))
            || (has(&eog, "<|calls|>") && has(&eog, "<|flush|>")))
    {
        if let Some(end) = find("<|end|>") {
            eog.retain(|&x| x != end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
    }
    // Gemma 4: "</s>" is not an end of generation when "<|tool_response>" exists.
    if has(&eog, "<|tool_response>") && has(&eog, "</s>") {
        if let Some(s) = find("</s>") {
            eog.retain(|&x| x != s);
            attrs[s as usize] = attr::NORMAL;
        }
    }

    // Special tokens split out of text: longest first.
    let mut special_cache: Vec<u32> = (0..n as u32)
        .filter(|&i| attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
        .collect();
    let len = |id: u32| texts.get(id).map_or(0, str::len);
    special_cache.sort_by(|&a, &b| len(b).cmp(&len(a)).then(a.cmp(&b)));

    // Name-based attribute fix-ups (llama.cpp: Phi-3 special tokens swallow following spaces).
    let name = f.get_str("general.name").unwrap_or("").to_lowercase();
    if name.contains("phi-3") || name.contains("phi3") {
        for &id in &special_cache {
            attrs[id as usize] |= attr::RSTRIP;
        }
        if let Some(id) = find("</s>") {
            attrs[id as usize] |= attr::RSTRIP;
        }
        for t in ["<unk>", "<s>", "<|endoftext|>"] {
            if let Some(id) = find(t) {
                attrs[id as usize] &= !attr::RSTRIP;
            }
        }
    }

    let special_ac = if special_cache.is_empty() {
        None
    } else {
        let pats: Vec<&str> =
            special_cache.iter().map(|&i| texts.get(i).unwrap_or_default()).collect();
        Some(aho_corasick::AhoCorasick::new(&pats).map_err(|e| TokenizerError::BadKey {
            key: "tokenizer.ggml.tokens",
            what: format!("special tokens could not be indexed: {e}"),
        })?)
    };

    // For each special token (by its place in `special_cache`), the longest other special token
    // whose text is a proper prefix of its text: what may still match where it does not fit.
    let special_prefix: Vec<u32> = match &special_ac {
        None => Vec::new(),
        Some(ac) => special_cache
            .iter()
            .map(|&id| {
                let t = texts.get(id).unwrap_or_default();
                ac.find_overlapping_iter(t)
                    .filter(|m| m.start() == 0 && m.end() < t.len())
                    .map(|m| m.pattern().as_u32())
                    .min()
                    .unwrap_or(crate::NO_SPECIAL)
            })
            .collect(),
    };

    // Piece cache: llama_token_to_piece(special = true).
    // GPT-2 stand-in characters are all below U+0144.
    let mut char_to_byte = [None::<u8>; 0x144];
    for (b, &c) in byte_to_char_table().iter().enumerate() {
        char_to_byte[c as usize] = Some(b as u8);
    }
    // A piece is at most as long as its text, except for the rare [UNK_BYTE_0x..] markers.
    let mut pieces = Vec::with_capacity(texts_raw.text_len() + n / 64);
    let mut piece_off = Vec::with_capacity(n + 1);
    for (t, &a) in texts.iter().zip(&attrs) {
        piece_off.push(pieces.len() as u32);
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            pieces.extend_from_slice(t.as_bytes());
        } else if a & attr::NORMAL != 0 {
            if is_bpe {
                for c in t.chars() {
                    match char_to_byte.get(c as usize).copied().flatten() {
                        Some(b) => pieces.push(b),
                        None => {
                            // llama.cpp's marker for a character outside the byte alphabet.
                            pieces.extend_from_slice(b"[UNK_BYTE_0x");
                            for b in c.encode_utf8(&mut [0u8; 4]).bytes() {
                                pieces.extend_from_slice(format!("{b:02x}").as_bytes());
                            }
                            pieces.extend_from_slice(t.as_bytes());
                            pieces.push(b']');
                        }
                    }
                }
            } else {
                pieces.extend_from_slice(t.replace('▁', " ").as_bytes());
            }
        } else if a & attr::BYTE != 0 {
            if let Some(b) = t.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                pieces.push(b);
            }
        }
        if pieces.len() > u32::MAX as usize {
            return Err(TokenizerError::BadKey {
                key: "tokenizer.ggml.tokens",
                what: "token text exceeds 4 GiB".into(),
            });
        }
    }
    piece_off.push(pieces.len() as u32);
    pieces.shrink_to_fit();

    Ok(Tokenizer {
        algo,
        texts,
        scores,
        attrs,
        pieces,
        piece_off,
        special: sp,
        eog,
        special_cache,
        special_ac,
        special_prefix,
        add_bos,
        add_eos,
        add_space_prefix,
        clean_spaces,
        model,
        pre_name,
    })
}
