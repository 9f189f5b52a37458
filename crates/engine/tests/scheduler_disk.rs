//! The scheduler with the prefix cache's disk tier (issue 49), on qwen2.5-coder-0.5b (pulled if
//! missing): after a restart a prompt's blocks come back from disk, with the cold answer; and a
//! running stream keeps producing tokens while another request's blocks are being read. The
//! read is held open by a block file replaced with a FIFO, whose `open` blocks the tier's
//! reader thread until the test opens the other end: were blocks read on the scheduler thread,
//! the stream would stop until then.

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::scheduler::{self, Event, Finish, Handle, SchedulerOptions};
use engine::SamplerParams;
use model::kv::disk::{DiskConfig, DiskStats};
use model::{Context, ContextParams, Model};
use tokenizer::Tokenizer;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::UnboundedReceiver;

const ALIAS: &str = "qwen2.5-coder-0.5b";

const DOC: &str = "// A small library of list utilities in C. Each function takes the head of a \
     singly linked list and returns the new head; no function allocates except where it says so, \
     and every function keeps the list acyclic. The nodes are defined below, followed by the \
     functions: reverse, append, remove_if, length and free_all, each with a comment that states \
     its invariant and its cost in time and memory.\nstruct node {";

/// A scheduler of two sequences on the disk tier in `dir`; the receiver ends (disconnects)
/// once the scheduler thread has dropped its context, so every block queued is written.
fn start(dir: &Path) -> (Handle, Arc<Tokenizer>, std_mpsc::Receiver<()>) {
    let path = hub::resolve(ALIAS)
        .unwrap_or_else(|e| panic!("{ALIAS} is needed: {e} (fetch it with `snug pull {ALIAS}`)"));
    let model = Arc::new(Model::load(&path).expect("the model loads"));
    let tok = Arc::new(Tokenizer::from_gguf(&model.file).expect("its tokenizer loads"));
    let params = ContextParams {
        n_ctx: 512,
        n_seq_max: 2,
        n_outputs_max: 2,
        n_threads: 2,
        ..ContextParams::default()
    };
    // Long enough that only the test ends a held read.
    let cfg = DiskConfig {
        read_deadline: Duration::from_secs(600),
        ..DiskConfig::new(dir.to_path_buf(), 1 << 30, 77)
    };
    let (gone_tx, gone) = std_mpsc::channel::<()>();
    let opts = SchedulerOptions { queue: 4, prefill_chunk: None, draft: false };
    let h = scheduler::spawn(tok.clone(), opts, Default::default(), move || {
        let mut ctx = Context::new(model, params);
        ctx.kv.attach_disk(&cfg, Arc::new(DiskStats::default()))?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((ctx, gone_tx))
    })
    .expect("the scheduler starts");
    (h, tok, gone)
}

fn greedy(h: &Handle, tok: &Tokenizer, prompt: &str, n: usize) -> UnboundedReceiver<Event> {
    h.start(tok.encode(prompt, true, false), SamplerParams::greedy(), n, Vec::new())
        .expect("the job is accepted")
}

fn finish(mut rx: UnboundedReceiver<Event>) -> (String, Finish) {
    let mut text = String::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done(f) => return (text, f),
            Event::Failed(e) => panic!("the job failed: {e}"),
        }
    }
    panic!("the job ended without Done")
}

/// Stops the scheduler and waits until its context (and disk tier) is gone.
fn stop(h: Handle, gone: std_mpsc::Receiver<()>) {
    drop(h);
    assert!(gone.recv().is_err());
}

fn block_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = (fs::read_dir(dir).unwrap().flatten().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "kv"))
        .collect();
    v.sort();
    v
}

/// Opens the other end of every FIFO in `files` that a reader waits on, which lets its `open`
/// return (to a file of the wrong length: dropped, the prompt computed). On drop too, so a
/// failing test does not leave the reader thread blocked.
struct Fifos(Vec<PathBuf>);

impl Fifos {
    fn release(&self) {
        for f in &self.0 {
            // Without a reader waiting this fails at once (ENXIO) instead of blocking.
            let _ = fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(f);
        }
    }
}

impl Drop for Fifos {
    fn drop(&mut self) {
        self.release();
    }
}

#[test]
fn a_stream_keeps_decoding_while_another_prompts_blocks_are_read_from_disk() {
    let dir = std::env::temp_dir().join(format!("snug-sched-disk-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let (h, tok, gone) = start(&dir);
    let n_doc = tok.encode(DOC, true, false).len();
    let blocks = (n_doc - 1) / 32;
    assert!(blocks >= 2, "the prompt spans blocks ({n_doc} tokens)");
    let (cold, f) = finish(greedy(&h, &tok, DOC, 8));
    assert_eq!(f.n_cached, 0);
    stop(h, gone);
    assert!(block_files(&dir).len() >= blocks, "its blocks were written");

    // A restart: the blocks come back from disk, and the answer is the cold one.
    let (h, tok, gone) = start(&dir);
    let (warm, f) = finish(greedy(&h, &tok, DOC, 8));
    assert_eq!(f.n_cached, blocks * 32, "every full block came back");
    assert_eq!(warm, cold);
    stop(h, gone);

    // Every block file becomes a FIFO: a read of one waits until the test opens it.
    let files = block_files(&dir);
    for f in &files {
        fs::remove_file(f).unwrap();
        let made = std::process::Command::new("mkfifo").arg(f).status().expect("mkfifo runs");
        assert!(made.success());
    }
    let fifos = Fifos(files);
    let (h, tok, gone) = start(&dir);
    let mut stream = greedy(&h, &tok, "def fibonacci(n):", 64);
    assert!(matches!(stream.blocking_recv(), Some(Event::Text(_))), "the stream starts");
    let mut held = greedy(&h, &tok, DOC, 8);
    // The stream goes on while the other prompt's first block is being read (and held).
    let end = Instant::now() + Duration::from_secs(120);
    let mut pieces = 0;
    while pieces < 16 {
        match stream.try_recv() {
            Ok(Event::Text(_)) => pieces += 1,
            Ok(ev) => panic!("the stream ended early: {:?}", matches!(ev, Event::Done(_))),
            Err(TryRecvError::Empty) => {
                assert!(Instant::now() < end, "the stream stopped while blocks were read");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(TryRecvError::Disconnected) => panic!("the stream went away"),
        }
    }
    assert!(matches!(held.try_recv(), Err(TryRecvError::Empty)), "its read is still held");
    // Let the read go on: the FIFO is no block, so the prompt is computed, with the cold answer.
    fifos.release();
    let (again, f) = finish(held);
    assert_eq!(f.n_cached, 0);
    assert_eq!(again, cold);
    let (_, f) = finish(stream);
    assert!(f.n_gen > 16);
    stop(h, gone);
    let _ = fs::remove_dir_all(&dir);
}
