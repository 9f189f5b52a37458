//! Fuzz the vocabulary loader: a GGUF from arbitrary bytes through `Tokenizer::from_gguf` and
//! `ChatTemplate::from_gguf`. Metadata of any shape (wrong types, ids out of range, merges of
//! unknown tokens, duplicate texts, odd special flags) must load or give a `TokenizerError`;
//! a vocabulary that loads must then encode and decode without panicking.
//!
//! Seeds are tokenizer-only GGUFs of a few hundred tokens (fuzz/README.md, Fixtures).

#![no_main]

use gguf::GgufFile;
use libfuzzer_sys::fuzz_target;
use tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else { return };
    let Ok(tok) = Tokenizer::from_gguf(&f) else { return };
    let n = tok.n_vocab() as u32;
    for text in ["Hello world! <|im_start|>user\n  héllo 🦀 12345", "<s><start_of_turn> ▁x"] {
        for (add, parse) in [(false, false), (true, true)] {
            let ids = tok.encode(text, add, parse);
            assert!(ids.iter().all(|&id| id < n), "encode gave an id past {n}: {ids:?}");
            let _ = tok.decode(&ids);
        }
    }
    let all: Vec<u32> = (0..n.min(4096)).chain([n, n + 1, u32::MAX]).collect();
    let _ = tok.detokenize(&all, true, false);
    let mut s = StreamDecoder::new(&tok).with_special(true);
    for &id in &all {
        let _ = s.push(id);
    }
    let _ = s.flush();
    let _ = (tok.bos(), tok.eos(), tok.eot(), tok.eog_ids(), tok.special_ids(), tok.pre());
    if let Ok(t) = ChatTemplate::from_gguf(&f, &tok) {
        let _ = t.render(&[ChatMessage::new("user", "hi")], true);
    }
});
