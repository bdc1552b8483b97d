//! A progress bar on stderr, drawn only when stderr is a terminal (never in logs or CI).

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the bar is redrawn.
const REDRAW_MS: u64 = 200;
const BAR_WIDTH: usize = 40;

/// Shared counter of completed requests; the drawing task reads it.
#[derive(Clone)]
pub struct Progress {
    done: Arc<AtomicU64>,
    /// Whether the bar is finished, behind the lock every stderr write takes, so the final
    /// line is printed exactly once and nothing is drawn after it.
    finished: Arc<Mutex<bool>>,
    label: Arc<str>,
    drawing: Drawing,
    total: u64,
}

/// Whether a bar is drawn at all (only when stderr is a terminal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Drawing {
    Terminal,
    Off,
}

impl Progress {
    /// Starts drawing (on the current tokio runtime) if stderr is a terminal.
    pub fn start(label: &str, total: u64) -> Progress {
        // SAFETY: isatty only inspects the file descriptor.
        let is_tty = unsafe { libc::isatty(libc::STDERR_FILENO) } == 1;
        let progress = Progress {
            done: Arc::new(AtomicU64::new(0)),
            finished: Arc::new(Mutex::new(false)),
            label: Arc::from(label),
            drawing: if is_tty && total > 0 {
                Drawing::Terminal
            } else {
                Drawing::Off
            },
            total,
        };
        if progress.drawing == Drawing::Terminal {
            let drawer = progress.clone();
            tokio::spawn(async move {
                loop {
                    {
                        let finished = drawer.finished.lock().expect("no panics while drawing");
                        if *finished {
                            break;
                        }
                        eprint!("\r{}", render(&drawer.label, drawer.done(), drawer.total));
                        let _ = std::io::stderr().flush();
                    }
                    tokio::time::sleep(Duration::from_millis(REDRAW_MS)).await;
                }
            });
        }
        progress
    }

    pub fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Stops redrawing and prints the final state and a newline (once, whoever calls first).
    pub fn finish(&self) {
        let mut finished = self.finished.lock().expect("no panics while drawing");
        if !*finished && self.drawing == Drawing::Terminal {
            eprintln!("\r{}", render(&self.label, self.done(), self.total));
        }
        *finished = true;
    }
}

/// One line of the bar, e.g. `put [#####-----] 50/100 50%`.
pub fn render(label: &str, done: u64, total: u64) -> String {
    assert!(total > 0, "a progress bar needs a total");
    let done = done.min(total);
    let filled = (done as u128 * BAR_WIDTH as u128 / total as u128) as usize;
    assert!(filled <= BAR_WIDTH);
    format!(
        "{label} [{}{}] {done}/{total} {}%",
        "#".repeat(filled),
        "-".repeat(BAR_WIDTH - filled),
        done * 100 / total
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_fills_in_proportion() {
        let half = render("put", 50, 100);
        assert!(half.starts_with("put ["), "{half}");
        assert_eq!(half.matches('#').count(), BAR_WIDTH / 2);
        assert!(half.ends_with("50/100 50%"), "{half}");
        assert_eq!(render("x", 150, 100).matches('#').count(), BAR_WIDTH);
    }
}
