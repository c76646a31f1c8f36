//! Status back: consumes the engine's status stream (`Engine::status_events`) and
//! copies what the engine reports about the service's applications into
//! `application_state` (only when something changed) and the progress of
//! requested syncs into their `sync_operation` rows. Engine-neutral: the engine
//! parses its own objects; this maps observations to rows.
//!
//! An engine may report an application many times without a change (Argo CD's
//! Application has no status subresource, so every status write is a watch
//! event); an unchanged observation is dropped in memory first and by the
//! database's `IS DISTINCT FROM` second, so the writers are woken only for real
//! changes. The memory is a digest per Application of what was last written, not
//! the observation: its JSON (resources, operation state) is most of its size,
//! and there is one per Application of the instance.
//!
//! An observation that cannot be written (the database restarting, say) is kept —
//! the latest one per Application — and written again with backoff until it goes
//! in: the engine may not report that Application again for minutes, and the tenant
//! must read the truth within seconds of the database's return.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use gitops_shared::db::application_state::{
    self, ApplicationOwner, ObservedSync, application_owner_by_id, application_owner_by_uid, application_state_upsert,
    sync_operation_progress,
};
use gitops_shared::db::engine_instance::InstanceEpoch;
use gitops_shared::db::{DbError, DbPool, pooled};
use gitops_shared::model::{ApplicationId, SyncOperationState};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::engine::{Engine, ObservedApplication, OperationPhase, StatusEvent};
use crate::metrics::Metrics;
use crate::names::APPLICATION_ID_LABEL;

/// Prefix of `names::application_name`: `gitops-<resource uid>`.
const APPLICATION_NAME_PREFIX: &str = "gitops-";

/// The first wait before dropped observations are written again; it doubles up to
/// `RETRY_LAST` while the database stays away.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_LAST: Duration = Duration::from_secs(2);

/// Records `engine`'s status events until `cancel` fires. Stream errors are logged
/// (the engine retries); observations the database refused are written again.
pub async fn run_status_watcher(
    engine: Arc<dyn Engine>,
    epoch: InstanceEpoch,
    pool: DbPool,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut events = engine.status_events();
    let mut writer = StatusWriter { epoch, pool, metrics, last: HashMap::new(), pending: HashMap::new() };
    let mut failures: u32 = 0;
    loop {
        let retry_in = gitops_shared::backoff::exponential(failures, RETRY_FIRST, RETRY_LAST, 1.0);
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            event = events.next() => event,
            () = tokio::time::sleep(retry_in), if !writer.pending.is_empty() => {
                failures = if writer.retry_pending().await { 0 } else { failures.saturating_add(1) };
                continue;
            }
        };
        match event {
            None => return,
            Some(Err(error)) => tracing::warn!(%error, engine = ?engine, "status stream failed; retrying"),
            Some(Ok(StatusEvent::Restarted)) => {
                writer.metrics.status_relists.fetch_add(1, Ordering::Relaxed);
                writer.last.clear();
            }
            Some(Ok(StatusEvent::Applied(observed))) => writer.observe(&observed).await,
            Some(Ok(StatusEvent::Deleted(name))) => {
                writer.last.remove(&name);
                writer.pending.remove(&name);
            }
        }
    }
}

struct StatusWriter {
    /// The instance, and the epoch status is written at.
    epoch: InstanceEpoch,
    pool: DbPool,
    metrics: Arc<Metrics>,
    /// A digest of what was last written (or found unchanged) per Application name.
    last: HashMap<String, Written>,
    /// The latest observation per Application that could not be written yet.
    pending: HashMap<String, ObservedApplication>,
}

impl StatusWriter {
    /// Writes the observations the database refused before; true when all went in.
    async fn retry_pending(&mut self) -> bool {
        let names: Vec<String> = self.pending.keys().cloned().collect();
        let count = names.len();
        for name in names {
            let Some(application) = self.pending.get(&name).cloned() else { continue };
            self.observe(&application).await;
            if self.pending.contains_key(&name) {
                return false; // still failing: the others wait for the next round
            }
        }
        tracing::info!(applications = count, "status held back by a database error recorded");
        true
    }

    async fn observe(&mut self, application: &ObservedApplication) {
        self.metrics.status_events.fetch_add(1, Ordering::Relaxed);
        let name = application.name.clone();
        // A newer report of the same Application replaces one held back.
        let retrying = self.pending.remove(&name).is_some();
        let result = async {
            let client = pooled(&self.pool).await?;
            let Some(owner) = self.owner(&client, application).await? else {
                self.metrics.status_unmatched.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(engine.application = %name, "no application row for this engine application");
                return Ok::<_, DbError>(());
            };
            let observed = observe_application(owner, application);
            let written = Written::of(&observed);
            if self.last.get(&name) == Some(&written) {
                return Ok(());
            }
            if let Some(seq) = application_state_upsert(&client, &self.epoch, &observed).await? {
                self.metrics.status_writes.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    application.id = %owner.application_id, tenant.id = %owner.tenant_id, seq,
                    sync = ?observed.sync_status, health = ?observed.health_status, "application state recorded"
                );
            }
            if let Some(sync) = observe_sync(owner.application_id, application)
                && sync_operation_progress(&client, &self.epoch, &sync).await?
            {
                self.metrics.sync_progress_writes.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    application.id = %owner.application_id, sync.correlation_id = %sync.correlation_id,
                    sync.state = %sync.state, "sync progress recorded"
                );
            }
            self.last.insert(name.clone(), written);
            Ok(())
        }
        .await;
        if let Err(error) = result {
            self.metrics.status_errors.fetch_add(1, Ordering::Relaxed);
            self.last.remove(&name);
            // One warning per streak: while observations are held back already, the
            // database is known to be away and every further one would say the same.
            let first = self.pending.is_empty() && !retrying;
            self.pending.insert(name.clone(), application.clone());
            if first {
                tracing::warn!(%error, engine.application = %name, "could not record an application's status; holding observations back");
            } else {
                tracing::debug!(%error, engine.application = %name, held_back = self.pending.len(), "could not record an application's status");
            }
        }
    }

    /// The row behind `application`: by its application-id label, else by its name.
    async fn owner(
        &self,
        client: &impl gitops_shared::db::Statements,
        application: &ObservedApplication,
    ) -> Result<Option<ApplicationOwner>, DbError> {
        let labelled = application.labels.get(APPLICATION_ID_LABEL);
        if let Some(id) = labelled.and_then(|v| v.parse::<i64>().ok()) {
            return application_owner_by_id(client, self.epoch.instance, ApplicationId(id)).await;
        }
        match uid_from_name(&application.name) {
            Some(uid) => application_owner_by_uid(client, self.epoch.instance, uid).await,
            None => Ok(None),
        }
    }
}

/// What an `application_state` write held, as a SHA-256 of its content: equal
/// digests mean an unchanged observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Written([u8; 32]);

impl Written {
    fn of(observed: &application_state::ObservedApplication) -> Written {
        // JSON of every field, by name: delimited, and `null` apart from any string.
        let bytes = serde_json::to_vec(observed).unwrap_or_default();
        Written(Sha256::digest(&bytes).into())
    }
}

/// The resource UID in an Application name made by `names::application_name`.
pub fn uid_from_name(name: &str) -> Option<Uuid> {
    name.strip_prefix(APPLICATION_NAME_PREFIX).and_then(|rest| Uuid::parse_str(rest).ok())
}

/// The `application_state` content of `application` for the row of `owner`.
pub fn observe_application(
    owner: ApplicationOwner,
    application: &ObservedApplication,
) -> application_state::ObservedApplication {
    application_state::ObservedApplication {
        application_id: owner.application_id,
        tenant_id: owner.tenant_id,
        sync_status: application.sync_status.clone(),
        sync_revision: application.sync_revision.clone(),
        health_status: application.health_status.clone(),
        health_message: application.health_message.clone(),
        resources: application.resources.clone(),
        conditions: application.conditions.clone(),
        operation_state: application.operation_state.clone(),
        reconciled_state: application.reconciled_state.clone(),
    }
}

/// The progress of the service-requested sync in the application's operation, if
/// the operation carries a correlation id.
pub fn observe_sync(application_id: ApplicationId, application: &ObservedApplication) -> Option<ObservedSync> {
    let state = application.operation.as_ref()?;
    let correlation_id = Uuid::parse_str(state.correlation_id.as_deref()?).ok()?;
    let sync_state = match state.phase {
        OperationPhase::Running => SyncOperationState::Running,
        OperationPhase::Terminating => SyncOperationState::Terminating,
        OperationPhase::Succeeded => SyncOperationState::Succeeded,
        OperationPhase::Failed | OperationPhase::Error => SyncOperationState::Failed,
        OperationPhase::Unknown => return None,
    };
    let finished = state.phase.is_finished();
    Some(ObservedSync {
        application_id,
        correlation_id,
        state: sync_state,
        synced_revision: if finished { state.synced_revision.clone() } else { None },
        message: state.message.clone(),
        started_at: time(state.started_at.as_deref()),
        finished_at: if finished { time(state.finished_at.as_deref()) } else { None },
    })
}

/// An RFC 3339 time as Kubernetes writes it.
fn time(text: Option<&str>) -> Option<SystemTime> {
    let timestamp: k8s_openapi::jiff::Timestamp = text?.parse().ok()?;
    Some(SystemTime::from(timestamp))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use gitops_shared::model::TenantId;
    use serde_json::json;

    use super::*;
    use crate::engine::ObservedOperation;

    const OWNER: ApplicationOwner = ApplicationOwner { application_id: ApplicationId(7), tenant_id: TenantId(3) };

    fn application(operation: Option<ObservedOperation>) -> ObservedApplication {
        ObservedApplication {
            name: "gitops-x".into(),
            labels: BTreeMap::new(),
            sync_status: Some("Synced".into()),
            sync_revision: Some("abc".into()),
            health_status: Some("Degraded".into()),
            health_message: Some("boom".into()),
            resources: json!([{"kind": "Deployment", "name": "web"}]),
            conditions: json!([]),
            operation_state: operation.as_ref().map(|_| json!({"phase": "Succeeded"})),
            operation,
            reconciled_state: Some(json!({"source": {"repoURL": "r"}})),
        }
    }

    fn operation(phase: OperationPhase, correlation_id: Option<String>) -> ObservedOperation {
        ObservedOperation {
            correlation_id,
            phase,
            synced_revision: Some("r1".into()),
            message: Some("ok".into()),
            started_at: Some("2025-01-01T00:00:00Z".into()),
            finished_at: Some("2025-01-01T00:00:05Z".into()),
        }
    }

    #[test]
    fn status_fields_map_to_the_row() {
        let observed = observe_application(OWNER, &application(None));
        assert_eq!((observed.application_id, observed.tenant_id), (ApplicationId(7), TenantId(3)));
        assert_eq!(observed.sync_status.as_deref(), Some("Synced"));
        assert_eq!(observed.health_message.as_deref(), Some("boom"));
        assert_eq!(observed.conditions, json!([]));
        assert_eq!(observed.reconciled_state, Some(json!({"source": {"repoURL": "r"}})));
        assert_eq!(observed.operation_state, None);
    }

    #[test]
    fn sync_progress_needs_a_correlation_id() {
        let id = Uuid::new_v4();
        let done = application(Some(operation(OperationPhase::Succeeded, Some(id.to_string()))));
        let sync = observe_sync(ApplicationId(7), &done).expect("a sync");
        assert_eq!(sync.correlation_id, id);
        assert_eq!(sync.state, SyncOperationState::Succeeded);
        assert_eq!(sync.synced_revision.as_deref(), Some("r1"));
        assert!(sync.started_at.is_some() && sync.finished_at.is_some());
        let running = application(Some(operation(OperationPhase::Running, Some(id.to_string()))));
        let sync = observe_sync(ApplicationId(7), &running).expect("a sync");
        assert_eq!((sync.state, sync.synced_revision, sync.finished_at), (SyncOperationState::Running, None, None));
        let automated = application(Some(operation(OperationPhase::Running, None)));
        assert!(observe_sync(ApplicationId(7), &automated).is_none());
        assert_eq!(uid_from_name(&format!("gitops-{id}")), Some(id));
        assert_eq!(uid_from_name("gitops-tenant-1"), None);
    }
}
