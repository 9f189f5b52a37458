//! Speculative decoding gives the answer decoding gives without drafts: byte for byte at greedy
//! and with a fixed seed, and with the same token distribution over many seeds, on
//! qwen2.5-coder-0.5b (two KV heads) and gemma3-270m (one KV head, so attention splits keys
//! across threads; sliding-window layers, so drafts are written past the window and cut back).

use std::sync::Arc;

use engine::draft::{DraftModel, Drafter, Ngram, MAX_DRAFT};
use engine::{GenStats, GenerateParams, SamplerParams, Session};
use model::{ContextParams, Model};
use tokenizer::Tokenizer;

fn load(name: &str) -> (Arc<Model>, Arc<Tokenizer>) {
    let path = hub::model_path(name);
    assert!(path.is_file(), "{} is missing: run `snug pull {name}`", path.display());
    let model = Model::load(&path).expect("the model loads");
    let tok = Tokenizer::from_gguf(&model.file).expect("its tokenizer loads");
    (Arc::new(model), Arc::new(tok))
}

fn params() -> ContextParams {
    ContextParams {
        n_ctx: 2048,
        n_threads: 2,
        n_outputs_max: 1 + MAX_DRAFT,
        ..ContextParams::default()
    }
}

fn session(m: &(Arc<Model>, Arc<Tokenizer>), temperature: f32, seed: u64) -> Session {
    let sampling = SamplerParams { temperature, seed, ..SamplerParams::default() };
    Session::new(Arc::clone(&m.0), Arc::clone(&m.1), params(), sampling)
}

/// The answer's text and statistics.
fn answer(s: &mut Session, prompt: &[u32], n: usize) -> (String, GenStats) {
    let gen = GenerateParams { n_predict: n, ..GenerateParams::default() };
    let mut text = String::new();
    let (_, stats) = s
        .generate(prompt, &gen, |t| {
            text.push_str(t);
            true
        })
        .expect("generation runs");
    (text, stats)
}

/// A code block and the start of its copy with one name changed: most of the answer is in the
/// prompt.
fn edit_prompt(tok: &Tokenizer) -> Vec<u32> {
    let code =
        "def area(width, height):\n    result = width * height\n    if result < 0:\n        \
                raise ValueError(\"negative area\")\n    print(\"area is\", result)\n    return \
                result\n\n\ndef perimeter(width, height):\n    result = 2 * (width + height)\n    \
                print(\"perimeter is\", result)\n    return result\n";
    let text = format!(
        "Here is some code:\n{code}\nThe same code with `result` renamed to `value`:\n\
         def area(width, height):\n    value ="
    );
    tok.encode(&text, true, false)
}

#[test]
fn greedy_answers_are_the_same_with_ngram_drafts_in_fewer_passes() {
    let m = load("qwen2.5-coder-0.5b");
    let prompt = edit_prompt(&m.1);
    let (plain, plain_stats) = answer(&mut session(&m, 0.0, 1), &prompt, 120);
    let mut s = session(&m, 0.0, 1);
    s.set_drafter(Some(Box::new(Ngram::new())));
    let (drafted, stats) = answer(&mut s, &prompt, 120);
    assert_eq!(drafted, plain);
    assert_eq!(stats.n_gen, plain_stats.n_gen);
    assert_eq!(plain_stats.drafted, 0);
    assert!(
        stats.kept >= 40,
        "{} of {} guesses kept: the copy was not guessed",
        stats.kept,
        stats.drafted
    );
    // Without drafts every token after the first costs a pass; kept guesses cost none.
    assert_eq!(plain_stats.passes, plain_stats.n_gen - 1);
    assert!(
        stats.passes + stats.kept < stats.n_gen + 1 && stats.passes + stats.kept + 1 >= stats.n_gen
    );
}

#[test]
fn sampled_answers_are_the_same_with_a_fixed_seed() {
    let m = load("qwen2.5-coder-0.5b");
    let prompt = edit_prompt(&m.1);
    for seed in [3, 4] {
        let (plain, _) = answer(&mut session(&m, 0.8, seed), &prompt, 60);
        let mut s = session(&m, 0.8, seed);
        s.set_drafter(Some(Box::new(Ngram::new())));
        let (drafted, stats) = answer(&mut s, &prompt, 60);
        assert_eq!(drafted, plain, "seed {seed}");
        assert!(stats.drafted > 0, "seed {seed}: nothing was drafted");
    }
}

#[test]
fn a_draft_model_of_the_same_tokenizer_is_kept_and_changes_nothing() {
    // The model drafting for itself: every greedy guess is what the model decodes.
    let m = load("qwen2.5-coder-0.5b");
    let prompt =
        m.1.encode("Write a Python function that checks whether a number is prime.", true, false);
    let (plain, _) = answer(&mut session(&m, 0.0, 1), &prompt, 48);
    let mut s = session(&m, 0.0, 1);
    let d = DraftModel::new(Arc::clone(&m.0), &m.1, &m.1, params()).expect("same tokenizer");
    assert_eq!(d.name(), "model");
    s.set_drafter(Some(Box::new(d)));
    let (drafted, stats) = answer(&mut s, &prompt, 48);
    assert_eq!(drafted, plain);
    assert!(stats.kept * 10 >= stats.drafted * 9, "kept {} of {}", stats.kept, stats.drafted);
    // Another tokenizer is refused with a reason.
    let other = load("gemma3-270m");
    let err = DraftModel::new(other.0, &other.1, &m.1, params()).err().expect("refused");
    assert!(err.to_string().contains("tokenizer"), "{err}");
}

#[test]
fn split_attention_and_sliding_windows_give_the_same_answer() {
    // gemma3-270m: one KV head (a lone token's keys are split across the 2 threads) and
    // 512-position windows, passed by a prompt of ~700 tokens.
    let m = load("gemma3-270m");
    let verse =
        "The quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire. ";
    let prompt = m.1.encode(&verse.repeat(40), true, false);
    assert!(prompt.len() > 600, "{} tokens", prompt.len());
    let (plain, _) = answer(&mut session(&m, 0.0, 1), &prompt, 80);
    let mut s = session(&m, 0.0, 1);
    s.set_drafter(Some(Box::new(Ngram::new())));
    let (drafted, stats) = answer(&mut s, &prompt, 80);
    assert_eq!(drafted, plain);
    assert!(stats.kept > 20, "kept {} of {}", stats.kept, stats.drafted);
}

/// The chi-square quantile at `p` for `k` degrees of freedom (Wilson–Hilferty).
fn chi2_quantile(z_p: f64, k: f64) -> f64 {
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + z_p * a.sqrt()).powi(3)
}

#[test]
fn sampled_tokens_keep_their_distribution_over_many_seeds() {
    // The third token of 200 sampled answers with drafts against 200 without, on other seeds:
    // a two-sample chi-square test at the 1% level.
    let m = load("gemma3-270m");
    let prompt = m.1.encode("red green blue red green blue red green blue red green", true, false);
    let third = |drafts: bool, seed: u64, s: &mut Session| -> (u32, usize) {
        let gen = GenerateParams { n_predict: 3, ..GenerateParams::default() };
        let sampling = SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..SamplerParams::default()
        };
        s.set_sampling(sampling);
        s.set_drafter(drafts.then(|| Box::new(Ngram::new()) as Box<dyn Drafter>));
        let (toks, st) = s.generate(&prompt, &gen, |_| true).expect("generation runs");
        (toks.get(2).copied().unwrap_or(u32::MAX), st.drafted)
    };
    let n = 200;
    let mut s = session(&m, 1.0, 0);
    let mut counts: std::collections::BTreeMap<u32, [f64; 2]> = Default::default();
    let mut drafted = 0;
    for i in 0..n {
        let (t, d) = third(true, i, &mut s);
        drafted += d;
        counts.entry(t).or_default()[0] += 1.0;
        let (t, _) = third(false, 10_000 + i, &mut s);
        counts.entry(t).or_default()[1] += 1.0;
    }
    // A 3-token answer has room for one guess a pass: most answers must have verified one.
    assert!(
        2 * drafted >= n as usize,
        "{drafted} guesses in {n} answers: the drafter was not tested"
    );
    // Bins with at least 10 draws between the two; the rest pooled.
    let (mut bins, mut rest) = (Vec::new(), [0.0; 2]);
    for c in counts.values() {
        if c[0] + c[1] >= 10.0 {
            bins.push(*c);
        } else {
            rest[0] += c[0];
            rest[1] += c[1];
        }
    }
    if rest[0] + rest[1] > 0.0 {
        bins.push(rest);
    }
    assert!(bins.len() >= 3, "the third token hardly varies: {counts:?}");
    let stat: f64 = bins.iter().map(|c| (c[0] - c[1]).powi(2) / (c[0] + c[1])).sum();
    let limit = chi2_quantile(2.326, (bins.len() - 1) as f64);
    assert!(
        stat < limit,
        "chi-square {stat:.2} over {} bins (1% limit {limit:.2}): {bins:?}",
        bins.len()
    );
}
