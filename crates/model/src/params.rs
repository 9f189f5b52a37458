//! What a context is created with: [`ContextParams`] and the KV precisions ([`KvType`]) it names.
//! Plain data with no dependencies inside the crate, so the forward pass, the KV cache and the
//! callers that size them all read one definition. How each precision lays out its bytes (and
//! so its size methods) is `kv::format`'s.

use std::str::FromStr;

/// Sizes fixed when a [`Context`](crate::Context) is created.
#[derive(Clone, Copy, Debug)]
pub struct ContextParams {
    /// Positions per sequence.
    pub n_ctx: usize,
    /// Tokens computed together (prefill chunk).
    pub n_ubatch: usize,
    /// Logit rows one `decode` call can return.
    pub n_outputs_max: usize,
    pub n_seq_max: usize,
    pub n_threads: usize,
    /// Precision of cached keys and of cached values.
    pub kv_k: KvType,
    pub kv_v: KvType,
    /// Keep only the last `kv_window` positions (plus `kv_sinks` first ones) in layers without
    /// a window of their own; positions may then run past `n_ctx` (context shift).
    pub kv_window: Option<usize>,
    pub kv_sinks: usize,
    /// Which of keys and values are stored Hadamard-rotated (`kv::rotate`); `None`: the
    /// architecture's default for the precisions chosen ([`KvRotate::default_for`]).
    pub kv_rotate: Option<KvRotate>,
}

impl Default for ContextParams {
    fn default() -> Self {
        ContextParams {
            n_ctx: 4096,
            n_ubatch: 512,
            n_outputs_max: 1,
            n_seq_max: 1,
            n_threads: 1,
            kv_k: KvType::F16,
            kv_v: KvType::F16,
            kv_window: None,
            kv_sinks: 4,
            kv_rotate: None,
        }
    }
}

/// Storage precision of keys or values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvType {
    #[default]
    F16,
    Q8,
    Q4,
}

#[derive(Debug, thiserror::Error)]
#[error("unknown KV precision {0:?}: valid values are f16, q8 and q4")]
pub struct ParseKvTypeError(pub String);

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F16, KvType::Q8, KvType::Q4];

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8 => "q8",
            KvType::Q4 => "q4",
        }
    }

    pub fn is_quantized(self) -> bool {
        self != KvType::F16
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = ParseKvTypeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8" | "q8_0" => Ok(KvType::Q8),
            "q4" | "q4_0" => Ok(KvType::Q4),
            _ => Err(ParseKvTypeError(s.to_string())),
        }
    }
}

/// Which of keys and values a cache stores rotated (`--kv-rotate on|off|k|v`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KvRotate {
    pub k: bool,
    pub v: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("unknown KV rotation {0:?}: valid values are on, off, k (keys only) and v (values only)")]
pub struct ParseKvRotateError(pub String);

impl KvRotate {
    pub const ON: KvRotate = KvRotate { k: true, v: true };
    pub const OFF: KvRotate = KvRotate { k: false, v: false };
    /// Values only: the default where measured (keys are quantized per channel at 4 bits, and
    /// mixing the channels costs more than the outliers it spreads; BENCHMARKS.md).
    pub const V: KvRotate = KvRotate { k: false, v: true };

    /// The default: each of keys and values rotated when it is quantized, as far as the
    /// architecture's `arch_default` (its `ArchSpec::kv_rotate`, chosen from measurement) allows.
    pub fn default_for(arch_default: KvRotate, k: KvType, v: KvType) -> KvRotate {
        KvRotate { k: arch_default.k && k.is_quantized(), v: arch_default.v && v.is_quantized() }
    }

    pub fn name(self) -> &'static str {
        match (self.k, self.v) {
            (true, true) => "on",
            (false, false) => "off",
            (true, false) => "k",
            (false, true) => "v",
        }
    }
}

impl FromStr for KvRotate {
    type Err = ParseKvRotateError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "on" => Ok(KvRotate::ON),
            "off" => Ok(KvRotate::OFF),
            "k" => Ok(KvRotate { k: true, v: false }),
            "v" => Ok(KvRotate { k: false, v: true }),
            _ => Err(ParseKvRotateError(s.to_string())),
        }
    }
}
