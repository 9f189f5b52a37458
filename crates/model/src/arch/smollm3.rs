//! SmolLM3: llama with every fourth layer (3, 7, 11, …) attending without RoPE ("NoPE"). Like
//! llama.cpp, the step is fixed by the architecture: the GGUF has no key for it.

use super::{ArchSpec, BASE};

pub const SPEC: ArchSpec = ArchSpec { name: "smollm3", no_rope_every: Some(4), ..BASE };
