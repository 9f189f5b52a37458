//! Embedding jobs in the scheduler: a request's inputs run in one slot, one after another,
//! each its own KV sequence (the slot is cleared between inputs, so no input sees another), as
//! prefill tokens in the same steps as everyone else's decoding.
//!
//! Why the scheduler and not a path of its own: the model's context (its KV pool, scratch and
//! thread pool) belongs to the scheduler thread, and a second context would hold memory the
//! plan never counted. Here an input's tokens are prefill like any prompt's, so the chunk sizer
//! keeps a long input from stalling running streams (a step with prefill costs about two decode
//! steps) and `--parallel` bounds embedding and generation jobs together. Inputs of one request
//! run in turn; inputs of different requests, and generation beside them, share each forward
//! pass. A token whose state the pooling needs asks the forward pass for its final hidden state
//! instead of logits ([`model::Batch::push_hidden`]); the pooled (not normalised) vector of each
//! input goes back on the job's vector channel, then `Done` with the token count. Embedding
//! jobs neither adopt nor need the prefix cache (mean pooling needs every token's state); the
//! blocks they fill are offered to it like any sequence's.

use std::collections::VecDeque;
use std::time::Duration;

use model::config::Pooling;
use model::Batch;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use super::run::Scheduler;
use super::{Event, Finish, FinishReason, Handle, Job, Refused, Request, Ticket};
use crate::embed::{wanted, Pooler};
use crate::SamplerParams;

/// What an embedding job carries besides its current input (`Request::prompt`).
pub(super) struct Task {
    /// Inputs after the current one.
    rest: VecDeque<Vec<u32>>,
    pooler: Pooler,
    /// Each input's pooled vector, in order.
    out: UnboundedSender<Vec<f32>>,
    /// Tokens of the inputs done so far.
    n_done: usize,
}

impl Task {
    pub(super) fn pooling(&self) -> Pooling {
        self.pooler.pooling()
    }
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("Task").field("rest", &self.rest.len()).finish()
    }
}

impl Handle {
    /// Queues the embedding of `inputs` (each at least one token and at most the context less
    /// one) with `pooling` on the place `ticket` holds: the receiver of the job's events (`Done`
    /// at the end, with every input's tokens as `n_prompt`) and of the pooled vectors, one per
    /// input in order, not normalised.
    pub fn embed_on(
        &self,
        ticket: Ticket,
        inputs: Vec<Vec<u32>>,
        pooling: Pooling,
        n_embd: usize,
    ) -> Result<(UnboundedReceiver<Event>, UnboundedReceiver<Vec<f32>>), Refused> {
        let max = self.n_ctx.saturating_sub(1);
        for i in &inputs {
            if i.is_empty() {
                return Err(Refused::Empty);
            }
            if i.len() > max {
                return Err(Refused::TooLong { n_prompt: i.len(), n_ctx: self.n_ctx, max });
            }
        }
        let mut rest: VecDeque<Vec<u32>> = inputs.into();
        let first = rest.pop_front().ok_or(Refused::Empty)?;
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let (out, vectors) = tokio::sync::mpsc::unbounded_channel();
        let req = Request::bare(first, SamplerParams::default(), 1, Vec::new(), None);
        let task = Task { rest, pooler: Pooler::new(pooling, n_embd), out, n_done: 0 };
        self.submit(ticket, Job { req, events, logprobs: None, embed: Some(task) })?;
        Ok((rx, vectors))
    }
}

/// Pushes token `pos` of an embedding input of `n` tokens: its hidden state asked for when the
/// pooling needs it, no logits.
pub(super) fn push(
    batch: &mut Batch,
    pooling: Pooling,
    token: u32,
    pos: usize,
    seq: usize,
    n: usize,
) {
    if wanted(pooling, pos, n) {
        batch.push_hidden(token, pos, seq);
    } else {
        batch.push(token, pos, seq, false);
    }
}

impl Scheduler {
    /// After a step's forward pass: folds each hidden row into its job's pooler, sends the
    /// vector of every input read to its end, moves its job to the next input (clearing the
    /// slot's KV) or, after the last, ends it.
    pub(super) fn collect_embeddings(&mut self) {
        let mut r = 0;
        for i in 0..self.batch.len() {
            if !self.batch.hidden[i] {
                continue;
            }
            let row = self.ctx.hidden(r);
            r += 1;
            let slot = self.batch.seq[i];
            if let Some(task) = self.slots[slot].as_mut().and_then(|q| q.job.embed.as_mut()) {
                task.pooler.accept(row);
            }
        }
        let done: Vec<usize> = (self.order.iter().copied())
            .filter(|&s| {
                self.slots[s].as_ref().is_some_and(|q| q.job.embed.is_some() && !q.prefilling())
            })
            .collect();
        for s in done {
            let Some(q) = self.slots[s].as_mut() else { continue };
            let Some(task) = q.job.embed.as_mut() else { continue };
            // A client gone: freed with the other cancelled jobs at the next loop.
            let _ = task.out.send(task.pooler.take());
            task.n_done += q.job.req.prompt.len();
            if let Some(next) = task.rest.pop_front() {
                q.job.req.prompt = next;
                q.tokens.clone_from(&q.job.req.prompt);
                q.n_past = 0;
                self.ctx.kv.seq_clear(s);
                continue;
            }
            let n_prompt = task.n_done;
            let Some(q) = self.release(s) else { continue };
            let finish = Finish {
                reason: FinishReason::Stop,
                n_prompt,
                n_cached: 0,
                n_gen: 0,
                stop_string: None,
                queued: q.admitted - q.submitted,
                prompt: q.admitted.elapsed(),
                generation: Duration::ZERO,
            };
            let _ = q.job.events.send(Event::Done(finish));
        }
    }
}
