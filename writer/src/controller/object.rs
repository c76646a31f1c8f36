//! What both controllers do to a tenant object: keep the writer's finalizer on it
//! (JSON patches guarded by `resourceVersion`, as `kube::runtime::finalizer` does),
//! and set the writer's condition in its status without touching the other
//! conditions, which the status loop owns.

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::condition::{HasConditions, refuse};
use super::{Controllers, Next, ReconcileError};
use crate::api::Condition;
use crate::work_queue::{Key, Kind};
use uuid::Uuid;

/// The writer's finalizer on every resource it manages.
pub const FINALIZER: &str = "managed-gitops.redhat.com/writer";
/// The original service's opt-in finalizer. On a GitOpsDeployment it means what
/// the wait-for-pruning annotation means (the deployment goes once Argo CD pruned);
/// the writer releases it with its own on any kind, so no object hangs on it.
pub const RESOURCES_FINALIZER: &str = "resources-finalizer.managed-gitops.redhat.com";
/// The condition type the writer sets: `True` with the reason when the resource is
/// not (yet) in effect, `False` once its intent is stored.
pub const CONDITION: &str = "ErrorOccurred";
/// The reason of the writer's condition when all is well.
pub const REASON_ACCEPTED: &str = "Accepted";

pub fn has_finalizer<K: Resource>(object: &K) -> bool {
    object.meta().finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

fn version_guard<K: Resource>(object: &K) -> serde_json::Value {
    json!({"op": "test", "path": "/metadata/resourceVersion", "value": object.meta().resource_version})
}

/// Adds the finalizer; returns the patched object.
pub async fn add_finalizer<K>(api: &Api<K>, object: &K) -> Result<K, ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let add = match &object.meta().finalizers {
        Some(list) if !list.is_empty() => json!({"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}),
        _ => json!({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}),
    };
    let patch: json_patch::Patch = serde_json::from_value(json!([version_guard(object), add]))
        .map_err(|source| ReconcileError::Patch { what: "build a finalizer patch", source })?;
    api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .map_err(|source| ReconcileError::Kube { action: "add the finalizer", source })
}

/// Removes the finalizer; NotFound means the object is gone already.
/// Where a managed resource stands when a reconcile starts.
pub enum Live<K> {
    /// Gone, or being deleted with our finalizer already released: nothing to do.
    Gone,
    /// Being deleted and still holding our finalizer: tombstone, then release it.
    Deleting(K, Uuid),
    /// Present and carrying our finalizer (added now if it was missing).
    Present(K, Uuid),
}

/// Where a managed resource stands when a reconcile starts, or the outcome that
/// already ends it (the object's namespace is not served: refused).
pub enum Opened<K> {
    Live(Live<K>),
    Ended(Next),
}

/// Reads `name` and sorts it into `Live`, adding the writer's finalizer to a live
/// object that lacks it — the opening every controller's reconcile shares. An object
/// in a namespace the service does not serve is refused instead: its condition says
/// why and nothing is written (no finalizer, no rows, no identity); rows and Argo CD
/// objects of a namespace that stopped being served stay as they are, and a deletion
/// goes on as usual.
pub async fn open<K>(
    ctl: &Controllers,
    api: &Api<K>,
    kind: Kind,
    name: &str,
    namespace: &str,
) -> Result<Opened<K>, ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug + HasConditions,
{
    let Some(object) = api.get_opt(name).await.map_err(|source| ReconcileError::Kube { action: "read", source })?
    else {
        return Ok(Opened::Live(Live::Gone));
    };
    let uid = super::uid(object.meta())?;
    if object.meta().deletion_timestamp.is_some() {
        let held = object
            .meta()
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER || f == RESOURCES_FINALIZER));
        return Ok(Opened::Live(if held { Live::Deleting(object, uid) } else { Live::Gone }));
    }
    if let Err(not_served) = ctl.serves_read(namespace).await? {
        return refuse(api, &object, not_served.reason(), &not_served.message(namespace)).await.map(Opened::Ended);
    }
    let object = if has_finalizer(&object) {
        object
    } else {
        let write = ctl.finalizing(Key { kind, namespace: namespace.to_owned(), name: name.to_owned() });
        let patched = add_finalizer(api, &object).await?;
        write.made(patched.meta().resource_version.as_deref());
        patched
    };
    Ok(Opened::Live(Live::Present(object, uid)))
}

/// Removes the writer's finalizer and the original service's opt-in one
/// ([`RESOURCES_FINALIZER`]) in one JSON patch, each guarded by a test so a list
/// changed meanwhile is not harmed; neither present, or the object gone, is success.
pub async fn remove_finalizer<K>(api: &Api<K>, object: &K) -> Result<(), ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let list = object.meta().finalizers.as_deref().unwrap_or_default();
    // From the highest index down, so each removal leaves the next index valid.
    let mut ops = Vec::new();
    for (index, finalizer) in list.iter().enumerate().rev() {
        if finalizer == FINALIZER || finalizer == RESOURCES_FINALIZER {
            let path = format!("/metadata/finalizers/{index}");
            ops.push(json!({"op": "test", "path": path, "value": finalizer}));
            ops.push(json!({"op": "remove", "path": path}));
        }
    }
    if ops.is_empty() {
        return Ok(());
    }
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(|source| ReconcileError::Patch { what: "build a finalizer patch", source })?;
    match api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(ReconcileError::Kube { action: "remove the finalizer", source }),
    }
}

/// The writer's condition for `generation`.
pub fn condition(error: bool, reason: &str, message: &str, generation: Option<i64>, now: &str) -> Condition {
    Condition {
        type_: CONDITION.to_owned(),
        status: if error { "True" } else { "False" }.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_transition_time: Some(now.to_owned()),
        observed_generation: generation,
    }
}

/// `existing` with the condition of `new`'s type replaced by `new`; the transition time is
/// kept when the status did not change. None when nothing would change.
pub fn merged_conditions(existing: &[Condition], mut new: Condition) -> Option<Vec<Condition>> {
    let old = existing.iter().find(|c| c.type_ == new.type_);
    if let Some(old) = old {
        if old.status == new.status {
            new.last_transition_time.clone_from(&old.last_transition_time);
        }
        if *old == new {
            return None;
        }
    }
    let mut out: Vec<Condition> = existing.iter().filter(|c| c.type_ != new.type_).cloned().collect();
    out.push(new);
    Some(out)
}

/// Writes `conditions` and `observedGeneration` into the status subresource of
/// `object`, as it was read: the patch carries its resourceVersion, so conditions
/// computed from a stale read (the status loop patched since) are never written;
/// the reconcile runs again on the fresh object instead.
pub async fn patch_status<K>(
    api: &Api<K>,
    object: &K,
    conditions: Vec<Condition>,
    generation: Option<i64>,
) -> Result<(), ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let meta = object.meta();
    let name = meta.name.clone().unwrap_or_default();
    let patch = json!({
        "metadata": {"resourceVersion": meta.resource_version},
        "status": {"conditions": conditions, "observedGeneration": generation},
    });
    match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Err(ReconcileError::StatusMoved),
        Err(source) => Err(ReconcileError::Kube { action: "update the status", source }),
    }
}

/// RFC 3339 UTC time of now, second precision.
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}
