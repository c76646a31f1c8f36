//! Status back: watches the instance's Argo CD Applications that carry the
//! service's managed-by label and copies what Argo CD reports into
//! `application_state` (only when something changed) and the progress of requested
//! syncs into their `sync_operation` rows.
//!
//! Argo CD's Application has no status subresource, so every status write arrives
//! here as an ordinary watch event; an unchanged observation is dropped in memory
//! first and by the database's `IS DISTINCT FROM` second, so the writers are woken
//! only for real changes.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use futures_util::StreamExt;
use gitops_shared::db::{DbError, DbPool, pooled};
use gitops_shared::model::{ApplicationId, EngineInstanceId, SyncOperationState};
use gitops_shared::observed::{
    ApplicationOwner, ObservedApplication, ObservedSync, application_owner_by_id, application_owner_by_uid,
    application_state_upsert, sync_operation_progress,
};
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::engine::OperationPhase;
use crate::engine::argocd::{application_resource, objects::operation_view};
use crate::metrics::Metrics;
use crate::names::{APPLICATION_ID_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE};

/// Prefix of `names::application_name`: `gitops-<resource uid>`.
const APPLICATION_NAME_PREFIX: &str = "gitops-";

/// Watches Applications in `namespace` until `cancel` fires. Watch errors are
/// retried with kube's default backoff; database errors are logged and the event
/// is seen again on the watch's next relist.
pub async fn run_status_watcher(
    client: kube::Client,
    namespace: String,
    instance: EngineInstanceId,
    pool: DbPool,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let api: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &application_resource());
    let config = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut writer = StatusWriter { instance, pool, metrics, last: HashMap::new() };
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            None => return,
            Some(Err(error)) => tracing::warn!(%error, argocd.ns = %namespace, "Application watch failed; retrying"),
            Some(Ok(Event::Init)) => writer.last.clear(),
            Some(Ok(Event::Apply(object) | Event::InitApply(object))) => writer.observe(&object).await,
            Some(Ok(Event::Delete(object))) => {
                writer.forget(&object);
            }
            Some(Ok(Event::InitDone)) => {}
        }
    }
}

struct StatusWriter {
    instance: EngineInstanceId,
    pool: DbPool,
    metrics: Arc<Metrics>,
    /// What was last written (or found unchanged) per Application name.
    last: HashMap<String, ObservedApplication>,
}

impl StatusWriter {
    async fn observe(&mut self, object: &DynamicObject) {
        self.metrics.status_events.fetch_add(1, Ordering::Relaxed);
        let name = object.metadata.name.clone().unwrap_or_default();
        let result = async {
            let client = pooled(&self.pool).await?;
            let Some(owner) = self.owner(&client, object).await? else {
                self.metrics.status_unmatched.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(argocd.application = %name, "no application row for this Application");
                return Ok::<_, DbError>(());
            };
            let observed = observe_application(owner, &object.data);
            if self.last.get(&name) == Some(&observed) {
                return Ok(());
            }
            if let Some(seq) = application_state_upsert(&client, &observed).await? {
                self.metrics.status_writes.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    application.id = %owner.application_id, tenant.id = %owner.tenant_id, seq,
                    sync = ?observed.sync_status, health = ?observed.health_status, "application state recorded"
                );
            }
            if let Some(sync) = observe_sync(owner.application_id, &object.data)
                && sync_operation_progress(&client, &sync).await?
            {
                self.metrics.sync_progress_writes.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    application.id = %owner.application_id, sync.correlation_id = %sync.correlation_id,
                    sync.state = %sync.state, "sync progress recorded"
                );
            }
            self.last.insert(name.clone(), observed);
            Ok(())
        }
        .await;
        if let Err(error) = result {
            self.metrics.status_errors.fetch_add(1, Ordering::Relaxed);
            self.last.remove(&name);
            tracing::warn!(%error, argocd.application = %name, "could not record an Application's status");
        }
    }

    fn forget(&mut self, object: &DynamicObject) {
        if let Some(name) = &object.metadata.name {
            self.last.remove(name);
        }
    }

    /// The row behind `object`: by its application-id label, else by its name.
    async fn owner(
        &self,
        client: &tokio_postgres::Client,
        object: &DynamicObject,
    ) -> Result<Option<ApplicationOwner>, DbError> {
        let labelled = object.metadata.labels.as_ref().and_then(|l| l.get(APPLICATION_ID_LABEL));
        if let Some(id) = labelled.and_then(|v| v.parse::<i64>().ok()) {
            return application_owner_by_id(client, self.instance, id).await;
        }
        match object.metadata.name.as_deref().and_then(uid_from_name) {
            Some(uid) => application_owner_by_uid(client, self.instance, uid).await,
            None => Ok(None),
        }
    }
}

/// The resource UID in an Application name made by `names::application_name`.
pub fn uid_from_name(name: &str) -> Option<Uuid> {
    name.strip_prefix(APPLICATION_NAME_PREFIX).and_then(|rest| Uuid::parse_str(rest).ok())
}

fn text(value: &Value, pointer: &str) -> Option<String> {
    value.pointer(pointer).and_then(Value::as_str).map(str::to_owned)
}

fn array(value: &Value, pointer: &str) -> Value {
    value.pointer(pointer).filter(|v| v.is_array()).cloned().unwrap_or_else(|| json!([]))
}

/// What an Application's status says, for the row of `owner`. Timestamps that move
/// without anything changing (`reconciledAt`, `observedAt`) are left out.
pub fn observe_application(owner: ApplicationOwner, application: &Value) -> ObservedApplication {
    ObservedApplication {
        application_id: owner.application_id,
        tenant_id: owner.tenant_id,
        sync_status: text(application, "/status/sync/status"),
        sync_revision: text(application, "/status/sync/revision"),
        health_status: text(application, "/status/health/status"),
        health_message: text(application, "/status/health/message"),
        resources: array(application, "/status/resources"),
        conditions: array(application, "/status/conditions"),
        operation_state: application.pointer("/status/operationState").filter(|v| v.is_object()).cloned(),
        reconciled_state: application.pointer("/status/sync/comparedTo").filter(|v| v.is_object()).cloned(),
    }
}

/// The progress of the service-requested sync in `status.operationState`, if the
/// operation carries a correlation id.
pub fn observe_sync(application_id: ApplicationId, application: &Value) -> Option<ObservedSync> {
    let state = operation_view(application).state?;
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
        synced_revision: if finished { state.synced_revision } else { None },
        message: state.message,
        started_at: time(text(application, "/status/operationState/startedAt").as_deref()),
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
    use gitops_shared::model::TenantId;

    use super::*;

    const OWNER: ApplicationOwner = ApplicationOwner { application_id: ApplicationId(7), tenant_id: TenantId(3) };

    #[test]
    fn status_fields_map_and_volatile_timestamps_do_not_matter() {
        let app = json!({"status": {
            "sync": {"status": "Synced", "revision": "abc", "comparedTo": {"source": {"repoURL": "r"}}},
            "health": {"status": "Degraded", "message": "boom"},
            "resources": [{"kind": "Deployment", "name": "web"}],
            "reconciledAt": "2025-01-01T00:00:00Z",
        }});
        let observed = observe_application(OWNER, &app);
        assert_eq!(observed.sync_status.as_deref(), Some("Synced"));
        assert_eq!(observed.health_message.as_deref(), Some("boom"));
        assert_eq!(observed.conditions, json!([]));
        assert_eq!(observed.reconciled_state, Some(json!({"source": {"repoURL": "r"}})));
        let mut later = app.clone();
        later["status"]["reconciledAt"] = json!("2025-01-01T00:03:00Z");
        assert_eq!(observe_application(OWNER, &later), observed);
    }

    #[test]
    fn sync_progress_needs_a_correlation_id() {
        let id = Uuid::new_v4();
        let app = json!({"status": {"operationState": {
            "phase": "Succeeded", "message": "ok", "startedAt": "2025-01-01T00:00:00Z",
            "finishedAt": "2025-01-01T00:00:05Z", "syncResult": {"revision": "r1"},
            "operation": {"info": [{"name": "correlation-id", "value": id.to_string()}]},
        }}});
        let sync = observe_sync(ApplicationId(7), &app).expect("a sync");
        assert_eq!(sync.correlation_id, id);
        assert_eq!(sync.state, SyncOperationState::Succeeded);
        assert_eq!(sync.synced_revision.as_deref(), Some("r1"));
        assert!(sync.started_at.is_some() && sync.finished_at.is_some());
        let automated = json!({"status": {"operationState": {"phase": "Running", "operation": {}}}});
        assert!(observe_sync(ApplicationId(7), &automated).is_none());
        assert_eq!(uid_from_name(&format!("gitops-{id}")), Some(id));
        assert_eq!(uid_from_name("gitops-tenant-1"), None);
    }
}
