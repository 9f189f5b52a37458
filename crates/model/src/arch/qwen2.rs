//! Qwen2 / Qwen2.5: llama with q/k/v biases (loaded when present) and NEOX-style RoPE.

use super::{ArchSpec, RopeStyle, BASE};

pub const SPEC: ArchSpec = ArchSpec { name: "qwen2", rope_style: RopeStyle::Neox, ..BASE };
