//! `gitopsctl crds check`: the stored tenant resources that the writer's rules
//! refuse — run it before applying stricter CRDs. The schemas are never stricter
//! than those rules (a unit test of the writer proves it for every pattern), so the
//! list holds every stored object a new schema could refuse, plus objects the
//! writer already refuses for reasons no schema expresses.
//!
//! Why before: Kubernetes 1.20 validates every update of a custom resource against
//! the current schema, metadata-only ones included, so once a stricter schema is
//! served an object it refuses can no longer lose its finalizer — its deletion
//! hangs until its spec is fixed. Fix or delete what this lists first (while the
//! writer still removes finalizers), then apply the CRDs.

use gitops_writer::api::{
    GROUP, GitOpsDeployment, GitOpsDeploymentManagedEnvironment, GitOpsDeploymentRepositoryCredential,
    GitOpsDeploymentSyncRun,
};
use gitops_writer::validate::{self, Invalid, reason};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde::de::DeserializeOwned;

use crate::CtlError;
use crate::table::render;

/// The four kinds as (plural, kind).
const KINDS: [(&str, &str); 4] = [
    ("gitopsdeployments", "GitOpsDeployment"),
    ("gitopsdeploymentsyncruns", "GitOpsDeploymentSyncRun"),
    ("gitopsdeploymentmanagedenvironments", "GitOpsDeploymentManagedEnvironment"),
    ("gitopsdeploymentrepositorycredentials", "GitOpsDeploymentRepositoryCredential"),
];

/// One stored object the rules refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// Being deleted (its finalizer waits for the writer).
    pub deleting: bool,
    pub reason: &'static str,
    pub message: String,
}

fn typed<T: DeserializeOwned>(object: &DynamicObject) -> Result<T, Invalid> {
    let unreadable = || Invalid::new(reason::INVALID_SPEC, "the object does not have the resource's shape");
    serde_json::to_value(object).ok().and_then(|v| serde_json::from_value(v).ok()).ok_or_else(unreadable)
}

/// What the writer's rules say of one stored object of `kind` (the webhook's and
/// the controllers' checks that need nothing but the object).
pub fn check_object(kind: &str, object: &DynamicObject, allow_private: bool) -> Result<(), Invalid> {
    let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
    match kind {
        "GitOpsDeployment" => {
            let valid = validate::deployment(&typed::<GitOpsDeployment>(object)?.spec)?;
            validate::home_destination(&valid, namespace)
        }
        "GitOpsDeploymentSyncRun" => validate::sync_run(&typed::<GitOpsDeploymentSyncRun>(object)?.spec).map(drop),
        "GitOpsDeploymentManagedEnvironment" => {
            let valid = validate::environment(&typed::<GitOpsDeploymentManagedEnvironment>(object)?.spec)?;
            if allow_private { Ok(()) } else { validate::public_api_url("spec.apiURL", &valid.api_url) }
        }
        "GitOpsDeploymentRepositoryCredential" => {
            validate::repository_credential(&typed::<GitOpsDeploymentRepositoryCredential>(object)?.spec).map(drop)
        }
        _ => Ok(()),
    }
}

/// Lists every stored tenant resource (all namespaces) and returns those refused.
pub async fn check(kube: kube::Client, allow_private: bool) -> Result<Vec<Refused>, CtlError> {
    let mut refused = Vec::new();
    for (plural, kind) in KINDS {
        let resource = ApiResource {
            group: GROUP.to_owned(),
            version: "v1alpha1".to_owned(),
            api_version: format!("{GROUP}/v1alpha1"),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        };
        let api: Api<DynamicObject> = Api::all_with(kube.clone(), &resource);
        let mut params = ListParams::default().limit(500);
        loop {
            let list = api.list(&params).await.map_err(|source| CtlError::Kube { action: "list", kind, source })?;
            for object in &list.items {
                if let Err(invalid) = check_object(kind, object, allow_private) {
                    refused.push(Refused {
                        kind,
                        namespace: object.metadata.namespace.clone().unwrap_or_default(),
                        name: object.metadata.name.clone().unwrap_or_default(),
                        deleting: object.metadata.deletion_timestamp.is_some(),
                        reason: invalid.reason,
                        message: invalid.message,
                    });
                }
            }
            match list.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    }
    Ok(refused)
}

/// The table `gitopsctl crds check` prints; an empty list says so.
pub fn render_refused(refused: &[Refused]) -> String {
    if refused.is_empty() {
        return "every stored tenant resource passes the rules: the CRDs can be applied\n".to_owned();
    }
    let rows: Vec<Vec<String>> = refused
        .iter()
        .map(|r| {
            vec![
                r.namespace.clone(),
                r.kind.to_owned(),
                r.name.clone(),
                if r.deleting { "yes" } else { "" }.to_owned(),
                r.reason.to_owned(),
                r.message.clone(),
            ]
        })
        .collect();
    format!(
        "{}{} stored objects are refused; fix or delete them before applying stricter CRDs\n",
        render(&["NAMESPACE", "KIND", "NAME", "DELETING", "REASON", "MESSAGE"], &rows),
        refused.len()
    )
}
