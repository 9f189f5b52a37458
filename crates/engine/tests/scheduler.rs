//! The scheduler on a real model (qwen2.5-coder-0.5b, pulled if missing): batch invariance
//! (greedy answers alone == the same answers computed together, byte for byte, with prompts of
//! different lengths so prefill chunks share steps with decoding), cancellation freeing the
//! slot, and refusals (queue full, prompt too long); the prefix cache (a cached prefix gives
//! the cold answer byte for byte, hits are counted, blocks come back, LRU eviction in a small
//! pool, a client leaving while it shares blocks with a running sequence).

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::scheduler::{self, Event, FinishReason, Handle, Refused, SchedulerOptions};
use engine::SamplerParams;
use model::{Context, ContextParams, Model};
use tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedReceiver;

const ALIAS: &str = "qwen2.5-coder-0.5b";
const N_CTX: usize = 512;

fn start(n_seq: usize, queue: usize, prefill_chunk: Option<usize>) -> (Handle, Arc<Tokenizer>) {
    start_ctx(n_seq, queue, prefill_chunk, N_CTX)
}

fn start_ctx(
    n_seq: usize,
    queue: usize,
    prefill_chunk: Option<usize>,
    n_ctx: usize,
) -> (Handle, Arc<Tokenizer>) {
    start_model(ALIAS, n_seq, queue, prefill_chunk, n_ctx, false)
}

fn start_model(
    alias: &str,
    n_seq: usize,
    queue: usize,
    prefill_chunk: Option<usize>,
    n_ctx: usize,
    draft: bool,
) -> (Handle, Arc<Tokenizer>) {
    let path = hub::resolve(alias)
        .unwrap_or_else(|e| panic!("{alias} is needed: {e} (fetch it with `snug pull {alias}`)"));
    let model = Arc::new(Model::load(&path).expect("the model loads"));
    let tok = Arc::new(Tokenizer::from_gguf(&model.file).expect("its tokenizer loads"));
    let params = ContextParams {
        n_ctx,
        n_seq_max: n_seq,
        n_outputs_max: n_seq + if draft { engine::draft::MAX_DRAFT } else { 0 },
        n_threads: 2,
        ..ContextParams::default()
    };
    let opts = SchedulerOptions { queue, prefill_chunk, draft };
    let h = scheduler::spawn(tok.clone(), opts, Default::default(), move || {
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((Context::new(model, params), ()))
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
    assert!(matches!(refused, Err(Refused::Busy { slots: 1, queue: 1, .. })), "{refused:?}");
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

/// A prompt of well over 100 tokens, so several full 32-token blocks can be shared.
const LONG: &str = "// A small library of list utilities in C. Each function takes the head of a \
     singly linked list and returns the new head; no function allocates except where it says so, \
     and every function keeps the list acyclic. The nodes are defined below, followed by the \
     functions: reverse, append, remove_if, length and free_all, each with a comment that states \
     its invariant and its cost in time and memory. The tests at the end of the file build lists \
     of zero, one, two and a thousand nodes, run every function on each of them, and check the \
     lengths, the order of the values and that valgrind reports no leak and no invalid read.\n";

/// The pool's blocks add up, and none is held by a sequence once nothing runs.
fn assert_blocks_back(h: &Handle) {
    let c = &h.counters;
    let (used, free, cached) =
        (c.kv_blocks_used.get(), c.kv_blocks_free.get(), c.kv_blocks_cached.get());
    assert_eq!(used, 0, "blocks still held with nothing running (free {free}, cached {cached})");
    assert_eq!((used + free + cached) as usize, h.kv_blocks, "used + free + cached");
}

#[test]
fn a_cached_prefix_gives_the_cold_answer_and_is_counted() {
    let (h, tok) = start(1, 4, None);
    let a = format!("{LONG}struct node {{");
    let b = format!("{LONG}int length(");
    let n_a = tok.encode(&a, true, false).len();
    assert!(n_a > 100, "the prompt is long enough to share blocks ({n_a} tokens)");
    let hits = || h.counters.prefix_hit_tokens.get();
    let cold = finish(greedy(&h, &tok, &a, 16)).0;
    assert!(!cold.is_empty());
    assert_eq!(hits(), 0, "nothing was cached before the first request");
    assert!(h.counters.kv_blocks_cached.get() > 0, "a finished request's blocks stay cached");
    assert_blocks_back(&h);
    // The same prompt again: every full block of it but the one holding its last token.
    let warm = finish(greedy(&h, &tok, &a, 16)).0;
    assert_eq!(hits(), ((n_a - 1) / 32 * 32) as u64);
    assert_eq!(warm, cold, "the answer from a cached prefix differs from the cold one");
    // Shed (memory pressure): the next run is cold again, and the same.
    h.shed_prefix_cache();
    let before = hits();
    let again = finish(greedy(&h, &tok, &a, 16)).0;
    assert_eq!(hits(), before, "the shed cache still served a prefix");
    assert_eq!(h.counters.prefix_sheds.get(), 1);
    assert_eq!(again, cold);
    // Another prompt sharing the leading blocks reuses them.
    let before = hits();
    let n_b = finish(greedy(&h, &tok, &b, 8)).2;
    assert!(n_b > 0);
    assert!(hits() >= before + 96, "the shared prefix was not reused ({} tokens)", hits() - before);
    assert_blocks_back(&h);
}

#[test]
fn a_small_pool_evicts_the_least_recently_used_prefix() {
    // 128 positions for one sequence: a handful of finished prompts fill the pool.
    let (h, tok) = start_ctx(1, 4, None, 128);
    let prompts: Vec<String> = (0..6).map(|i| format!("Note {i}. {}", &LONG[..300])).collect();
    let hits = || h.counters.prefix_hit_tokens.get();
    let first = finish(greedy(&h, &tok, &prompts[0], 4)).0;
    for p in &prompts[1..] {
        let (text, _, n) = finish(greedy(&h, &tok, p, 4));
        assert!(n > 0, "{text:?}");
        assert_blocks_back(&h);
    }
    assert_eq!(hits(), 0, "the prompts differ from their first token");
    // The oldest prompt's blocks were the first to go: it runs cold, and the same.
    let again = finish(greedy(&h, &tok, &prompts[0], 4)).0;
    assert_eq!(hits(), 0, "the least recently used prefix was still cached");
    assert_eq!(again, first);
    // The newest one is still there.
    let last = prompts.last().unwrap();
    finish(greedy(&h, &tok, last, 4));
    assert!(hits() > 0, "the most recent prefix was evicted");
    assert_blocks_back(&h);
}

#[test]
fn a_client_leaving_frees_its_blocks_and_spares_the_shared_ones() {
    let (h, tok) = start(2, 4, None);
    let a = format!("{LONG}void reverse(");
    let b = format!("{LONG}void free_all(");
    let alone = finish(greedy(&h, &tok, &a, 32)).0;
    // Both start on the cached prefix; the second one's client goes away after its first piece.
    let rx_a = greedy(&h, &tok, &a, 32);
    let mut rx_b = greedy(&h, &tok, &b, 200);
    assert!(matches!(rx_b.blocking_recv(), Some(Event::Text(_))));
    drop(rx_b);
    assert!(h.counters.prefix_hit_tokens.get() >= 2 * 96, "both shared the cached prefix");
    assert_eq!(finish(rx_a).0, alone, "the shared blocks changed under the sequence using them");
    assert_eq!(h.counters.running.get(), 0);
    assert_blocks_back(&h);
    assert!(h.counters.kv_blocks_cached.get() > 0);
}

#[test]
fn logprobs_come_with_each_generated_token_and_greedy_picks_the_top_one() {
    let (h, tok) = start(1, 2, None);
    let prompt = tok.encode(PROMPTS[0], true, false);
    let (rx, mut lp) =
        h.start_with_logprobs(prompt, SamplerParams::greedy(), 12, Vec::new(), 5).unwrap();
    let (_, _, n_gen) = finish(rx);
    let mut got = Vec::new();
    while let Ok(t) = lp.try_recv() {
        got.push(t);
    }
    assert_eq!(got.len(), n_gen, "one entry per generated token");
    for t in &got {
        assert_eq!(t.top.len(), 5);
        assert_eq!(t.top[0].1, t.logprob, "the greedy token is the most likely one: {t:?}");
        assert!(t.top.iter().all(|p| p.1 <= 0.0), "{t:?}");
        assert!(t.top.iter().map(|p| p.1.exp()).sum::<f32>() <= 1.0 + 1e-6, "{t:?}");
    }
}

#[test]
fn a_model_with_sliding_window_layers_shares_no_blocks() {
    // gemma3's local layers free blocks past their window: nothing is cached, answers agree.
    let (h, tok) = start_model("gemma3-270m", 1, 2, None, N_CTX, false);
    let first = finish(greedy(&h, &tok, LONG, 8)).0;
    let again = finish(greedy(&h, &tok, LONG, 8)).0;
    assert_eq!(h.counters.prefix_hit_tokens.get(), 0);
    assert_eq!(h.counters.kv_blocks_cached.get(), 0);
    assert_eq!(first, again);
    assert_blocks_back(&h);
}

#[test]
fn a_queue_of_0_is_honoured_and_leaving_waiters_stop_counting() {
    let (h, tok) = start(1, 0, None);
    let mut rx = greedy(&h, &tok, PROMPTS[1], 400);
    assert!(matches!(rx.blocking_recv(), Some(Event::Text(_))));
    // No place to wait: refused at once, with a Retry-After of at least 1 s.
    let t = h.reserve();
    assert!(matches!(t, Err(Refused::Busy { slots: 1, queue: 0, retry_after: 1.. })), "{t:?}");
    assert_eq!(h.outstanding(), 1);
    drop(rx);
    // The running job's client left: its place comes back at the next step.
    let t0 = Instant::now();
    while h.outstanding() != 0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "a job whose client left still counts");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A place taken and dropped unused is given back.
    let ticket = h.reserve().expect("a free place");
    assert_eq!(h.outstanding(), 1);
    drop(ticket);
    assert_eq!(h.outstanding(), 0);
    let (text, reason, n) = finish(greedy(&h, &tok, PROMPTS[0], 3));
    assert_eq!((reason, n), (FinishReason::Length, 3), "{text:?}");
    assert!(h.is_alive());

    // With a queue of 2 behind a busy slot, waiters whose clients left are forgotten at the
    // next step, not when the slot frees.
    let (h, tok) = start(1, 2, None);
    let mut running = greedy(&h, &tok, PROMPTS[1], 400);
    assert!(matches!(running.blocking_recv(), Some(Event::Text(_))));
    let waiters = [greedy(&h, &tok, PROMPTS[0], 4), greedy(&h, &tok, PROMPTS[0], 4)];
    assert!(matches!(h.reserve(), Err(Refused::Busy { .. })));
    drop(waiters);
    let t0 = Instant::now();
    while h.outstanding() != 1 {
        assert!(t0.elapsed() < Duration::from_secs(30), "waiters that left still count");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(matches!(running.blocking_recv(), Some(Event::Text(_))), "the running job goes on");
    drop(running);
}

/// A prompt whose answer copies it: a short function and the start of its copy with one name
/// changed.
const COPY: &str = "def area(width, height):\n    result = width * height\n    if result < 0:\n        \
                    raise ValueError(\"negative area\")\n    print(\"area is\", result)\n    return \
                    result\n\nThe same function with `result` renamed to `value`:\n\ndef area(width, \
                    height):\n    value =";

#[test]
fn drafting_keeps_every_answer_and_counts_its_guesses() {
    let n = 40;
    let (plain, tok) = start(2, 4, None);
    let want: Vec<String> =
        [COPY, PROMPTS[0]].iter().map(|p| finish(greedy(&plain, &tok, p, n)).0).collect();
    drop(plain);
    let (h, tok) = start_model(ALIAS, 2, 4, None, N_CTX, true);
    // Alone: the copy is guessed and the answer is the same.
    assert_eq!(finish(greedy(&h, &tok, COPY, n)).0, want[0]);
    let (tried, kept) = (h.counters.draft_tokens.get(), h.counters.draft_kept.get());
    assert!(kept >= 10 && tried >= kept, "{kept} of {tried} guesses kept");
    assert_eq!(h.counters.draft_kept_per_pass.get().sum as u64, kept);
    // Two together (both may draft), and the same answers.
    let rxs: Vec<_> = [COPY, PROMPTS[0]].iter().map(|p| greedy(&h, &tok, p, n)).collect();
    let together: Vec<String> = rxs.into_iter().map(|rx| finish(rx).0).collect();
    assert_eq!(together, want);
    // A request that opts out verifies no guesses.
    let before = h.counters.draft_tokens.get();
    let req = scheduler::Request {
        prompt: tok.encode(COPY, true, false),
        sampling: SamplerParams::greedy(),
        max_tokens: n,
        stop: Vec::new(),
        json: None,
        logprobs: None,
        adapters: Default::default(),
        logit_bias: Vec::new(),
        tools: None,
        draft: false,
    };
    assert_eq!(finish(h.request(req).expect("accepted").0).0, want[0]);
    assert_eq!(h.counters.draft_tokens.get(), before);
}
