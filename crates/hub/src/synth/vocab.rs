//! A made-up tokenizer for models synthesised without a real one.

use gguf::{Array, Value};

/// 256 byte tokens (GPT-2's byte-to-unicode spelling) + `<|endoftext|>`, no merges: a valid
/// byte-level BPE vocabulary for tests that have no real model at hand.
pub(super) fn byte_level_tokenizer() -> Vec<(String, Value)> {
    let mut tokens: Vec<String> = (0..=255u8).map(gpt2_byte_char).map(String::from).collect();
    tokens.push("<|endoftext|>".into());
    let mut types = vec![1i32; 256];
    types.push(3); // control
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(Array::String(tokens.into()))),
        ("tokenizer.ggml.token_type".into(), Value::Array(Array::I32(types))),
        ("tokenizer.ggml.merges".into(), Value::Array(Array::String(Default::default()))),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(256)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(256)),
    ]
}

/// Cuts or pads the vocabulary of `kvs` to `n` tokens: the per-token arrays (tokens, scores,
/// types) are cut, or padded as llama.cpp's converter pads (`[PAD{id}]`, score -1000, type
/// unused); special-token ids past the cut are dropped. Merges are kept: cut only vocabularies
/// without them (SPM), or whose merges do not reach the cut tokens.
pub(super) fn fit(kvs: Vec<(String, Value)>, n: usize) -> Vec<(String, Value)> {
    kvs.into_iter()
        .filter_map(|(k, v)| {
            let v = match (k.as_str(), v) {
                ("tokenizer.ggml.tokens", Value::Array(Array::String(a))) => {
                    let pad = (a.len()..n).map(|i| format!("[PAD{i}]"));
                    let kept: Vec<String> = a.iter().take(n).map(String::from).chain(pad).collect();
                    Value::Array(Array::String(kept.into()))
                }
                ("tokenizer.ggml.scores", Value::Array(Array::F32(mut a))) => {
                    a.resize(n, -1000.0);
                    Value::Array(Array::F32(a))
                }
                ("tokenizer.ggml.token_type", Value::Array(Array::I32(mut a))) => {
                    a.resize(n, 5); // unused
                    Value::Array(Array::I32(a))
                }
                (k, v) if k.ends_with("_token_id") => {
                    if v.as_u64().is_some_and(|id| id >= n as u64) {
                        return None;
                    }
                    v
                }
                (_, v) => v,
            };
            Some((k, v))
        })
        .collect()
}

/// GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the rest to U+0100 upwards.
fn gpt2_byte_char(b: u8) -> char {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    if printable(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_made_up_vocabulary_spells_bytes_like_gpt2() {
        assert_eq!(gpt2_byte_char(b'A'), 'A');
        assert_eq!(gpt2_byte_char(b' '), 'Ġ');
        assert_eq!(gpt2_byte_char(b'\n'), 'Ċ');
        let toks: std::collections::HashSet<char> = (0..=255u8).map(gpt2_byte_char).collect();
        assert_eq!(toks.len(), 256);
    }

    #[test]
    fn a_vocabulary_is_cut_or_padded_to_the_shape() {
        let len = |kvs: &[(String, Value)], key: &str| {
            kvs.iter().find(|(k, _)| k == key).and_then(|(_, v)| v.as_array()).map(Array::len)
        };
        let cut = fit(byte_level_tokenizer(), 100);
        assert_eq!(len(&cut, "tokenizer.ggml.tokens"), Some(100));
        assert_eq!(len(&cut, "tokenizer.ggml.token_type"), Some(100));
        assert!(!cut.iter().any(|(k, _)| k == "tokenizer.ggml.eos_token_id"));
        let padded = fit(byte_level_tokenizer(), 300);
        assert_eq!(len(&padded, "tokenizer.ggml.tokens"), Some(300));
        assert!(padded.iter().any(|(k, _)| k == "tokenizer.ggml.eos_token_id"));
    }
}
