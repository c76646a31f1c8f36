//! Sync operations: a pending row becomes a sync request on its Application's
//! `.operation` (with the row's correlation id in `operation.info`) and the row
//! `running`; a reconcile that finds the operation with that correlation id
//! finished records its result; a terminate request terminates it as the Argo CD
//! CLI does (or withdraws it before it started). The agent's status watcher may
//! record the same result: `sync_operation_record_outcome` lets the first write
//! win. A request is made only from `pending`, so a repeated reconcile never
//! repeats a sync.

use std::time::SystemTime;

use gitops_shared::db::desired::{
    DesiredSyncOperation, SyncOutcome, resource_mark_deleted, sync_operation_load, sync_operation_record_outcome,
    sync_operation_set_state,
};
use gitops_shared::db::pooled;
use gitops_shared::model::{ResourceType, RowState, SyncOperationId, SyncOperationState, SyncType, TenantId};

use super::{ReconcileError, Reconciler, same_tenant};
use crate::engine::{ObservedOperation, OperationPhase, SyncRequest};
use crate::names::application_name;

fn parse_time(text: &str) -> Option<SystemTime> {
    text.parse::<k8s_openapi::jiff::Timestamp>().ok().map(SystemTime::from)
}

/// The row's outcome for a finished engine operation.
fn outcome(sync: &DesiredSyncOperation, observed: &ObservedOperation) -> SyncOutcome {
    let terminating = sync.terminate_requested || sync.state == SyncOperationState::Terminating;
    let state = match observed.phase {
        OperationPhase::Succeeded => SyncOperationState::Succeeded,
        _ if terminating => SyncOperationState::Terminated,
        _ => SyncOperationState::Failed,
    };
    SyncOutcome {
        state,
        synced_revision: observed.synced_revision.clone(),
        message: observed.message.clone(),
        finished_at: observed.finished_at.as_deref().and_then(parse_time),
    }
}

fn never_started(message: &str) -> SyncOutcome {
    SyncOutcome {
        state: SyncOperationState::Terminated,
        synced_revision: None,
        message: Some(message.to_owned()),
        finished_at: None,
    }
}

impl Reconciler {
    pub(super) async fn sync(&self, tenant: TenantId, id: SyncOperationId) -> Result<(), ReconcileError> {
        let sync = {
            let client = pooled(&self.pool).await?;
            sync_operation_load(&client, id).await?
        };
        let Some(sync) = sync else { return Ok(()) };
        same_tenant(tenant, sync.tenant_id, "sync operation")?;
        let finished = matches!(
            sync.state,
            SyncOperationState::Succeeded | SyncOperationState::Failed | SyncOperationState::Terminated
        );
        match sync.row_state {
            RowState::Deleted => return Ok(()),
            RowState::Deleting => {
                if !finished {
                    self.stop(&sync).await?;
                }
                let client = pooled(&self.pool).await?;
                resource_mark_deleted(&client, ResourceType::SyncOperation, id.0).await?;
                return Ok(());
            }
            RowState::Active | RowState::Unknown => {}
        }
        if finished {
            return Ok(());
        }
        let Some(target) = sync.application.as_ref().filter(|a| a.row_state == RowState::Active) else {
            return Err(ReconcileError::not_yet(
                format!("sync operation {id}: application not present"),
                format!("the GitOpsDeployment {:?} does not exist", sync.deployment_name),
            ));
        };
        if target.sync_type == SyncType::Automated {
            return Err(ReconcileError::refused(
                format!("sync operation {id} targets an automated application"),
                "sync runs are not allowed for automated deployments",
            ));
        }
        let name = application_name(target.resource_uid);
        let Some(view) = self.engine().operation(&name).await? else {
            return Err(ReconcileError::not_yet(
                format!("Application {name} does not exist yet"),
                "waiting for the deployment to reach Argo CD",
            ));
        };
        let correlation = sync.correlation_id.to_string();
        let ours = view.state.as_ref().filter(|s| s.correlation_id.as_deref() == Some(correlation.as_str()));
        let requested = view.requested.as_deref() == Some(correlation.as_str());
        let client = pooled(&self.pool).await?;
        if let Some(observed) = ours.filter(|s| s.phase.is_finished()) {
            sync_operation_record_outcome(&client, id, sync.correlation_id, &outcome(&sync, observed)).await?;
            return Ok(());
        }
        if sync.terminate_requested {
            drop(client);
            self.stop(&sync).await?;
            return Ok(());
        }
        if ours.is_some() || requested {
            sync_operation_set_state(&client, id, SyncOperationState::Running).await?;
            return Ok(());
        }
        if sync.state != SyncOperationState::Pending {
            // Ours was requested but its trace is gone: another operation replaced it.
            let lost = SyncOutcome {
                state: SyncOperationState::Failed,
                synced_revision: None,
                message: Some("the sync was replaced by another operation before it finished".into()),
                finished_at: None,
            };
            sync_operation_record_outcome(&client, id, sync.correlation_id, &lost).await?;
            return Ok(());
        }
        let busy = view.requested.is_some() || view.state.as_ref().is_some_and(|s| !s.phase.is_finished());
        if busy {
            return Err(ReconcileError::not_yet(
                format!("Application {name} has another operation in progress"),
                "another sync of this deployment is in progress; waiting for it to finish",
            ));
        }
        drop(client);
        let request = SyncRequest { application: name, revision: sync.revision.clone(), correlation_id: correlation };
        self.engine().request_sync(&request).await?;
        let client = pooled(&self.pool).await?;
        sync_operation_set_state(&client, id, SyncOperationState::Running).await?;
        Ok(())
    }

    /// Stops the sync of `sync`: terminates it when running, withdraws it when only
    /// requested, and records the end when it never started.
    async fn stop(&self, sync: &DesiredSyncOperation) -> Result<(), ReconcileError> {
        let Some(target) = &sync.application else {
            let client = pooled(&self.pool).await?;
            sync_operation_record_outcome(
                &client,
                sync.id,
                sync.correlation_id,
                &never_started("terminated before it started"),
            )
            .await?;
            return Ok(());
        };
        let name = application_name(target.resource_uid);
        let correlation = sync.correlation_id.to_string();
        let view = self.engine().operation(&name).await?.unwrap_or_default();
        let ours = view.state.as_ref().filter(|s| s.correlation_id.as_deref() == Some(correlation.as_str()));
        if let Some(observed) = ours {
            if observed.phase.is_finished() {
                let client = pooled(&self.pool).await?;
                sync_operation_record_outcome(&client, sync.id, sync.correlation_id, &outcome(sync, observed)).await?;
            } else {
                self.engine().terminate(&name).await?;
                let client = pooled(&self.pool).await?;
                sync_operation_set_state(&client, sync.id, SyncOperationState::Terminating).await?;
            }
            return Ok(());
        }
        if view.requested.as_deref() == Some(correlation.as_str()) {
            self.engine().withdraw_sync(&name).await?;
        }
        let client = pooled(&self.pool).await?;
        sync_operation_record_outcome(
            &client,
            sync.id,
            sync.correlation_id,
            &never_started("terminated before it started"),
        )
        .await?;
        Ok(())
    }
}
