//! One conversation on one sequence: prompt prefill, sampling, streaming text with stop strings.
//!
//! A [`Session`] remembers the tokens its KV cache holds, so a chat that re-renders the whole
//! conversation each turn only prefills what is new (the longest common prefix is reused).
//! With a drafter ([`Session::set_drafter`]) each pass also verifies guessed tokens
//! ([`crate::draft`]): the output is the same, in fewer passes when the guesses are kept.

use std::sync::Arc;
use std::time::Instant;

use model::{Batch, Context, ContextParams, Model, ModelError};
use tokenizer::Tokenizer;

use crate::draft::{Drafter, Gate};
use crate::json::{JsonFormat, JsonMask};
use crate::logprobs::TokenLogprob;
use crate::sampling::{Sampler, SamplerParams};
use crate::sequence::{Finish, Masks, Sequence};
use crate::stops::StopMatcher;

#[derive(Clone, Debug)]
pub struct GenerateParams {
    /// Tokens to generate at most.
    pub n_predict: usize,
    /// Text that ends generation (not included in the output).
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// JSON mode: the answer is one JSON object, or one value a schema accepts.
    pub format: Option<JsonFormat>,
    /// Report each answer token's log-probability with this many alternatives
    /// ([`TokenLogprob`]; at most [`crate::logprobs::MAX_TOP`]).
    pub logprobs: Option<usize>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            n_predict: 256,
            stop: Vec::new(),
            ignore_eos: false,
            format: None,
            logprobs: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    Eog,
    /// `n_predict` tokens were generated.
    MaxTokens,
    /// A stop string appeared.
    StopString,
    /// The callback asked to stop (e.g. Ctrl-C).
    Cancelled,
    /// The context is full (and no KV window lets generation shift past it).
    ContextFull,
}

impl From<Finish> for StopReason {
    fn from(f: Finish) -> StopReason {
        match f {
            // A constraint that completes is the answer's own end, as an end token would be.
            Finish::Eog | Finish::Complete => StopReason::Eog,
            Finish::StopString => StopReason::StopString,
            Finish::Length => StopReason::MaxTokens,
            Finish::ContextFull => StopReason::ContextFull,
        }
    }
}

#[derive(Clone, Debug)]
pub struct GenStats {
    pub n_prompt: usize,
    /// Prompt tokens actually computed (the rest were already cached).
    pub n_prompt_computed: usize,
    pub n_gen: usize,
    pub prompt_secs: f64,
    pub gen_secs: f64,
    pub stop: StopReason,
    /// Each answer token's log-probability, when [`GenerateParams::logprobs`] asked.
    pub logprobs: Vec<TokenLogprob>,
    /// Guesses verified, and of them kept, with a drafter.
    pub drafted: usize,
    pub kept: usize,
    /// Forward passes of the answer (tokens less kept guesses).
    pub passes: usize,
}

impl GenStats {
    pub fn prompt_tok_s(&self) -> f64 {
        rate(self.n_prompt_computed, self.prompt_secs)
    }

    pub fn gen_tok_s(&self) -> f64 {
        // The first generated token comes from the prefill's logits; the rest each cost a step.
        rate(self.n_gen.saturating_sub(1), self.gen_secs)
    }
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

pub struct Session {
    pub tok: Arc<Tokenizer>,
    ctx: Context,
    sampler: Sampler,
    /// JSON mode's scratch (built at the first JSON-mode answer).
    masks: Masks,
    /// Tokens whose keys/values are in the cache, in order.
    history: Vec<u32>,
    batch: Batch,
    /// Guesses for speculative decoding (none: one token a pass).
    drafter: Option<Box<dyn Drafter>>,
}

impl Session {
    /// One sequence in a context of `params`; its `n_outputs_max` less one is the most guesses
    /// a pass verifies once a drafter is set.
    pub fn new(
        model: Arc<Model>,
        tok: Arc<Tokenizer>,
        params: ContextParams,
        sampling: SamplerParams,
    ) -> Session {
        let n_vocab = model.config.n_vocab;
        let params = ContextParams { n_seq_max: 1, ..params };
        Session {
            tok,
            ctx: Context::new(model, params),
            sampler: Sampler::new(sampling, n_vocab),
            masks: Masks::default(),
            history: Vec::new(),
            batch: Batch::default(),
            drafter: None,
        }
    }

    /// Samples with `p` from the next answer on (a fresh sampler: its seed, no penalty history).
    pub fn set_sampling(&mut self, p: SamplerParams) {
        self.sampler = Sampler::new(p, self.ctx.config().n_vocab);
    }

    /// Drafts guesses with `drafter` from the next answer on (`None`: one token a pass).
    pub fn set_drafter(&mut self, drafter: Option<Box<dyn Drafter>>) {
        self.drafter = drafter;
    }

    /// Heap one session holds besides its [`Context`], at most: the token history and the
    /// caller's prompt (`[n_ctx]` ids each), the batch (an entry per position at most) and the
    /// sampler.
    pub fn heap_bytes(n_ctx: usize, n_vocab: usize) -> usize {
        n_ctx
            .saturating_mul(2 * std::mem::size_of::<u32>() + Batch::BYTES_PER_TOKEN)
            .saturating_add(Sampler::heap_bytes(n_vocab))
    }

    pub fn n_ctx(&self) -> usize {
        self.ctx.params.n_ctx
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The context, to configure before generating (e.g. [`Context::set_adapters`]).
    pub fn context_mut(&mut self) -> &mut Context {
        &mut self.ctx
    }

    /// Forgets the conversation.
    pub fn reset(&mut self) {
        self.ctx.kv.seq_clear(0);
        self.history.clear();
        self.sampler.reset();
    }

    /// Makes the cache hold exactly `tokens`, computing only what differs from what it holds;
    /// leaves the last token's logits in the context. Returns how many tokens were computed;
    /// `progress(done, to_compute)` is called after each micro-batch.
    fn prefill(
        &mut self,
        tokens: &[u32],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<usize, ModelError> {
        if tokens.len() > self.n_ctx() && !self.ctx.kv.unbounded() {
            return Err(ModelError::ContextFull { pos: tokens.len() - 1, n_ctx: self.n_ctx() });
        }
        let mut common = self.history.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        // The last token must be computed again to get its logits.
        common = common.min(tokens.len().saturating_sub(1));
        // A window may have freed the positions a shorter prefix would need: start over.
        if common < self.history.len() && self.ctx.kv.seq_evicted(0) {
            self.ctx.kv.seq_clear(0);
            common = 0;
        }
        self.ctx.kv.seq_truncate(0, common);
        self.history.truncate(common);
        let ub = self.ctx.params.n_ubatch.max(1);
        let todo = &tokens[common..];
        for (c, chunk) in todo.chunks(ub).enumerate() {
            self.batch.clear();
            let last_chunk = (c + 1) * ub >= todo.len();
            for (i, &t) in chunk.iter().enumerate() {
                self.batch.push(t, common + c * ub + i, 0, last_chunk && i + 1 == chunk.len());
            }
            self.ctx.decode(&self.batch)?;
            self.history.extend_from_slice(chunk);
            progress((c * ub + chunk.len()).min(todo.len()), todo.len());
        }
        Ok(todo.len())
    }

    /// Generates a continuation of `prompt` (the whole conversation so far, as tokens),
    /// calling `on_text` with each new piece of text; `on_text` returns false to stop.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_text: impl FnMut(&str) -> bool,
    ) -> Result<(Vec<u32>, GenStats), ModelError> {
        self.generate_reporting(prompt, params, |_, _| {}, on_text)
    }

    /// [`Session::generate`] that also reports prompt processing: `on_prefill(done, to_compute)`
    /// after each micro-batch of the prompt tokens not already cached (at least the last prompt
    /// token is always computed), before any text.
    pub fn generate_reporting(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        mut on_prefill: impl FnMut(usize, usize),
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<(Vec<u32>, GenStats), ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::Unsupported("the prompt is empty: nothing to continue".into()));
        }
        let t0 = Instant::now();
        let computed = self.prefill(prompt, &mut on_prefill)?;
        let prompt_secs = t0.elapsed().as_secs_f64();
        for &t in prompt {
            self.sampler.accept(t);
        }
        let t1 = Instant::now();
        let mut answer = Sequence::new(
            Arc::clone(&self.tok),
            StopMatcher::new(&params.stop),
            params.n_predict,
            false,
        )
        .ignoring_eos(params.ignore_eos)
        .constrained(params.format.as_ref().map(JsonMask::new), None);
        if let Some(d) = self.drafter.as_mut() {
            d.start(prompt);
        }
        let mut gate = Gate::new();
        // The guesses the last pass computed after its first token, and the row to sample next
        // (row `i` follows the `i`-th of them; row 0 the pass's first token).
        let mut drafts: Vec<u32> = Vec::new();
        let mut row = 0;
        let (mut drafted, mut kept, mut passes) = (0, 0, 0);
        let mut out = Vec::new();
        let mut logprobs = Vec::new();
        let mut stop = StopReason::MaxTokens;
        while out.len() < params.n_predict {
            let logits = self.ctx.logits(row);
            let Some(next) = answer.sample(&mut self.sampler, logits, &mut self.masks) else {
                // Nothing continues the JSON value: the answer ends as it is.
                stop = StopReason::Eog;
                break;
            };
            self.sampler.accept(next);
            let lp = params.logprobs.map(|top| TokenLogprob::from_logits(logits, next, top));
            // With a KV window, positions run on past n_ctx (context shift): keys are stored roped
            // at their absolute positions, so relative distances stay right as positions grow.
            let pos = self.history.len();
            let step = answer.accept(next, pos < self.n_ctx() || self.ctx.kv.unbounded());
            if step.finish == Some(Finish::Eog) {
                stop = StopReason::Eog;
                break;
            }
            out.push(next);
            logprobs.extend(lp);
            if !step.text.is_empty() && !on_text(&step.text) {
                stop = StopReason::Cancelled;
                break;
            }
            if let Some(f) = step.finish {
                stop = StopReason::from(f);
                break;
            }
            if let Some(d) = self.drafter.as_mut() {
                d.extend(&[next]);
            }
            if drafts.get(row) == Some(&next) {
                // The last pass computed this guess at `pos`: sample the row after it.
                self.history.push(next);
                row += 1;
                kept += 1;
                continue;
            }
            gate.observe(drafts.len(), row);
            // Rejected guesses leave the cache; `next` and new guesses go in one pass.
            self.ctx.kv.seq_truncate(0, pos);
            drafts.clear();
            row = 0;
            let n_ctx = self.n_ctx();
            // A pass costs its drafting too (a draft model's passes; nothing for prompt lookup).
            let t = Instant::now();
            if let Some(d) = self.drafter.as_mut() {
                let ctx_room = if self.ctx.kv.unbounded() {
                    usize::MAX
                } else {
                    n_ctx.saturating_sub(pos + 1)
                };
                // Each kept guess is a token, and the row after the last one gives one more.
                let room = (params.n_predict - out.len())
                    .saturating_sub(1)
                    .min(ctx_room)
                    .min(self.ctx.params.n_outputs_max - 1)
                    .min(self.ctx.kv.draft_room(pos));
                let want = gate.want(room);
                // A drafter that fails only costs its guesses.
                if want > 0 && d.draft(want, &mut drafts).is_err() {
                    drafts.clear();
                }
                drafts.truncate(want);
                drafted += drafts.len();
            }
            self.batch.clear();
            self.batch.push(next, pos, 0, true);
            for (i, &g) in drafts.iter().enumerate() {
                self.batch.push(g, pos + 1 + i, 0, true);
            }
            self.ctx.decode(&self.batch)?;
            gate.timed(drafts.len(), t.elapsed().as_secs_f64());
            passes += 1;
            self.history.push(next);
        }
        // Guesses computed past the answer's end leave the cache.
        self.ctx.kv.seq_truncate(0, self.history.len());
        if stop != StopReason::Cancelled {
            let rest = answer.flush();
            if !rest.is_empty() {
                on_text(&rest);
            }
        }
        let stats = GenStats {
            n_prompt: prompt.len(),
            n_prompt_computed: computed,
            n_gen: out.len(),
            prompt_secs,
            gen_secs: t1.elapsed().as_secs_f64(),
            stop,
            logprobs,
            drafted,
            kept,
            passes,
        };
        Ok((out, stats))
    }
}
