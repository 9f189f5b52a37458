//! Prompt processing as a progress bar on stderr (tokens read of the total, tokens per second),
//! for the verbs that stream an answer to stdout.
//!
//! The bar appears only when stderr is a terminal and the prompt is still being read after
//! [`DELAY`] (a short prompt draws nothing), and it is cleared before the first piece of the answer
//! so it never mixes with the text. Cost: a sleeping thread per prompt that outlives it by at most
//! [`DELAY`], and a redraw five times a second while shown; the position moves a micro-batch
//! (`--ubatch`) at a time, as the engine reports it.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long a prompt may take before its bar appears.
pub const DELAY: Duration = Duration::from_secs(2);

pub struct PromptBar {
    bar: ProgressBar,
    t0: Instant,
    /// Set once the prompt is read; the timer reveals the bar only while it is unset.
    finished: Arc<Mutex<bool>>,
}

impl PromptBar {
    /// A hidden bar for a prompt of `n_tokens` (the engine's first report may lower it to the
    /// tokens not already cached), revealed after [`DELAY`] if stderr is a terminal and prompt
    /// processing has not finished by then.
    pub fn start(n_tokens: usize) -> PromptBar {
        let bar =
            ProgressBar::with_draw_target(Some(n_tokens as u64), ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("prompt [{bar:25}] {pos}/{len} tok {msg} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let finished = Arc::new(Mutex::new(false));
        if std::io::stderr().is_terminal() {
            let (bar, finished) = (bar.clone(), Arc::clone(&finished));
            std::thread::spawn(move || {
                std::thread::sleep(DELAY);
                let done = finished.lock().unwrap_or_else(|p| p.into_inner());
                if !*done {
                    bar.set_draw_target(ProgressDrawTarget::stderr());
                    bar.enable_steady_tick(Duration::from_millis(200));
                }
            });
        }
        PromptBar { bar, t0: Instant::now(), finished }
    }

    /// `done` of `total` prompt tokens computed; the last call (done == total) clears the bar.
    /// The rate shown is the average since the start: the position moves a micro-batch at a
    /// time, which indicatif's own moving rate would read as stalls.
    pub fn update(&self, done: usize, total: usize) {
        self.bar.set_length(total as u64);
        self.bar.set_position(done as u64);
        let secs = self.t0.elapsed().as_secs_f64();
        if secs > 0.0 {
            self.bar.set_message(format!("{:.1} tok/s", done as f64 / secs));
        }
        if done >= total {
            self.finish();
        }
    }

    fn finish(&self) {
        let mut done = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        *done = true;
        self.bar.finish_and_clear();
    }
}

impl Drop for PromptBar {
    /// An error mid-prompt leaves no bar behind.
    fn drop(&mut self) {
        self.finish();
    }
}
