//! `snug list`: the models in the cache (`$SNUG_HOME/models/*.gguf`) — name, id, size and when
//! each was modified — like `ollama list`. One `read_dir` and a `stat` per file; nothing is
//! opened or hashed (the ID of a known alias is its published sha256, of any other file `-`).

use std::path::Path;
use std::time::SystemTime;

use anyhow::Context as _;

#[derive(clap::Args, Debug)]
pub struct ListArgs {}

/// One cached model.
struct Row {
    name: String,
    id: String,
    size: String,
    modified: String,
}

pub fn run(_args: ListArgs) -> anyhow::Result<()> {
    let dir = hub::snug_home().join("models");
    let rows = rows(&dir, SystemTime::now())?;
    if rows.is_empty() {
        eprintln!(
            "no models in {} yet: `snug pull ALIAS` fetches one (`snug pull --list` shows them)",
            dir.display()
        );
    }
    let w = rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(4);
    println!("{:w$}  {:12}  {:>10}  MODIFIED", "NAME", "ID", "SIZE");
    for r in &rows {
        println!("{:w$}  {:12}  {:>10}  {}", r.name, r.id, r.size, r.modified);
    }
    Ok(())
}

/// The `.gguf` files in `dir`, by name; a missing directory is an empty cache.
fn rows(dir: &Path, now: SystemTime) -> anyhow::Result<Vec<Row>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    let mut rows = Vec::new();
    for entry in entries {
        let path = entry.with_context(|| format!("reading {}", dir.display()))?.path();
        let Some(name) =
            path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".gguf"))
        else {
            continue;
        };
        let meta = std::fs::metadata(&path)
            .with_context(|| format!("reading the size of {}", path.display()))?;
        if !meta.is_file() {
            continue;
        }
        let known = hub::spec(name);
        let id = known.as_ref().map_or("-".to_string(), |s| s.sha256[..12].to_string());
        let mut size = runtime::fmt_bytes(meta.len());
        if known.is_some_and(|s| s.size != meta.len()) {
            size.push_str(" (incomplete: `snug pull --force`)");
        }
        let age = meta.modified().ok().and_then(|m| now.duration_since(m).ok());
        let modified = age.map_or("-".to_string(), |a| ago(a.as_secs()));
        rows.push(Row { name: name.to_string(), id, size, modified });
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(rows)
}

/// `3 days ago`, as `ollama list` words an age.
fn ago(secs: u64) -> String {
    const UNITS: [(u64, &str); 6] = [
        (365 * 86_400, "year"),
        (30 * 86_400, "month"),
        (7 * 86_400, "week"),
        (86_400, "day"),
        (3_600, "hour"),
        (60, "minute"),
    ];
    match UNITS.iter().find(|(len, _)| secs >= *len) {
        Some(&(len, unit)) => {
            let n = secs / len;
            format!("{n} {unit}{} ago", if n == 1 { "" } else { "s" })
        }
        None => "just now".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_ollama_list() {
        assert_eq!(ago(5), "just now");
        assert_eq!(ago(60), "1 minute ago");
        assert_eq!(ago(7_199), "1 hour ago");
        assert_eq!(ago(3 * 86_400 + 5), "3 days ago");
        assert_eq!(ago(400 * 86_400), "1 year ago");
    }

    #[test]
    fn only_gguf_files_are_listed_and_a_missing_cache_is_empty() {
        let dir = std::env::temp_dir().join(format!("snug-list-unit-{}", std::process::id()));
        assert!(rows(&dir, SystemTime::now()).unwrap().is_empty());
        std::fs::create_dir_all(dir.join("sub.gguf")).unwrap();
        std::fs::write(dir.join("b.gguf"), b"GGUF").unwrap();
        std::fs::write(dir.join("a.gguf.partial"), b"GGUF").unwrap();
        std::fs::write(dir.join("gemma3-270m.gguf"), b"GGUF").unwrap();
        let r = rows(&dir, SystemTime::now()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["b", "gemma3-270m"]);
        assert_eq!(r[0].id, "-");
        assert_eq!(r[1].id, "a5fd3b62230a");
        assert!(r[1].size.contains("incomplete"), "{}", r[1].size);
        assert_eq!(r[0].modified, "just now");
    }
}
