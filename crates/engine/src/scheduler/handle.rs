//! The submitting side of the scheduler, shared by whoever takes requests (the HTTP handlers):
//! [`Handle::reserve`] takes a place ([`Ticket`]) before any work for a request, so a full
//! scheduler refuses at once with how long to wait; [`Handle::request_on`] queues the request
//! on it and returns the receivers of its answer. Also the handle's side of what the thread and
//! the handles share: liveness, the recent mean job time, the drain's close, the prefix-cache
//! [`Shed`] and the adapters of the waiting jobs. Cost: an atomic add per admission check, a
//! channel send per request.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedReceiver;

use super::counters::{Counters, Gauge};
use super::{Event, Job, Refused, Request};
use crate::logprobs::TokenLogprob;
use crate::SamplerParams;

/// The submitting side, shared by the HTTP handlers.
#[derive(Clone)]
pub struct Handle {
    pub(super) tx: Sender<(Job, Instant)>,
    /// Jobs submitted and not yet finished (waiting or running), shared with the scheduler.
    pub(super) outstanding: Arc<AtomicUsize>,
    pub counters: Counters,
    pub n_seq: usize,
    pub queue: usize,
    pub n_ctx: usize,
    /// Blocks in the KV pool: `kv_blocks_used + kv_blocks_free + kv_blocks_cached`. A block
    /// holds `model::kv::BLOCK_TOKENS` positions of one layer.
    pub kv_blocks: usize,
    /// The model's layers (a position takes a block in each).
    pub n_layer: usize,
    pub(super) shed: Shed,
    /// Shared with the scheduler thread: its liveness and recent mean job time.
    pub(super) life: Arc<Life>,
}

/// What the scheduler thread and the handles tell each other.
#[derive(Debug, Default)]
pub(super) struct Life {
    /// False once the thread has ended (returned or unwound).
    pub(super) alive: AtomicBool,
    /// Exponential mean of the seconds a job holds a slot (`f64` bits; 0: none finished yet).
    pub(super) mean_job: AtomicU64,
    /// Set by [`Handle::close`]: every job running or waiting, and any submitted later, ends
    /// at the next step with [`super::FinishReason::Aborted`].
    pub(super) closing: AtomicBool,
    /// The adapter names of the jobs waiting for a slot (sorted, without repeats), published
    /// by the scheduler whenever they change. Jobs still in the channel show from the
    /// scheduler's next loop, at most one step late.
    pub(super) waiting_adapters: std::sync::Mutex<Vec<String>>,
}

impl Life {
    const ALPHA: f64 = 0.2;

    pub(super) fn mean_job(&self) -> f64 {
        f64::from_bits(self.mean_job.load(Ordering::Relaxed))
    }

    pub(super) fn observe_job(&self, secs: f64) {
        let old = self.mean_job();
        let new = if old == 0.0 { secs } else { old + Self::ALPHA * (secs - old) };
        self.mean_job.store(new.to_bits(), Ordering::Relaxed);
    }
}

/// Marks the scheduler dead when its thread ends, however it ends (a panic that escaped every
/// per-job guard unwinds through this).
pub(super) struct AliveGuard(pub(super) Arc<Life>);

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
    pub(super) fn take(&self) -> bool {
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
    /// next step with [`super::FinishReason::Aborted`] (a well-formed end with the text so
    /// far): the last act of a drain whose grace period ran out. Cannot be undone.
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
    pub(super) fn submit(&self, mut ticket: Ticket, job: Job) -> Result<(), Refused> {
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
