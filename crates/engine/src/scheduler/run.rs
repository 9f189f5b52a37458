//! The scheduler thread's loop: between steps it takes new jobs off the channel into free
//! slots (admission: sampler, adapters, prefix-cache hit), takes in the blocks the prefix
//! cache's disk tier has read for jobs that wait for them, drops those whose client left,
//! honours a shed or a close, then runs one step ([`Scheduler::step`], in `pass`). A job whose
//! prefix may be on disk waits in its slot, outside the steps, until its blocks are in or its
//! read deadline passes (`model::kv::KvCache::prefix_restore_poll`); the running streams step
//! meanwhile. A job leaves through [`Scheduler::release`], which frees its slot, KV blocks,
//! adapters and place.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use model::{Batch, Context};
use tokenizer::Tokenizer;

use super::fault::{self, panic_text};
use super::seq::{Draft, Seq};
use super::{Counters, Event, Finish, FinishReason, Job, Life, SchedulerOptions, Shed};
use crate::reuse::{self, Recent, Splice};
use crate::sequence::{Masks, Sequence};
use crate::step::{self, ChunkSizer};
use crate::tools::ToolGrammar;
use crate::{JsonMask, Sampler, StopMatcher};

/// What the scheduler thread owns: the context, the slots and their sequences, the jobs
/// waiting, and the buffers a step reuses.
pub(super) struct Scheduler {
    pub(super) ctx: Context,
    pub(super) tok: Arc<Tokenizer>,
    pub(super) rx: Receiver<(Job, Instant)>,
    /// [`super::Handle`]'s count of jobs waiting or running: decremented as each one leaves.
    pub(super) outstanding: Arc<AtomicUsize>,
    pub(super) counters: Counters,
    pub(super) opts: SchedulerOptions,
    pub(super) slots: Vec<Option<Seq>>,
    /// Slots in admission order (prefill goes oldest first).
    pub(super) order: VecDeque<usize>,
    /// Slots whose prefix is being read from disk: not stepped until it is in.
    pub(super) restoring: Vec<usize>,
    pub(super) batch: Batch,
    /// Slot of each output row of the batch.
    pub(super) rows: Vec<usize>,
    /// The step plan's input and output, reused step after step ([`crate::step::plan_into`]).
    pub(super) progress: Vec<step::Progress>,
    pub(super) plan: Vec<usize>,
    pub(super) sizer: ChunkSizer,
    pub(super) shed: Shed,
    /// What JSON mode's and the tool grammar's masks read of each token and the masked copy of
    /// an output row (built at the first constrained request; `JsonVocab::heap_bytes` and a
    /// row, which the plan counts).
    pub(super) masks: Masks,
    /// Jobs taken off the channel, waiting for a slot (the channel is drained every loop, so a
    /// queued job whose client left stops counting at the next step, not when a slot frees).
    pub(super) waiting: VecDeque<(Job, Instant)>,
    pub(super) life: Arc<Life>,
    /// An output row with a request's `logit_bias` added (allocated at the first such request:
    /// 4 bytes per vocabulary entry).
    pub(super) biased: Vec<f32>,
    /// The last finished sequences' tokens, for prompt reuse by text ([`crate::reuse`]).
    pub(super) recent: Recent,
}

impl Scheduler {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
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
            restoring: Vec::new(),
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
            recent: Recent::default(),
        }
    }

    /// Drops the prefix cache if [`super::Handle::shed_prefix_cache`] asked for it.
    pub(super) fn shed_if_asked(&mut self) {
        if self.shed.take() {
            self.ctx.kv.prefix_clear();
            self.recent.clear();
            self.counters.prefix_sheds.inc();
            self.publish_blocks();
        }
    }

    /// Publishes the KV pool's block counts.
    pub(super) fn publish_blocks(&self) -> model::kv::BlockStats {
        let b = self.ctx.kv.block_stats();
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.counters.kv_blocks_used.set(g(b.used));
        self.counters.kv_blocks_free.set(g(b.free));
        self.counters.kv_blocks_cached.set(g(b.cached));
        b
    }

    pub(super) fn run(mut self) {
        loop {
            if !self.admit() {
                return;
            }
            self.shed_if_asked();
            self.take_restored();
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
        let running: Vec<usize> = self.order.iter().chain(&self.restoring).copied().collect();
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
                n_cached: 0,
                n_gen: 0,
                stop_string: None,
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
            .flat_map(|(j, _)| j.req.adapters.names().map(str::to_owned))
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
    pub(super) fn fail(&mut self, slot: usize, msg: &str) {
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
                    if self.order.is_empty() && self.waiting.is_empty() && self.restoring.is_empty()
                    {
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
        if self.order.is_empty() && self.waiting.is_empty() && self.restoring.is_empty() {
            // Idle: cached blocks the disk tier skipped while busy get another chance.
            self.ctx.kv.prefix_spill();
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
    fn admit_one(&mut self, slot: usize, mut job: Job, submitted: Instant) {
        fault::check(&job.req, fault::Phase::Admit);
        let splice = if job.is_embedding() {
            None
        } else {
            self.splice(&mut job.req.prompt, job.req.adapters.salt)
        };
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
        let hit = if job.is_embedding() {
            0
        } else {
            self.ctx.kv.prefix_adopt_start(slot, &job.req.prompt, job.req.adapters.salt)
        };
        let restoring = self.ctx.kv.prefix_restoring(slot);
        if !restoring {
            self.counters.prefix_hit_tokens.inc_by(hit as u64);
        }
        let drafts = self.opts.draft && job.req.draft && !job.is_embedding();
        let seq = Seq {
            draft: drafts.then(|| Draft::new(&job.req.prompt)),
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
            n_cached: hit,
            splice,
            warm: None,
            next: 0,
            submitted,
            admitted: Instant::now(),
            first: None,
            last: None,
            job,
        };
        // Nothing below can panic: the slot is taken only once the sequence is whole.
        self.slots[slot] = Some(seq);
        if restoring {
            self.restoring.push(slot);
        } else {
            self.order.push_back(slot);
        }
        self.counters.running.inc();
    }

    /// Splices `prompt` onto a recently finished sequence under `salt` where the two spell the
    /// same text ([`crate::reuse`]), when the prefix cache then holds more of it and the
    /// spliced prompt still fits the context; the splice, to count usage in `prompt`'s tokens.
    fn splice(&self, prompt: &mut Vec<u32>, salt: u64) -> Option<Splice> {
        if !self.ctx.kv.prefix_enabled() {
            return None;
        }
        let tok = &*self.tok;
        let (sp, s) = self.recent.best(salt, prompt, |id| reuse::piece_of(tok, id))?;
        let spliced = sp.prompt(s, prompt);
        if spliced.len() >= self.ctx.params.n_ctx
            || self.ctx.kv.prefix_peek(&spliced, salt) <= self.ctx.kv.prefix_peek(prompt, salt)
        {
            return None;
        }
        *prompt = spliced;
        Some(sp)
    }

    /// Takes in the blocks read from disk for the slots waiting for them, and starts those
    /// whose restore has ended on what it brought. Waits a little (at most 10 ms) for blocks
    /// when nothing else could run.
    fn take_restored(&mut self) {
        if self.restoring.is_empty() {
            return;
        }
        // Nothing to step: the jobs waiting (if any) have no free slot.
        let wait = if self.order.is_empty() { Duration::from_millis(10) } else { Duration::ZERO };
        self.ctx.kv.prefix_restore_poll(wait);
        let mut i = 0;
        while i < self.restoring.len() {
            let slot = self.restoring[i];
            if self.ctx.kv.prefix_restoring(slot) {
                i += 1;
                continue;
            }
            self.restoring.swap_remove(i);
            let held = self.ctx.kv.seq_len(slot);
            if let Some(q) = self.slots[slot].as_mut() {
                (q.n_past, q.n_cached) = (held, held);
                self.counters.prefix_hit_tokens.inc_by(held as u64);
                self.order.push_back(slot);
            }
        }
        self.publish_blocks();
    }

    /// Frees the slot (and at once its KV blocks) of every job whose client went away.
    fn drop_cancelled(&mut self) {
        let gone: Vec<usize> = (self.order.iter().chain(&self.restoring))
            .copied()
            .filter(|&s| self.slots[s].as_ref().is_some_and(|q| q.job.events.is_closed()))
            .collect();
        for s in gone {
            self.release(s);
        }
    }

    /// Empties `slot` and frees its KV blocks; returns what ran there.
    pub(super) fn release(&mut self, slot: usize) -> Option<Seq> {
        let q = self.slots[slot].take()?;
        self.life.observe_job(q.admitted.elapsed().as_secs_f64());
        self.order.retain(|&s| s != slot);
        self.restoring.retain(|&s| s != slot);
        self.counters.running.dec();
        if q.warm.is_none() {
            // A sequence computing its answer again gave its place back when it was answered.
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
        }
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
}
