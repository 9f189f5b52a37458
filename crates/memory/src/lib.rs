//! Memory: what the machine allows, what a model will cost, and how its weights stay resident.
//!
//! - [`probe`] reads the real limit (cgroup v2 `memory.max`, cgroup v1 `memory.limit_in_bytes`,
//!   `/proc/meminfo` MemAvailable) and the process's own RSS.
//! - [`plan`] predicts peak RSS from the GGUF header alone (weights touched, KV per token per
//!   layer with GQA / sliding windows / q8 / q4 block scales, activation arena, logits, tokenizer
//!   heap, fixed process overhead) and chooses context, KV precision and residency for a budget.
//! - [`residency`] applies a residency mode to the mapped file (mmap / populate / mlock / stream)
//!   and, for streaming, reads stages ahead of the compute and drops them after it.
//! - [`stages`] cuts each layer's matrices into the stages streaming works in.
//! - [`pressure`] watches the budget while running and moves layers between pinned and streamed
//!   as the limit, the free memory and the KV cache length change.

pub mod plan;
pub mod pressure;
pub mod probe;
pub mod residency;
pub mod stages;

pub use plan::{
    choose, fmt_bytes, parse_bytes, Choice, KvType, ModelFacts, Prediction, Request, Residency,
    Shape,
};
pub use probe::{Budget, BudgetSource};
