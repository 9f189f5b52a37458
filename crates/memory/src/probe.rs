//! The memory this process may use: the tightest of its cgroup's limit (v2 `memory.max` or v1
//! `memory.limit_in_bytes`, walking up to the root since a parent's limit binds too) and the
//! host's `MemAvailable`. Everything here reads small text files once; no allocation after
//! start-up matters.

use std::fs;
use std::path::{Path, PathBuf};

/// Where a budget came from (printed so the user sees why snug chose what it chose).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BudgetSource {
    /// `--ram` on the command line.
    Flag,
    /// cgroup v2 `memory.max` at this path.
    CgroupV2(PathBuf),
    /// cgroup v1 `memory.limit_in_bytes` at this path.
    CgroupV1(PathBuf),
    /// `/proc/meminfo` MemAvailable (no tighter cgroup limit).
    MemAvailable,
}

impl std::fmt::Display for BudgetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BudgetSource::Flag => write!(f, "the limit given"),
            BudgetSource::CgroupV2(p) => write!(f, "cgroup v2 limit {}", p.display()),
            BudgetSource::CgroupV1(p) => write!(f, "cgroup v1 limit {}", p.display()),
            BudgetSource::MemAvailable => write!(f, "MemAvailable in /proc/meminfo"),
        }
    }
}

/// Bytes this process may use, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    pub source: BudgetSource,
}

/// cgroup limits at or above this are "no limit" (v1 reports 2^63 rounded down to a page).
const NO_LIMIT: u64 = 1 << 60;

/// The budget: `ram` if given, else the tightest cgroup limit, else MemAvailable. A cgroup limit
/// larger than MemAvailable plus what this process already holds is capped by the latter.
pub fn budget(ram: Option<u64>) -> Budget {
    if let Some(bytes) = ram {
        return Budget { bytes, source: BudgetSource::Flag };
    }
    let avail = mem_available().map(|a| a + self_rss().unwrap_or(0));
    match cgroup_limit() {
        Some((limit, source)) if avail.is_none_or(|a| limit <= a) => {
            Budget { bytes: limit, source }
        }
        _ => Budget { bytes: avail.unwrap_or(u64::MAX), source: BudgetSource::MemAvailable },
    }
}

/// The tightest memory limit over this process's cgroup and its ancestors, if any.
pub fn cgroup_limit() -> Option<(u64, BudgetSource)> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_limit_in(&text, Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_limit`] over a given `/proc/self/cgroup` text and cgroup mount root (for tests).
pub fn cgroup_limit_in(proc_cgroup: &str, root: &Path) -> Option<(u64, BudgetSource)> {
    let mut best: Option<(u64, BudgetSource)> = None;
    let mut consider = |limit: Option<u64>, src: BudgetSource| {
        if let Some(l) = limit.filter(|&l| l < NO_LIMIT) {
            if best.as_ref().is_none_or(|(b, _)| l < *b) {
                best = Some((l, src));
            }
        }
    };
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if id == "0" && ctrls.is_empty() {
            for dir in ancestors(&root.join("unified"), rel).into_iter().chain(ancestors(root, rel))
            {
                let f = dir.join("memory.max");
                consider(read_limit(&f), BudgetSource::CgroupV2(f));
            }
        } else if ctrls.split(',').any(|c| c == "memory") {
            for dir in ancestors(&root.join("memory"), rel) {
                let f = dir.join("memory.limit_in_bytes");
                consider(read_limit(&f), BudgetSource::CgroupV1(f));
            }
        }
    }
    best
}

/// `base/rel`, `base/rel/..`, … up to `base` itself.
fn ancestors(base: &Path, rel: &str) -> Vec<PathBuf> {
    let mut out = vec![base.to_path_buf()];
    let mut cur = base.to_path_buf();
    for comp in rel.split('/').filter(|c| !c.is_empty()) {
        cur.push(comp);
        out.push(cur.clone());
    }
    out
}

fn read_limit(f: &Path) -> Option<u64> {
    let s = fs::read_to_string(f).ok()?;
    let s = s.trim();
    if s == "max" {
        return None;
    }
    s.parse().ok()
}

/// `MemAvailable` from `/proc/meminfo`, in bytes.
pub fn mem_available() -> Option<u64> {
    meminfo_field(&fs::read_to_string("/proc/meminfo").ok()?, "MemAvailable:")
}

/// A `kB` field of a `/proc/meminfo`- or `/proc/self/status`-style text, in bytes.
pub fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kb: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kb * 1024)
}

/// `/proc/self/status`, for several of its fields at once.
pub fn self_status() -> Option<String> {
    fs::read_to_string("/proc/self/status").ok()
}

/// This process's resident set now (`VmRSS`).
pub fn self_rss() -> Option<u64> {
    meminfo_field(&self_status()?, "VmRSS:")
}

/// This process's peak resident set so far (`VmHWM`).
pub fn self_peak_rss() -> Option<u64> {
    meminfo_field(&self_status()?, "VmHWM:")
}

/// Current usage of the tightest limited cgroup (v1 `memory.usage_in_bytes`, v2
/// `memory.current`), beside the limit's own file.
pub fn cgroup_usage(limit_file: &Path) -> Option<u64> {
    let dir = limit_file.parent()?;
    let name =
        if limit_file.ends_with("memory.max") { "memory.current" } else { "memory.usage_in_bytes" };
    read_limit(&dir.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_bytes() {
        let t = "MemTotal:       24000000 kB\nMemAvailable:    1000 kB\n";
        assert_eq!(meminfo_field(t, "MemAvailable:"), Some(1_024_000));
        assert_eq!(meminfo_field(t, "Missing:"), None);
    }

    #[test]
    fn cgroup_v1_limit_is_the_tightest_ancestor() {
        let root = std::env::temp_dir().join(format!("snug-cg-{}", std::process::id()));
        let leaf = root.join("memory/a/b");
        fs::create_dir_all(&leaf).unwrap();
        fs::write(root.join("memory/memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        fs::write(root.join("memory/a/memory.limit_in_bytes"), "3221225472\n").unwrap();
        fs::write(leaf.join("memory.limit_in_bytes"), "6442450944\n").unwrap();
        let (l, src) = cgroup_limit_in("4:memory:/a/b\n", &root).unwrap();
        assert_eq!(l, 3 << 30);
        assert_eq!(src, BudgetSource::CgroupV1(root.join("memory/a/memory.limit_in_bytes")));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn cgroup_v2_max_means_no_limit() {
        let root = std::env::temp_dir().join(format!("snug-cg2-{}", std::process::id()));
        fs::create_dir_all(root.join("x")).unwrap();
        fs::write(root.join("x/memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit_in("0::/x\n", &root), None);
        fs::write(root.join("x/memory.max"), "2147483648\n").unwrap();
        assert_eq!(cgroup_limit_in("0::/x\n", &root).map(|b| b.0), Some(2 << 30));
        fs::remove_dir_all(&root).unwrap();
    }
}
