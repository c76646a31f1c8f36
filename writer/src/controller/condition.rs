//! The writer's condition on a tenant resource (`ErrorOccurred`, with
//! `observedGeneration`): set when it changed, and `refuse`, the one way a
//! reconcile ends on input the tenant must fix.

use kube::Resource;
use kube::api::Api;
use serde::de::DeserializeOwned;

use super::object;
use super::{Next, ReconcileError, Settled};
use crate::api::{
    Condition, GitOpsDeployment, GitOpsDeploymentManagedEnvironment, GitOpsDeploymentRepositoryCredential,
    GitOpsDeploymentSyncRun,
};

/// Refuses the object: its condition says why (`reason`, `message`), nothing is
/// written, and the reconcile settles as invalid (counted by reason).
pub(super) async fn refuse<K>(
    api: &Api<K>,
    object: &K,
    reason: &'static str,
    message: &str,
) -> Result<Next, ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + HasConditions,
{
    tracing::debug!(reason, kind = std::any::type_name::<K>(), "refused");
    set_condition(api, object, true, reason, message).await?;
    Ok(Next::Settled(Settled::Invalid(reason)))
}

/// Sets the writer's condition (and `observedGeneration`) when it changed.
pub(super) async fn set_condition<K>(
    api: &Api<K>,
    object: &K,
    error: bool,
    reason: &str,
    message: &str,
) -> Result<(), ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + HasConditions,
{
    set_conditions(api, object, error, reason, message, None::<Condition>).await
}

/// [`set_condition`], with more conditions of other types set in the same patch.
pub(super) async fn set_conditions<K>(
    api: &Api<K>,
    object: &K,
    error: bool,
    reason: &str,
    message: &str,
    extra: impl IntoIterator<Item = Condition>,
) -> Result<(), ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + HasConditions,
{
    let generation = object.meta().generation;
    let now = object::now_rfc3339();
    let new = object::condition(error, reason, message, generation, &now);
    let existing = object.conditions();
    let unchanged_generation = object.observed_generation() == generation;
    let mut merged = object::merged_conditions(&existing, new);
    // Where the status loop keeps `Ready`, the writer sets it as it refuses or accepts
    // a new generation (the loop hears of the outcome only once the agent acted).
    let ready = K::KEEPS_READY
        .then(|| crate::status::render::writer_ready(error, reason, message, generation, &existing, &now))
        .flatten();
    for extra in extra.into_iter().chain(ready) {
        let base = merged.clone().unwrap_or_else(|| existing.clone());
        if let Some(next) = object::merged_conditions(&base, extra) {
            merged = Some(next);
        }
    }
    match merged {
        None if unchanged_generation => Ok(()),
        None => object::patch_status(api, object, existing, generation).await,
        Some(conditions) => object::patch_status(api, object, conditions, generation).await,
    }
}

/// Read access to the status the writer patches.
pub(crate) trait HasConditions {
    /// Whether the kind carries a `Ready` condition (kept by the status loop).
    const KEEPS_READY: bool = false;
    fn conditions(&self) -> Vec<crate::api::Condition>;
    fn observed_generation(&self) -> Option<i64>;
}

/// Every kind keeps its conditions and observed generation in the same status fields.
macro_rules! has_conditions {
    ($($kind:ty: $ready:expr),*) => {$(
        impl HasConditions for $kind {
            const KEEPS_READY: bool = $ready;
            fn conditions(&self) -> Vec<crate::api::Condition> {
                self.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default()
            }
            fn observed_generation(&self) -> Option<i64> {
                self.status.as_ref().and_then(|s| s.observed_generation)
            }
        }
    )*};
}

has_conditions!(
    GitOpsDeployment: true,
    GitOpsDeploymentManagedEnvironment: true,
    GitOpsDeploymentRepositoryCredential: true,
    GitOpsDeploymentSyncRun: false
);
