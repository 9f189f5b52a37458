//! Shared by the CLI's integration tests.

use std::path::PathBuf;

/// The cached file of a known model, pulled if missing; a model that cannot be had is a failure
/// naming the command that fetches it, never a skip.
pub fn model(alias: &str) -> PathBuf {
    hub::resolve(alias).unwrap_or_else(|e| panic!("{alias} is needed: {e} (fetch it with `snug pull {alias}`)"))
}
