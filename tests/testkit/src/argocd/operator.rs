//! The Argo CD Operator's part, played for tests: its `ArgoCD` kind
//! (`argocds.argoproj.io`, `v1beta1`, the operator's current version of it) and a
//! loop that, for every such resource, starts an Argo CD stand-in over the
//! resource's namespace with the requested `spec.version`, reports
//! `status.phase: Available` as the operator does once the instance runs, and
//! stops the stand-in when the resource is deleted.
//!
//! The CRD carries the fields the service reads or writes (`spec.version`,
//! `spec.resourceTrackingMethod`, `status.phase`, `status.version`) with the
//! operator's types; everything else is kept as unknown fields
//! (`x-kubernetes-preserve-unknown-fields`), since the operator's full schema is
//! not reproduced here. Status is a subresource, as in the operator's CRD.

use std::collections::BTreeMap;

use futures_util::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::crds::{from_json, labels, preserved, string};
use super::{DEFAULT_VERSION, StandinOptions};

/// The field manager of the operator stand-in's status writes.
const FIELD_MANAGER: &str = "argocd-operator-standin";

/// `argocds.argoproj.io/v1beta1`.
pub fn argocd_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("argoproj.io", "v1beta1", "ArgoCD"), "argocds")
}

/// `argocds.argoproj.io`, with the fields used and unknown fields kept.
pub fn argocd_crd() -> CustomResourceDefinition {
    from_json(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "argocds.argoproj.io", "labels": labels("argocds.argoproj.io")},
        "spec": {
            "group": "argoproj.io",
            "names": {"kind": "ArgoCD", "listKind": "ArgoCDList", "plural": "argocds", "singular": "argocd"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1beta1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "apiVersion": string(),
                        "kind": string(),
                        "metadata": {"type": "object"},
                        "spec": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": true,
                            "properties": {"version": string(), "resourceTrackingMethod": string()},
                        },
                        "status": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": true,
                            "properties": {"phase": string(), "version": string(), "server": preserved()},
                        },
                    },
                }},
                "subresources": {"status": {}},
            }],
        },
    }))
}

/// Plays the operator until `cancel` fires: an Argo CD stand-in (with `options`,
/// and each resource's `spec.version`) per `ArgoCD` resource in a namespace whose
/// name starts with `namespaces` ("" for every namespace; tests sharing a cluster
/// each keep to their own).
pub async fn run_operator(client: Client, options: StandinOptions, namespaces: String, cancel: CancellationToken) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &argocd_resource());
    let mut running: BTreeMap<String, CancellationToken> = BTreeMap::new();
    let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => break,
            event = events.next() => event,
        };
        let Some(event) = event else { break };
        let objects = match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => vec![(object, true)],
            Ok(watcher::Event::Delete(object)) => vec![(object, false)],
            Ok(_) => Vec::new(),
            Err(error) => {
                warn!(%error, "the operator stand-in's watch failed; it retries");
                Vec::new()
            }
        };
        for (object, live) in objects {
            let Some(namespace) = object.namespace().filter(|ns| ns.starts_with(&namespaces)) else { continue };
            if !live || object.metadata.deletion_timestamp.is_some() {
                if let Some(token) = running.remove(&namespace) {
                    token.cancel();
                    info!(argocd.ns = %namespace, "ArgoCD deleted: its stand-in stopped");
                }
                continue;
            }
            let version = object.data.pointer("/spec/version").and_then(|v| v.as_str()).unwrap_or(DEFAULT_VERSION);
            if !running.contains_key(&namespace) {
                let tracking = object.data.pointer("/spec/resourceTrackingMethod").and_then(|v| v.as_str());
                if let Some(tracking) = tracking
                    && let Err(error) = settings(&client, &namespace, tracking).await
                {
                    warn!(argocd.ns = %namespace, %error, "could not write argocd-cm");
                }
                let token = cancel.child_token();
                let options = StandinOptions { version: version.to_owned(), ..options.clone() };
                tokio::spawn({
                    let (client, namespace, token) = (client.clone(), namespace.clone(), token.clone());
                    async move {
                        if let Err(error) = super::run(client, &namespace, options, token).await {
                            warn!(argocd.ns = %namespace, %error, "a stand-in started for an ArgoCD stopped");
                        }
                    }
                });
                running.insert(namespace.clone(), token);
                info!(argocd.ns = %namespace, version, "ArgoCD: stand-in started");
            }
            if object.data.pointer("/status/phase").and_then(|p| p.as_str()) != Some("Available") {
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &argocd_resource());
                let status = json!({
                    "apiVersion": "argoproj.io/v1beta1", "kind": "ArgoCD",
                    "status": {"phase": "Available", "version": version},
                });
                if let Err(error) = api
                    .patch_status(&object.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(status))
                    .await
                {
                    warn!(argocd.ns = %namespace, %error, "could not report the ArgoCD available");
                }
            }
        }
    }
    for token in running.values() {
        token.cancel();
    }
}

/// Writes `argocd-cm` as the operator does from the resource's spec (only the
/// tracking method is modelled).
async fn settings(client: &Client, namespace: &str, tracking: &str) -> Result<(), kube::Error> {
    let config: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), namespace);
    let object = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "argocd-cm"},
        "data": {"application.resourceTrackingMethod": tracking},
    });
    config.patch("argocd-cm", &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(object)).await?;
    Ok(())
}
