//! Watch streams: newline-delimited JSON events over a chunked response.
//! `resourceVersion` "" or "0" starts with synthetic ADDED events for the current
//! state; N replays the kept history after N, or sends an ERROR event with a 410
//! `Expired` Status when N is older than the watch window (see `store`; kube's
//! watcher then relists). Live events come from the resource's broadcast channel; a watcher
//! that falls behind it catches up from the history. Selector transitions are
//! reported as the real server does (MODIFIED out of the selection → DELETED,
//! into it → ADDED). BOOKMARKs are sent every second when asked for.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Frame;
use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use super::errors::ApiError;
use super::resources::ResourceInfo;
use super::selector::Filter;
use super::store::{Event, EventType, State, to_json};
use super::write::present;

const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);
/// kube-apiserver picks a random timeout of 30–60 minutes when none is given.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// A response body fed by a channel: one frame per watch event.
pub struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|item| item.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// What a watch asks for.
pub struct WatchSpec {
    pub info: Arc<ResourceInfo>,
    pub namespace: Option<String>,
    pub filter: Filter,
    /// None: start with the current state ("" or "0").
    pub since: Option<u64>,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
}

/// Starts the watch; the stream ends on timeout, shutdown, or client disconnect.
pub fn start(state: Arc<Mutex<State>>, spec: WatchSpec, stop: watch::Receiver<bool>) -> ChannelBody {
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(run(state, spec, tx, stop));
    ChannelBody(rx)
}

fn line(kind: &str, object: &Value) -> Bytes {
    line_from_json(kind, &to_json(object))
}

fn line_from_json(kind: &str, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(json);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// The event line of `object`, from its stored JSON when the version matches.
fn object_line(info: &ResourceInfo, kind: &str, object: &Arc<Value>, json: Option<&Bytes>) -> Bytes {
    let presented = present(info, object);
    match json {
        Some(json) if Arc::ptr_eq(&presented, object) => line_from_json(kind, json),
        _ => line(kind, &presented),
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl WatchSpec {
    fn in_scope(&self, object: &Value) -> bool {
        self.selects(super::meta::labels(object), object)
    }

    /// Whether `object`'s name and namespace with `labels` are in this watch's scope.
    fn selects(&self, labels: Option<&Map<String, Value>>, object: &Value) -> bool {
        self.filter.labels.matches_labels(labels)
            && self.filter.fields.matches(object)
            && self.namespace.as_deref().is_none_or(|ns| super::meta::meta_str(object, "namespace") == ns)
    }

    /// The line a committed event becomes for this watcher, if any.
    fn render(&self, event: &Event) -> Option<Bytes> {
        let now_in = self.in_scope(&event.object);
        // Names and namespaces never change: only the labels can move an object
        // into or out of the selection.
        let was_in = event.old_labels.as_ref().is_some_and(|labels| self.selects(Some(labels), &event.object));
        let kind = match event.kind {
            EventType::Added if now_in => EventType::Added,
            EventType::Deleted if now_in => EventType::Deleted,
            EventType::Modified if now_in && was_in => EventType::Modified,
            EventType::Modified if now_in => EventType::Added,
            EventType::Modified if was_in => EventType::Deleted,
            _ => return None,
        };
        if event.kind == EventType::Modified && kind == EventType::Deleted {
            // Leaving the selection: the previous content at the change's version.
            let mut previous: Value =
                event.old_json.as_deref().and_then(|json| serde_json::from_slice(json).ok()).unwrap_or(Value::Null);
            super::meta::metadata_mut(&mut previous)
                .insert("resourceVersion".into(), Value::String(event.rv.to_string()));
            return Some(line("DELETED", &present(&self.info, &Arc::new(previous))));
        }
        Some(object_line(&self.info, kind.as_str(), &event.object, Some(&event.json)))
    }

    fn bookmark(&self, rv: u64) -> Bytes {
        let object = json!({
            "kind": self.info.kind,
            "apiVersion": self.info.api_version(),
            "metadata": { "resourceVersion": rv.to_string(), "creationTimestamp": null }
        });
        line("BOOKMARK", &object)
    }
}

enum Start {
    Lines(Vec<Bytes>, u64, broadcast::Receiver<Arc<Event>>),
    Expired(Bytes),
}

/// Events after `since` and a receiver for what follows, atomically: every
/// event up to the current resourceVersion is in the history, later ones will
/// arrive on the receiver.
fn resume(state: &Mutex<State>, spec: &WatchSpec, since: u64) -> Start {
    let mut guard = lock(state);
    let current = guard.current_rv();
    guard.expire(&spec.info.storage_key());
    let table = guard.table(&spec.info.storage_key());
    match table.events_after(since) {
        Ok(events) => {
            let lines = events.iter().filter_map(|e| spec.render(e)).collect();
            Start::Lines(lines, since.max(current), table.subscribe())
        }
        Err(oldest) => {
            guard.count_expired_watch();
            Start::Expired(line("ERROR", &ApiError::expired(since, oldest).status()))
        }
    }
}

fn initial(state: &Mutex<State>, spec: &WatchSpec) -> Start {
    let mut guard = lock(state);
    let current = guard.current_rv();
    let table = guard.table(&spec.info.storage_key());
    let lines = table
        .range(spec.namespace.as_deref(), None)
        .filter(|(_, object)| spec.filter.matches(object))
        .map(|(key, object)| object_line(&spec.info, "ADDED", object, table.json_of(key)))
        .collect();
    Start::Lines(lines, current, table.subscribe())
}

/// One watcher's position and output.
struct Watcher {
    state: Arc<Mutex<State>>,
    spec: WatchSpec,
    tx: mpsc::Sender<Bytes>,
    last_rv: u64,
    receiver: broadcast::Receiver<Arc<Event>>,
}

/// Why a watch stream ends.
struct Ended;

impl Watcher {
    async fn send(&self, line: Bytes) -> Result<(), Ended> {
        self.tx.send(line).await.map_err(|_| Ended)
    }

    async fn deliver(&mut self, event: &Event) -> Result<(), Ended> {
        if event.rv <= self.last_rv {
            return Ok(());
        }
        self.last_rv = event.rv;
        match self.spec.render(event) {
            Some(line) => self.send(line).await,
            None => Ok(()),
        }
    }

    /// After falling behind the channel: replay from the history, or 410.
    async fn recover(&mut self) -> Result<(), Ended> {
        match resume(&self.state, &self.spec, self.last_rv) {
            Start::Lines(lines, last, fresh) => {
                self.receiver = fresh;
                self.last_rv = last;
                for line in lines {
                    self.send(line).await?;
                }
                Ok(())
            }
            Start::Expired(error) => {
                let _ = self.send(error).await;
                Err(Ended)
            }
        }
    }

    async fn on_received(&mut self, received: Result<Arc<Event>, broadcast::error::RecvError>) -> Result<(), Ended> {
        match received {
            Ok(event) => self.deliver(&event).await,
            Err(broadcast::error::RecvError::Lagged(_)) => self.recover().await,
            Err(broadcast::error::RecvError::Closed) => Err(Ended),
        }
    }

    async fn bookmark(&mut self) -> Result<(), Ended> {
        let current = lock(&self.state).current_rv();
        // Everything committed up to `current` is already in the channel: drain it.
        loop {
            match self.receiver.try_recv() {
                Ok(event) => self.deliver(&event).await?,
                Err(broadcast::error::TryRecvError::Lagged(_)) => return self.recover().await,
                Err(_) => break,
            }
        }
        self.last_rv = self.last_rv.max(current);
        let line = self.spec.bookmark(self.last_rv);
        self.send(line).await
    }
}

async fn run(state: Arc<Mutex<State>>, spec: WatchSpec, tx: mpsc::Sender<Bytes>, mut stop: watch::Receiver<bool>) {
    let start = match spec.since {
        None => initial(&state, &spec),
        Some(since) => resume(&state, &spec, since),
    };
    let (lines, last_rv, receiver) = match start {
        Start::Lines(lines, last, receiver) => (lines, last, receiver),
        Start::Expired(error) => {
            let _ = tx.send(error).await;
            return;
        }
    };
    let timeout = spec.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let bookmarks = spec.bookmarks;
    let mut watcher = Watcher { state, spec, tx, last_rv, receiver };
    for line in lines {
        if watcher.send(line).await.is_err() {
            return;
        }
    }
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut ticker = tokio::time::interval(BOOKMARK_INTERVAL);
    ticker.tick().await;
    loop {
        let step = tokio::select! {
            received = watcher.receiver.recv() => watcher.on_received(received).await,
            _ = ticker.tick(), if bookmarks => watcher.bookmark().await,
            _ = &mut deadline => Err(Ended),
            _ = stop.changed() => Err(Ended),
            _ = watcher.tx.closed() => Err(Ended),
        };
        if step.is_err() {
            return;
        }
    }
}
