//! The layer's validating admission webhook: the core's HTTPS server
//! (`gitops_writer::webhook`: certificate files read again when they change,
//! `POST /validate`) answering with [`rules`] for CREATE and UPDATE of
//! Environments, SnapshotEnvironmentBindings, Snapshots, PromotionRuns and
//! DeploymentTargets (`ops/deploy/appstudio/webhook.yaml`). Deletes, `/status`
//! and changes that leave the spec alone are always allowed, so a finalizer can
//! always be released. Refusals are 422 `Invalid`, with the message the client prints.
//!
//! Two checks read other objects and so race (two creates can both pass): one
//! binding per (application, environment) and no cycle of `parentEnvironment`.
//! The controllers check both again and report them as conditions.
//!
//! Objects in namespaces the tenancy policy (the core's selection) does not serve
//! are refused first, with the core's message.
//!
//! **Home deployments.** An Environment without a cluster makes its bindings'
//! GitOpsDeployments go to the namespace itself, where Argo CD acts with the home
//! role. The core lets only who could grant that role there deploy so; the layer
//! holds no such right, so its webhook asks the same question (the core's
//! `escalation` check) of whoever makes something go home — creates an Environment
//! without a cluster or changes one to have none, creates or changes a binding of
//! such an Environment (or of one that does not exist yet), or creates a
//! PromotionRun into one — and the core's webhook approves the layer's home
//! deployments only when a binding of the namespace owns them
//! (`--appstudio-identity` on the writer). The layer's own requests (bindings a
//! promotion makes) are not asked again: the PromotionRun was.

pub mod rules;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde::de::DeserializeOwned;
use serde_json::Value;

use gitops_writer::webhook::escalation::Escalation;
use k8s_openapi::api::rbac::v1::ClusterRole;

use crate::api::{DeploymentTarget, Environment, PromotionRun, Snapshot, SnapshotEnvironmentBinding};
use crate::metrics::Metrics;

/// The API group the webhook judges.
const GROUP: &str = "appstudio.redhat.com";

/// The webhook's state.
pub struct Reviewer {
    pub client: kube::Client,
    /// `--api-url-allow-private`: loopback and link-local API URLs are accepted.
    pub allow_private: bool,
    /// Serve only this namespace (None: all), as the controllers do.
    pub namespace: Option<String>,
    pub metrics: Arc<Metrics>,
    /// Who may make things go home, and as whom the layer itself asks.
    pub home: HomeCheck,
    /// The tenant namespaces (the core's selection): objects elsewhere are refused.
    pub tenancy: gitops_shared::tenancy::NamespacePolicy,
}

/// The home-role check: the ClusterRole Argo CD acts with in a tenant's own
/// namespace (the writer's `--home-cluster-role`), the core's escalation checker,
/// and the layer's own username, whose requests are not checked.
pub struct HomeCheck {
    pub cluster_role: String,
    pub escalation: Escalation,
    pub own_identity: String,
}

impl HomeCheck {
    pub fn new(client: kube::Client, cluster_role: String, own_identity: String) -> HomeCheck {
        HomeCheck { cluster_role, escalation: Escalation::new(client), own_identity }
    }
}

/// A refusal of the webhook: 422 for a rule, 403 for the home-role check.
enum Verdict {
    Invalid(String),
    Forbidden(String),
}

impl From<String> for Verdict {
    fn from(message: String) -> Verdict {
        Verdict::Invalid(message)
    }
}

/// Whether an Environment's spec has no cluster: its bindings' deployments go home.
fn home_mode(spec: &crate::api::EnvironmentSpec) -> bool {
    spec.claim_name().is_none() && spec.unstable_configuration_fields.is_none()
}

/// The typed object of a request (`old`: the object before an update).
fn typed<K: DeserializeOwned>(object: Option<&DynamicObject>) -> Result<Option<K>, String> {
    let Some(object) = object else { return Ok(None) };
    let value = serde_json::to_value(object).map_err(|e| e.to_string())?;
    serde_json::from_value(value).map(Some).map_err(|e| format!("the object cannot be read: {e}"))
}

fn spec(object: Option<&DynamicObject>) -> Option<&Value> {
    object.and_then(|o| o.data.get("spec"))
}

impl Reviewer {
    /// The verdict on one request: the rules, then the home-role check.
    async fn verdict(&self, request: &AdmissionRequest<DynamicObject>) -> Result<(), Verdict> {
        if let Some(namespace) = self.generator_report(request) {
            // What a home binding deploys is what its status says: whoever writes
            // that is checked as whoever points the binding.
            let binding = typed::<SnapshotEnvironmentBinding>(request.object.as_ref())?;
            let Some(binding) = binding else { return Ok(()) };
            let goes_home = self.environment_goes_home(namespace, &binding.spec.environment).await?;
            return self.home_check(request, namespace, goes_home).await;
        }
        let Some(namespace) = self.judged(request) else { return Ok(()) };
        self.served(namespace).await?;
        self.rules(request).await?;
        let goes_home = self.goes_home(request, namespace).await?;
        self.home_check(request, namespace, goes_home).await
    }

    /// The namespace of a binding status update that changes `status.components`
    /// (the repository generator's report: the repository, path and commit each
    /// deployment takes).
    fn generator_report<'a>(&self, request: &'a AdmissionRequest<DynamicObject>) -> Option<&'a str> {
        let components = |object: Option<&DynamicObject>| {
            object.and_then(|o| o.data.get("status")).and_then(|s| s.get("components")).cloned()
        };
        let relevant = request.kind.group == GROUP
            && request.kind.kind == "SnapshotEnvironmentBinding"
            && request.sub_resource.as_deref() == Some("status")
            && request.operation == Operation::Update
            && components(request.object.as_ref()) != components(request.old_object.as_ref());
        let namespace = request.namespace.as_deref().filter(|_| relevant)?;
        self.namespace.as_deref().is_none_or(|served| served == namespace).then_some(namespace)
    }

    /// The home-role check of a request that `goes_home`; the layer's own pass.
    async fn home_check(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        namespace: &str,
        goes_home: bool,
    ) -> Result<(), Verdict> {
        if !goes_home || request.user_info.username.as_deref() == Some(self.home.own_identity.as_str()) {
            return Ok(());
        }
        let roles: Api<ClusterRole> = Api::all(self.client.clone());
        let role = match roles.get_opt(&self.home.cluster_role).await {
            Ok(Some(role)) => role,
            Ok(None) => {
                return Err(Verdict::Forbidden(format!(
                    "the GitOps service's home role {} does not exist, so nothing may deploy into this namespace \
                     itself; ask the operator",
                    self.home.cluster_role
                )));
            }
            Err(error) => return Err(Verdict::Forbidden(unavailable(error))),
        };
        self.home.escalation.may_grant(&request.user_info, namespace, &role).await.map_err(|refusal| {
            Verdict::Forbidden(format!(
                "{} {} makes deployments go into this namespace itself, with the role {}: {}",
                request.kind.kind, request.name, self.home.cluster_role, refusal.0
            ))
        })
    }

    /// Refuses a namespace the tenancy policy does not serve (403, the core's words).
    async fn served(&self, namespace: &str) -> Result<(), Verdict> {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let labels = match namespaces.get_opt(namespace).await {
            Ok(found) => found.and_then(|ns| ns.metadata.labels).unwrap_or_default(),
            Err(error) => return Err(Verdict::Forbidden(unavailable(error))),
        };
        self.tenancy.serves(namespace, &labels).map_err(|not| Verdict::Forbidden(not.message(namespace)))
    }

    /// The namespace of a request this webhook judges: a created object, or a
    /// changed spec, of the group, in a served namespace.
    fn judged<'a>(&self, request: &'a AdmissionRequest<DynamicObject>) -> Option<&'a str> {
        if request.kind.group != GROUP || request.sub_resource.is_some() {
            return None;
        }
        let changes = match request.operation {
            Operation::Create => true,
            Operation::Update => spec(request.object.as_ref()) != spec(request.old_object.as_ref()),
            _ => false,
        };
        let namespace = request.namespace.as_deref().filter(|_| changes)?;
        self.namespace.as_deref().is_none_or(|served| served == namespace).then_some(namespace)
    }

    /// Whether the request makes deployments go home (see the module's docs).
    async fn goes_home(&self, request: &AdmissionRequest<DynamicObject>, namespace: &str) -> Result<bool, Verdict> {
        let (new, old) = (request.object.as_ref(), request.old_object.as_ref());
        let environment = match request.kind.kind.as_str() {
            "Environment" => {
                let Some(env) = typed::<Environment>(new)? else { return Ok(false) };
                // Becoming home, or, being home, joining or leaving the automated
                // promotion graph (its parent or strategy), which decides whose runs
                // deploy into it.
                let Some(old) = typed::<Environment>(old)? else { return Ok(home_mode(&env.spec)) };
                let moved = old.spec.parent_environment != env.spec.parent_environment
                    || old.spec.deployment_strategy != env.spec.deployment_strategy;
                return Ok(home_mode(&env.spec) && (!home_mode(&old.spec) || moved));
            }
            "SnapshotEnvironmentBinding" => match typed::<SnapshotEnvironmentBinding>(new)? {
                Some(binding) => binding.spec.environment,
                None => return Ok(false),
            },
            "PromotionRun" if request.operation == Operation::Create => match typed::<PromotionRun>(new)? {
                Some(run) if !run.spec.automated_promotion.initial_environment.is_empty() => {
                    return self
                        .automated_goes_home(namespace, &run.spec.automated_promotion.initial_environment)
                        .await;
                }
                Some(run) if !run.spec.manual_promotion.target_environment.is_empty() => {
                    run.spec.manual_promotion.target_environment
                }
                _ => return Ok(false),
            },
            _ => return Ok(false),
        };
        self.environment_goes_home(namespace, &environment).await
    }

    /// Whether the Environment `name` has no cluster, or does not exist yet (it may
    /// come without one).
    async fn environment_goes_home(&self, namespace: &str, name: &str) -> Result<bool, Verdict> {
        let envs = Api::<Environment>::namespaced(self.client.clone(), namespace);
        match envs.get_opt(name).await {
            Ok(Some(env)) => Ok(home_mode(&env.spec)),
            Ok(None) => Ok(true),
            Err(error) => Err(Verdict::Forbidden(unavailable(error))),
        }
    }

    /// Whether an automated promotion from `initial` reaches an Environment without
    /// a cluster (or its plan cannot be made: then it is refused as the controller
    /// would report it).
    async fn automated_goes_home(&self, namespace: &str, initial: &str) -> Result<bool, Verdict> {
        let envs = Api::<Environment>::namespaced(self.client.clone(), namespace);
        let list = envs.list(&ListParams::default()).await.map_err(|e| Verdict::Forbidden(unavailable(e)))?;
        let nodes: std::collections::BTreeMap<String, crate::promotion::automated::Node> = list
            .items
            .iter()
            .filter_map(|env| {
                let node = crate::promotion::automated::Node {
                    parent: env.spec.parent_environment.clone(),
                    strategy: env.spec.deployment_strategy.clone(),
                };
                Some((env.metadata.name.clone()?, node))
            })
            .collect();
        let steps = crate::promotion::automated::plan(initial, &nodes).map_err(Verdict::Invalid)?;
        Ok(steps.iter().flatten().any(|name| {
            list.items
                .iter()
                .find(|env| env.metadata.name.as_deref() == Some(name.as_str()))
                .is_none_or(|env| home_mode(&env.spec))
        }))
    }

    /// The rules of [`rules`]: Ok allows the request.
    pub async fn rules(&self, request: &AdmissionRequest<DynamicObject>) -> Result<(), String> {
        if request.kind.group != GROUP || request.sub_resource.is_some() {
            return Ok(());
        }
        let create = match request.operation {
            Operation::Create => true,
            Operation::Update if spec(request.object.as_ref()) != spec(request.old_object.as_ref()) => false,
            _ => return Ok(()),
        };
        let Some(namespace) = request.namespace.as_deref() else { return Ok(()) };
        if self.namespace.as_deref().is_some_and(|served| served != namespace) {
            return Ok(());
        }
        let (new, old) = (request.object.as_ref(), request.old_object.as_ref());
        match request.kind.kind.as_str() {
            "Environment" => {
                let Some(env) = typed::<Environment>(new)? else { return Ok(()) };
                if create {
                    rules::environment_name(&request.name)?;
                }
                rules::environment(&env.spec, self.allow_private)?;
                let parent = env.spec.parent_environment.as_deref();
                let parent_changed =
                    create || typed::<Environment>(old)?.is_none_or(|o| o.spec.parent_environment.as_deref() != parent);
                if parent_changed && parent.is_some_and(|p| !p.is_empty()) {
                    let parents = self.parents(namespace).await?;
                    let cycle = rules::parent_cycle(&request.name, parent, |name| parents.get(name).cloned());
                    if let Some(path) = cycle {
                        return Err(rules::cycle_refusal(&path));
                    }
                }
                Ok(())
            }
            "SnapshotEnvironmentBinding" => {
                let Some(binding) = typed::<SnapshotEnvironmentBinding>(new)? else { return Ok(()) };
                if !create {
                    return match typed::<SnapshotEnvironmentBinding>(old)? {
                        Some(old) => rules::binding_update(&old.spec, &binding.spec),
                        None => Ok(()),
                    };
                }
                let api = Api::<SnapshotEnvironmentBinding>::namespaced(self.client.clone(), namespace);
                let others = api.list(&ListParams::default()).await.map_err(unavailable)?;
                match others.items.iter().find(|other| {
                    other.metadata.name.as_deref() != Some(request.name.as_str())
                        && other.spec.application == binding.spec.application
                        && other.spec.environment == binding.spec.environment
                }) {
                    Some(other) => {
                        Err(rules::duplicate_binding(&binding.spec, other.metadata.name.as_deref().unwrap_or_default()))
                    }
                    None => Ok(()),
                }
            }
            "Snapshot" if !create => match (typed::<Snapshot>(old)?, typed::<Snapshot>(new)?) {
                (Some(old), Some(new)) => rules::snapshot_update(&old.spec, &new.spec),
                _ => Ok(()),
            },
            "PromotionRun" if !create => match (typed::<PromotionRun>(old)?, typed::<PromotionRun>(new)?) {
                (Some(old), Some(new)) => rules::promotion_update(&old.spec, &new.spec),
                _ => Ok(()),
            },
            "DeploymentTarget" => match typed::<DeploymentTarget>(new)? {
                Some(target) => rules::deployment_target(&target.spec, self.allow_private),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// Each Environment's parent in `namespace`.
    async fn parents(&self, namespace: &str) -> Result<std::collections::HashMap<String, String>, String> {
        let api = Api::<Environment>::namespaced(self.client.clone(), namespace);
        let envs = api.list(&ListParams::default()).await.map_err(unavailable)?;
        Ok(envs
            .items
            .into_iter()
            .filter_map(|env| Some((env.metadata.name?, env.spec.parent_environment.unwrap_or_default())))
            .collect())
    }
}

/// A check that could not read what it needs refuses (the webhook fails closed).
fn unavailable(error: kube::Error) -> String {
    format!("the AppStudio webhook could not check this request now, try again: {error}")
}

/// The metric label of a request's kind.
pub fn kind_label(request: &AdmissionRequest<DynamicObject>) -> &'static str {
    crate::metrics::ADMISSION_KINDS.iter().find(|k| **k == request.kind.kind).copied().unwrap_or("other")
}

impl gitops_writer::webhook::Review for Reviewer {
    fn review<'a>(&'a self, request: &'a AdmissionRequest<DynamicObject>) -> BoxFuture<'a, AdmissionResponse> {
        Box::pin(async move {
            let allow = AdmissionResponse::from(request);
            let (code, reason, message) = match self.verdict(request).await {
                Ok(()) => return allow,
                Err(Verdict::Invalid(message)) => (422, "Invalid", message),
                Err(Verdict::Forbidden(message)) => (403, "Forbidden", message),
            };
            let mut response = allow.deny(message);
            response.result.code = code;
            response.result.reason = reason.to_owned();
            response
        })
    }

    fn count(&self, request: Option<&AdmissionRequest<DynamicObject>>, outcome: &'static str) {
        self.metrics.admission_reviewed(request.map_or("other", kind_label), outcome);
    }
}
