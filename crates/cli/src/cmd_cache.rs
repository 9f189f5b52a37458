//! The prefix cache's disk tier from the command line: `serve`'s `--prefix-cache-dir` and
//! `--prefix-cache-disk` (validated into a `model::kv::disk::DiskConfig`), and `snug cache
//! ls|clear`, which list and empty the tier's folders under `$SNUG_HOME/kv-cache` (one per
//! model file: its stem and identity).

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use memory::units::fmt_bytes;
use model::kv::disk::{self, store, DiskConfig};

/// `serve`'s flags for the prefix cache's disk tier.
#[derive(Args, Clone, Debug)]
pub struct PrefixDiskArgs {
    /// Where KV blocks of prompts are kept on disk, so a prompt seen before (even before a
    /// restart) is read back instead of computed (default: a folder per model file under
    /// $SNUG_HOME/kv-cache).
    #[arg(long, value_name = "DIR")]
    pub prefix_cache_dir: Option<PathBuf>,
    /// Most bytes the disk tier keeps (least recently used blocks go first), e.g. 2G; 0 turns
    /// it off.
    #[arg(long, value_name = "SIZE", default_value = "2G", value_parser = parse_budget)]
    pub prefix_cache_disk: u64,
}

/// A byte count, 0 allowed (off).
fn parse_budget(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    memory::units::parse_bytes(s)
}

/// Every model's folder of the disk tier lives here.
pub fn cache_home() -> PathBuf {
    hub::snug_home().join("kv-cache")
}

impl PrefixDiskArgs {
    /// The tier for the model file `model` (`None`: off).
    pub fn config(&self, model: &Path) -> anyhow::Result<Option<DiskConfig>> {
        if self.prefix_cache_disk == 0 {
            return Ok(None);
        }
        let identity = disk::file_identity(model)
            .map_err(|e| anyhow::anyhow!("reading the model file {}: {e}", model.display()))?;
        let dir = match &self.prefix_cache_dir {
            Some(d) => d.clone(),
            None => {
                let stem = model.file_stem().map_or("model".into(), |s| s.to_string_lossy());
                cache_home().join(format!("{stem}-{identity:016x}"))
            }
        };
        Ok(Some(DiskConfig::new(dir, self.prefix_cache_disk, identity)))
    }
}

#[derive(Args, Debug)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub what: CacheCmd,
}

#[derive(Subcommand, Debug)]
pub enum CacheCmd {
    /// The prefix cache's folders on disk: blocks and bytes in each.
    Ls {
        /// A --prefix-cache-dir given to serve (default: every folder under
        /// $SNUG_HOME/kv-cache).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Deletes the prefix cache's blocks on disk.
    Clear {
        /// A --prefix-cache-dir given to serve (default: every folder under
        /// $SNUG_HOME/kv-cache).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// The folders `dir` names: itself, or every folder under [`cache_home`].
fn folders(dir: Option<PathBuf>) -> Vec<PathBuf> {
    if let Some(d) = dir {
        return vec![d];
    }
    let Ok(rd) = std::fs::read_dir(cache_home()) else { return Vec::new() };
    let mut v: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    v.sort();
    v
}

pub fn run(a: CacheArgs) -> anyhow::Result<()> {
    match a.what {
        CacheCmd::Ls { dir } => {
            let (mut n, mut bytes) = (0, 0);
            for f in folders(dir) {
                let (fn_, fb) = store::dir_usage(&f);
                println!("{:>8} blocks {:>12}  {}", fn_, fmt_bytes(fb), f.display());
                n += fn_;
                bytes += fb;
            }
            println!("{n:>8} blocks {:>12}  in all", fmt_bytes(bytes));
        }
        CacheCmd::Clear { dir } => {
            let (mut n, mut bytes) = (0, 0);
            for f in folders(dir) {
                let (fn_, fb) = store::dir_clear(&f)
                    .map_err(|e| anyhow::anyhow!("clearing {}: {e}", f.display()))?;
                n += fn_;
                bytes += fb;
            }
            println!("deleted {n} blocks, {}", fmt_bytes(bytes));
        }
    }
    Ok(())
}
