//! The continuous-batching scheduler: one thread owns the [`Context`] and runs every admitted
//! request in it at once.
//!
//! Requests ([`Job`]s) arrive on a channel; a count of the jobs waiting or running bounds it to
//! the `n_seq` slots (KV sequences) plus the wait queue, and past that a request is refused at
//! once ([`Refused::Busy`], the HTTP layer's 429) instead of queueing without end. The thread
//! takes a job from the channel between steps, when one of the slots is free. Each step builds ONE [`Batch`]: every decoding sequence's last token, then prefill
//! chunks of the prompts still being read, oldest first. While sequences decode, the prefill
//! chunk is sized from measured step times so that a step with prefill costs about twice a
//! decode-only step ([`ChunkSizer`]): a long prompt arriving slows running streams by at most
//! that, and is read at nearly full speed once nothing else decodes. Each sequence samples from
//! its own output row with its own [`Sampler`] (seed, penalties), detokenizes with its own
//! [`StreamDecoder`] and watches its own stop strings; text goes back on the job's unbounded
//! channel, so the scheduler never blocks on a slow client. A client that goes away closes that
//! channel: its sequence is dropped at the next step and its KV blocks return to the pool then.
//!
//! Batch invariance: matmul rows and attention rows are computed per token by the same kernels
//! in the same order whatever else is in the batch, so a greedy answer alone equals the same
//! answer beside others, byte for byte (tested in `crates/engine/tests/scheduler.rs` on qwen2.5-coder-0.5b at
//! 2 threads). One exception in the model crate: attention splits a lone decode token's keys
//! across threads (split-K) when there are fewer (token, KV head) items than twice the threads,
//! which changes the summation order — models with fewer KV heads than threads (or 4+ threads
//! with 2 KV heads) are then not invariant between a lone sequence and a full batch.
//!
//! Prefix cache: a job starts on the longest run of full 32-token KV blocks another sequence
//! (running or finished) computed for the same leading tokens ([`model::kv::prefix`]), so only
//! the rest of its prompt is read; after each step every sequence offers its newly filled
//! blocks, prompt and answer alike. Cached blocks no sequence holds are evicted
//! least-recently-used when the pool runs out, and all of them at once when memory pressure is
//! signalled ([`Shed`]: `snug serve` requests it with each reaction of the memory governor, so
//! the cache goes at the governor's first reaction, together with the layers it demotes). A cached block gives the same KV as a cold one
//! when both were computed in multi-token (prefill) steps; one written by a lone decode step
//! can differ in the last bits where attention splits keys across threads (see above), so a
//! follow-up turn that reuses an answer's blocks is equal to its cold run only as far as that.
//! Prompt reuse by text ([`crate::reuse`]): a model's answer is rarely the tokens its text
//! tokenizes to, so once its client has the answer, a slot computes the answer's KV again as a
//! prompt will tokenize it (from the first token that differs) before it is freed, and the job's
//! place is given back at once. Each finished sequence's tokens are kept (the last
//! [`crate::reuse::Recent::SEQS`]), and a prompt admitted later that leaves one of them but
//! spells the same text takes its tokens for that text when the prefix cache then holds more of
//! it; its [`Finish`] still counts the prompt as submitted.
//!
//! LoRA adapters: a job carries its adapter set already leased ([`JobAdapters`]: the server
//! loads cold ones off this thread, in `server::adapters`); admission hands the set to `Context::set_adapters` for
//! the job's slot and release clears it, dropping the leases with the job. A batch mixes
//! sequences on different adapters and on none. The prefix cache keys a sequence's blocks by
//! its set's salt ([`model::lora::AdapterStore::salt`], 0 for none), so KV computed under one
//! adapter set is only ever reused under the same set.
//!
//! Survival: a job's admission, each of its samples, and each step run under `catch_unwind`.
//! A panic there fails that job alone with [`Event::Failed`] (a 500 in the API's shape), frees
//! its slot and its place in [`Handle::outstanding`], and the thread goes on; a panic in the
//! forward pass fails the sequences of that step. Should the thread end anyway,
//! [`Handle::is_alive`] turns false and `/health` says 503. A request's numbers never size an
//! allocation here: the penalty window is clamped to the context at admission.
//!
//! Shutdown: [`Handle::close`] (a drain whose grace period ran out) ends every running and
//! waiting job at the next loop with [`FinishReason::Aborted`], text so far included, so each
//! client still gets a final event. For the gateway's metrics the thread also publishes the
//! adapters of the waiting jobs ([`Handle::waiting_adapters`]) whenever they change.
//!
//! Admission: [`Handle::reserve`] takes a place before the HTTP side does any work for a
//! request (a [`Ticket`], given back if dropped unused), so a full server refuses at once, with
//! a `Retry-After` of the jobs ahead × the recent mean job time ÷ the slots. Every loop drains
//! the channel into `waiting` and forgets jobs whose client left, so they stop counting at the
//! next step rather than when a slot frees.
//!
//! Embeddings ([`embed`]): an embedding job's inputs are prefill in the same steps, one input
//! after another in its slot, each pooled from the final hidden states the forward pass gives
//! for the tokens that ask for them (no logits).
//!
//! Cost per step: one forward pass over the batch, a vocabulary-sized scan per sampled token, a
//! channel send per piece of text. Memory: the context's KV pool (planned for `n_seq` sequences)
//! plus per running sequence a sampler (12 bytes per vocabulary entry) and its prompt, plus the
//! kept sequences' tokens ([`crate::reuse::Recent::heap_bytes`]).
//!
//! Where it lives: here in the engine, beside the pieces it runs ([`crate::Sequence`]'s finish
//! rule, [`crate::step`]'s plan). The server only decodes HTTP requests into [`Request`]s,
//! submits them on a [`Handle`] and turns the [`Event`]s it receives into responses; `/metrics`
//! registers the [`Counters`] (plain shared atomics and histograms) under their Prometheus
//! names. Answers go back on tokio's unbounded channels (its `sync` part alone, which needs no
//! runtime): a handler awaits them, a test blocks on them.
//!
//! Files: [`handle`] the submitting side (admission, tickets, shedding, shutdown); `run` the
//! thread's loop (taking jobs into slots, releasing them, failing and aborting); `pass` one
//! step (the batch, the forward pass, sampling each row); `seq` a running job's state;
//! [`counters`] the numbers it publishes; [`adapters`] the LoRA adapters a job carries;
//! `embed` embedding jobs; `fault` panics turned into a failed job, and fault injection.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use model::Context;
use tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::logprobs::TokenLogprob;
use crate::tools::ToolGrammar;
use crate::{JsonFormat, SamplerParams};

pub mod adapters;
pub mod counters;
mod embed;
mod fault;
pub mod handle;
mod pass;
mod run;
mod seq;

pub use adapters::JobAdapters;
pub use counters::Counters;
use handle::{AliveGuard, Life};
pub use handle::{Handle, Shed, Ticket};
use run::Scheduler;

/// What a handler asks the scheduler for.
#[derive(Debug)]
pub struct Request {
    /// The prompt's tokens (at least one, at most the context less one).
    pub prompt: Vec<u32>,
    pub sampling: SamplerParams,
    /// Tokens to generate at most (the context's end stops earlier).
    pub max_tokens: usize,
    /// Text that ends generation (not included in the output).
    pub stop: Vec<String>,
    /// JSON mode: only tokens that keep the answer a prefix of a JSON object (or of a value the
    /// schema accepts) are sampled, and the answer ends when it closes ([`crate::json`]).
    pub json: Option<JsonFormat>,
    /// Log-probabilities of each generated token, with this many alternatives (at most
    /// [`crate::logprobs::MAX_TOP`]), sent before the text they are part of.
    pub logprobs: Option<usize>,
    /// The LoRA adapters the sequence runs with, leased until it ends (empty: the bare model).
    pub adapters: JobAdapters,
    /// Added to these tokens' logits before sampling (OpenAI's `logit_bias`; ids in the
    /// vocabulary, checked by the caller; others are skipped). Log-probabilities stay the
    /// model's own.
    pub logit_bias: Vec<(u32, f32)>,
    /// Tool calls: the grammar a call is generated under ([`crate::tools`]); the answer ends
    /// when its call section closes.
    pub tools: Option<Arc<ToolGrammar>>,
    /// Speculative decoding may run for this request (when the server drafts at all,
    /// [`SchedulerOptions::draft`]); false opts out.
    pub draft: bool,
}

impl Request {
    /// A request on the bare model, with no JSON mode and no logit bias.
    fn bare(
        prompt: Vec<u32>,
        sampling: SamplerParams,
        max_tokens: usize,
        stop: Vec<String>,
        logprobs: Option<usize>,
    ) -> Request {
        let adapters = JobAdapters::default();
        let logit_bias = Vec::new();
        let (json, tools) = (None, None);
        Request {
            prompt,
            sampling,
            max_tokens,
            stop,
            json,
            logprobs,
            adapters,
            logit_bias,
            tools,
            draft: true,
        }
    }
}

/// A [`Request`] on its way through the scheduler, with the channels its answer goes to.
struct Job {
    req: Request,
    /// Where the answer goes.
    events: UnboundedSender<Event>,
    /// Where each token's log-probability goes; present exactly when `req.logprobs` is.
    logprobs: Option<UnboundedSender<TokenLogprob>>,
    /// An embedding job's inputs and pooling ([`embed`]); `req.prompt` is its current input.
    embed: Option<embed::Task>,
}

impl Job {
    /// Whether this is an embedding job (checked where generation-only work is skipped).
    fn is_embedding(&self) -> bool {
        self.embed.is_some()
    }
}

/// What a job's receiver gets: text pieces, then one `Done` (or one `Failed`).
#[derive(Debug)]
pub enum Event {
    Text(String),
    Done(Finish),
    Failed(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The context filled up.
    ContextFull,
    /// The server cut it short: it is shutting down and its drain grace period ran out
    /// ([`Handle::close`]).
    Aborted,
}

/// How a job ended, with its exact token counts and timings.
#[derive(Clone, Copy, Debug)]
pub struct Finish {
    pub reason: FinishReason,
    pub n_prompt: usize,
    /// Of `n_prompt`, the tokens the prefix cache held (read from it, not computed).
    pub n_cached: usize,
    pub n_gen: usize,
    /// The index in `Request::stop` of the stop string that ended the answer, if one did
    /// (Anthropic's `stop_sequence`).
    pub stop_string: Option<usize>,
    /// From submission to a free slot.
    pub queued: Duration,
    /// From admission to the first sampled token (prompt processing).
    pub prompt: Duration,
    /// From the first sampled token to the end.
    pub generation: Duration,
}

/// Why a job was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the server is busy: all {slots} sequences are running and {queue} requests are waiting; retry in {retry_after} s")]
    Busy {
        slots: usize,
        queue: usize,
        /// Seconds until a slot is likely free: the jobs ahead times the recent mean job time,
        /// over the slots (at least 1).
        retry_after: u64,
    },
    #[error("the prompt has {n_prompt} tokens but the context holds {n_ctx} positions (a prompt may use at most {max}); shorten it")]
    TooLong { n_prompt: usize, n_ctx: usize, max: usize },
    #[error("the prompt is empty: give at least one token of text")]
    Empty,
    #[error("the scheduler has stopped: restart the server")]
    Down,
}

/// Scheduler settings.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerOptions {
    /// Requests waiting for a slot at most; past that, [`Refused::Busy`].
    pub queue: usize,
    /// Prefill tokens per step while others decode; `None`: sized from step times.
    pub prefill_chunk: Option<usize>,
    /// Prompt-lookup drafting ([`crate::draft::Ngram`]) for requests that allow it, in steps
    /// with at most [`DRAFT_STREAMS`] sequences decoding and no prompt being read. The context
    /// needs [`crate::draft::MAX_DRAFT`] more rows of logits than slots.
    pub draft: bool,
}

/// Most sequences decoding together for a step to verify guesses: past that the step's rows
/// already keep the CPU busy, and a guess costs about what it would save (BENCHMARKS.md,
/// "Speculative decoding").
pub const DRAFT_STREAMS: usize = 2;

/// The scheduler thread ended before its context was ready (it panicked in `make`).
#[derive(Debug, thiserror::Error)]
#[error("the scheduler thread ended before its context was ready")]
pub struct Died;

/// Starts the scheduler thread on a context built by `make` (called on that thread, so the
/// context never crosses threads; `make` returns whatever must live as long as the context, such
/// as the weights' residence). Returns once `make` has run, with its error if it failed; a
/// thread that cannot start is `E`'s `io::Error`, one that ends before `make` returns [`Died`].
pub fn spawn<R: 'static, E: From<std::io::Error> + From<Died> + Send + 'static>(
    tok: Arc<Tokenizer>,
    opts: SchedulerOptions,
    counters: Counters,
    make: impl FnOnce() -> Result<(Context, R), E> + Send + 'static,
) -> Result<Handle, E> {
    spawn_with_shed(tok, opts, counters, Shed::default(), make)
}

/// [`spawn`] with a [`Shed`] made beforehand (for whoever watches memory before the scheduler
/// exists, e.g. the pressure monitor `make` starts).
pub fn spawn_with_shed<R: 'static, E: From<std::io::Error> + From<Died> + Send + 'static>(
    tok: Arc<Tokenizer>,
    opts: SchedulerOptions,
    counters: Counters,
    shed: Shed,
    make: impl FnOnce() -> Result<(Context, R), E> + Send + 'static,
) -> Result<Handle, E> {
    // 0 is honoured: no request waits, one past the slots is refused at once.
    let queue = opts.queue;
    // Unbounded: `outstanding` bounds it to the slots plus the queue.
    let (tx, rx) = mpsc::channel();
    let outstanding = Arc::new(AtomicUsize::new(0));
    let outstanding2 = outstanding.clone();
    let (ready_tx, ready_rx) = mpsc::channel();
    let c = counters.clone();
    let shed2 = shed.clone();
    let life = Arc::new(Life { alive: AtomicBool::new(true), ..Life::default() });
    let life2 = life.clone();
    std::thread::Builder::new().name("snug-scheduler".into()).spawn(move || match make() {
        Ok((ctx, keep)) => {
            let _alive = AliveGuard(life2.clone());
            let sizes = (ctx.params.n_seq_max, ctx.params.n_ctx, ctx.config().n_layer);
            let sched = Scheduler::new(ctx, tok, rx, outstanding2, c, opts, shed2, life2);
            let b = sched.publish_blocks();
            let _ = ready_tx.send(Ok((sizes, b.used + b.free + b.cached)));
            sched.run();
            drop(keep);
        }
        Err(e) => {
            let _ = ready_tx.send(Err(e));
        }
    })?;
    let ((n_seq, n_ctx, n_layer), kv_blocks) = ready_rx.recv().map_err(|_| Died)??;
    Ok(Handle { tx, outstanding, counters, n_seq, queue, n_ctx, kv_blocks, n_layer, shed, life })
}
