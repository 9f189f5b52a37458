//! The libraries' typed errors worded for the command line. A library says what is wrong,
//! with the numbers (`position 4096 is past the context length 4096`); this module adds which
//! of `snug`'s flags changes it (`use a larger --ctx`). [`explain`] rewrites the runtime's
//! errors whose whole sentence depends on the flags; [`hint`] finds a typed error anywhere in
//! an error's chain and gives the advice `main` appends to it. Cost: a walk of the error chain
//! once, when a command fails.

use engine::perplexity::PerplexityError;
use hub::synth::SynthError;
use hub::HubError;
use memory::probe::BudgetSource;
use memory::residency::LockError;
use model::kv::pool::PoolFull;
use model::lora::LoraError;
use model::ModelError;
use runtime::plan::Alternative;
use runtime::{fmt_bytes, Planned, RuntimeError};

/// Where the budget came from, a `--ram` given by its flag.
pub fn budget_source(s: &BudgetSource) -> String {
    match s {
        BudgetSource::Flag => "--ram".into(),
        other => other.to_string(),
    }
}

/// The plan's one line, its budget's source in the command line's words.
pub fn summary(planned: &Planned) -> String {
    planned.summary_from(&budget_source(&planned.budget.source))
}

/// The runtime's errors worded for the command line: which flag to change.
pub fn explain(e: RuntimeError) -> anyhow::Error {
    match e {
        RuntimeError::Zero { what } => {
            let flag = match what {
                "context length" => "--ctx",
                "thread count" => "--threads",
                "micro-batch" => "--ubatch",
                "KV window" => {
                    return anyhow::anyhow!(
                        "--window must be at least 1 (leave it out to keep every position)"
                    )
                }
                other => other,
            };
            anyhow::anyhow!("{flag} must be at least 1")
        }
        RuntimeError::PromptTooLong { needed, n_ctx } => anyhow::anyhow!(
            "the prompt needs {needed} tokens of context but --ctx is {n_ctx}; raise --ctx or \
             shorten the prompt"
        ),
        RuntimeError::DoesNotFit { fit, from } => {
            let flag = |a| match a {
                Alternative::Context(n, t) => format!("--ctx {n} ({})", fmt_bytes(t)),
                Alternative::Kv(k, t) => format!("--kv {k} ({})", fmt_bytes(t)),
                Alternative::Stream(t) => {
                    format!("--load stream ({} with no layer pinned)", fmt_bytes(t))
                }
            };
            let advice = fit.advice(flag, "give it more memory (--ram) or use a smaller model");
            anyhow::anyhow!("{}; {advice} (budget from {})", fit.facts(), budget_source(&from))
        }
        RuntimeError::Lock(LockError::Limit { need, limit }) => anyhow::anyhow!(
            "--load mlock needs to lock {} but RLIMIT_MEMLOCK is {}; raise it (`ulimit -l \
             unlimited`, or LimitMEMLOCK= in a systemd unit) or use --load populate",
            fmt_bytes(need),
            fmt_bytes(limit)
        ),
        RuntimeError::Lock(e @ LockError::Refused { .. }) => {
            anyhow::anyhow!("making the weights resident: {e}; or use --load populate")
        }
        e => e.into(),
    }
}

/// The flag that changes the outcome of a typed error in `e`'s chain, if one is known.
pub fn hint(e: &anyhow::Error) -> Option<String> {
    e.chain().find_map(|cause| {
        if let Some(m) = cause.downcast_ref::<ModelError>() {
            return match m {
                ModelError::ContextFull { .. } => Some("use a larger --ctx".into()),
                ModelError::KvFull { .. } => {
                    Some("use a larger --ctx, fewer sequences or a --window".into())
                }
                ModelError::Lora(LoraError::NotAdapter(_)) => {
                    Some("a base model given as --lora?".into())
                }
                _ => None,
            };
        }
        if cause.downcast_ref::<PoolFull>().is_some() {
            return Some("raise --ram or lower --max-loras".into());
        }
        if let Some(LoraError::NotAdapter(_)) = cause.downcast_ref::<LoraError>() {
            return Some("a base model given as --lora?".into());
        }
        if let Some(PerplexityError::TooShort { .. }) = cause.downcast_ref::<PerplexityError>() {
            return Some("use a longer text or a smaller --ctx".into());
        }
        if let Some(server::ServeError::Bind { .. }) = cause.downcast_ref::<server::ServeError>() {
            return Some("pick another --port or stop what uses it".into());
        }
        if let Some(SynthError::NoTokenizer) = cause.downcast_ref::<SynthError>() {
            return Some("pass one with --tokenizer-from (e.g. qwen2.5-coder-0.5b)".into());
        }
        match cause.downcast_ref::<HubError>()? {
            HubError::SizeMismatch { alias, .. } | HubError::ChecksumMismatch { alias, .. } => {
                Some(format!("run `snug pull --force {alias}`"))
            }
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_errors_get_the_flag_that_changes_them() {
        let full = anyhow::Error::from(ModelError::ContextFull { pos: 9, n_ctx: 8 });
        assert_eq!(hint(&full.context("generating")).as_deref(), Some("use a larger --ctx"));
        let short = anyhow::Error::from(PerplexityError::TooShort { needed: 8, have: 3 });
        assert!(hint(&short).is_some_and(|h| h.contains("--ctx")));
        let busy = server::ServeError::Bind {
            addr: "127.0.0.1:11434".into(),
            reason: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        assert!(hint(&anyhow::Error::from(busy)).is_some_and(|h| h.contains("--port")));
        assert_eq!(hint(&anyhow::anyhow!("no typed error here")), None);
        assert_eq!(budget_source(&BudgetSource::Flag), "--ram");
    }
}
