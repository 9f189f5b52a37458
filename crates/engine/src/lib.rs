//! Running models: sampling, generation with streaming text and stop conditions, the
//! continuous-batching scheduler ([`scheduler`]) that serves many requests on one context,
//! speculative decoding ([`draft`]), and evaluation against reference logits.

#![forbid(unsafe_code)]

pub mod draft;
pub mod embed;
pub mod fim;
pub mod generate;
pub mod json;
pub mod json_schema;
pub mod json_syntax;
mod kl_base;
mod kl_save;
pub mod logprobs;
pub mod perplexity;
pub mod reuse;
pub mod sampling;
pub mod scheduler;
pub mod sequence;
pub mod step;
pub mod stops;
pub mod tools;

pub use generate::{GenStats, GenerateParams, Session, StopReason};
pub use json::{JsonFormat, JsonMask, JsonVocab};
pub use kl_base::{kl_divergence, Agreement, KlBase, KlBaseError};
pub use kl_save::save_kl_base;
pub use model::eval::{evaluate, EvalResult, PositionRow};
pub use perplexity::{perplexity, PerplexityResult};
pub use sampling::{Sampler, SamplerParams, MAX_REPEAT_LAST_N, REPEAT_LAST_N_WHOLE_CONTEXT};
pub use sequence::Sequence;
pub use stops::{StopMatcher, MAX_STOPS, MAX_STOP_BYTES};
