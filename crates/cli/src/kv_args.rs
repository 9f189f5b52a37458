//! KV-cache flags shared by the verbs that run a model: precision of keys and values, and a
//! sliding window with sink tokens. Parsed raw by clap, validated once into `ContextParams`.

use clap::Args;
use model::{ContextParams, KvRotate, KvType};
pub use runtime::plan::kv_label;

#[derive(Args, Clone, Debug, Default)]
pub struct KvArgs {
    /// KV cache precision for keys and values: f16, q8 or q4.
    #[arg(long)]
    pub kv: Option<String>,
    /// Precision of cached keys (overrides --kv): f16, q8 or q4.
    #[arg(long = "kv-k")]
    pub kv_k: Option<String>,
    /// Precision of cached values (overrides --kv): f16, q8 or q4.
    #[arg(long = "kv-v")]
    pub kv_v: Option<String>,
    /// Keep only the last N positions (plus --sinks first ones); generation can then run past
    /// the context length.
    #[arg(long)]
    pub window: Option<usize>,
    /// With --window: first positions always kept (attention sinks, e.g. a system prompt).
    #[arg(long, default_value_t = 4)]
    pub sinks: usize,
    /// Hadamard-rotate cached keys and values: on, off, k (keys only) or v (values only).
    /// Default: quantized values (not keys), where the model's architecture gains from it.
    #[arg(long = "kv-rotate", value_name = "on|off|k|v")]
    pub kv_rotate: Option<String>,
}

impl KvArgs {
    /// (key precision, value precision).
    pub fn types(&self) -> anyhow::Result<(KvType, KvType)> {
        let parse = |flag: &str, s: &Option<String>| -> anyhow::Result<Option<KvType>> {
            s.as_deref()
                .map(|v| v.parse::<KvType>().map_err(|e| anyhow::anyhow!("--{flag}: {e}")))
                .transpose()
        };
        let both = parse("kv", &self.kv)?.unwrap_or_default();
        Ok((parse("kv-k", &self.kv_k)?.unwrap_or(both), parse("kv-v", &self.kv_v)?.unwrap_or(both)))
    }

    /// The `--kv-rotate` choice (`None`: the architecture's default).
    pub fn rotate(&self) -> anyhow::Result<Option<KvRotate>> {
        self.kv_rotate
            .as_deref()
            .map(|v| v.parse::<KvRotate>().map_err(|e| anyhow::anyhow!("--kv-rotate: {e}")))
            .transpose()
    }

    /// Short label such as `q8/q4` (keys/values).
    pub fn label(&self) -> anyhow::Result<String> {
        let (k, v) = self.types()?;
        Ok(kv_label(k, v))
    }

    /// Fills the KV fields of `p`.
    pub fn apply(&self, p: &mut ContextParams) -> anyhow::Result<()> {
        let (k, v) = self.types()?;
        if self.window == Some(0) {
            anyhow::bail!("--window must be at least 1 (leave it out to keep every position)");
        }
        p.kv_k = k;
        p.kv_v = v;
        p.kv_rotate = self.rotate()?;
        p.kv_window = self.window;
        p.kv_sinks = self.sinks;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_sets_both_and_kv_k_kv_v_override_it() {
        let a = KvArgs { kv: Some("q8".into()), kv_v: Some("q4".into()), ..Default::default() };
        assert_eq!(a.types().unwrap(), (KvType::Q8, KvType::Q4));
        assert_eq!(a.label().unwrap(), "q8/q4");
        assert_eq!(KvArgs::default().types().unwrap(), (KvType::F16, KvType::F16));
    }

    #[test]
    fn an_unknown_precision_names_the_flag_and_the_valid_values() {
        let a = KvArgs { kv_k: Some("q3".into()), ..Default::default() };
        let e = a.types().unwrap_err().to_string();
        assert!(e.contains("--kv-k") && e.contains("f16, q8 and q4"), "{e}");
        let a = KvArgs { kv_rotate: Some("maybe".into()), ..Default::default() };
        let e = a.rotate().unwrap_err().to_string();
        assert!(e.contains("--kv-rotate") && e.contains("on, off"), "{e}");
    }

    #[test]
    fn kv_rotate_is_the_architecture_default_unless_given() {
        let mut p = ContextParams::default();
        KvArgs::default().apply(&mut p).unwrap();
        assert_eq!(p.kv_rotate, None);
        let a = KvArgs { kv_rotate: Some("off".into()), ..Default::default() };
        a.apply(&mut p).unwrap();
        assert_eq!(p.kv_rotate, Some(KvRotate::OFF));
    }
}
