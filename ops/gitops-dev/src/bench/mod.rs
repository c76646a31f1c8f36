//! Benchmarks: programs, not tests, that print figures as JSON on stdout and their
//! progress on stderr. Tests assert behaviour; these measure it.

pub mod appstudio;
pub mod chaos;
pub mod cpu;
pub mod e2e;
pub mod failover;
pub mod kube;
pub mod queue;
pub mod soak;

use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::up::{DevError, DevStack};

/// How often [`wait_until`] prints progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Why [`wait_until`] gave up.
pub(crate) enum WaitFailed {
    /// A child process of the stack stopped.
    Child(DevError),
    /// The deadline passed (or the watches ended) with only `got` counted.
    Deadline { got: usize },
}

/// Waits until `count` of what the benchmark's watches have `seen` reaches `want`;
/// returns when. Prints `progress` every few seconds, and gives up when a child of
/// the stack exits or `deadline` passes.
pub(crate) async fn wait_until<S>(
    stack: &mut DevStack,
    deadline: Duration,
    mut seen: watch::Receiver<S>,
    count: impl Fn(&S) -> usize,
    want: usize,
    progress: impl Fn(&S) -> String,
) -> Result<Instant, WaitFailed> {
    let until = tokio::time::Instant::now() + deadline;
    let mut ticks = tokio::time::interval(PROGRESS_EVERY);
    loop {
        let mut report = false;
        tokio::select! {
            done = seen.wait_for(|s| count(s) >= want) => {
                if done.is_ok() {
                    return Ok(Instant::now());
                }
            }
            _ = ticks.tick() => report = true,
            () = tokio::time::sleep_until(until) => {}
        }
        if report {
            stack.check_children().map_err(WaitFailed::Child)?;
            eprintln!("  {}", progress(&seen.borrow()));
        }
        if tokio::time::Instant::now() >= until || seen.has_changed().is_err() {
            return Err(WaitFailed::Deadline { got: count(&seen.borrow()) });
        }
    }
}
