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

use ::kube::runtime::{WatchStreamExt, watcher};
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

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

/// Calls `each` with every object of `api` as it is applied (listed, added or
/// modified), until `cancel` or the watch ends; watch errors are logged with `what`
/// and the watcher retries with its backoff.
pub(crate) async fn for_each_applied<K>(
    api: ::kube::Api<K>,
    cancel: CancellationToken,
    what: &'static str,
    mut each: impl FnMut(K),
) where
    K: ::kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut events = watcher::watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
    loop {
        let next = tokio::select! {
            () = cancel.cancelled() => return,
            next = events.next() => next,
        };
        match next {
            Some(Ok(object)) => each(object),
            Some(Err(error)) => tracing::warn!(%error, what, "watch"),
            None => return,
        }
    }
}

/// One metric's value from a `/metrics` endpoint on loopback (plain HTTP/1.0).
pub(crate) async fn scrape(url: &str, metric: &str) -> Option<f64> {
    let rest = url.strip_prefix("http://")?;
    let (address, path) = rest.split_once('/').map_or((rest, "/"), |(a, p)| (a, p));
    let mut stream =
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(address)).await.ok()?.ok()?;
    let request =
        format!("GET /{} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n", path.trim_start_matches('/'));
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut body)).await.ok()?.ok()?;
    body.lines().find_map(|line| line.strip_prefix(metric)?.strip_prefix(' ')?.trim().parse().ok())
}
