//! The SnapshotEnvironmentBinding controller: one GitOpsDeployment per component the
//! repository generator listed in `status.components`, owned by the binding, aimed at
//! what the Environment says, edits by hand reverted, deployments of components no
//! longer listed deleted; the deployments' sync and health reported back in the
//! binding's status. The layer never writes Git: the repository generator (or a test
//! acting as it) fills `status.components`.
//!
//! Bindings of an Application that does not exist are deleted after a delay (it may
//! be created just after the binding); of several bindings for one (application,
//! environment) only the oldest acts (the admission check races). Where no webhook
//! runs, a binding moved to another application or environment, or whose Snapshot
//! changed its application or components, reports `ImmutableFieldChanged` and
//! generates nothing.

pub mod cache;
pub mod changes;
pub mod desired;
pub mod index;
pub mod snapshot;
pub mod status;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use gitops_writer::api::GitOpsDeployment;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::api::{
    DeploymentTarget, DeploymentTargetClaim, Environment, SnapshotEnvironmentBinding, SnapshotEnvironmentBindingStatus,
};
use crate::condition::{self, ERROR_OCCURRED, FALSE, RECONCILED, TRUE, now_rfc3339};
use crate::context::{Closed, Context, ReconcileError, deleted, found, namespace_closed};
use crate::names::{APPLICATION_LABEL, FIELD_MANAGER};
use crate::target::{self, Bound};
use cache::Cache;

pub const GITOPS_REPO_NOT_READY: &str = "GitOpsRepoNotReady";
pub const WAITING_FOR_COMPONENT_STATUS: &str = "WaitingForComponentStatus";
pub const DUPLICATE_COMPONENTS: &str = "DuplicateComponents";
pub const ERROR_GENERATING: &str = "ErrorGeneratingGitOpsDeployment";
pub const DUPLICATE_BINDING: &str = "DuplicateBinding";
/// A binding whose application or environment changed after it first acted, or
/// whose Snapshot changed its application or components after the binding used it.
pub const IMMUTABLE_FIELD_CHANGED: &str = "ImmutableFieldChanged";
/// On a binding: the `<application>/<environment>` it first acted for (the
/// webhook keeps them fixed; this is the controller's check where none runs).
pub const BOUND_TO_ANNOTATION: &str = "appstudio.redhat.com/bound-to";

/// The controller's context: the layer's, and the stores it reads.
pub struct Binder {
    ctx: Arc<Context>,
    cache: Cache,
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let config = watcher::Config::default();
    let (cache, feeds) = Cache::new(&ctx, &config);
    let store = cache.bindings.clone();
    let controller = Controller::for_stream(feeds.bindings, store.clone())
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.settings.binding_concurrency));
    let (by_env, by_app, by_claim, by_target, by_snapshot) =
        (store.clone(), store.clone(), store.clone(), store.clone(), store);
    let binder = Arc::new(Binder { ctx: ctx.clone(), cache });
    controller
        .owns_stream(feeds.deployments)
        .watches_stream(feeds.environments, move |env| {
            let name = env.name_any();
            bindings(&by_env, env.namespace().as_deref(), |b| b.spec.environment == name)
        })
        .watches_stream(feeds.applications, move |app| {
            let name = app.name_any();
            bindings(&by_app, app.namespace().as_deref(), |b| b.spec.application == name)
        })
        .watches(ctx.served::<DeploymentTargetClaim>(), config.clone(), move |claim| {
            bindings(&by_claim, claim.namespace().as_deref(), |_| true)
        })
        .watches(ctx.served::<DeploymentTarget>(), config, move |target| {
            bindings(&by_target, target.namespace().as_deref(), |_| true)
        })
        // A changed Snapshot is reported at once (see [`snapshot`]).
        .watches_stream(feeds.snapshots, move |snapshot| {
            let name = snapshot.name_any();
            bindings(&by_snapshot, snapshot.namespace().as_deref(), |b| b.spec.snapshot == name)
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, binder)
        .for_each(|result| {
            let metrics = ctx.metrics.clone();
            async move {
                metrics.outcome("binding", &result);
                if let Err(error) = result {
                    tracing::debug!(error = %gitops_shared::telemetry::error_chain(&error), "binding reconcile");
                }
            }
        })
        .await;
}

fn bindings(
    store: &Store<SnapshotEnvironmentBinding>,
    namespace: Option<&str>,
    matches: impl Fn(&SnapshotEnvironmentBinding) -> bool,
) -> Vec<ObjectRef<SnapshotEnvironmentBinding>> {
    store
        .state()
        .into_iter()
        .filter(|b| b.namespace().as_deref() == namespace && matches(b))
        .map(|b| ObjectRef::from_obj(b.as_ref()))
        .collect()
}

fn error_policy(_: Arc<SnapshotEnvironmentBinding>, error: &ReconcileError, _: Arc<Binder>) -> Action {
    tracing::warn!(error = %gitops_shared::telemetry::error_chain(error), "binding reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// How a reconcile ended, for the binding's conditions.
enum Report {
    /// Deployments generated; `gate` says the repository generator reported ready.
    Done { gate: bool },
    /// A tenant's or the repository generator's problem: `(reason, message)`.
    Error(&'static str, String),
}

async fn reconcile(binding: Arc<SnapshotEnvironmentBinding>, binder: Arc<Binder>) -> Result<Action, ReconcileError> {
    let (ctx, cache) = (&*binder.ctx, &binder.cache);
    let namespace = binding.namespace().ok_or(ReconcileError::Incomplete("namespace"))?;
    if binding.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    match namespace_closed(ctx, &namespace).await? {
        Some(Closed::Terminating) => return Ok(Action::await_change()),
        Some(Closed::NotServed(reason, message)) => {
            write_status(ctx, &binding, &namespace, Report::Error(reason, message), None).await?;
            // It may become one (a label): look again from time to time.
            return Ok(Action::requeue(ctx.settings.user_error_requeue));
        }
        None => {}
    }
    cache.ready().await?;
    let name = binding.name_any();
    // What the binding is for and the Snapshot it uses are recorded, when first
    // seen, in one write (which wakes the binding once more, to no effect).
    let mut record = serde_json::Map::new();
    match moved(&binding) {
        Moved::Refused(message) => {
            write_status(ctx, &binding, &namespace, Report::Error(IMMUTABLE_FIELD_CHANGED, message), None).await?;
            return Ok(Action::await_change());
        }
        Moved::First(bound_to) => {
            record.insert(BOUND_TO_ANNOTATION.to_owned(), bound_to.into());
        }
        Moved::No => {}
    }
    let live_snapshot =
        Some(&binding.spec.snapshot).filter(|name| !name.is_empty()).and_then(|name| cache.snapshot(&namespace, name));
    let changed = match snapshot::check(&binding, live_snapshot.as_deref())? {
        snapshot::Check::Changed(message) => Some(message),
        snapshot::Check::FirstUse(used) => {
            record.insert(snapshot::SNAPSHOT_USED_ANNOTATION.to_owned(), used.into());
            None
        }
        snapshot::Check::Same => None,
    };
    annotate(ctx, &binding, &namespace, record).await?;
    if let Some(message) = changed {
        write_status(ctx, &binding, &namespace, Report::Error(IMMUTABLE_FIELD_CHANGED, message), None).await?;
        return Ok(Action::await_change());
    }
    if !cache.application_exists(&namespace, &binding.spec.application) {
        return orphaned(ctx, &binding, &namespace).await;
    }
    let Some(env) = cache.environment(&namespace, &binding.spec.environment) else {
        return Ok(Action::await_change());
    };
    let (report, entries) = generate(ctx, cache, &binding, &namespace, &env).await?;
    let retry = matches!(&report, Report::Error(ERROR_GENERATING, _));
    write_status(ctx, &binding, &namespace, report, entries).await?;
    tracing::debug!(tenant.ns = %namespace, binding = %name, "binding reconciled");
    Ok(if retry {
        Action::requeue(ctx.settings.user_error_requeue)
    } else {
        Action::requeue(ctx.settings.resync_interval)
    })
}

/// Whether the binding was moved to another application or environment.
enum Moved {
    /// The webhook's refusal: it first acted for others (recorded then in
    /// [`BOUND_TO_ANNOTATION`]).
    Refused(String),
    /// Nothing recorded yet: record this.
    First(String),
    No,
}

fn moved(binding: &SnapshotEnvironmentBinding) -> Moved {
    let current = format!("{}/{}", binding.spec.application, binding.spec.environment);
    let Some(recorded) = binding.annotations().get(BOUND_TO_ANNOTATION) else {
        return Moved::First(current);
    };
    let Some((application, environment)) = recorded.split_once('/') else { return Moved::No };
    let old = crate::api::SnapshotEnvironmentBindingSpec {
        application: application.to_owned(),
        environment: environment.to_owned(),
        ..binding.spec.clone()
    };
    match crate::webhook::rules::binding_update(&old, &binding.spec) {
        Ok(()) => Moved::No,
        Err(refusal) => Moved::Refused(format!(
            "{refusal}; the binding acts for application {application} and environment {environment} only: \
                 change them back, or make a new binding"
        )),
    }
}

/// Adds `annotations` to the binding, if there are any.
async fn annotate(
    ctx: &Context,
    binding: &SnapshotEnvironmentBinding,
    namespace: &str,
    annotations: serde_json::Map<String, serde_json::Value>,
) -> Result<(), ReconcileError> {
    if annotations.is_empty() {
        return Ok(());
    }
    let api = Api::<SnapshotEnvironmentBinding>::namespaced(ctx.client.clone(), namespace);
    let patch = json!({"metadata": {"annotations": annotations}});
    deleted(
        api.patch(&binding.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await,
        "record what the binding is for and the Snapshot it uses",
    )
}

/// A binding whose Application does not exist: deleted once older than the delay.
async fn orphaned(
    ctx: &Context,
    binding: &SnapshotEnvironmentBinding,
    namespace: &str,
) -> Result<Action, ReconcileError> {
    let delay = ctx.settings.orphan_binding_delay;
    let age = binding
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|created| Duration::try_from(k8s_openapi::jiff::Timestamp::now().duration_since(created.0)).ok())
        .unwrap_or(Duration::ZERO);
    if age < delay {
        return Ok(Action::requeue(delay - age));
    }
    tracing::info!(tenant.ns = %namespace, binding = %binding.name_any(), application = %binding.spec.application,
        "deleting a binding whose Application does not exist");
    let api = Api::<SnapshotEnvironmentBinding>::namespaced(ctx.client.clone(), namespace);
    deleted(api.delete(&binding.name_any(), &DeleteParams::default()).await, "delete the orphaned binding")?;
    Ok(Action::await_change())
}

/// Creates, updates and deletes the binding's deployments; returns the report and
/// the status entries (None: keep what the status says).
async fn generate(
    ctx: &Context,
    cache: &Cache,
    binding: &SnapshotEnvironmentBinding,
    namespace: &str,
    env: &Environment,
) -> Result<(Report, Option<Vec<crate::api::BindingStatusGitOpsDeployment>>), ReconcileError> {
    let name = binding.name_any();
    if let Some(older) = older_duplicate(cache, binding, namespace) {
        let message = format!(
            "invalid SnapshotEnvironmentBinding: duplicate combination of Application ({}) and Environment ({}). \
             Duplicated by: {older}",
            binding.spec.application, binding.spec.environment
        );
        return Ok((Report::Error(DUPLICATE_BINDING, message), None));
    }
    let status = binding.status.clone().unwrap_or_default();
    let gate = match status.gitops_repo_conditions.last().map(|c| c.status.as_str()) {
        Some(FALSE) => {
            let message = format!("Cannot Reconcile Binding '{name}', since GitOps Repo Conditions status is false.");
            return Ok((Report::Error(GITOPS_REPO_NOT_READY, message), None));
        }
        Some(TRUE) => true,
        _ if status.components.is_empty() => {
            delete_deployments(ctx, cache, binding, namespace, &BTreeSet::new()).await?;
            let message = format!(
                "SnapshotEventBinding Component status is required to generate GitOps deployment, waiting for the \
                 Application Service controller to finish reconciling binding '{name}'"
            );
            return Ok((Report::Error(WAITING_FOR_COMPONENT_STATUS, message), Some(Vec::new())));
        }
        _ => false,
    };
    if let Some(duplicate) = desired::duplicate_component(&status.components) {
        let message = format!("duplicate component keys found in status field in {duplicate}");
        return Ok((Report::Error(DUPLICATE_COMPONENTS, message), None));
    }
    let destination = match destination(ctx, env, namespace).await? {
        Ok(destination) => destination,
        Err(message) => return Ok((Report::Error(ERROR_GENERATING, message), None)),
    };
    let mut components = status.components.clone();
    components.sort_by(|a, b| a.name.cmp(&b.name));
    let mut expected = Vec::with_capacity(components.len());
    for component in &components {
        match desired::expected(binding, component, &destination) {
            Ok(one) => expected.push(one),
            Err(message) => return Ok((Report::Error(ERROR_GENERATING, message), None)),
        }
    }
    let keep: BTreeSet<String> = expected.iter().map(|e| e.name.clone()).collect();
    delete_deployments(ctx, cache, binding, namespace, &keep).await?;
    let mut entries = Vec::with_capacity(expected.len());
    let mut refused = Vec::new();
    for one in &expected {
        match apply_deployment(ctx, cache, binding, namespace, one).await? {
            Ok(live) => entries.push(status::deployment_entry(&one.component, &one.name, live.as_ref())),
            Err(message) => {
                refused.push(message);
                entries.push(status::deployment_entry(&one.component, &one.name, None));
            }
        }
    }
    if !refused.is_empty() {
        return Ok((Report::Error(ERROR_GENERATING, refused.join("; ")), Some(entries)));
    }
    Ok((Report::Done { gate }, Some(entries)))
}

/// The name of an older binding of the same (application, environment), if any:
/// that one acts, this one does not.
fn older_duplicate(cache: &Cache, binding: &SnapshotEnvironmentBinding, namespace: &str) -> Option<String> {
    let key = |b: &SnapshotEnvironmentBinding| (b.metadata.creation_timestamp.clone().map(|t| t.0), b.name_any());
    cache
        .bindings_for(namespace, &binding.spec.application, &binding.spec.environment)
        .iter()
        .filter(|other| {
            other.metadata.uid != binding.metadata.uid
                && other.metadata.deletion_timestamp.is_none()
                && other.spec.application == binding.spec.application
                && other.spec.environment == binding.spec.environment
                && key(other) < key(binding)
        })
        .map(|other| other.name_any())
        .min()
}

/// The destination the Environment gives, or the tenant's mistake.
async fn destination(
    ctx: &Context,
    env: &Environment,
    namespace: &str,
) -> Result<Result<gitops_writer::api::DeploymentDestination, String>, ReconcileError> {
    let (mut claim_found, mut bound) = (false, None);
    if let Some(claim_name) = env.spec.claim_name() {
        let claims = Api::<DeploymentTargetClaim>::namespaced(ctx.client.clone(), namespace);
        if let Some(claim) = found(claims.get(claim_name).await, "read the DeploymentTargetClaim")? {
            claim_found = true;
            if let Bound::Target(target) = target::bound_target(&ctx.client, namespace, &claim).await? {
                bound = Some(*target);
            }
        }
    }
    Ok(desired::destination(env, claim_found, bound.as_ref()))
}

/// Deletes the binding's deployments not named in `keep`.
async fn delete_deployments(
    ctx: &Context,
    cache: &Cache,
    binding: &SnapshotEnvironmentBinding,
    namespace: &str,
    keep: &BTreeSet<String>,
) -> Result<(), ReconcileError> {
    let api = Api::<GitOpsDeployment>::namespaced(ctx.client.clone(), namespace);
    let uid = binding.uid().ok_or(ReconcileError::Incomplete("uid"))?;
    let gone = cache.owned_by(&uid).into_iter().filter(|deployment| {
        deployment.labels().get(APPLICATION_LABEL) == Some(&binding.spec.application)
            && deployment.metadata.namespace.as_deref() == Some(namespace)
            && deployment.metadata.deletion_timestamp.is_none()
            && !keep.contains(&deployment.name_any())
    });
    for deployment in gone {
        let name = deployment.name_any();
        tracing::info!(tenant.ns = %namespace, deployment = %name, "deleting a GitOpsDeployment of a component no longer bound");
        deleted(api.delete(&name, &DeleteParams::default()).await, "delete a GitOpsDeployment")?;
    }
    Ok(())
}

/// Creates or corrects one deployment; returns it as it is now, or why it was refused.
async fn apply_deployment(
    ctx: &Context,
    cache: &Cache,
    binding: &SnapshotEnvironmentBinding,
    namespace: &str,
    expected: &desired::Expected,
) -> Result<Result<Option<GitOpsDeployment>, String>, ReconcileError> {
    let api = Api::<GitOpsDeployment>::namespaced(ctx.client.clone(), namespace);
    let mut owner = binding.controller_owner_ref(&()).ok_or(ReconcileError::Incomplete("uid"))?;
    owner.block_owner_deletion = Some(true);
    if let Some(live) = cache.deployment(namespace, &expected.name) {
        let owned = live.owner_references().iter().any(|o| o.uid == owner.uid);
        let same_spec = live.spec.source == expected.spec.source
            && live.spec.destination == expected.spec.destination
            && live.spec.type_ == expected.spec.type_;
        if owned && same_spec && desired::appstudio_labels(live.labels()) == expected.labels {
            return Ok(Ok(Some(live.as_ref().clone())));
        }
    }
    let object = json!({
        "apiVersion": GitOpsDeployment::api_version(&()),
        "kind": GitOpsDeployment::kind(&()),
        "metadata": {"name": expected.name, "labels": expected.labels, "ownerReferences": [owner]},
        "spec": {"source": expected.spec.source, "destination": expected.spec.destination, "type": expected.spec.type_},
    });
    tracing::debug!(tenant.ns = %namespace, deployment = %expected.name, "applying a GitOpsDeployment");
    match api.patch(&expected.name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object)).await {
        Ok(live) => Ok(Ok(Some(live))),
        Err(kube::Error::Api(status)) if matches!(status.code, 400 | 403 | 422) => {
            Ok(Err(format!("the GitOpsDeployment {} was refused: {}", expected.name, status.message)))
        }
        Err(source) => Err(ReconcileError::Kube { action: "apply a GitOpsDeployment", source }),
    }
}

/// Writes the binding's conditions and deployment entries, if they changed.
async fn write_status(
    ctx: &Context,
    binding: &SnapshotEnvironmentBinding,
    namespace: &str,
    report: Report,
    entries: Option<Vec<crate::api::BindingStatusGitOpsDeployment>>,
) -> Result<(), ReconcileError> {
    let old: SnapshotEnvironmentBindingStatus = binding.status.clone().unwrap_or_default();
    let now = now_rfc3339();
    let mut binding_conditions = old.binding_conditions.clone();
    match report {
        Report::Done { gate: true } => {
            condition::upsert(
                &mut binding_conditions,
                condition::condition(ERROR_OCCURRED, FALSE, RECONCILED, ""),
                &now,
            );
            condition::upsert(&mut binding_conditions, condition::condition(RECONCILED, TRUE, RECONCILED, ""), &now);
        }
        Report::Done { gate: false } => {
            condition::resolve(&mut binding_conditions, &now);
        }
        Report::Error(reason, message) => {
            condition::set_error(&mut binding_conditions, reason, &message, &now);
        }
    }
    let (gitops_deployments, component_deployment_conditions) = match entries {
        // Nothing to deploy: no deployment condition either.
        Some(entries) if entries.is_empty() => (entries, Vec::new()),
        Some(entries) => {
            let conditions = status::deployment_conditions(
                &old.component_deployment_conditions,
                status::components_deployed(&entries),
                &now,
            );
            (entries, conditions)
        }
        None => (old.gitops_deployments.clone(), old.component_deployment_conditions.clone()),
    };
    if binding_conditions == old.binding_conditions
        && gitops_deployments == old.gitops_deployments
        && component_deployment_conditions == old.component_deployment_conditions
    {
        return Ok(());
    }
    let patch = json!({"status": {
        "bindingConditions": binding_conditions,
        "gitopsDeployments": gitops_deployments,
        "componentDeploymentConditions": component_deployment_conditions,
    }});
    let api = Api::<SnapshotEnvironmentBinding>::namespaced(ctx.client.clone(), namespace);
    deleted(
        api.patch_status(&binding.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await,
        "write the binding's status",
    )
}
