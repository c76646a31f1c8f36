//! The controllers' watchers: one per kind of tenant resource, the namespaces'
//! (UIDs, labels, deletions) and the credential Secrets' (metadata only), feeding
//! the work queue with the keys of objects in namespaces whose shard this writer
//! owns; and the re-queueing of every known object of a shard gained.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::StreamExt;
use gitops_shared::telemetry::error_chain;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Resource;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::condition::HasConditions;
use super::{CONDITION, Controllers, Seen, events, namespace, namespace_key, namespace_state_of, object};
use crate::shard::shard_of;
use crate::work_queue::{Key, Kind};

/// The next item of a watch stream; None once `cancel` fires or the stream ends.
pub(crate) async fn next_or_cancelled<S: futures_util::Stream + Unpin>(
    events: &mut S,
    cancel: &CancellationToken,
) -> Option<S::Item> {
    tokio::select! {
        () = cancel.cancelled() => None,
        event = events.next() => event,
    }
}

/// After a (re)listing: removes from `store` the entries `relevant` to that watch
/// that the listing did not bring back (they went while it was not watching), and
/// returns their keys.
fn drop_unlisted<K, V>(store: &mut HashMap<K, V>, listing: &HashSet<K>, relevant: impl Fn(&K) -> bool) -> Vec<K>
where
    K: Clone + Eq + std::hash::Hash,
{
    let gone: Vec<K> = store.keys().filter(|key| relevant(key) && !listing.contains(*key)).cloned().collect();
    for key in &gone {
        store.remove(key);
    }
    gone
}

/// Whether the writer finished with `object` as it is: not being deleted, holding
/// the finalizer, and accepted at its current generation.
fn settled<K: Resource + HasConditions>(object: &K) -> bool {
    let meta = object.meta();
    meta.deletion_timestamp.is_none()
        && object::has_finalizer(object)
        && object.conditions().iter().any(|c| {
            c.type_ == CONDITION
                && c.status == "False"
                && c.observed_generation.is_some()
                && c.observed_generation == meta.generation
        })
}

pub(super) async fn watch_kind<K>(ctl: Arc<Controllers>, scope: Option<String>, kind: Kind, cancel: CancellationToken)
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + HasConditions
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = match &scope {
        Some(namespace) => Api::namespaced(ctl.ctx.kube.clone(), namespace),
        None => Api::all(ctl.ctx.kube.clone()),
    };
    let mut events = watcher::watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut synced = false;
    // Keys seen in the listing under way: a relist drops objects that went meanwhile.
    let mut listing: HashSet<Key> = HashSet::new();
    // A SyncRun also waits on its deployment and its sync: always look again.
    let filter_settled = kind != Kind::SyncRun;
    while let Some(event) = next_or_cancelled(&mut events, &cancel).await {
        let key = |object: &K| Key {
            kind,
            namespace: object.meta().namespace.clone().unwrap_or_default(),
            name: object.meta().name.clone().unwrap_or_default(),
        };
        match event {
            Ok(Event::Apply(object)) => {
                let key = key(&object);
                let seen = Seen::of(&object);
                let before = ctl.known().insert(key.clone(), seen.clone());
                // Unserved namespaces get their condition and nothing else, no Events either.
                if let Some(before) = before
                    && ctl.owns(&key.namespace)
                    && ctl.serves(&key.namespace).is_ok()
                {
                    events::publish_changes(&ctl, &object, &before.shown, &seen.shown);
                }
                // Our own writes (finalizer, condition) and the status loop's come
                // back as events; an object already settled at its generation has
                // nothing new for the writer, nor has the finalizer write of a
                // reconcile that goes on from it. Other causes (a Secret, an
                // environment, a shard move) queue keys directly.
                let finalizer = ctl.finalizing_marks().event(&key, object.meta().resource_version.as_deref());
                let nothing_new = finalizer || (filter_settled && settled(&object));
                if !nothing_new {
                    ctl.offer(key);
                }
            }
            Ok(Event::InitApply(object)) => {
                // Everything is looked at once after a (re)start.
                let key = key(&object);
                ctl.known().insert(key.clone(), Seen::of(&object));
                listing.insert(key.clone());
                ctl.offer(key);
            }
            Ok(Event::Delete(object)) => {
                let key = key(&object);
                ctl.known().remove(&key);
                ctl.finalizing_marks().forget(&key);
                if ctl.owns(&key.namespace) && ctl.serves(&key.namespace).is_ok() {
                    events::publish_deleted(&ctl, &object);
                }
                ctl.offer(key);
            }
            Ok(Event::InitDone) => {
                let in_scope = |key: &Key| key.kind == kind && scope.as_ref().is_none_or(|only| *only == key.namespace);
                let gone = drop_unlisted(&mut ctl.known(), &listing, in_scope);
                listing = HashSet::new();
                for key in gone {
                    ctl.offer(key);
                }
                ctl.relisting().remove(&(kind, scope.clone()));
                ctl.first_listing_done(&mut synced);
            }
            Ok(Event::Init) => {
                ctl.relisting().insert((kind, scope.clone()));
                listing.clear();
            }
            Err(error) => tracing::warn!(%error, ?kind, "watch failed; retrying"),
        }
    }
}

/// Keeps `namespace_states` and queues the cleanup of each namespace that starts
/// terminating or goes; after the first listing, looks for tenants whose namespace
/// went while no writer watched.
pub(super) async fn watch_namespaces(ctl: Arc<Controllers>, scope: Option<String>, cancel: CancellationToken) {
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(ctl.ctx.kube.clone());
    let config = match &scope {
        Some(namespace) => watcher::Config::default().fields(&format!("metadata.name={namespace}")),
        None => watcher::Config::default(),
    };
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut synced = false;
    // Names seen in the listing under way (a relist drops namespaces that went meanwhile).
    let mut listing: HashSet<String> = HashSet::new();
    while let Some(event) = next_or_cancelled(&mut events, &cancel).await {
        match event {
            Ok(Event::Apply(object) | Event::InitApply(object)) => {
                let name = object.metadata.name.clone().unwrap_or_default();
                let Ok(state) = namespace_state_of(&object.metadata) else { continue };
                listing.insert(name.clone());
                let (terminating, uid) = (state.terminating, state.uid);
                let labels = object.metadata.labels.clone().unwrap_or_default();
                let labels_before = ctl.ctx.served.remember(&name, labels.clone());
                let before = ctl.namespace_states().insert(name.clone(), state);
                // Terminating, or made again under the same name: the old tenant goes.
                let replaced = before.as_ref().is_some_and(|b| b.uid != uid);
                if terminating || replaced {
                    ctl.offer(namespace_key(&name));
                }
                // Selected or unselected by a label change: look at its objects again.
                if labels_before.is_some_and(|b| b != labels) {
                    ctl.namespace_again(&name);
                }
            }
            Ok(Event::Delete(object)) => {
                let name = object.metadata.name.clone().unwrap_or_default();
                ctl.namespace_states().remove(&name);
                ctl.ctx.served.forget(&name);
                ctl.offer(namespace_key(&name));
            }
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitDone) => {
                let in_scope = |name: &String| scope.as_ref().is_none_or(|only| only == name);
                let gone = drop_unlisted(&mut ctl.namespace_states(), &listing, in_scope);
                for name in gone {
                    ctl.offer(namespace_key(&name));
                }
                ctl.first_listing_done(&mut synced);
                if let Err(error) = namespace::queue_missing(&ctl).await {
                    tracing::warn!(error = %error_chain(&error), "could not look for tenants of deleted namespaces");
                }
            }
            Err(error) => tracing::warn!(%error, "namespace watch failed; retrying"),
        }
    }
}

/// Queues the referrers of each Secret that is created, changed or deleted.
pub(super) async fn watch_secrets(ctl: Arc<Controllers>, scope: Option<String>, cancel: CancellationToken) {
    // Only names matter here (metadata-only requests); the reconcile reads the Secret.
    let api: Api<PartialObjectMeta<Secret>> = match &scope {
        Some(namespace) => Api::namespaced(ctl.ctx.kube.clone(), namespace),
        None => Api::all(ctl.ctx.kube.clone()),
    };
    let mut events = watcher::watcher(api, watcher::Config::default()).default_backoff().boxed();
    while let Some(event) = next_or_cancelled(&mut events, &cancel).await {
        match event {
            Ok(Event::Apply(object) | Event::InitApply(object) | Event::Delete(object)) => {
                let namespace = object.metadata.namespace.unwrap_or_default();
                if ctl.owns(&namespace) {
                    ctl.secret_changed(&namespace, &object.metadata.name.unwrap_or_default());
                }
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "Secret watch failed; retrying"),
        }
    }
}

pub(super) async fn requeue_on_shard_change(
    ctl: Arc<Controllers>,
    mut shards: watch::Receiver<Vec<i32>>,
    cancel: CancellationToken,
) {
    let mut before: BTreeSet<i32> = BTreeSet::new();
    loop {
        let now: BTreeSet<i32> = shards.borrow_and_update().iter().copied().collect();
        ctl.ctx.metrics.shards_owned.store(now.len() as u64, Ordering::Relaxed);
        let gained: BTreeSet<i32> = now.difference(&before).copied().collect();
        if !gained.is_empty() {
            let keys: Vec<Key> =
                ctl.known().keys().filter(|k| gained.contains(&shard_of(&k.namespace))).cloned().collect();
            ctl.resync_wanted.notify_one();
            for key in keys {
                ctl.offer(key);
            }
            // Tenants of the new shards whose namespace went while no writer watched.
            if ctl.ctx.metrics.is_ready()
                && let Err(error) = namespace::queue_missing(&ctl).await
            {
                tracing::warn!(error = %error_chain(&error), "could not look for tenants of deleted namespaces");
            }
        }
        before = now;
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = shards.changed() => if changed.is_err() { return },
        }
    }
}
