//! The LISTEN helper: one dedicated connection per process (never a pooled one,
//! which would drop notifications), reconnecting with backoff.
//!
//! Consumers subscribe to a channel and get a `watch` receiver whose value changes
//! on every notification *and* after every (re)connect, so they scan whenever
//! something may have been missed. Notifications are only hints: consumers also
//! scan on start and on a timer.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use crate::db::{ConnectConfig, DbError};
use crate::signal::Signal;

/// A running listener. Dropping it does not stop it; cancel its token.
#[derive(Clone)]
pub struct Listener {
    wakers: Arc<HashMap<String, watch::Sender<u64>>>,
    connected: watch::Receiver<bool>,
    reconnects: Arc<AtomicU64>,
}

impl Listener {
    /// Starts listening on the channels of `signals` over its own connection to
    /// `url`, until `cancel` fires. Returns at once; the first connection is made
    /// in the background (see `wait_connected`).
    pub fn start(url: &str, signals: &[Signal], cancel: CancellationToken) -> Result<Self, DbError> {
        let mut config = ConnectConfig::parse(url)?;
        config.config.application_name("gitops-listener");
        config.config.keepalives(true);
        config.config.keepalives_idle(Duration::from_secs(30));
        let channels: Vec<String> = signals.iter().map(Signal::channel).collect();
        let wakers: HashMap<String, watch::Sender<u64>> =
            channels.iter().map(|c| (c.clone(), watch::channel(0).0)).collect();
        let wakers = Arc::new(wakers);
        let (connected_tx, connected) = watch::channel(false);
        let reconnects = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(config, channels, wakers.clone(), connected_tx, reconnects.clone(), cancel));
        Ok(Listener { wakers, connected, reconnects })
    }

    /// A receiver that changes whenever `signal` may have new work. Mark the value
    /// seen (`borrow_and_update`) *before* scanning, so that a notification arriving
    /// during the scan is not lost.
    pub fn subscribe(&self, signal: &Signal) -> Option<watch::Receiver<u64>> {
        self.wakers.get(&signal.channel()).map(watch::Sender::subscribe)
    }

    /// How many times the connection was re-established after a loss.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// Whether the LISTEN connection is up right now.
    pub fn is_connected(&self) -> bool {
        *self.connected.borrow()
    }

    /// Waits until the LISTEN connection is up (or `timeout` passes).
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let mut connected = self.connected.clone();
        tokio::time::timeout(timeout, connected.wait_for(|up| *up)).await.is_ok_and(|r| r.is_ok())
    }

    fn wake_all(wakers: &HashMap<String, watch::Sender<u64>>) {
        for waker in wakers.values() {
            waker.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Short on purpose: the time from the database's return to the first notification
/// heard is at most this, and one connection attempt per interval costs nothing.
const BACKOFF_MAX: Duration = Duration::from_secs(2);

async fn run(
    config: ConnectConfig,
    channels: Vec<String>,
    wakers: Arc<HashMap<String, watch::Sender<u64>>>,
    connected: watch::Sender<bool>,
    reconnects: Arc<AtomicU64>,
    cancel: CancellationToken,
) {
    let mut backoff = BACKOFF_MIN;
    let mut failures: u32 = 0;
    let mut ever_connected = false;
    while !cancel.is_cancelled() {
        let up = || {
            if ever_connected {
                reconnects.fetch_add(1, Ordering::Relaxed);
            }
            ever_connected = true;
        };
        let pause = match listen_once(&config, &channels, &wakers, &connected, &cancel, up).await {
            Ok(()) => {
                backoff = BACKOFF_MIN;
                failures = 0;
                BACKOFF_MIN
            }
            Err(error) => {
                // One warning when the connection goes, then one every ten attempts.
                if failures.is_multiple_of(10) {
                    tracing::warn!(%error, attempts = failures + 1, retry_in_ms = backoff.as_millis() as u64, "LISTEN connection failed");
                } else {
                    tracing::debug!(%error, retry_in_ms = backoff.as_millis() as u64, "LISTEN connection failed");
                }
                failures += 1;
                let pause = backoff;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                pause
            }
        };
        connected.send_replace(false);
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// One connection's life: connect, LISTEN, forward notifications until it ends.
/// Ok means it was up and then lost (or cancelled).
async fn listen_once(
    config: &ConnectConfig,
    channels: &[String],
    wakers: &HashMap<String, watch::Sender<u64>>,
    connected: &watch::Sender<bool>,
    cancel: &CancellationToken,
    on_up: impl FnOnce(),
) -> Result<(), DbError> {
    let (client, mut connection) =
        config.config.connect(config.tls.clone()).await.map_err(|source| DbError::Connect { source })?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<String>>();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    let _ = tx.send(Some(n.channel().to_owned()));
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "LISTEN connection lost");
                    break;
                }
            }
        }
        let _ = tx.send(None);
    });
    let mut statement = String::new();
    for channel in channels {
        // Channel names are derived from enum names and numbers (Signal::channel),
        // so they are plain identifiers; quoting keeps them case-exact.
        debug_assert!(channel.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        statement.push_str(&format!("LISTEN \"{channel}\";"));
    }
    let listened = client.batch_execute(&statement).await;
    if let Err(source) = listened {
        driver.abort();
        return Err(DbError::Query { action: "LISTEN", source });
    }
    on_up();
    connected.send_replace(true);
    // Anything sent while we were away is only findable by scanning: wake everyone.
    Listener::wake_all(wakers);
    tracing::info!(channels = channels.len(), "LISTEN connection up");
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            message = rx.recv() => match message {
                Some(Some(channel)) => {
                    if let Some(waker) = wakers.get(&channel) {
                        waker.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
                Some(None) | None => break,
            }
        }
    }
    drop(client);
    driver.abort();
    Ok(())
}
