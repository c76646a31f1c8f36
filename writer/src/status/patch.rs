//! Writing a status back: read the tenant resource, check it is the one the row
//! belongs to (same UID), and merge-patch its status subresource only when the
//! owned fields differ. The patch carries the object's UID and resourceVersion as
//! preconditions, so a recreated object or a concurrent status write (the
//! writer's validation conditions) is never overwritten; a conflict reads again.

use gitops_shared::db::resource_state::StateOf;
use gitops_shared::db::status_feed::{ResourceFeedRow, StatusFeedRow, SyncRunRow};
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::StatusError;
use super::render::{
    AgentView, DeploymentFacts, deletion_stuck_conditions, deployment_status, merge_diff, resource_conditions,
    sync_run_conditions,
};
use crate::api::{
    GitOpsDeployment, GitOpsDeploymentManagedEnvironment, GitOpsDeploymentRepositoryCredential, GitOpsDeploymentSyncRun,
};
use crate::controller::HasConditions;

/// Attempts per object when its resourceVersion moved between read and patch.
const CONFLICT_ATTEMPTS: u32 = 5;

/// The action of a refused patch (`StatusError::Kube`), as opposed to a refused read.
pub(super) const PATCH_ACTION: &str = "patch the status of";

/// What happened to one tenant resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchOutcome {
    Patched,
    /// Its status already said so.
    Unchanged,
    /// No object with the row's UID: deleted, or recreated as a new resource.
    Gone,
}

/// Says on a GitOpsDeployment whose deletion waits for pruning that Argo CD has not
/// finished it for long (`message`).
pub async fn patch_deletion_stuck(
    client: &kube::Client,
    row: &StatusFeedRow,
    message: &str,
) -> Result<PatchOutcome, StatusError> {
    let api = Api::<GitOpsDeployment>::namespaced(client.clone(), &row.namespace);
    patch_status(&api, &row.resource_name, row.resource_uid, |object: &GitOpsDeployment| {
        let current = object.status.clone().unwrap_or_default();
        let mut desired = current.clone();
        desired.conditions =
            deletion_stuck_conditions(message, object.metadata.generation, &current.conditions, &now());
        (to_json(&current), to_json(&desired))
    })
    .await
}

/// Brings a GitOpsDeployment's status in line with its feed row.
pub async fn patch_deployment(client: &kube::Client, row: &StatusFeedRow) -> Result<PatchOutcome, StatusError> {
    let api = Api::<GitOpsDeployment>::namespaced(client.clone(), &row.namespace);
    patch_status(&api, &row.resource_name, row.resource_uid, |object: &GitOpsDeployment| {
        let current = object.status.clone().unwrap_or_default();
        let facts =
            DeploymentFacts { generation: object.metadata.generation, automated: object.spec.type_ != "manual" };
        let desired = deployment_status(row, facts, &current, &now());
        (to_json(&current), to_json(&desired))
    })
    .await
}

/// Brings a GitOpsDeploymentSyncRun's condition in line with its sync request.
pub async fn patch_sync_run(client: &kube::Client, row: &SyncRunRow) -> Result<PatchOutcome, StatusError> {
    let api = Api::<GitOpsDeploymentSyncRun>::namespaced(client.clone(), &row.namespace);
    patch_status(&api, &row.resource_name, row.resource_uid, |object: &GitOpsDeploymentSyncRun| {
        let current = object.status.clone().unwrap_or_default();
        let mut desired = current.clone();
        desired.conditions = sync_run_conditions(row, &current.conditions, &now());
        (to_json(&current), to_json(&desired))
    })
    .await
}

/// Brings a managed environment's or repository credential's kstatus conditions in
/// line with what the agent last made of its row.
pub async fn patch_resource(client: &kube::Client, row: &ResourceFeedRow) -> Result<PatchOutcome, StatusError> {
    match row.kind {
        StateOf::ManagedEnvironment => {
            let api = Api::<GitOpsDeploymentManagedEnvironment>::namespaced(client.clone(), &row.namespace);
            patch_conditions(&api, row).await
        }
        StateOf::RepositoryCredential => {
            let api = Api::<GitOpsDeploymentRepositoryCredential>::namespaced(client.clone(), &row.namespace);
            patch_conditions(&api, row).await
        }
    }
}

async fn patch_conditions<K>(api: &Api<K>, row: &ResourceFeedRow) -> Result<PatchOutcome, StatusError>
where
    K: kube::Resource + Clone + std::fmt::Debug + DeserializeOwned + Serialize + HasConditions,
{
    let agent = AgentView {
        applied_generation: row.applied_generation,
        message: row.agent_message.as_deref(),
        stalled: row.agent_stalled,
        moving: row.moving.as_deref(),
        instance: row.instance_health.as_deref(),
    };
    patch_status(api, &row.resource_name, row.resource_uid, |object: &K| {
        let current = object.conditions();
        let desired = resource_conditions(agent, object.meta().generation, &current, &now());
        (json!({"conditions": current}), json!({"conditions": desired}))
    })
    .await
}

async fn patch_status<K>(
    api: &Api<K>,
    name: &str,
    uid: uuid::Uuid,
    render: impl Fn(&K) -> (Value, Value),
) -> Result<PatchOutcome, StatusError>
where
    K: kube::Resource + Clone + std::fmt::Debug + DeserializeOwned + Serialize,
{
    let uid = uid.to_string();
    for _ in 0..CONFLICT_ATTEMPTS {
        let object = api.get_opt(name).await.map_err(|source| StatusError::Kube { action: "read", source })?;
        let Some(object) = object else { return Ok(PatchOutcome::Gone) };
        let meta = object.meta();
        if meta.uid.as_deref() != Some(uid.as_str()) {
            return Ok(PatchOutcome::Gone);
        }
        let (current, desired) = render(&object);
        let diff = merge_diff(&current, &desired);
        if diff.as_object().is_some_and(serde_json::Map::is_empty) {
            return Ok(PatchOutcome::Unchanged);
        }
        let patch = json!({
            "metadata": {"uid": uid, "resourceVersion": meta.resource_version},
            "status": diff,
        });
        match api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(PatchOutcome::Patched),
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(PatchOutcome::Gone),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(source) => return Err(StatusError::Kube { action: PATCH_ACTION, source }),
        }
    }
    Err(StatusError::Contended { name: name.to_owned() })
}

fn to_json<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}
