//! The finish rule every answer goes through ([`engine::Sequence`]), on the tokenizer of
//! qwen2.5-coder-0.5b: what each token settles, and why and when the answer ends.

use std::sync::Arc;

use engine::sequence::{Finish, Step};
use engine::{JsonFormat, JsonMask, Sequence, StopMatcher};
use tokenizer::Tokenizer;

fn tokenizer() -> Arc<Tokenizer> {
    let path = hub::model_path("qwen2.5-coder-0.5b");
    assert!(path.is_file(), "{} is missing: run `snug pull qwen2.5-coder-0.5b`", path.display());
    let file = gguf::GgufFile::open(&path).expect("the model file opens");
    Arc::new(Tokenizer::from_gguf(&file).expect("its tokenizer loads"))
}

fn answer(tok: &Arc<Tokenizer>, stops: &[&str], max_tokens: usize) -> Sequence {
    let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
    Sequence::new(Arc::clone(tok), StopMatcher::new(&stops), max_tokens, false)
}

/// Feeds `text`'s tokens with room in the context; the text settled and the last step's end.
fn feed(a: &mut Sequence, tok: &Tokenizer, text: &str) -> (String, Option<Finish>) {
    let mut out = String::new();
    for t in tok.encode(text, false, false) {
        let Step { text, finish } = a.accept(t, true);
        out += &text;
        if finish.is_some() {
            return (out, finish);
        }
    }
    (out, None)
}

#[test]
fn an_end_token_ends_the_answer_without_text_unless_ignored() {
    let tok = tokenizer();
    let eos = tok.eos().expect("an end token");
    let mut a = answer(&tok, &[], 10);
    assert_eq!(feed(&mut a, &tok, "Hello"), ("Hello".into(), None));
    assert_eq!(a.accept(eos, true), Step { text: String::new(), finish: Some(Finish::Eog) });
    assert_eq!(a.n_gen(), 1);
    let mut a = answer(&tok, &[], 10).ignoring_eos(true);
    assert_eq!(a.accept(eos, true).finish, None);
    assert_eq!(a.n_gen(), 1);
}

#[test]
fn a_stop_string_ends_the_answer_and_nothing_of_it_comes_out() {
    let tok = tokenizer();
    let mut a = answer(&tok, &["STOP here"], 100);
    let (text, finish) = feed(&mut a, &tok, "one two STOP here three");
    assert_eq!((text.as_str(), finish), ("one two ", Some(Finish::StopString)));
    assert_eq!(a.flush(), "");
}

#[test]
fn text_held_for_a_stop_string_comes_out_when_the_answer_ends_otherwise() {
    let tok = tokenizer();
    let n = tok.encode("one two ST", false, false).len();
    let mut a = answer(&tok, &["STOP"], n);
    let (text, finish) = feed(&mut a, &tok, "one two ST");
    assert_eq!(finish, Some(Finish::Length));
    assert!(!text.contains("ST"), "{text:?}: the start of a stop string is held back");
    assert_eq!(text + &a.flush(), "one two ST");
}

#[test]
fn the_token_limit_comes_before_a_full_context_and_after_the_text() {
    let tok = tokenizer();
    let t = tok.encode(" word", false, false)[0];
    let mut a = answer(&tok, &[], 2);
    assert_eq!(a.accept(t, true).finish, None);
    // The second token is both the last allowed and past the context: the limit is the reason.
    assert_eq!(a.accept(t, false), Step { text: " word".into(), finish: Some(Finish::Length) });
    let mut a = answer(&tok, &[], 5);
    assert_eq!(
        a.accept(t, false),
        Step { text: " word".into(), finish: Some(Finish::ContextFull) }
    );
}

#[test]
fn a_complete_constraint_ends_the_answer() {
    let tok = tokenizer();
    let mut a = answer(&tok, &[], 100).constrained(Some(JsonMask::new(&JsonFormat::Object)), None);
    let (text, finish) = feed(&mut a, &tok, "{\"a\": [1, 2]} and more");
    assert_eq!((text.as_str(), finish), ("{\"a\": [1, 2]}", Some(Finish::Complete)));
}

#[test]
fn a_required_call_under_random_logits_never_leaves_the_grammar() {
    // The real vocabulary holds tokens that close a call's arguments and carry more (`"}}`,
    // `"}\n`, ` }\n\n`): the mask must allow exactly those the call may go on with. Random
    // logits, tilted toward closing bytes, walk many answers through `Sequence::sample`.
    use engine::json_schema::Schema;
    use engine::sampling::Rng;
    use engine::sequence::Masks;
    use engine::tools::{Format, Reasoning, Start, Tool, ToolGrammar};
    use engine::{Sampler, SamplerParams};

    let tok = tokenizer();
    let schema = |v: serde_json::Value| Arc::new(Schema::compile(&v).unwrap());
    let tools = vec![
        Tool {
            name: "get_weather".into(),
            parameters: schema(serde_json::json!({"type": "object",
                "properties": {"location": {"type": "string"},
                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["location"]})),
        },
        Tool {
            name: "add".into(),
            parameters: schema(serde_json::json!({"type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "number"}}})),
        },
    ];
    let n_vocab = tok.n_vocab();
    // Tokens with closing or whitespace bytes are drawn far more often than their share.
    let tilt: Vec<f32> = (0..n_vocab as u32)
        .map(|t| {
            let b = tok.token_piece(t);
            if b.iter().any(|c| b"}]\"\n ".contains(c)) {
                6.0
            } else {
                0.0
            }
        })
        .collect();
    let mut rng = Rng::new(7);
    let mut masks = Masks::default();
    let mut calls = 0;
    for (walk, max_calls) in (0..24).zip([1, 2, 3].into_iter().cycle()) {
        let grammar = Arc::new(ToolGrammar {
            format: Format::Hermes,
            tools: tools.clone(),
            start: Start::Now,
            max_calls,
            reasoning: Reasoning::Off,
        });
        let mut a = answer(&tok, &[], 120).constrained(None, Some(grammar.mask()));
        let params = SamplerParams { temperature: 1.0, seed: walk, ..SamplerParams::default() };
        let mut sampler = Sampler::new(params, n_vocab);
        let mut text = String::new();
        loop {
            let logits: Vec<f32> = tilt.iter().map(|t| t + 4.0 * rng.next_f32()).collect();
            let Some(t) = a.sample(&mut sampler, &logits, &mut masks) else {
                panic!("nothing allowed after {text:?}")
            };
            let step = a.accept(t, true);
            text += &step.text;
            let mask = a.tools.as_ref().unwrap();
            if step.finish.is_some() {
                calls += mask.n_calls();
                break;
            }
            assert!(mask.constrains(), "walk {walk} left the grammar after {text:?}");
        }
    }
    assert!(calls >= 12, "{calls} calls in 24 walks");
}
