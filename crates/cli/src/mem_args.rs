//! Memory flags shared by the verbs that run a model (`--ram`, `--load`, `--verbose`), parsed
//! into the runtime's [`MemOptions`].

use clap::{Args, ValueEnum};
use runtime::{MemOptions, Residency};

/// `--load`: how the weights stay in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LoadMode {
    /// mmap when the model fits the budget, else stream.
    #[default]
    Auto,
    /// Zero-copy mapping; pages come in on first touch.
    Mmap,
    /// Read the whole file in at load.
    Populate,
    /// Read it in and pin it (needs RLIMIT_MEMLOCK).
    Mlock,
    /// Pin as many layers as fit and stream the rest layer by layer.
    Stream,
}

#[derive(Args, Clone, Debug, Default)]
pub struct MemArgs {
    /// Memory budget, e.g. 6G or 2.5GiB (default: the cgroup limit, else MemAvailable).
    #[arg(long, value_parser = runtime::parse_bytes)]
    pub ram: Option<u64>,
    /// How weights stay in memory: auto, mmap, populate, mlock or stream.
    #[arg(long = "load", value_enum, default_value_t = LoadMode::Auto)]
    pub load: LoadMode,
    /// Print the whole memory plan, and the peak RSS at exit.
    #[arg(long)]
    pub verbose: bool,
}

impl MemArgs {
    pub fn options(&self) -> MemOptions {
        let residency = match self.load {
            LoadMode::Auto => None,
            LoadMode::Mmap => Some(Residency::Mmap),
            LoadMode::Populate => Some(Residency::Populate),
            LoadMode::Mlock => Some(Residency::Mlock),
            LoadMode::Stream => Some(Residency::Stream),
        };
        MemOptions { ram: self.ram, residency }
    }
}
