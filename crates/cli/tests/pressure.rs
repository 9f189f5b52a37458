//! Memory pressure, for real: `snug run` starts inside a cgroup-v1 memory limit of 1 GiB
//! (qwen2.5-coder-0.5b, 469 MiB, fits and is mmap'd); once it has produced some text the limit
//! is lowered to 300 MiB — well under the model — and the run must finish every token without
//! the OOM killer, say what it did about it, and write exactly the text of an unconstrained run
//! (greedy: streaming layers must not change a single logit).
//!
//! Needs root and the cgroup-v1 memory controller at /sys/fs/cgroup/memory; without them the
//! test says so and skips, except under `SNUG_REQUIRE_PRIVILEGED` (scripts/test.sh), where it
//! fails.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SNUG: &str = env!("CARGO_BIN_EXE_snug");
const ALIAS: &str = "qwen2.5-coder-0.5b";
const N_PREDICT: usize = 64;
const PROMPT: &str = "Write a story about a lighthouse keeper.";

/// The same flags for both runs: greedy, a fixed context and KV precision (so the budget cannot
/// change what is computed), every token generated.
fn run_args(model: &Path) -> Vec<String> {
    let mut v = vec!["run".to_string(), model.display().to_string()];
    for a in [
        "--raw",
        "--ctx",
        "512",
        "--kv",
        "f16",
        "--threads",
        "2",
        "--temp",
        "0",
        "--ignore-eos",
        "--verbose",
        "-n",
    ] {
        v.push(a.to_string());
    }
    v.push(N_PREDICT.to_string());
    v.push(PROMPT.to_string());
    v
}

/// A cgroup-v1 memory cgroup of our own; dropping it kills what is left in it and removes it.
struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    fn create(name: &str, limit: u64) -> Cgroup {
        let dir = Path::new(common::CGROUP_V1).join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let cg = Cgroup { dir };
        cg.write("memory.limit_in_bytes", limit)
            .unwrap_or_else(|e| panic!("setting the limit of {}: {e}", cg.dir.display()));
        cg
    }

    fn write(&self, file: &str, value: u64) -> std::io::Result<()> {
        std::fs::write(self.dir.join(file), value.to_string())
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    fn bytes(&self, file: &str) -> u64 {
        self.read(file).trim().parse().unwrap_or(0)
    }

    /// `oom_kill N` from memory.oom_control (kernels before 4.13 lack the line: `None`).
    fn oom_kills(&self) -> Option<u64> {
        self.read("memory.oom_control")
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
    }

    /// `cmd` started inside this cgroup (a shell writes its own pid to cgroup.procs, then execs
    /// it, so everything the command allocates is charged here).
    fn spawn(&self, cmd: &str, args: &[String]) -> Child {
        Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(self.dir.join("cgroup.procs"))
            .arg(cmd)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh starts")
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            let procs = self.read("cgroup.procs");
            if procs.trim().is_empty() {
                break;
            }
            for pid in procs.lines().filter_map(|l| l.trim().parse::<libc::pid_t>().ok()) {
                // SAFETY: kill has no memory-safety preconditions; these are the processes this
                // test put in its own cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("could not remove {}: {e}", self.dir.display());
        }
    }
}

/// Kills and reaps the child if the test ends early.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Collects a pipe on a thread; the buffer can be looked at while it fills.
fn collect(
    mut pipe: impl Read + Send + 'static,
) -> (Arc<Mutex<Vec<u8>>>, std::thread::JoinHandle<()>) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = Arc::clone(&buf);
    let h = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            b.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(&chunk[..n]);
        }
    });
    (buf, h)
}

fn text(buf: &Mutex<Vec<u8>>) -> String {
    String::from_utf8_lossy(&buf.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
}

/// A private copy of the model beside it (same filesystem), removed on drop. Its page cache is
/// dropped after writing, so the constrained run reads every page itself and the cgroup is
/// charged for all of them — even if another process has the cached model mapped.
struct ColdCopy(PathBuf);

impl ColdCopy {
    fn of(model: &Path) -> ColdCopy {
        let copy =
            ColdCopy(model.with_extension(format!("pressure-test-{}.gguf", std::process::id())));
        std::fs::copy(model, &copy.0)
            .unwrap_or_else(|e| panic!("copying {} to {}: {e}", model.display(), copy.0.display()));
        let f = std::fs::File::open(&copy.0).expect("the copy opens");
        f.sync_all().expect("the copy reaches the disk");
        // SAFETY: fadvise on a descriptor we own; it only drops clean cached pages.
        unsafe {
            libc::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
                0,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        copy
    }
}

impl Drop for ColdCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn lowering_the_cgroup_limit_under_a_running_generation_streams_layers_and_finishes() {
    if !common::may_run("pressure", common::cgroup_v1_memory()) {
        return;
    }
    let model = common::model(ALIAS);
    let args = run_args(&model);
    let t0 = Instant::now();

    // The reference: the same run, unconstrained.
    let reference = Command::new(SNUG).args(&args).output().expect("snug runs");
    let ref_err = String::from_utf8_lossy(&reference.stderr);
    assert!(reference.status.success(), "unconstrained run failed:\n{ref_err}");
    assert!(!ref_err.contains("memory pressure"), "pressure seen without a limit:\n{ref_err}");
    let want = String::from_utf8_lossy(&reference.stdout).into_owned();
    let t_ref = t0.elapsed();

    let cold = ColdCopy::of(&model);
    let cg = Cgroup::create("snug-pressure-test", 1 << 30);
    let mut child = Running(cg.spawn(SNUG, &run_args(&cold.0)));
    let (out, out_h) = collect(child.0.stdout.take().expect("stdout piped"));
    let (err, err_h) = collect(child.0.stderr.take().expect("stderr piped"));

    // Some tokens first: about a quarter of the text.
    let before = want.len() / 4;
    let deadline = Instant::now() + Duration::from_secs(120);
    while out.lock().unwrap_or_else(|p| p.into_inner()).len() < before {
        if let Ok(Some(st)) = child.0.try_wait() {
            panic!("snug ended ({st}) before producing {before} bytes:\n{}", text(&err));
        }
        assert!(Instant::now() < deadline, "no output after 120 s:\n{}", text(&err));
        std::thread::sleep(Duration::from_millis(20));
    }
    let usage_before = cg.bytes("memory.usage_in_bytes");
    let seen_before = text(&out);
    // 300 MiB: under the model file (469 MiB). The kernel reclaims page cache to get there (a
    // cgroup-v1 write fails with EBUSY only if it cannot); try a few times.
    let low: u64 = 300 << 20;
    let mut lowered = cg.write("memory.limit_in_bytes", low);
    for _ in 0..10 {
        if lowered.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        lowered = cg.write("memory.limit_in_bytes", low);
    }
    lowered.unwrap_or_else(|e| panic!("lowering the limit to {low} failed: {e}"));
    // From here on the peak is the constrained run's.
    let _ = cg.write("memory.max_usage_in_bytes", 0);
    let t_low = Instant::now();

    let status = child.0.wait().expect("snug is reaped");
    let _ = (out_h.join(), err_h.join());
    let (got, log) = (text(&out), text(&err));
    let peak_after = cg.bytes("memory.max_usage_in_bytes");
    let oom = cg.oom_kills();
    eprintln!(
        "reference {:.1} s; limit 1 GiB -> 300 MiB after {} bytes of text (usage then {} MiB); finished {:.1} s later; peak usage after {} MiB; oom_kill {oom:?}\n{log}",
        t_ref.as_secs_f64(),
        seen_before.len(),
        usage_before >> 20,
        t_low.elapsed().as_secs_f64(),
        peak_after >> 20,
    );

    assert_eq!(oom.unwrap_or(0), 0, "the OOM killer struck:\n{log}");
    assert!(status.success(), "snug did not finish ({status}):\n{log}");
    assert!(
        log.contains(&format!("generated {N_PREDICT} tok")),
        "not every token was generated:\n{log}"
    );
    let reaction = log
        .lines()
        .find(|l| l.starts_with("snug: memory pressure: limit 300.0 MiB"))
        .unwrap_or_else(|| panic!("no pressure line for the 300 MiB limit:\n{log}"));
    assert!(reaction.contains("now stream"), "{reaction}");
    assert!(usage_before > low, "the run held only {usage_before} bytes before the limit was lowered: no pressure to react to");
    assert!(
        want.starts_with(&seen_before),
        "text before the pressure differs from the unconstrained run:\n{seen_before}\n---\n{want}"
    );
    assert_eq!(
        &got[seen_before.len()..],
        &want[seen_before.len()..],
        "text after the pressure differs from the unconstrained run"
    );
}
