//! One scheduler step: ONE batch of every decoding sequence's last token (with its guesses
//! when it drafts), then prefill chunks of the prompts still being read
//! ([`crate::step::plan_into`] sizes them), one forward pass, the prefix cache offered the blocks
//! it filled, and each output row sampled by its sequence, whose text goes to its client.
//!
//! Speculative decoding ([`crate::draft`]): in a step with at most [`DRAFT_STREAMS`] sequences
//! decoding and no prompt being read, a sequence that drafts feeds its guesses after its token;
//! its rows are then sampled in order while each sampled token equals the guess fed after the
//! row before, and the cache is cut back past the first that does not. Sampling is the same
//! as without guesses, so the answer is too.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::fault::{self, panic_text};
use super::run::Scheduler;
use super::{embed, Event, FinishReason, DRAFT_STREAMS};
use crate::draft::Drafter;
use crate::logprobs::TokenLogprob;
use crate::reuse;
use crate::sequence::Finish as End;
use crate::step;

impl Scheduler {
    pub(super) fn step(&mut self) {
        self.batch.clear();
        self.rows.clear();
        let ubatch = self.ctx.params.n_ubatch.max(1);
        let budget = step::Budget {
            idle: ubatch,
            beside_decode: self.opts.prefill_chunk.unwrap_or_else(|| self.sizer.chunk(ubatch)),
        };
        let (mut progress, mut plan) =
            (std::mem::take(&mut self.progress), std::mem::take(&mut self.plan));
        progress.clear();
        progress.extend(self.order.iter().map(|&s| {
            let q = self.slots[s].as_ref().expect("ordered slots are occupied");
            step::Progress { prompt: q.job.req.prompt.len(), n_past: q.n_past }
        }));
        step::plan_into(&progress, budget, &mut plan);
        // Guesses only while few sequences decode and no prompt is read: then a step's rows leave
        // the CPU room, and guesses that miss cost nobody else's latency.
        let decoding = self.order.iter().filter(|&&s| self.slot_decoding(s)).count();
        let mut guess_rows = if decoding <= DRAFT_STREAMS && decoding == self.order.len() {
            self.ctx.params.n_outputs_max.saturating_sub(self.slots.len())
        } else {
            0
        };
        // Decoding tokens first (their output rows in order, a sequence's guesses right after
        // its token), then the prompts' chunks.
        for &s in &self.order {
            let q = self.slots[s].as_mut().expect("ordered slots are occupied");
            if q.prefilling() {
                continue;
            }
            self.batch.push(q.next, q.n_past, s, true);
            self.rows.push(s);
            let Some(d) = q.draft.as_mut() else { continue };
            d.guesses.clear();
            let room = q
                .answer
                .tokens_left()
                .saturating_sub(1)
                .min(self.ctx.params.n_ctx.saturating_sub(q.n_past + 1))
                .min(self.ctx.kv.draft_room(q.n_past))
                .min(guess_rows);
            let want = d.gate.want(room);
            if want > 0 {
                // A drafter that fails only loses its guesses; one that panics loses drafting for
                // its sequence alone, which decodes on without guesses.
                let (drafter, guesses) = (&mut d.drafter, &mut d.guesses);
                if catch_unwind(AssertUnwindSafe(|| drafter.draft(want, guesses))).is_err() {
                    d.guesses.clear();
                    q.draft = None;
                    continue;
                }
                d.guesses.truncate(want);
            }
            guess_rows -= d.guesses.len();
            for (i, &g) in d.guesses.iter().enumerate() {
                self.batch.push(g, q.n_past + 1 + i, s, true);
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
        let pass_secs = t0.elapsed().as_secs_f64();
        // Positions written; a sequence's guesses count once they are kept.
        for i in 0..self.batch.len() {
            if let Some(q) = self.slots[self.batch.seq[i]].as_mut() {
                q.n_past = q.n_past.max(self.batch.pos[i] + 1);
            }
        }
        for &s in &self.order {
            let Some(q) = self.slots[s].as_mut() else { continue };
            if let Some(d) = q.draft.as_mut() {
                d.gate.timed(d.guesses.len(), pass_secs);
                q.n_past -= d.guesses.len();
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
        let mut row = 0;
        while row < rows.len() {
            // A sequence's rows: its token's, then one per guess.
            let s = rows[row];
            let n = rows[row..].iter().take_while(|&&r| r == s).count();
            self.verify(s, row, n);
            row += n;
        }
        self.rows = rows;
        let secs = t0.elapsed().as_secs_f64();
        self.sizer.observe(secs, n_decode, n_prefill);
    }

    /// Whether slot `s` holds a sequence past its prompt.
    fn slot_decoding(&self, s: usize) -> bool {
        self.slots[s].as_ref().is_some_and(|q| !q.prefilling())
    }

    /// Samples slot `s`'s rows `row..row + n` in order (its token's, then its guesses'): each
    /// sampled token that equals the next guess keeps that guess, whose keys and values the
    /// pass already wrote; the first that does not ends the run, and the cache is cut back to
    /// the tokens kept.
    fn verify(&mut self, s: usize, row: usize, n: usize) {
        let mut kept = 0;
        for i in 0..n {
            let sampled = catch_unwind(AssertUnwindSafe(|| self.sample(row + i, s)));
            match sampled {
                Ok(None) => {}
                Ok(Some(reason)) => return self.finish(s, reason),
                Err(p) => {
                    let msg = format!("internal error while sampling: {}", panic_text(&*p));
                    return self.fail(s, &msg);
                }
            }
            let Some(q) = self.slots[s].as_mut() else { return };
            let guess = q.draft.as_ref().and_then(|d| d.guesses.get(i).copied());
            if i + 1 == n || guess != Some(q.next) {
                break;
            }
            // The guess is the sampled token, already at position n_past.
            q.n_past += 1;
            kept += 1;
        }
        let Some(q) = self.slots[s].as_mut() else { return };
        let Some(d) = q.draft.as_mut() else { return };
        if n > 1 {
            d.gate.observe(n - 1, kept);
            self.counters.draft_tokens.inc_by((n - 1) as u64);
            self.counters.draft_kept.inc_by(kept as u64);
            self.counters.draft_kept_per_pass.observe(kept as f64);
            self.ctx.kv.seq_truncate(s, q.n_past);
        }
        d.guesses.clear();
    }

    /// Ends slot `s`'s job for `reason`: the slot (or, while the answer is computed again as
    /// the next prompt will tokenize it, the job's place: [`Scheduler::warm`]) is freed before
    /// the client hears of it, and text held back for a possible stop string goes out first. A
    /// re-tokenized answer, once read, frees its slot.
    fn finish(&mut self, s: usize, reason: FinishReason) {
        if self.slots[s].as_ref().is_some_and(|q| q.warm.is_some()) {
            if let Some(q) = self.release(s) {
                self.recent.remember(q.job.req.adapters.salt, &q.tokens);
            }
            return;
        }
        let Some(q) = self.slots[s].as_mut() else { return };
        let rest = q.answer.flush();
        let done = q.finish(reason);
        let events = match self.warm(s) {
            Some(client) => client,
            None => {
                let Some(q) = self.release(s) else { return };
                if self.ctx.kv.prefix_enabled() {
                    self.recent.remember(q.job.req.adapters.salt, &q.tokens);
                }
                q.job.events
            }
        };
        if !rest.is_empty() {
            let _ = events.send(Event::Text(rest));
        }
        let _ = events.send(Event::Done(done));
    }

    /// Starts computing slot `s`'s answer as the next prompt will tokenize it
    /// ([`crate::reuse::canonical`]), from the first token that differs, when it differs and
    /// the prefix cache is on. The job's place is given back at once (its client is answered);
    /// the client's channel is returned, the sequence's events go nowhere from now on. `None`
    /// if there is nothing to compute. Cost: a prefill of the answer's tokens from the first
    /// one that differs, in the steps after the answer (while an agent runs its tool).
    fn warm(&mut self, s: usize) -> Option<UnboundedSender<Event>> {
        if !self.ctx.kv.prefix_enabled() {
            return None;
        }
        let n_ctx = self.ctx.params.n_ctx;
        let q = self.slots[s].as_mut()?;
        if q.job.is_embedding() || q.prefilling() {
            return None;
        }
        let canon = reuse::canonical(&self.tok, &q.tokens, q.job.req.prompt.len())?;
        let same = canon.iter().zip(&q.tokens).take_while(|(a, b)| a == b).count();
        let keep = same.min(q.n_past);
        if keep >= canon.len() || canon.len() >= n_ctx {
            return None;
        }
        self.ctx.kv.seq_truncate(s, keep);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let client = std::mem::replace(&mut q.job.events, tx);
        q.job.logprobs = None;
        q.warm = Some(rx);
        q.draft = None;
        q.n_past = keep;
        q.tokens.clone_from(&canon);
        q.job.req.prompt = canon;
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        Some(client)
    }

    /// Samples slot `s`'s next token from output row `row` and streams its text; the reason to
    /// stop, if it is done.
    fn sample(&mut self, row: usize, s: usize) -> Option<FinishReason> {
        let n_ctx = self.ctx.params.n_ctx;
        let raw = self.ctx.logits(row);
        let q = self.slots[s].as_mut()?;
        if q.warm.is_some() {
            // The re-tokenized answer is read: nothing to sample.
            return Some(FinishReason::Stop);
        }
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
        // Past the KV's positions when the answer ends here: the whole answer, for its
        // re-tokenization and for reuse by text (`crate::reuse`).
        q.tokens.push(tok);
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
        if let Some(d) = q.draft.as_mut() {
            d.drafter.extend(&[tok]);
        }
        None
    }
}
