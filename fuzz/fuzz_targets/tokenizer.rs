//! Fuzz the tokenizers on real vocabularies (see `snug_fuzz::Vocab`): arbitrary bytes through
//! `encode` under every flag combination, and arbitrary ids through `decode`, `detokenize` and
//! the `StreamDecoder`. Nothing may panic, and three properties must hold:
//!
//! - every id `encode` returns is inside the vocabulary;
//! - tokenizing is lossless: `decode(encode(text))` gives `text` back (SentencePiece renders
//!   its `▁` as a space, so a literal `▁` in the input comes back as one);
//! - streaming is the same text as decoding at once: the pushes plus the flush concatenate to
//!   `detokenize(ids)` made valid UTF-8.
//!
//! Input layout: byte 0 picks the vocabulary (bit 0) and the mode (bit 1); the rest is the text
//! (lossy UTF-8) or the ids (4 bytes each, mostly folded into the vocabulary's range).

#![no_main]

use libfuzzer_sys::fuzz_target;
use snug_fuzz::Vocab;
use tokenizer::{StreamDecoder, Tokenizer};

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else { return };
    let vocab = if ctl & 1 == 0 { Vocab::Bpe } else { Vocab::Spm };
    let tok = &vocab.load().tok;
    if ctl & 2 == 0 {
        encode(tok, vocab, &String::from_utf8_lossy(rest));
    } else {
        decode(tok, &ids_of(tok, rest));
    }
});

fn encode(tok: &Tokenizer, vocab: Vocab, text: &str) {
    let expected = match vocab {
        Vocab::Bpe => text.to_string(),
        Vocab::Spm => text.replace('\u{2581}', " "),
    };
    for add_special in [false, true] {
        for parse_special in [false, true] {
            let ids = tok.encode(text, add_special, parse_special);
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= tok.n_vocab()) {
                panic!("encode gave id {bad} of a {}-token vocabulary", tok.n_vocab());
            }
            if !add_special {
                assert_eq!(tok.decode(&ids), expected, "parse_special {parse_special}: {ids:?}");
            }
            stream_equals_detokenize(tok, &ids);
        }
    }
}

fn decode(tok: &Tokenizer, ids: &[u32]) {
    let _ = tok.decode(ids);
    for remove_special in [false, true] {
        for unparse_special in [false, true] {
            let _ = tok.detokenize(ids, remove_special, unparse_special);
        }
    }
    for &id in ids {
        let _ = (tok.token_piece(id), tok.token_text(id), tok.token_attr(id));
        let _ = (tok.is_control(id), tok.is_eog(id));
        if let Some(text) = tok.token_text(id) {
            assert!(tok.token_id(text).is_some(), "token {id} text {text:?} not found back");
        }
    }
    stream_equals_detokenize(tok, ids);
    // Stripping the first token's leading space must not panic on any piece (empty, one byte).
    let mut s = StreamDecoder::new(tok).strip_leading_space(true);
    for &id in ids {
        let _ = s.push(id);
    }
    let _ = s.flush();
}

fn stream_equals_detokenize(tok: &Tokenizer, ids: &[u32]) {
    for special in [false, true] {
        let mut s = StreamDecoder::new(tok).with_special(special);
        let mut text = String::new();
        for &id in ids {
            text += &s.push(id);
            assert!(s.pending_bytes() <= 3, "{} bytes pending", s.pending_bytes());
        }
        text += &s.flush();
        let whole = tok.detokenize(ids, false, special);
        assert_eq!(text, String::from_utf8_lossy(&whole), "special {special}: {ids:?}");
    }
}

/// 4 bytes per id: mostly inside the vocabulary (plus a few past its end), sometimes raw.
fn ids_of(tok: &Tokenizer, bytes: &[u8]) -> Vec<u32> {
    let span = tok.n_vocab() as u32 + 8;
    bytes
        .chunks_exact(4)
        .map(|c| {
            let raw = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            if raw & 0x8000_0000 != 0 && raw & 0xff == 0xff {
                raw
            } else {
                raw % span
            }
        })
        .collect()
}
