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

pub mod rules;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde::de::DeserializeOwned;
use serde_json::Value;

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
    /// The verdict on one request: Ok allows it.
    pub async fn verdict(&self, request: &AdmissionRequest<DynamicObject>) -> Result<(), String> {
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
            match self.verdict(request).await {
                Ok(()) => allow,
                Err(message) => {
                    let mut response = allow.deny(message);
                    response.result.code = 422;
                    response.result.reason = "Invalid".to_owned();
                    response
                }
            }
        })
    }

    fn count(&self, request: Option<&AdmissionRequest<DynamicObject>>, outcome: &'static str) {
        self.metrics.admission_reviewed(request.map_or("other", kind_label), outcome);
    }
}
