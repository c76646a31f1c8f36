//! The Environment controller: each Environment with a cluster becomes the
//! ManagedEnvironment `managed-environment-<env>` in its namespace (credentials
//! mode, or DeploymentTargetClaim mode with an Opaque Secret copied to
//! `managed-environment-secret-<env>`). A tenant's mistake becomes the pair of
//! conditions `ErrorOccurred`/`Reconciled`; an Environment that never failed has no
//! condition at all, as in the original. The admission webhook's rules on names and
//! API URLs (`crate::webhook::rules`) are checked again here, as `InvalidEnvironment`.
//!
//! The ManagedEnvironment is owned by the Environment (a correct
//! `appstudio.redhat.com` owner reference, so Kubernetes collects it); those the
//! original made, whose owner reference names `managed-gitops.redhat.com`, are
//! deleted by [`legacy`] once their Environment is gone.

pub mod desired;
pub mod legacy;

use std::sync::Arc;

use futures_util::StreamExt;
use gitops_writer::api::{GitOpsDeploymentManagedEnvironment, GitOpsDeploymentManagedEnvironmentSpec};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::binding::cache::{Feed, reflected, trim_meta};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::api::{DeploymentTarget, DeploymentTargetClaim, Environment};
use crate::condition::{self, now_rfc3339};
use crate::context::{Closed, Context, ReconcileError, deleted, found, namespace_closed};
use crate::names::{
    ENVIRONMENT_SECRET_LABEL, FIELD_MANAGER, MANAGED_ENVIRONMENT_SECRET_TYPE, managed_environment_name,
    managed_environment_secret_name,
};
use crate::target::{self, Bound, PHASE_BOUND};
use crate::webhook::rules;
use desired::{Mode, Refusal};

pub const CLAIM_NOT_FOUND: &str = "DeploymentTargetClaimNotFound";
pub const CLAIM_NOT_FOUND_MESSAGE: &str =
    "DeploymentTargetClaim not found while generating the desired Environment resource";
pub const TARGET_NOT_FOUND: &str = "DeploymentTargetNotFound";
pub const TARGET_NOT_FOUND_MESSAGE: &str =
    "DeploymentTarget not found for the DeploymentTargetClaim while generating the desired Environment resource";
pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
pub const MANAGED_ENVIRONMENT_REFUSED: &str = "ManagedEnvironmentRefused";

/// Runs the controller until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let config = watcher::Config::default();
    let (store, environments) = reflected(ctx.served::<Environment>(), &config, trim_meta, None, None, Feed::Own);
    let controller = Controller::for_stream(environments, store.clone());
    let (by_secret, by_claim, by_target) = (store.clone(), store.clone(), store);
    controller
        .owns(ctx.served::<GitOpsDeploymentManagedEnvironment>(), config.clone())
        .watches(ctx.served::<PartialObjectMeta<Secret>>(), config.clone(), move |secret| {
            environments_of_secret(&by_secret, &secret)
        })
        .watches(ctx.served::<DeploymentTargetClaim>(), config.clone(), move |claim| {
            let name = claim.name_any();
            claiming(&by_claim, claim.namespace().as_deref(), |claim_name| claim_name == name)
        })
        .watches(ctx.served::<DeploymentTarget>(), config, move |target| {
            claiming(&by_target, target.namespace().as_deref(), |_| true)
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| {
            let metrics = ctx.metrics.clone();
            async move {
                metrics.outcome("environment", &result);
                if let Err(error) = result {
                    tracing::debug!(error = %gitops_shared::telemetry::error_chain(&error), "environment reconcile");
                }
            }
        })
        .await;
}

/// The Environments of the Secret's namespace that may use it: its own (the
/// label of a copy), those naming it, and those following a claim (whose target's
/// Secret is only known after a read).
fn environments_of_secret(
    store: &Store<Environment>,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<Environment>> {
    let namespace = secret.namespace();
    let name = secret.name_any();
    let labelled = secret.labels().get(ENVIRONMENT_SECRET_LABEL).cloned();
    store
        .state()
        .into_iter()
        .filter(|env| env.namespace() == namespace)
        .filter(|env| {
            labelled.as_deref() == Some(env.name_any().as_str())
                || env.spec.claim_name().is_some()
                || env
                    .spec
                    .unstable_configuration_fields
                    .as_ref()
                    .is_some_and(|u| u.kubernetes_credentials.cluster_credentials_secret == name)
        })
        .map(|env| ObjectRef::from_obj(env.as_ref()))
        .collect()
}

/// The Environments of `namespace` whose claim passes `matches`.
fn claiming(
    store: &Store<Environment>,
    namespace: Option<&str>,
    matches: impl Fn(&str) -> bool,
) -> Vec<ObjectRef<Environment>> {
    store
        .state()
        .into_iter()
        .filter(|env| env.namespace().as_deref() == namespace)
        .filter(|env| env.spec.claim_name().is_some_and(&matches))
        .map(|env| ObjectRef::from_obj(env.as_ref()))
        .collect()
}

fn error_policy(_: Arc<Environment>, error: &ReconcileError, _: Arc<Context>) -> Action {
    tracing::warn!(error = %gitops_shared::telemetry::error_chain(error), "environment reconcile failed; retrying");
    Action::requeue(std::time::Duration::from_secs(5))
}

/// What one reconcile decided.
enum Outcome {
    Done,
    /// The claim is not bound yet: nothing to report, its watch brings us back.
    Waiting,
    Refused(Refusal),
}

async fn reconcile(env: Arc<Environment>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let namespace = env.namespace().ok_or(ReconcileError::Incomplete("namespace"))?;
    if env.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let closed = match namespace_closed(&ctx, &namespace).await? {
        Some(Closed::Terminating) => return Ok(Action::await_change()),
        Some(Closed::NotServed(reason, message)) => Some(Refusal { reason, message }),
        None => None,
    };
    // The webhook's rules again, for installations without it: nothing is made
    // for an Environment it would have refused.
    let checked = rules::environment_name(&env.name_any())
        .and_then(|()| rules::environment(&env.spec, ctx.settings.api_url_allow_private));
    // A namespace not served may become one (a label): look again from time to time.
    let not_served = closed.is_some();
    let checked = match closed {
        Some(refusal) => Err(refusal),
        None => checked.map_err(|message| Refusal { reason: desired::INVALID_ENVIRONMENT, message }),
    };
    let outcome = match checked {
        Err(refusal) => Outcome::Refused(refusal),
        Ok(()) => match desired::mode(&env.spec) {
            Err(refusal) => Outcome::Refused(refusal),
            Ok(mode) => converge(&ctx, &env, &namespace, mode).await?,
        },
    };
    let mut conditions = env.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let now = now_rfc3339();
    let changed = match &outcome {
        Outcome::Done => condition::resolve(&mut conditions, &now),
        Outcome::Waiting => false,
        Outcome::Refused(refusal) => condition::set_error(&mut conditions, refusal.reason, &refusal.message, &now),
    };
    if changed {
        let api = Api::<Environment>::namespaced(ctx.client.clone(), &namespace);
        let patch = json!({"status": {"conditions": conditions}});
        deleted(
            api.patch_status(&env.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await,
            "write the Environment's status",
        )?;
    }
    Ok(match outcome {
        Outcome::Done => Action::requeue(ctx.settings.resync_interval),
        Outcome::Refused(_) if not_served => Action::requeue(ctx.settings.user_error_requeue),
        Outcome::Waiting | Outcome::Refused(_) => Action::await_change(),
    })
}

/// Brings the ManagedEnvironment (and the copied Secret) to what `mode` asks for.
async fn converge(
    ctx: &Context,
    env: &Environment,
    namespace: &str,
    mode: Mode<'_>,
) -> Result<Outcome, ReconcileError> {
    let name = env.name_any();
    let (spec, copy_from) = match mode {
        Mode::None => {
            // No cluster any more: what was made for one goes (the original kept it).
            delete_owned_managed_environment(ctx, env, namespace).await?;
            delete_copied_secret(ctx, namespace, &name).await?;
            return Ok(Outcome::Done);
        }
        Mode::Credentials(credentials) => (desired::from_credentials(credentials), None),
        Mode::Claim(claim_name) => {
            let claims = Api::<DeploymentTargetClaim>::namespaced(ctx.client.clone(), namespace);
            let Some(claim) = found(claims.get(claim_name).await, "read the DeploymentTargetClaim")? else {
                return Ok(refused(CLAIM_NOT_FOUND, CLAIM_NOT_FOUND_MESSAGE.to_owned()));
            };
            if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some(PHASE_BOUND) {
                return Ok(Outcome::Waiting);
            }
            let target = match target::bound_target(&ctx.client, namespace, &claim).await? {
                Bound::Target(target) => target,
                Bound::None | Bound::Conflict(_) => {
                    return Ok(refused(TARGET_NOT_FOUND, TARGET_NOT_FOUND_MESSAGE.to_owned()));
                }
            };
            if let Err(message) = rules::deployment_target(&target.spec, ctx.settings.api_url_allow_private) {
                let message = format!("DeploymentTarget {}: {message}", target.name_any());
                return Ok(refused(desired::INVALID_ENVIRONMENT, message));
            }
            let secret = target.spec.kubernetes_credentials.cluster_credentials_secret.clone();
            (desired::from_target(&target, &secret), Some(secret))
        }
    };
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), namespace);
    let Some(secret) = found(secrets.get(&spec.credentials_secret).await, "read the credentials Secret")? else {
        delete_copied_secret(ctx, namespace, &name).await?;
        let message =
            format!("the secret {} referenced by the Environment resource was not found", spec.credentials_secret);
        return Ok(refused(SECRET_NOT_FOUND, message));
    };
    let mut spec = spec;
    let needs_copy =
        copy_from.is_some() && secret.type_.as_deref().unwrap_or("Opaque") != MANAGED_ENVIRONMENT_SECRET_TYPE;
    if needs_copy {
        spec.credentials_secret = copy_secret(ctx, env, namespace, secret.data.clone().unwrap_or_default()).await?;
    } else {
        delete_copied_secret(ctx, namespace, &name).await?;
    }
    apply_managed_environment(ctx, env, namespace, spec).await
}

fn refused(reason: &'static str, message: String) -> Outcome {
    Outcome::Refused(Refusal { reason, message })
}

/// The owner reference of everything made for `env`.
fn owner(env: &Environment) -> Result<OwnerReference, ReconcileError> {
    env.controller_owner_ref(&()).ok_or(ReconcileError::Incomplete("uid"))
}

async fn apply_managed_environment(
    ctx: &Context,
    env: &Environment,
    namespace: &str,
    spec: GitOpsDeploymentManagedEnvironmentSpec,
) -> Result<Outcome, ReconcileError> {
    let name = managed_environment_name(&env.name_any());
    let api = Api::<GitOpsDeploymentManagedEnvironment>::namespaced(ctx.client.clone(), namespace);
    let owner = owner(env)?;
    if let Some(live) = found(api.get(&name).await, "read the ManagedEnvironment")? {
        let owned = live.owner_references().iter().any(|o| o.uid == owner.uid && o.controller == Some(true));
        if owned && live.spec == spec {
            return Ok(Outcome::Done);
        }
    }
    let object = json!({
        "apiVersion": GitOpsDeploymentManagedEnvironment::api_version(&()),
        "kind": GitOpsDeploymentManagedEnvironment::kind(&()),
        "metadata": {"name": name, "ownerReferences": [owner]},
        "spec": spec,
    });
    match api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object)).await {
        Ok(_) => Ok(Outcome::Done),
        // Refused by the schema or the writer's webhook: the tenant's input.
        Err(kube::Error::Api(status)) if matches!(status.code, 400 | 403 | 422) => Ok(refused(
            MANAGED_ENVIRONMENT_REFUSED,
            format!("the GitOpsDeploymentManagedEnvironment {name} was refused: {}", status.message),
        )),
        Err(source) => Err(ReconcileError::Kube { action: "apply the ManagedEnvironment", source }),
    }
}

/// Copies a target's Secret data into `managed-environment-secret-<env>` (of the
/// type the core expects); returns the copy's name.
async fn copy_secret(
    ctx: &Context,
    env: &Environment,
    namespace: &str,
    data: std::collections::BTreeMap<String, ByteString>,
) -> Result<String, ReconcileError> {
    let env_name = env.name_any();
    let name = managed_environment_secret_name(&env_name);
    let api = Api::<Secret>::namespaced(ctx.client.clone(), namespace);
    if let Some(live) = found(api.get(&name).await, "read the copied Secret")? {
        let labelled = live.labels().get(ENVIRONMENT_SECRET_LABEL) == Some(&env_name);
        if labelled && live.data.clone().unwrap_or_default() == data {
            return Ok(name);
        }
    }
    let object = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": MANAGED_ENVIRONMENT_SECRET_TYPE,
        "metadata": {
            "name": name,
            "labels": {ENVIRONMENT_SECRET_LABEL: env_name},
            "ownerReferences": [owner(env)?],
        },
        "data": data,
    });
    api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object))
        .await
        .map_err(|source| ReconcileError::Kube { action: "apply the copied Secret", source })?;
    Ok(name)
}

/// Deletes `managed-environment-secret-<env>` if the layer made it (its label).
async fn delete_copied_secret(ctx: &Context, namespace: &str, env_name: &str) -> Result<(), ReconcileError> {
    let name = managed_environment_secret_name(env_name);
    let api = Api::<Secret>::namespaced(ctx.client.clone(), namespace);
    let selector = format!("{ENVIRONMENT_SECRET_LABEL}={env_name}");
    let list = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(|source| ReconcileError::Kube { action: "list the copied Secrets", source })?;
    if list.items.iter().any(|s| s.metadata.name.as_deref() == Some(name.as_str())) {
        deleted(api.delete(&name, &DeleteParams::default()).await, "delete the copied Secret")?;
    }
    Ok(())
}

/// Deletes `managed-environment-<env>` if `env` owns it.
async fn delete_owned_managed_environment(
    ctx: &Context,
    env: &Environment,
    namespace: &str,
) -> Result<(), ReconcileError> {
    let name = managed_environment_name(&env.name_any());
    let api = Api::<GitOpsDeploymentManagedEnvironment>::namespaced(ctx.client.clone(), namespace);
    let uid = env.uid();
    if let Some(live) = found(api.get_metadata(&name).await, "read the ManagedEnvironment")?
        && live.owner_references().iter().any(|o| Some(&o.uid) == uid.as_ref())
    {
        deleted(api.delete(&name, &DeleteParams::default()).await, "delete the ManagedEnvironment")?;
    }
    Ok(())
}
