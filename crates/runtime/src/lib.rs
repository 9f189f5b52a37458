//! The runtime as a library: what every front end (the `snug` CLI, the server) does between a
//! model's name and a running context, and the memory policy behind it.
//!
//! - [`session`]: open a model, plan its context within the memory budget, make its weights
//!   resident and keep the pressure governor running; typed errors each front end words itself.
//! - [`plan`]: peak resident memory predicted from the GGUF header and the model's own size
//!   formulas, and the configuration (context, KV precision, residency) chosen for a budget.
//! - [`pressure`]: while running, moves layers between pinned and streamed as the limit, the
//!   free memory and the KV cache's length change.
//!
//! Dependencies: the mechanisms below (`memory` for probing and residency, `model` for the
//! forward pass and its sizes, `engine` for generation), never a front end.

#![forbid(unsafe_code)]

pub mod plan;
pub mod pressure;
pub mod session;

pub use plan::{
    fmt_bytes, parse_bytes, Choice, DoesNotFit, ModelFacts, Prediction, Request, Residency,
};
pub use session::{
    default_threads, open, plan as plan_context, Loaded, MemOptions, Planned, Residence,
    RunOptions, RuntimeError,
};
