//! Known models and the local model cache (`$SNUG_HOME`, default `~/.cache/snug`).
//!
//! Everywhere a model is named, either an alias from [`ALIASES`] or a path to a `.gguf` file
//! works; [`resolve`] turns either into a path, pulling an alias into the cache if needed.

use std::path::{Path, PathBuf};

/// The cache root: `$SNUG_HOME`, else `~/.cache/snug`.
pub fn snug_home() -> PathBuf {
    if let Some(h) = std::env::var_os("SNUG_HOME") {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("snug")
}

/// Where an alias's assembled file lives in the cache.
pub fn model_path(alias: &str) -> PathBuf {
    snug_home().join("models").join(format!("{alias}.gguf"))
}

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0:?} is neither a .gguf file nor a known model alias (known: gemma3-270m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b)")]
    Unknown(String),
}

/// Resolves an alias or a path to a local `.gguf` file.
pub fn resolve(name: &str) -> Result<PathBuf, HubError> {
    let p = Path::new(name);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    let cached = model_path(name);
    if cached.is_file() {
        return Ok(cached);
    }
    Err(HubError::Unknown(name.to_string()))
}
