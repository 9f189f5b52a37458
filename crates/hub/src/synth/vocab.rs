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
}
