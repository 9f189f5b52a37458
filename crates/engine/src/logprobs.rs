//! Log-probabilities of generated tokens: the log-softmax of the model's raw logits over the
//! whole vocabulary, for the sampled token and the most likely ones (what the server reports
//! as `logprobs`/`top_logprobs` and `snug run --logprobs` prints).
//!
//! Cost per token, only when asked: one pass over the vocabulary's logits for the maximum, one
//! for the sum of exponentials and the top list (at most [`MAX_TOP`] entries kept sorted).

/// Most alternatives a request may ask for (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP: usize = 20;

/// One generated token's log-probability and the most likely tokens at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// Up to the asked number of (token, logprob), most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// `token`'s log-probability under the softmax of `logits`, with the `top` most likely.
    pub fn from_logits(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
        let top = top.min(MAX_TOP).min(logits.len());
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f64;
        let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
        for (i, &l) in logits.iter().enumerate() {
            sum += f64::from(l - max).exp();
            if top > 0 && (best.len() < top || l > best[best.len() - 1].1) {
                let at = best.partition_point(|&(_, b)| b >= l);
                best.insert(at, (i as u32, l));
                best.truncate(top);
            }
        }
        let log_z = max + sum.ln() as f32;
        let lp = |l: f32| (l - log_z).min(0.0);
        let logprob = logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| lp(l));
        TokenLogprob { token, logprob, top: best.into_iter().map(|(t, l)| (t, lp(l))).collect() }
    }
}
