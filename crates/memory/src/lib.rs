//! Memory mechanisms: what the machine allows and how a model's weights stay resident. What a
//! model will cost and what to do about it (the planner, the pressure governor) is policy and
//! lives above the model, in the `runtime` crate, where it can use the model's own formulas.
//!
//! - [`heap`] hands the allocator's free pages back after work that freed a lot.
//! - [`probe`] reads the real limit (cgroup v2 `memory.max`, cgroup v1 `memory.limit_in_bytes`,
//!   `/proc/meminfo` MemAvailable) and the process's own RSS.
//! - [`residency`] applies a residency mode to the mapped file (mmap / populate / mlock / stream)
//!   and, for streaming, reads stages ahead of the compute and drops them after it.
//! - [`stages`] cuts each layer's matrices into the stages streaming works in.
//! - [`units`] prints and parses byte counts.

pub mod heap;
pub mod probe;
pub mod residency;
pub mod stages;
pub mod units;

pub use probe::{Budget, BudgetSource};
pub use units::{fmt_bytes, parse_bytes};
