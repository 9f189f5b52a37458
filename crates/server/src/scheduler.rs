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
//! answer beside others, byte for byte (tested in `tests/scheduler.rs` on qwen2.5-coder-0.5b at
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
//!
//! LoRA adapters: a job carries its adapter set already leased (the HTTP side loads cold ones
//! off this thread, [`crate::adapters`]); admission hands the set to `Context::set_adapters` for
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
//! plus per running sequence a sampler (12 bytes per vocabulary entry) and its prompt.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::sequence::{Finish as End, Masks, Sequence};
use engine::step::{self, ChunkSizer};
use engine::tools::ToolGrammar;
use engine::{JsonFormat, JsonMask, Sampler, SamplerParams, StopMatcher};
use model::{Batch, Context};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use tokenizer::Tokenizer;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::adapters::AdapterSet;
use crate::ServeError;
use engine::logprobs::TokenLogprob;

mod embed;

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
    /// schema accepts) are sampled, and the answer ends when it closes ([`engine::json`]).
    pub json: Option<JsonFormat>,
    /// Log-probabilities of each generated token, with this many alternatives (at most
    /// [`engine::logprobs::MAX_TOP`]), sent before the text they are part of.
    pub logprobs: Option<usize>,
    /// The LoRA adapters the sequence runs with, leased until it ends (empty: the bare model).
    pub adapters: AdapterSet,
    /// Added to these tokens' logits before sampling (OpenAI's `logit_bias`; ids in the
    /// vocabulary, checked by the caller; others are skipped). Log-probabilities stay the
    /// model's own.
    pub logit_bias: Vec<(u32, f32)>,
    /// Tool calls: the grammar a call is generated under (`engine::tools`); the answer ends
    /// when its call section closes.
    pub tools: Option<Arc<ToolGrammar>>,
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
        let adapters = AdapterSet::default();
        let logit_bias = Vec::new();
        let (json, tools) = (None, None);
        Request { prompt, sampling, max_tokens, stop, json, logprobs, adapters, logit_bias, tools }
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
    pub n_gen: usize,
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

/// What the scheduler counts for the metrics endpoint (prometheus-client handles: cloning one
/// shares its value, so the registry and the scheduler hold the same numbers).
#[derive(Clone, Debug)]
pub struct Counters {
    /// Requests waiting for a slot.
    pub queued: Gauge,
    /// Sequences running.
    pub running: Gauge,
    /// Prompt tokens computed and tokens generated.
    pub prompt_tokens: Counter,
    pub generated_tokens: Counter,
    /// Seconds from admission to the first token, and between a sequence's tokens.
    pub ttft: Histogram,
    pub itl: Histogram,
    /// KV pool blocks held by sequences, free, and held by the prefix cache alone (their sum
    /// is the pool's capacity), after the last step.
    pub kv_blocks_used: Gauge,
    pub kv_blocks_free: Gauge,
    pub kv_blocks_cached: Gauge,
    /// Prompt tokens not computed because their KV came from the prefix cache.
    pub prefix_hit_tokens: Counter,
    /// Times the prefix cache was dropped for memory pressure.
    pub prefix_sheds: Counter,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            queued: Gauge::default(),
            running: Gauge::default(),
            prompt_tokens: Counter::default(),
            generated_tokens: Counter::default(),
            ttft: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            itl: Histogram::new(exponential_buckets(0.005, 2.0, 12)),
            kv_blocks_used: Gauge::default(),
            kv_blocks_free: Gauge::default(),
            kv_blocks_cached: Gauge::default(),
            prefix_hit_tokens: Counter::default(),
            prefix_sheds: Counter::default(),
        }
    }
}

/// The submitting side, shared by the HTTP handlers.
#[derive(Clone)]
pub struct Handle {
    tx: Sender<(Job, Instant)>,
    /// Jobs submitted and not yet finished (waiting or running), shared with the scheduler.
    outstanding: Arc<AtomicUsize>,
    pub counters: Counters,
    pub n_seq: usize,
    pub queue: usize,
    pub n_ctx: usize,
    /// Blocks in the KV pool: `kv_blocks_used + kv_blocks_free + kv_blocks_cached`. A block
    /// holds `model::kv::BLOCK_TOKENS` positions of one layer.
    pub kv_blocks: usize,
    /// The model's layers (a position takes a block in each).
    pub n_layer: usize,
    shed: Shed,
    /// Shared with the scheduler thread: its liveness and recent mean job time.
    life: Arc<Life>,
}

/// What the scheduler thread and the handles tell each other.
#[derive(Debug, Default)]
struct Life {
    /// False once the thread has ended (returned or unwound).
    alive: AtomicBool,
    /// Exponential mean of the seconds a job holds a slot (`f64` bits; 0: none finished yet).
    mean_job: AtomicU64,
    /// Set by [`Handle::close`]: every job running or waiting, and any submitted later, ends
    /// at the next step with [`FinishReason::Aborted`].
    closing: AtomicBool,
    /// The adapter names of the jobs waiting for a slot (sorted, without repeats), published
    /// by the scheduler whenever they change. Jobs still in the channel show from the
    /// scheduler's next loop, at most one step late.
    waiting_adapters: std::sync::Mutex<Vec<String>>,
}

impl Life {
    const ALPHA: f64 = 0.2;

    fn mean_job(&self) -> f64 {
        f64::from_bits(self.mean_job.load(Ordering::Relaxed))
    }

    fn observe_job(&self, secs: f64) {
        let old = self.mean_job();
        let new = if old == 0.0 { secs } else { old + Self::ALPHA * (secs - old) };
        self.mean_job.store(new.to_bits(), Ordering::Relaxed);
    }
}

/// Marks the scheduler dead when its thread ends, however it ends (a panic that escaped every
/// per-job guard unwinds through this).
struct AliveGuard(Arc<Life>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Release);
    }
}

/// A place among the scheduler's outstanding jobs, taken before a request's expensive work
/// (decode, render, tokenize) so a full server refuses at once; dropped unused, it gives the
/// place back.
#[derive(Debug)]
pub struct Ticket {
    outstanding: Arc<AtomicUsize>,
    queued: Gauge,
    armed: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.armed {
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A request to drop the prefix cache (memory pressure), honoured before the scheduler's next
/// step; clones share one flag.
#[derive(Clone, Debug, Default)]
pub struct Shed(Arc<AtomicBool>);

impl Shed {
    pub fn request(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// True once per request.
    fn take(&self) -> bool {
        self.0.swap(false, Ordering::Relaxed)
    }
}

impl Handle {
    /// Asks the scheduler to drop every cached prefix block no sequence holds (memory
    /// pressure): done before its next step, counted in [`Counters::prefix_sheds`].
    pub fn shed_prefix_cache(&self) {
        self.shed.request();
    }

    /// True while the scheduler thread runs (it survives a panicking job; this is false only
    /// if the thread itself is gone, when every request gets [`Refused::Down`]).
    pub fn is_alive(&self) -> bool {
        self.life.alive.load(Ordering::Acquire)
    }

    /// Jobs waiting or running, plus tickets held by requests still being prepared.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    /// The adapters of the jobs waiting for a slot (sorted; at most one step late).
    pub fn waiting_adapters(&self) -> Vec<String> {
        self.life.waiting_adapters.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Ends every job running or waiting, and any submitted from now on, at the scheduler's
    /// next step with [`FinishReason::Aborted`] (a well-formed end with the text so far): the
    /// last act of a drain whose grace period ran out. Cannot be undone.
    pub fn close(&self) {
        self.life.closing.store(true, Ordering::Release);
    }

    /// Recent mean seconds a job holds a slot (0 before any finished).
    pub fn mean_job_secs(&self) -> f64 {
        self.life.mean_job()
    }

    /// Seconds a refused client should wait: the jobs ahead of it (those waiting, plus itself)
    /// times the recent mean job time, over the slots; at least 1, at most an hour.
    pub fn retry_after(&self) -> u64 {
        let ahead = self.outstanding().saturating_sub(self.n_seq) + 1;
        let secs = ahead as f64 * self.life.mean_job() / self.n_seq.max(1) as f64;
        if secs.is_finite() {
            secs.ceil().clamp(1.0, 3600.0) as u64
        } else {
            1
        }
    }

    /// A place for one job, or [`Refused::Busy`] (all slots and the queue taken) or
    /// [`Refused::Down`] at once: the cheap admission check a handler makes before any work.
    /// Admission counts jobs, not channel slots: the scheduler takes jobs only between steps,
    /// so two arriving during one step must not be refused while slots are free.
    pub fn reserve(&self) -> Result<Ticket, Refused> {
        if !self.is_alive() {
            return Err(Refused::Down);
        }
        let ticket = Ticket {
            outstanding: self.outstanding.clone(),
            queued: self.counters.queued.clone(),
            armed: true,
        };
        if self.outstanding.fetch_add(1, Ordering::AcqRel) >= self.n_seq + self.queue {
            drop(ticket);
            return Err(Refused::Busy {
                slots: self.n_seq,
                queue: self.queue,
                retry_after: self.retry_after(),
            });
        }
        Ok(ticket)
    }

    /// Queues `job` on `ticket`'s place, or refuses at once when it can never run.
    fn submit(&self, mut ticket: Ticket, job: Job) -> Result<(), Refused> {
        let n_prompt = job.req.prompt.len();
        if n_prompt == 0 {
            return Err(Refused::Empty);
        }
        let max = self.n_ctx.saturating_sub(1);
        if n_prompt > max {
            return Err(Refused::TooLong { n_prompt, n_ctx: self.n_ctx, max });
        }
        ticket.queued.inc();
        match self.tx.send((job, Instant::now())) {
            Ok(()) => {
                // The scheduler gives the place back when the job leaves.
                ticket.armed = false;
                Ok(())
            }
            Err(_) => {
                ticket.queued.dec();
                Err(Refused::Down)
            }
        }
    }

    /// Queues `r` with fresh channels: the receiver of the job's events and, with
    /// `r.logprobs`, of each generated token's log-probability (which arrives before the text
    /// it is part of).
    pub fn request(
        &self,
        r: Request,
    ) -> Result<(UnboundedReceiver<Event>, Option<UnboundedReceiver<TokenLogprob>>), Refused> {
        self.request_on(self.reserve()?, r)
    }

    /// [`Handle::request`] on a place taken earlier with [`Handle::reserve`].
    pub fn request_on(
        &self,
        ticket: Ticket,
        r: Request,
    ) -> Result<(UnboundedReceiver<Event>, Option<UnboundedReceiver<TokenLogprob>>), Refused> {
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let (logprobs, lp_rx) = match r.logprobs {
            Some(_) => {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        self.submit(ticket, Job { req: r, events, logprobs, embed: None })?;
        Ok((rx, lp_rx))
    }

    /// [`Handle::submit`] on the bare model with a fresh channel: the receiver of the job's
    /// events.
    pub fn start(
        &self,
        prompt: Vec<u32>,
        sampling: SamplerParams,
        max_tokens: usize,
        stop: Vec<String>,
    ) -> Result<UnboundedReceiver<Event>, Refused> {
        Ok(self.request(Request::bare(prompt, sampling, max_tokens, stop, None))?.0)
    }

    /// [`Handle::start`] with each generated token's log-probability and `top` alternatives
    /// on a second receiver (a token's entry arrives before the text it is part of).
    pub fn start_with_logprobs(
        &self,
        prompt: Vec<u32>,
        sampling: SamplerParams,
        max_tokens: usize,
        stop: Vec<String>,
        top: usize,
    ) -> Result<(UnboundedReceiver<Event>, UnboundedReceiver<TokenLogprob>), Refused> {
        let r = Request::bare(prompt, sampling, max_tokens, stop, Some(top));
        match self.request(r)? {
            (rx, Some(lp)) => Ok((rx, lp)),
            (_, None) => unreachable!("a request with logprobs has their receiver"),
        }
    }
}

/// Scheduler settings.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerOptions {
    /// Requests waiting for a slot at most; past that, [`Refused::Busy`].
    pub queue: usize,
    /// Prefill tokens per step while others decode; `None`: sized from step times.
    pub prefill_chunk: Option<usize>,
}

/// Starts the scheduler thread on a context built by `make` (called on that thread, so the
/// context never crosses threads; `make` returns whatever must live as long as the context, such
/// as the weights' residence). Returns once `make` has run, with its error if it failed.
pub fn spawn<R: 'static>(
    tok: Arc<Tokenizer>,
    opts: SchedulerOptions,
    counters: Counters,
    make: impl FnOnce() -> Result<(Context, R), ServeError> + Send + 'static,
) -> Result<Handle, ServeError> {
    spawn_with_shed(tok, opts, counters, Shed::default(), make)
}

/// [`spawn`] with a [`Shed`] made beforehand (for whoever watches memory before the scheduler
/// exists, e.g. the pressure monitor `make` starts).
pub fn spawn_with_shed<R: 'static>(
    tok: Arc<Tokenizer>,
    opts: SchedulerOptions,
    counters: Counters,
    shed: Shed,
    make: impl FnOnce() -> Result<(Context, R), ServeError> + Send + 'static,
) -> Result<Handle, ServeError> {
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
    let ((n_seq, n_ctx, n_layer), kv_blocks) =
        ready_rx.recv().map_err(|_| ServeError::SchedulerDied)??;
    Ok(Handle { tx, outstanding, counters, n_seq, queue, n_ctx, kv_blocks, n_layer, shed, life })
}

/// One running request in a slot.
struct Seq {
    job: Job,
    sampler: Sampler,
    /// The answer's text, constraints (`Request::json`, `Request::tools`) and finish rule.
    answer: Sequence,
    /// The prompt, then each sampled token once it is to be fed: the tokens at the KV's
    /// positions, for the prefix cache.
    tokens: Vec<u32>,
    /// Positions written to the KV cache.
    n_past: usize,
    /// The token to feed next once the prompt is read.
    next: u32,
    submitted: Instant,
    admitted: Instant,
    first: Option<Instant>,
    /// When the last token was sampled.
    last: Option<Instant>,
}

impl Seq {
    fn prefilling(&self) -> bool {
        self.n_past < self.job.req.prompt.len()
    }

    fn finish(&self, reason: FinishReason) -> Finish {
        let now = Instant::now();
        let first = self.first.unwrap_or(now);
        Finish {
            reason,
            n_prompt: self.job.req.prompt.len(),
            n_gen: self.answer.n_gen(),
            queued: self.admitted - self.submitted,
            prompt: first - self.admitted,
            generation: now - first,
        }
    }
}

struct Scheduler {
    ctx: Context,
    tok: Arc<Tokenizer>,
    rx: Receiver<(Job, Instant)>,
    /// [`Handle`]'s count of jobs waiting or running: decremented as each one leaves.
    outstanding: Arc<AtomicUsize>,
    counters: Counters,
    opts: SchedulerOptions,
    slots: Vec<Option<Seq>>,
    /// Slots in admission order (prefill goes oldest first).
    order: VecDeque<usize>,
    batch: Batch,
    /// Slot of each output row of the batch.
    rows: Vec<usize>,
    /// The step plan's input and output, reused step after step (`engine::step::plan_into`).
    progress: Vec<step::Progress>,
    plan: Vec<usize>,
    sizer: ChunkSizer,
    shed: Shed,
    /// What JSON mode's and the tool grammar's masks read of each token and the masked copy of
    /// an output row (built at the first constrained request; `JsonVocab::heap_bytes` and a
    /// row, which the plan counts).
    masks: Masks,
    /// Jobs taken off the channel, waiting for a slot (the channel is drained every loop, so a
    /// queued job whose client left stops counting at the next step, not when a slot frees).
    waiting: VecDeque<(Job, Instant)>,
    life: Arc<Life>,
    /// An output row with a request's `logit_bias` added (allocated at the first such request:
    /// 4 bytes per vocabulary entry).
    biased: Vec<f32>,
}

impl Scheduler {
    #[allow(clippy::too_many_arguments)]
    fn new(
        ctx: Context,
        tok: Arc<Tokenizer>,
        rx: Receiver<(Job, Instant)>,
        outstanding: Arc<AtomicUsize>,
        counters: Counters,
        opts: SchedulerOptions,
        shed: Shed,
        life: Arc<Life>,
    ) -> Scheduler {
        let n_seq = ctx.params.n_seq_max.max(1);
        Scheduler {
            ctx,
            tok,
            rx,
            outstanding,
            counters,
            opts,
            slots: (0..n_seq).map(|_| None).collect(),
            order: VecDeque::new(),
            batch: Batch::default(),
            rows: Vec::new(),
            progress: Vec::new(),
            plan: Vec::new(),
            sizer: ChunkSizer::default(),
            shed,
            masks: Masks::default(),
            waiting: VecDeque::new(),
            life,
            biased: Vec::new(),
        }
    }

    /// Drops the prefix cache if [`Handle::shed_prefix_cache`] asked for it.
    fn shed_if_asked(&mut self) {
        if self.shed.take() {
            self.ctx.kv.prefix_clear();
            self.counters.prefix_sheds.inc();
            self.publish_blocks();
        }
    }

    /// Publishes the KV pool's block counts.
    fn publish_blocks(&self) -> model::kv::BlockStats {
        let b = self.ctx.kv.block_stats();
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.counters.kv_blocks_used.set(g(b.used));
        self.counters.kv_blocks_free.set(g(b.free));
        self.counters.kv_blocks_cached.set(g(b.cached));
        b
    }

    fn run(mut self) {
        loop {
            if !self.admit() {
                return;
            }
            self.shed_if_asked();
            self.drop_cancelled();
            if self.life.closing.load(Ordering::Acquire) {
                self.abort_all();
            }
            if self.order.is_empty() {
                continue;
            }
            // A panic outside the per-sequence guards (the forward pass, the prefix cache)
            // fails the sequences of this step; the scheduler goes on with the next.
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| self.step())) {
                self.fail_all(&format!("internal error in a scheduler step: {}", panic_text(&*p)));
            }
        }
    }

    /// Ends every running sequence and every waiting job with [`FinishReason::Aborted`]: the
    /// text so far and a final event, so each client sees a well-formed end.
    fn abort_all(&mut self) {
        let running: Vec<usize> = self.order.iter().copied().collect();
        for s in running {
            if let Some(q) = self.release(s) {
                let _ = q.job.events.send(Event::Done(q.finish(FinishReason::Aborted)));
            }
        }
        for (job, submitted) in std::mem::take(&mut self.waiting) {
            self.counters.queued.dec();
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
            let _ = job.events.send(Event::Done(Finish {
                reason: FinishReason::Aborted,
                n_prompt: job.req.prompt.len(),
                n_gen: 0,
                queued: submitted.elapsed(),
                prompt: Duration::ZERO,
                generation: Duration::ZERO,
            }));
        }
        self.publish_waiting_adapters();
    }

    /// Publishes the adapters of the waiting jobs if they changed (no allocation while no
    /// waiting job has an adapter).
    fn publish_waiting_adapters(&self) {
        let mut now: Vec<String> = (self.waiting.iter())
            .flat_map(|(j, _)| j.req.adapters.leases.iter().map(|(l, _)| l.lora().name.clone()))
            .collect();
        now.sort_unstable();
        now.dedup();
        let mut cur =
            self.life.waiting_adapters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *cur != now {
            *cur = now;
        }
    }

    /// Fails and frees every running sequence with `msg`.
    fn fail_all(&mut self, msg: &str) {
        let running: Vec<usize> = self.order.iter().copied().collect();
        for s in running {
            self.fail(s, msg);
        }
    }

    /// Fails the sequence in `slot` with `msg` (a 500 in the API's shape) and frees the slot.
    fn fail(&mut self, slot: usize, msg: &str) {
        if let Some(q) = self.release(slot) {
            let _ = q.job.events.send(Event::Failed(msg.to_string()));
        }
    }

    /// Takes every job off the channel (without blocking) and forgets the waiting ones whose
    /// client went away; blocks for one when nothing runs or waits. False once every
    /// submitter is gone and nothing runs or waits.
    fn take_jobs(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(j) => self.waiting.push_back(j),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    if self.order.is_empty() && self.waiting.is_empty() {
                        return false;
                    }
                    break;
                }
            }
        }
        let before = self.waiting.len();
        self.waiting.retain(|(j, _)| !j.events.is_closed());
        for _ in self.waiting.len()..before {
            self.counters.queued.dec();
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
        }
        if self.order.is_empty() && self.waiting.is_empty() {
            match self.rx.recv() {
                Ok(j) => self.waiting.push_back(j),
                Err(_) => return false,
            }
        }
        true
    }

    /// Moves waiting jobs into free slots; blocks when nothing runs. False once every
    /// submitter is gone and nothing runs.
    fn admit(&mut self) -> bool {
        if !self.take_jobs() {
            return false;
        }
        while let Some(slot) = self.slots.iter().position(Option::is_none) {
            let Some((job, submitted)) = self.waiting.pop_front() else { break };
            self.counters.queued.dec();
            if job.events.is_closed() {
                self.outstanding.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            let events = job.events.clone();
            let admitted = catch_unwind(AssertUnwindSafe(|| self.admit_one(slot, job, submitted)));
            if let Err(p) = admitted {
                // Only this job fails: its slot is cleared and its place given back.
                let msg =
                    format!("internal error while starting this request: {}", panic_text(&*p));
                let _ = catch_unwind(AssertUnwindSafe(|| {
                    self.ctx.kv.seq_clear(slot);
                    let _ = self.ctx.set_adapters(slot, &[]);
                }));
                self.outstanding.fetch_sub(1, Ordering::AcqRel);
                let _ = events.send(Event::Failed(msg));
            }
        }
        self.publish_waiting_adapters();
        true
    }

    /// Starts `job` in the free `slot` (its sampler, adapters and prefix-cache hit).
    fn admit_one(&mut self, slot: usize, job: Job, submitted: Instant) {
        fault::check(&job.req, fault::Phase::Admit);
        let n_vocab = self.ctx.config().n_vocab;
        // A request's number never sizes an allocation past the context: the HTTP side refuses
        // a larger window, and this holds for any other caller.
        let mut params = job.req.sampling.clone();
        params.repeat_last_n = params.repeat_last_n.min(self.ctx.params.n_ctx);
        let mut sampler = Sampler::new(params, n_vocab);
        for &t in &job.req.prompt {
            sampler.accept(t);
        }
        if let Err(e) = self.ctx.set_adapters(slot, &job.req.adapters.loras()) {
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
            let _ = job.events.send(Event::Failed(format!("the adapters do not apply: {e}")));
            return;
        }
        self.shed_if_asked();
        let hit = if embed::is_embedding(&job) {
            0
        } else {
            self.ctx.kv.prefix_adopt(slot, &job.req.prompt, job.req.adapters.salt)
        };
        self.counters.prefix_hit_tokens.inc_by(hit as u64);
        let seq = Seq {
            sampler,
            // A call's markup may be control tokens (Qwen's `<tool_call>`): its text is kept
            // for the parser when the request offers tools.
            answer: Sequence::new(
                self.tok.clone(),
                StopMatcher::new(&job.req.stop),
                job.req.max_tokens,
                job.req.tools.is_some(),
            )
            .constrained(
                job.req.json.as_ref().map(JsonMask::new),
                job.req.tools.as_ref().map(ToolGrammar::mask),
            ),
            tokens: job.req.prompt.clone(),
            n_past: hit,
            next: 0,
            submitted,
            admitted: Instant::now(),
            first: None,
            last: None,
            job,
        };
        // Nothing below can panic: the slot is taken only once the sequence is whole.
        self.slots[slot] = Some(seq);
        self.order.push_back(slot);
        self.counters.running.inc();
    }

    /// Frees the slot (and at once its KV blocks) of every job whose client went away.
    fn drop_cancelled(&mut self) {
        let gone: Vec<usize> = self
            .order
            .iter()
            .copied()
            .filter(|&s| self.slots[s].as_ref().is_some_and(|q| q.job.events.is_closed()))
            .collect();
        for s in gone {
            self.release(s);
        }
    }

    /// Empties `slot` and frees its KV blocks; returns what ran there.
    fn release(&mut self, slot: usize) -> Option<Seq> {
        let q = self.slots[slot].take()?;
        self.life.observe_job(q.admitted.elapsed().as_secs_f64());
        self.order.retain(|&s| s != slot);
        self.counters.running.dec();
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        // Guarded: after a panic in a step the KV cache may be half-updated, and freeing it
        // must not lose the job's place or its answer.
        let freed = catch_unwind(AssertUnwindSafe(|| {
            self.ctx.kv.seq_clear(slot);
            // Clearing a sequence's adapters cannot fail (the set is empty); the leases go
            // with `q`.
            let _ = self.ctx.set_adapters(slot, &[]);
            self.publish_blocks();
        }));
        if freed.is_err() {
            eprintln!("snug: freeing sequence {slot} panicked; its KV blocks may stay held");
        }
        Some(q)
    }

    /// One forward pass: every decoding sequence's token, then prefill chunks; then sampling.
    fn step(&mut self) {
        self.batch.clear();
        self.rows.clear();
        let ubatch = self.ctx.params.n_ubatch.max(1);
        let budget = step::Budget {
            idle: ubatch,
            beside_decode: self.opts.prefill_chunk.unwrap_or_else(|| self.sizer.chunk(ubatch)),
            // The prefill panels give the row kernels' bits: chunks may end anywhere.
            aligned: false,
        };
        let (mut progress, mut plan) =
            (std::mem::take(&mut self.progress), std::mem::take(&mut self.plan));
        progress.clear();
        progress.extend(self.order.iter().map(|&s| {
            let q = self.slots[s].as_ref().expect("ordered slots are occupied");
            step::Progress { prompt: q.job.req.prompt.len(), n_past: q.n_past }
        }));
        step::plan_into(&progress, budget, &mut plan);
        // Decoding tokens first (their output rows in order), then the prompts' chunks.
        for &s in &self.order {
            let q = self.slots[s].as_ref().expect("ordered slots are occupied");
            if !q.prefilling() {
                self.batch.push(q.next, q.n_past, s, true);
                self.rows.push(s);
            }
        }
        let n_decode = self.batch.len();
        for (&s, &n) in self.order.iter().zip(&plan) {
            let q = self.slots[s].as_ref().expect("ordered slots are occupied");
            if !q.prefilling() {
                continue;
            }
            let len = q.job.req.prompt.len();
            for i in 0..n {
                let pos = q.n_past + i;
                let tok = q.job.req.prompt[pos];
                if let Some(e) = &q.job.embed {
                    embed::push(&mut self.batch, e.pooling(), tok, pos, s, len);
                    continue;
                }
                let last = pos + 1 == len;
                self.batch.push(tok, pos, s, last);
                if last {
                    self.rows.push(s);
                }
            }
        }
        (self.progress, self.plan) = (progress, plan);
        let n_prefill = self.batch.len() - n_decode;
        let t0 = Instant::now();
        if let Err(e) = self.ctx.decode(&self.batch) {
            // Nothing changed (a batch is checked whole first): fail the jobs in it.
            let msg = format!("the forward pass failed: {e}");
            let in_batch: Vec<usize> = self.order.iter().copied().collect();
            for s in in_batch {
                if let Some(q) = self.release(s) {
                    let _ = q.job.events.send(Event::Failed(msg.clone()));
                }
            }
            return;
        }
        // Positions written.
        for i in 0..self.batch.len() {
            if let Some(q) = self.slots[self.batch.seq[i]].as_mut() {
                q.n_past = q.n_past.max(self.batch.pos[i] + 1);
            }
        }
        self.counters.prompt_tokens.inc_by(n_prefill as u64);
        for &s in &self.order {
            if let Some(q) = &self.slots[s] {
                self.ctx.kv.prefix_register(s, &q.tokens, q.job.req.adapters.salt);
            }
        }
        self.publish_blocks();
        self.collect_embeddings();
        let rows = std::mem::take(&mut self.rows);
        for (row, &s) in rows.iter().enumerate() {
            let sampled = catch_unwind(AssertUnwindSafe(|| self.sample(row, s)));
            let sampled = match sampled {
                Ok(r) => r,
                Err(p) => {
                    let msg = format!("internal error while sampling: {}", panic_text(&*p));
                    self.fail(s, &msg);
                    continue;
                }
            };
            if let Some(reason) = sampled {
                // The slot is free before the client hears that the job is done.
                let Some(mut q) = self.release(s) else { continue };
                // Text held back for a possible stop string is released at the end, unless a
                // stop string ended the answer.
                let rest = q.answer.flush();
                if !rest.is_empty() {
                    let _ = q.job.events.send(Event::Text(rest));
                }
                let _ = q.job.events.send(Event::Done(q.finish(reason)));
            }
        }
        self.rows = rows;
        let secs = t0.elapsed().as_secs_f64();
        self.sizer.observe(secs, n_decode, n_prefill);
    }

    /// Samples slot `s`'s next token from output row `row` and streams its text; the reason to
    /// stop, if it is done.
    fn sample(&mut self, row: usize, s: usize) -> Option<FinishReason> {
        let n_ctx = self.ctx.params.n_ctx;
        let raw = self.ctx.logits(row);
        let q = self.slots[s].as_mut()?;
        fault::check(&q.job.req, fault::Phase::Sample);
        let logits = if q.job.req.logit_bias.is_empty() {
            raw
        } else {
            self.biased.clear();
            self.biased.extend_from_slice(raw);
            for &(t, b) in &q.job.req.logit_bias {
                if let Some(l) = self.biased.get_mut(t as usize) {
                    *l += b;
                }
            }
            &self.biased[..]
        };
        // Nothing the vocabulary holds continues the constraint: end rather than break the
        // format (never met in JSON mode: single-character tokens always continue it).
        let Some(tok) = q.answer.sample(&mut q.sampler, logits, &mut self.masks) else {
            return Some(FinishReason::Stop);
        };
        q.sampler.accept(tok);
        let step = q.answer.accept(tok, q.n_past < n_ctx);
        let now = Instant::now();
        match q.last {
            None => self.counters.ttft.observe((now - q.admitted).as_secs_f64()),
            Some(t) => self.counters.itl.observe((now - t).as_secs_f64()),
        }
        q.first.get_or_insert(now);
        q.last = Some(now);
        if step.finish == Some(End::Eog) {
            return Some(FinishReason::Stop);
        }
        self.counters.generated_tokens.inc();
        if let (Some(top), Some(tx)) = (q.job.req.logprobs, &q.job.logprobs) {
            let _ = tx.send(TokenLogprob::from_logits(raw, tok, top));
        }
        if !step.text.is_empty() && q.job.events.send(Event::Text(step.text)).is_err() {
            // The client is gone: the slot is freed before the next step.
            return None;
        }
        match step.finish {
            Some(End::Eog | End::StopString | End::Complete) => return Some(FinishReason::Stop),
            Some(End::Length) => return Some(FinishReason::Length),
            Some(End::ContextFull) => return Some(FinishReason::ContextFull),
            None => {}
        }
        q.next = tok;
        q.tokens.push(tok);
        None
    }
}

/// A panic's message, for the failed request's error.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    match (p.downcast_ref::<&str>(), p.downcast_ref::<String>()) {
        (Some(s), _) => format!("{s}; the request was dropped, others go on"),
        (_, Some(s)) => format!("{s}; the request was dropped, others go on"),
        _ => "a panic; the request was dropped, others go on".to_string(),
    }
}

/// Fault injection for the survival tests, compiled only with debug assertions (the `ci` and
/// test profiles; never in a release build) and armed only by the server's environment:
/// `SNUG_TEST_PANIC=PHASE:SEED[,PHASE:SEED…]` with PHASE `admit` or `sample` makes a job with
/// that sampling seed panic there. No request can arm it.
mod fault {
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub(super) enum Phase {
        Admit,
        Sample,
    }

    #[cfg(debug_assertions)]
    pub(super) fn check(req: &super::Request, at: Phase) {
        use std::sync::OnceLock;
        static ARMED: OnceLock<Vec<(Phase, u64)>> = OnceLock::new();
        let armed = ARMED.get_or_init(|| {
            let v = std::env::var("SNUG_TEST_PANIC").unwrap_or_default();
            let one = |p: &str| {
                let (phase, seed) = p.split_once(':')?;
                let phase = match phase {
                    "admit" => Phase::Admit,
                    "sample" => Phase::Sample,
                    _ => return None,
                };
                Some((phase, seed.parse().ok()?))
            };
            v.split(',').filter_map(one).collect()
        });
        if armed.contains(&(at, req.sampling.seed)) {
            panic!("injected fault at {at:?} (SNUG_TEST_PANIC)");
        }
    }

    #[cfg(not(debug_assertions))]
    #[inline(always)]
    pub(super) fn check(_: &super::Request, _: Phase) {}
}
