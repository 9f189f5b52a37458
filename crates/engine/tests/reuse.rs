//! Prompt reuse by text ([`engine::reuse`]) on the tokenizer of qwen2.5-coder-0.5b: a call's
//! markup written in pieces is read again as its added token, a control token never stands for
//! text that spells it, and a prompt takes a kept sequence's split of the same text.

use engine::reuse::{canonical, piece_of, splice, Piece};
use tokenizer::Tokenizer;

fn tokenizer() -> Tokenizer {
    let path = hub::model_path("qwen2.5-coder-0.5b");
    assert!(path.is_file(), "{} is missing: run `snug pull qwen2.5-coder-0.5b`", path.display());
    let file = gguf::GgufFile::open(&path).expect("the model file opens");
    Tokenizer::from_gguf(&file).expect("its tokenizer loads")
}

/// The tokens of each piece, one token a piece (each must be one token of the vocabulary).
fn pieces(tok: &Tokenizer, parts: &[&str]) -> Vec<u32> {
    parts
        .iter()
        .map(|p| match tok.encode(p, false, false)[..] {
            [t] => t,
            ref ts => panic!("{p:?} is not one token: {ts:?}"),
        })
        .collect()
}

#[test]
fn a_call_written_in_pieces_is_read_again_as_its_markup_token() {
    let tok = tokenizer();
    let call = tok.token_id("<tool_call>").expect("Qwen's call markup");
    let end = tok.token_id("<|im_end|>").expect("the end of a turn");
    assert_eq!(piece_of(&tok, call), Piece::Exact(call), "an added token matches only itself");
    assert_eq!(piece_of(&tok, end), Piece::Exact(end));
    let prompt = tok.encode("<|im_start|>assistant\n", false, true);
    let mut seq = prompt.clone();
    seq.extend(pieces(&tok, &["<", "tool", "_call", ">"]));
    seq.extend(tok.encode("\n{\"name\": \"f\"}\n", false, false));
    seq.push(end);
    let canon = canonical(&tok, &seq, prompt.len()).expect("the pieces are not the markup token");
    let mut want = prompt.clone();
    want.extend(tok.encode("<tool_call>\n{\"name\": \"f\"}\n", false, false));
    want.push(end);
    assert_eq!(canon, want);
    assert_eq!(want[prompt.len()], call);
    assert_eq!(canonical(&tok, &want, prompt.len()), None, "already as a prompt tokenizes it");
}

#[test]
fn text_spelling_a_control_token_stays_text() {
    let tok = tokenizer();
    let end = tok.token_id("<|im_end|>").expect("the end of a turn");
    let prompt = tok.encode("hi", false, false);
    // An answer that wrote the end token's spelling in pieces: re-tokenized, it is still text.
    let mut seq = prompt.clone();
    seq.extend(pieces(&tok, &["<", "|", "im", "_end", "|", ">"]));
    if let Some(canon) = canonical(&tok, &seq, prompt.len()) {
        assert!(!canon.contains(&end), "text became the control token: {canon:?}");
    }
    // A prompt holding the control token never takes that text for it, nor the other way.
    let mut p = prompt.clone();
    p.push(end);
    p.extend(tok.encode("more", false, false));
    assert!(splice(&p, &seq, |id| piece_of(&tok, id)).is_none());
    let mut s = prompt.clone();
    s.push(end);
    let mut q = seq.clone();
    q.extend(tok.encode("more", false, false));
    assert!(splice(&q, &s, |id| piece_of(&tok, id)).is_none());
}

#[test]
fn a_prompt_takes_a_kept_sequences_split_of_the_same_text() {
    let tok = tokenizer();
    let head = tok.encode("The weather in", false, false);
    // The model wrote " Paris" as " Par" "is" (not the canonical split), then a new line.
    let mut s = head.clone();
    s.extend(pieces(&tok, &[" Par", "is"]));
    let p_text = "The weather in Paris is mild today";
    let p = tok.encode(p_text, false, false);
    assert_ne!(&p[..s.len()], &s[..], "the prompt splits it otherwise");
    let sp = splice(&p, &s, |id| piece_of(&tok, id)).expect("the same text");
    assert_eq!(sp.k, s.len(), "through the whole kept sequence");
    let spliced = sp.prompt(&s, &p);
    assert_eq!(tok.decode(&spliced), p_text, "the same text");
    assert_eq!(&spliced[..s.len()], &s[..]);
    // The prompt's tokens the kept part stands for are counted as the prompt's own.
    assert_eq!(sp.plain_cached(spliced.len()), p.len());
    // Text that differs stops it where the two part.
    let other = tok.encode("The weather in Berlin", false, false);
    let sp = splice(&other, &s, |id| piece_of(&tok, id));
    assert!(sp.is_none(), "nothing past the common tokens: {sp:?}");
}
