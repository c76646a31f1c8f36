//! Anti-entropy: the rows of the shards this writer owns are compared, by UID,
//! with the tenant resources its watchers hold — at start, whenever shards are
//! gained, and every `resync_interval`. A live row whose resource is gone (its
//! finalizer was stripped while no writer watched, say) is tombstoned and its
//! deletion enqueued, as the deletion path would have done; a resource without a
//! row, or whose row is of an older generation, is queued for reconcile.
//!
//! It must never delete by mistake, so a pass compares only watch stores whose
//! listing completed since their last relist, only rows of namespaces the writer
//! serves and knows, and only on the cluster it first saw (the `kube-system`
//! namespace's UID); each candidate is read once more before it is tombstoned,
//! and a pass with more candidates than `resync_max_tombstones` tombstones none.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gitops_shared::db::pooled;
use gitops_shared::db::resync::{ResyncRow, resync_rows_page};
use gitops_shared::db::tombstone::TombstoneOf;
use gitops_shared::telemetry::error_chain;
use k8s_openapi::api::core::v1::Namespace;
use kube::Resource;
use kube::api::Api;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::credential::tombstone_and_enqueue;
use super::{Controllers, ReconcileError};
use crate::api::{
    GitOpsDeployment, GitOpsDeploymentManagedEnvironment, GitOpsDeploymentRepositoryCredential, GitOpsDeploymentSyncRun,
};
use crate::work_queue::{Key, Kind};

/// Rows read per statement.
const PAGE: i64 = 1000;
/// How soon a pass that could not run (watchers relisting, not ready) is tried again.
const NOT_YET: Duration = Duration::from_secs(5);
/// The namespace whose UID identifies the cluster.
const CLUSTER_IDENTITY: &str = "kube-system";

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResyncReport {
    pub rows: usize,
    pub tombstoned: usize,
    pub requeued: usize,
}

/// Why a pass did not act.
#[derive(Debug, thiserror::Error)]
pub enum ResyncRefused {
    #[error("the writer's watchers have not listed since their last relist")]
    NotListed,
    #[error("the cluster is not the one the writer started on (kube-system's UID changed)")]
    OtherCluster,
    #[error("{candidates} rows of gone resources are more than the {cap} one pass may tombstone")]
    TooMany { candidates: usize, cap: usize },
    #[error(transparent)]
    Failed(#[from] ReconcileError),
}

impl ResyncRefused {
    fn reason(&self) -> &'static str {
        match self {
            ResyncRefused::NotListed => "not_listed",
            ResyncRefused::OtherCluster => "other_cluster",
            ResyncRefused::TooMany { .. } => "too_many_tombstones",
            ResyncRefused::Failed(_) => "failed",
        }
    }
}

fn table(kind: Kind) -> Option<TombstoneOf> {
    match kind {
        Kind::Deployment => Some(TombstoneOf::Application),
        Kind::SyncRun => Some(TombstoneOf::SyncOperation),
        Kind::Environment => Some(TombstoneOf::ManagedEnvironment),
        Kind::RepositoryCredential => Some(TombstoneOf::RepositoryCredential),
        Kind::Namespace => None,
    }
}

/// Runs a pass at start, when shards are gained and every `resync_interval`.
pub(super) async fn resync_loop(ctl: Arc<Controllers>, cancel: CancellationToken) {
    let mut cluster: Option<Uuid> = None;
    let mut next = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
            () = ctl.resync_wanted.notified() => {}
        }
        next = tokio::time::Instant::now() + ctl.settings.resync_interval;
        if !ctl.ctx.metrics.is_ready() || ctl.shards.borrow().is_empty() {
            next = tokio::time::Instant::now() + NOT_YET;
            continue;
        }
        match resync_pass(&ctl, &mut cluster).await {
            Ok(report) => {
                if report.tombstoned + report.requeued > 0 {
                    tracing::info!(
                        rows = report.rows,
                        tombstoned = report.tombstoned,
                        requeued = report.requeued,
                        "anti-entropy repaired rows and resources"
                    );
                }
            }
            Err(refused) => {
                ctl.ctx.metrics.resync_refused(refused.reason());
                match &refused {
                    ResyncRefused::NotListed => next = tokio::time::Instant::now() + NOT_YET,
                    ResyncRefused::Failed(error) => {
                        tracing::warn!(error = %error_chain(error), "anti-entropy pass failed; trying again soon");
                        next = tokio::time::Instant::now() + NOT_YET;
                    }
                    other => tracing::error!(%other, "anti-entropy refused to act"),
                }
            }
        }
    }
}

/// One pass over every tenant-resource kind of the owned shards.
pub async fn resync_pass(ctl: &Arc<Controllers>, cluster: &mut Option<Uuid>) -> Result<ResyncReport, ResyncRefused> {
    if !ctl.relisting().is_empty() {
        return Err(ResyncRefused::NotListed);
    }
    let namespaces: Api<Namespace> = Api::all(ctl.ctx.kube.clone());
    let identity = namespaces
        .get(CLUSTER_IDENTITY)
        .await
        .map_err(|source| ReconcileError::Kube { action: "read the kube-system namespace", source })?;
    let uid = super::uid(&identity.metadata)?;
    if *cluster.get_or_insert(uid) != uid {
        return Err(ResyncRefused::OtherCluster);
    }
    let shards: Vec<i32> = ctl.shards.borrow().clone();
    let mut report = ResyncReport::default();
    let mut candidates: Vec<(Kind, Key, Uuid)> = Vec::new();
    for kind in Kind::TENANT_RESOURCES {
        let Some(table) = table(kind) else { continue };
        let mut with_rows: HashSet<Uuid> = HashSet::new();
        let mut stale: Vec<Key> = Vec::new();
        let mut after = 0;
        loop {
            let page = {
                let client = pooled(&ctl.ctx.pool).await.map_err(ReconcileError::from)?;
                resync_rows_page(&client, table, &shards, after, PAGE).await.map_err(ReconcileError::from)?
            };
            let Some(last) = page.last() else { break };
            after = last.id;
            report.rows += page.len();
            // Other locks are taken before `known`, never while it is held.
            let rows: Vec<&ResyncRow> = page.iter().filter(|row| comparable(ctl, row)).collect();
            let known = ctl.known();
            for row in rows {
                with_rows.insert(row.resource_uid);
                let key = Key { kind, namespace: row.namespace.clone(), name: row.resource_name.clone() };
                match known.get(&key) {
                    Some(seen) if seen.uid == Some(row.resource_uid) => {
                        if seen.generation.is_some_and(|g| g > row.generation) {
                            stale.push(key);
                        }
                    }
                    _ => candidates.push((kind, key, row.resource_uid)),
                }
            }
            if (page.len() as i64) < PAGE {
                break;
            }
        }
        // Resources in served namespaces of the owned shards without a row.
        let without_row: Vec<Key> = ctl
            .known()
            .iter()
            .filter(|(key, seen)| key.kind == kind && seen.uid.is_some_and(|uid| !with_rows.contains(&uid)))
            .map(|(key, _)| key.clone())
            .collect();
        let missing: Vec<Key> = without_row
            .into_iter()
            .filter(|key| ctl.owns(&key.namespace) && ctl.serves(&key.namespace).is_ok())
            .collect();
        let requeued = (stale.len() + missing.len()) as u64;
        for key in stale.into_iter().chain(missing) {
            ctl.offer(key);
        }
        ctl.ctx.metrics.resync_repaired(kind, "requeued", requeued);
        report.requeued += requeued as usize;
    }
    let cap = ctl.settings.resync_max_tombstones;
    if candidates.len() > cap {
        return Err(ResyncRefused::TooMany { candidates: candidates.len(), cap });
    }
    for (kind, key, uid) in candidates {
        if still_there(ctl, &key, uid).await? {
            continue;
        }
        let Some(table) = table(kind) else { continue };
        if tombstone_and_enqueue(ctl, &key.namespace, uid, table).await? {
            tracing::warn!(
                tenant.ns = %key.namespace, resource.kind = kind.name(), resource.name = %key.name, resource.uid = %uid,
                "the resource of a live row is gone: row tombstoned and its deletion enqueued"
            );
            ctl.ctx.metrics.resync_repaired(kind, "tombstoned", 1);
            report.tombstoned += 1;
        }
    }
    ctl.ctx.metrics.resync_passes.fetch_add(1, Ordering::Relaxed);
    Ok(report)
}

/// Whether a row of `row`'s namespace may be compared: owned, served, and its
/// namespace live and known (a namespace that went is the namespace cleanup's).
fn comparable(ctl: &Controllers, row: &ResyncRow) -> bool {
    ctl.owns(&row.namespace)
        && ctl.serves(&row.namespace).is_ok()
        && ctl.namespace_cached(&row.namespace).is_some_and(|state| !state.terminating)
}

/// Reads the resource behind a candidate: true when it exists with `uid` (the watch
/// is behind; nothing to repair).
async fn still_there(ctl: &Controllers, key: &Key, uid: Uuid) -> Result<bool, ReconcileError> {
    match key.kind {
        Kind::Deployment => has_uid::<GitOpsDeployment>(ctl, key, uid).await,
        Kind::SyncRun => has_uid::<GitOpsDeploymentSyncRun>(ctl, key, uid).await,
        Kind::Environment => has_uid::<GitOpsDeploymentManagedEnvironment>(ctl, key, uid).await,
        Kind::RepositoryCredential => has_uid::<GitOpsDeploymentRepositoryCredential>(ctl, key, uid).await,
        Kind::Namespace => Ok(true),
    }
}

async fn has_uid<K>(ctl: &Controllers, key: &Key, uid: Uuid) -> Result<bool, ReconcileError>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctl.ctx.kube.clone(), &key.namespace);
    let object = api
        .get_opt(&key.name)
        .await
        .map_err(|source| ReconcileError::Kube { action: "read a resource before tombstoning its row", source })?;
    Ok(object.is_some_and(|o| o.meta().uid.as_deref() == Some(uid.to_string().as_str())))
}
