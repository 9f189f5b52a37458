//! The scheduler on a real model (qwen2.5-coder-0.5b, pulled if missing): batch invariance
//! (greedy answers alone == the same answers computed together, byte for byte, with prompts of
//! different lengths so prefill chunks share steps with decoding), cancellation freeing the
//! slot, and refusals (queue full, prompt too long).

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::SamplerParams;
use model::{Context, ContextParams, Model};
use server::scheduler::{self, Event, FinishReason, Handle, Refused, SchedulerOptions};
use tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedReceiver;

const ALIAS: &str = "qwen2.5-coder-0.5b";
const N_CTX: usize = 512;

fn start(n_seq: usize, queue: usize, prefill_chunk: Option<usize>) -> (Handle, Arc<Tokenizer>) {
    let path = hub::resolve(ALIAS)
        .unwrap_or_else(|e| panic!("{ALIAS} is needed: {e} (fetch it with `snug pull {ALIAS}`)"));
    let model = Arc::new(Model::load(&path).expect("the model loads"));
    let tok = Arc::new(Tokenizer::from_gguf(&model.file).expect("its tokenizer loads"));
    let params = ContextParams {
        n_ctx: N_CTX,
        n_seq_max: n_seq,
        n_outputs_max: n_seq,
        n_threads: 2,
        ..ContextParams::default()
    };
    let opts = SchedulerOptions { queue, prefill_chunk };
    let h = scheduler::spawn(tok.clone(), opts, Default::default(), move || {
        Ok((Context::new(model, params), ()))
    })
    .expect("the scheduler starts");
    (h, tok)
}

fn greedy(h: &Handle, tok: &Tokenizer, prompt: &str, n: usize) -> UnboundedReceiver<Event> {
    h.start(tok.encode(prompt, true, false), SamplerParams::greedy(), n, Vec::new())
        .expect("the job is accepted")
}

/// The whole text and how it ended.
fn finish(mut rx: UnboundedReceiver<Event>) -> (String, FinishReason, usize) {
    let mut text = String::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done(f) => return (text, f.reason, f.n_gen),
            Event::Failed(e) => panic!("the job failed: {e}"),
        }
    }
    panic!("the job ended without Done")
}

const PROMPTS: [&str; 4] = [
    "def fibonacci(n):",
    "The capital of France is",
    "// A function in C that reverses a linked list, with comments explaining each step of the \
     algorithm and the invariants it keeps while it walks the list from head to tail.\n",
    "import numpy as np\n\n# compute the mean of an array",
];

#[test]
fn greedy_answers_alone_equal_the_answers_computed_together() {
    let n = 24;
    // A small prefill chunk makes the long prompt's reading share steps with the others' decoding.
    let (h, tok) = start(4, 8, Some(16));
    let alone: Vec<String> = PROMPTS.iter().map(|p| finish(greedy(&h, &tok, p, n)).0).collect();
    let rxs: Vec<_> = PROMPTS.iter().map(|p| greedy(&h, &tok, p, n)).collect();
    let together: Vec<String> = rxs.into_iter().map(|rx| finish(rx).0).collect();
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert!(!a.is_empty(), "prompt {i} produced no text");
        assert_eq!(a, t, "prompt {i}: the answer beside others differs from the answer alone");
    }
}

#[test]
fn stop_strings_end_the_answer_and_max_tokens_is_exact() {
    let (h, tok) = start(2, 4, None);
    let (text, reason, n_gen) = finish(greedy(&h, &tok, PROMPTS[0], 5));
    assert_eq!((reason, n_gen), (FinishReason::Length, 5), "{text:?}");
    let full = finish(greedy(&h, &tok, PROMPTS[0], 16)).0;
    // Stop at the second character of the answer: what comes before it is all that is sent.
    let cut = full.char_indices().nth(1).map(|(i, _)| i).expect("two characters");
    let stop = full[cut..].chars().take(3).collect::<String>();
    let rx = h
        .start(tok.encode(PROMPTS[0], true, false), SamplerParams::greedy(), 16, vec![stop.clone()])
        .unwrap();
    let (text, reason, _) = finish(rx);
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(text, full[..full.find(&stop).unwrap()], "stop {stop:?} in {full:?}");
}

#[test]
fn a_dropped_receiver_frees_its_sequence_and_refusals_say_why() {
    let (h, tok) = start(1, 1, None);
    // A job that would run long; its client goes away after the first piece.
    let mut rx = greedy(&h, &tok, PROMPTS[1], 400);
    assert!(matches!(rx.blocking_recv(), Some(Event::Text(_))));
    // While it runs, one job waits and the next is refused.
    let waiting = greedy(&h, &tok, PROMPTS[0], 4);
    let refused = h.start(tok.encode("x", true, false), SamplerParams::greedy(), 4, vec![]);
    assert!(matches!(refused, Err(Refused::Busy { slots: 1, queue: 1 })), "{refused:?}");
    drop(rx);
    // The waiting job gets the freed slot and finishes.
    let t0 = Instant::now();
    let (_, reason, n) = finish(waiting);
    assert_eq!((reason, n), (FinishReason::Length, 4));
    assert!(t0.elapsed() < Duration::from_secs(60));
    assert_eq!(h.counters.running.get(), 0);
    assert_eq!(h.counters.queued.get(), 0);
    let long = vec![tok.encode("a", false, false)[0]; N_CTX];
    let e = h.start(long, SamplerParams::greedy(), 4, vec![]).unwrap_err();
    assert!(matches!(e, Refused::TooLong { n_prompt: 512, n_ctx: 512, max: 511 }), "{e:?}");
    assert!(e.to_string().contains("512 tokens"), "{e}");
}
