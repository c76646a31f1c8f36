//! Argo CD's `Application` and `AppProject` CustomResourceDefinitions, so the
//! stand-in, the emulator and the tests can install the objects the agent writes
//! without a real Argo CD.
//!
//! The shapes follow `manifests/crds/application-crd.yaml` and
//! `appproject-crd.yaml` of the argoproj/argo-cd repository on the v3 line
//! (v3.6.1 is the current stable release); the fields kept here have had the
//! same shape throughout v2 and v3. What is faithful: group, version, scope, names, short names, printer
//! columns, **no status subresource** on either kind (`subresources: {}` upstream:
//! status lives on the main resource, so any non-metadata write bumps
//! `generation`), `required: [metadata, spec]`, and every field the service or the
//! stand-in reads or writes, with upstream's types, formats and `required` lists.
//! What is trimmed: descriptions; the per-tool source options (`directory`,
//! `helm`, `kustomize`, `plugin`), `syncStrategy`, `ignoreDifferences`,
//! `sourceHydrator`, `managedNamespaceMetadata`, `syncResult.resources`, project
//! `roles`, `syncWindows`, `orphanedResources` and the project status are kept as
//! objects with `x-kubernetes-preserve-unknown-fields: true` instead of their full
//! schemas, so values written by a real Argo CD client survive untouched. One
//! addition on request of the test kit: `categories: [argo]` (upstream declares
//! none), so `kubectl get argo` lists both kinds.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

/// Label that marks a CRD as installed by this test kit (and so replaceable by it).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] on the CRDs built here.
pub const MANAGED_BY_VALUE: &str = "gitops-testkit";

/// `applications.argoproj.io`.
pub fn application_crd() -> CustomResourceDefinition {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": "applications.argoproj.io",
            "labels": labels("applications.argoproj.io"),
        },
        "spec": {
            "group": "argoproj.io",
            "names": {
                "kind": "Application",
                "listKind": "ApplicationList",
                "plural": "applications",
                "singular": "application",
                "shortNames": ["app", "apps"],
                "categories": ["argo"],
            },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1alpha1",
                "served": true,
                "storage": true,
                "additionalPrinterColumns": [
                    {"jsonPath": ".status.sync.status", "name": "Sync Status", "type": "string"},
                    {"jsonPath": ".status.health.status", "name": "Health Status", "type": "string"},
                    {"jsonPath": ".status.sync.revision", "name": "Revision", "priority": 10, "type": "string"},
                    {"jsonPath": ".spec.project", "name": "Project", "priority": 10, "type": "string"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["metadata", "spec"],
                    "properties": {
                        "apiVersion": string(),
                        "kind": string(),
                        "metadata": {"type": "object"},
                        "operation": operation(),
                        "spec": application_spec(),
                        "status": application_status(),
                    },
                }},
                "subresources": {},
            }],
        },
    });
    from_json(crd)
}

/// `appprojects.argoproj.io`.
pub fn app_project_crd() -> CustomResourceDefinition {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": "appprojects.argoproj.io",
            "labels": labels("appprojects.argoproj.io"),
        },
        "spec": {
            "group": "argoproj.io",
            "names": {
                "kind": "AppProject",
                "listKind": "AppProjectList",
                "plural": "appprojects",
                "singular": "appproject",
                "shortNames": ["appproj", "appprojs"],
                "categories": ["argo"],
            },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1alpha1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["metadata", "spec"],
                    "properties": {
                        "apiVersion": string(),
                        "kind": string(),
                        "metadata": {"type": "object"},
                        "spec": app_project_spec(),
                        "status": preserved(),
                    },
                }},
            }],
        },
    });
    from_json(crd)
}

pub(super) fn from_json(value: Value) -> CustomResourceDefinition {
    // The literals above are fixed at compile time; a failure is a bug in this file
    // and the unit tests below catch it.
    serde_json::from_value(value).expect("a CustomResourceDefinition literal")
}

pub(super) fn labels(name: &str) -> Value {
    json!({
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/part-of": "argocd",
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
    })
}

pub(super) fn string() -> Value {
    json!({"type": "string"})
}

fn boolean() -> Value {
    json!({"type": "boolean"})
}

fn int64() -> Value {
    json!({"type": "integer", "format": "int64"})
}

fn date_time() -> Value {
    json!({"type": "string", "format": "date-time"})
}

fn strings() -> Value {
    json!({"type": "array", "items": string()})
}

pub(super) fn preserved() -> Value {
    json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

fn array_of(items: Value) -> Value {
    json!({"type": "array", "items": items})
}

/// `ApplicationSource`: the fields the service sets are typed; the per-tool
/// options are preserved as they come.
fn source() -> Value {
    json!({
        "type": "object",
        "required": ["repoURL"],
        "properties": {
            "repoURL": string(),
            "path": string(),
            "targetRevision": string(),
            "chart": string(),
            "ref": string(),
            "name": string(),
            "directory": preserved(),
            "helm": preserved(),
            "kustomize": preserved(),
            "plugin": preserved(),
        },
    })
}

/// `ApplicationDestination`.
fn destination() -> Value {
    json!({
        "type": "object",
        "properties": {"server": string(), "namespace": string(), "name": string()},
    })
}

fn info_items() -> Value {
    array_of(json!({
        "type": "object",
        "required": ["name", "value"],
        "properties": {"name": string(), "value": string()},
    }))
}

fn retry_strategy() -> Value {
    json!({
        "type": "object",
        "properties": {
            "backoff": {
                "type": "object",
                "properties": {"duration": string(), "factor": int64(), "maxDuration": string()},
            },
            "limit": int64(),
            "refresh": boolean(),
        },
    })
}

/// `Operation`: both the requested `.operation` and `status.operationState.operation`.
fn operation() -> Value {
    json!({
        "type": "object",
        "properties": {
            "info": info_items(),
            "initiatedBy": {
                "type": "object",
                "properties": {"automated": boolean(), "username": string()},
            },
            "retry": retry_strategy(),
            "sync": {
                "type": "object",
                "properties": {
                    "autoHealAttemptsCount": int64(),
                    "dryRun": boolean(),
                    "manifests": strings(),
                    "prune": boolean(),
                    "resources": array_of(json!({
                        "type": "object",
                        "required": ["kind", "name"],
                        "properties": {
                            "group": string(), "kind": string(), "name": string(), "namespace": string(),
                        },
                    })),
                    "revision": string(),
                    "revisions": strings(),
                    "source": source(),
                    "sources": array_of(source()),
                    "syncOptions": strings(),
                    "syncStrategy": preserved(),
                },
            },
        },
    })
}

fn application_spec() -> Value {
    json!({
        "type": "object",
        "required": ["destination", "project"],
        "properties": {
            "destination": destination(),
            "ignoreDifferences": array_of(preserved()),
            "info": info_items(),
            "project": string(),
            "revisionHistoryLimit": int64(),
            "source": source(),
            "sourceHydrator": preserved(),
            "sources": array_of(source()),
            "syncPolicy": {
                "type": "object",
                "properties": {
                    "automated": {
                        "type": "object",
                        "properties": {
                            "allowEmpty": boolean(),
                            "enabled": boolean(),
                            "prune": boolean(),
                            "selfHeal": boolean(),
                        },
                    },
                    "managedNamespaceMetadata": preserved(),
                    "retry": retry_strategy(),
                    "syncOptions": strings(),
                },
            },
        },
    })
}

fn health() -> Value {
    json!({
        "type": "object",
        "properties": {"lastTransitionTime": date_time(), "message": string(), "status": string()},
    })
}

fn application_status() -> Value {
    json!({
        "type": "object",
        "properties": {
            "conditions": array_of(json!({
                "type": "object",
                "required": ["message", "type"],
                "properties": {"lastTransitionTime": date_time(), "message": string(), "type": string()},
            })),
            "controllerNamespace": string(),
            "health": health(),
            "history": array_of(json!({
                "type": "object",
                "required": ["deployedAt", "id"],
                "properties": {
                    "deployStartedAt": date_time(),
                    "deployedAt": date_time(),
                    "id": int64(),
                    "initiatedBy": {
                        "type": "object",
                        "properties": {"automated": boolean(), "username": string()},
                    },
                    "revision": string(),
                    "revisions": strings(),
                    "source": source(),
                    "sources": array_of(source()),
                },
            })),
            "observedAt": date_time(),
            "operationState": {
                "type": "object",
                "required": ["operation", "phase", "startedAt"],
                "properties": {
                    "finishedAt": date_time(),
                    "message": string(),
                    "operation": operation(),
                    "phase": string(),
                    "retryCount": int64(),
                    "startedAt": date_time(),
                    "syncResult": {
                        "type": "object",
                        "properties": {
                            "managedNamespaceMetadata": preserved(),
                            "resources": array_of(preserved()),
                            "revision": string(),
                            "revisions": strings(),
                            "source": source(),
                            "sources": array_of(source()),
                        },
                    },
                },
            },
            "reconciledAt": date_time(),
            "resourceHealthSource": string(),
            "resources": array_of(json!({
                "type": "object",
                "properties": {
                    "group": string(),
                    "health": health(),
                    "hook": boolean(),
                    "kind": string(),
                    "name": string(),
                    "namespace": string(),
                    "requiresDeletionConfirmation": boolean(),
                    "requiresPruning": boolean(),
                    "status": string(),
                    "syncWave": int64(),
                    "version": string(),
                },
            })),
            "sourceHydrator": preserved(),
            "sourceType": string(),
            "sourceTypes": strings(),
            "summary": {
                "type": "object",
                "properties": {"externalURLs": strings(), "images": strings()},
            },
            "sync": {
                "type": "object",
                "required": ["status"],
                "properties": {
                    "comparedTo": {
                        "type": "object",
                        "required": ["destination"],
                        "properties": {
                            "destination": destination(),
                            "ignoreDifferences": array_of(preserved()),
                            "source": source(),
                            "sources": array_of(source()),
                        },
                    },
                    "revision": string(),
                    "revisions": strings(),
                    "status": string(),
                },
            },
        },
    })
}

fn group_kinds() -> Value {
    array_of(json!({
        "type": "object",
        "required": ["group", "kind"],
        "properties": {"group": string(), "kind": string()},
    }))
}

fn app_project_spec() -> Value {
    json!({
        "type": "object",
        "properties": {
            "clusterResourceBlacklist": group_kinds(),
            "clusterResourceWhitelist": group_kinds(),
            "description": string(),
            "destinationServiceAccounts": array_of(json!({
                "type": "object",
                "required": ["defaultServiceAccount", "server"],
                "properties": {"defaultServiceAccount": string(), "namespace": string(), "server": string()},
            })),
            "destinations": array_of(destination()),
            "namespaceResourceBlacklist": group_kinds(),
            "namespaceResourceWhitelist": group_kinds(),
            "orphanedResources": preserved(),
            "permitOnlyProjectScopedClusters": boolean(),
            "roles": array_of(preserved()),
            "signatureKeys": array_of(json!({
                "type": "object",
                "required": ["keyID"],
                "properties": {"keyID": string()},
            })),
            "sourceNamespaces": strings(),
            "sourceRepos": strings(),
            "syncWindows": array_of(preserved()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version_schema(crd: &CustomResourceDefinition) -> Value {
        let version = &crd.spec.versions[0];
        serde_json::to_value(version.schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap()).unwrap()
    }

    #[test]
    fn application_has_no_status_subresource_and_argo_names() {
        let crd = application_crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("applications.argoproj.io"));
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.short_names.as_deref(), Some(&["app".to_owned(), "apps".to_owned()][..]));
        let version = &crd.spec.versions[0];
        let subresources = version.subresources.as_ref().unwrap();
        assert!(subresources.status.is_none() && subresources.scale.is_none());
        let columns: Vec<&str> =
            version.additional_printer_columns.as_ref().unwrap().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(columns, ["Sync Status", "Health Status", "Revision", "Project"]);
        let schema = version_schema(&crd);
        assert_eq!(schema["required"], json!(["metadata", "spec"]));
        assert_eq!(
            schema["properties"]["status"]["properties"]["operationState"]["required"],
            json!(["operation", "phase", "startedAt"])
        );
    }

    #[test]
    fn app_project_names() {
        let crd = app_project_crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("appprojects.argoproj.io"));
        assert_eq!(crd.spec.names.short_names.as_deref(), Some(&["appproj".to_owned(), "appprojs".to_owned()][..]));
        assert!(crd.spec.versions[0].subresources.is_none());
        let schema = version_schema(&crd);
        assert_eq!(schema["properties"]["spec"]["properties"]["sourceRepos"]["items"]["type"], "string");
    }

    /// A structural schema: every node has a type (or preserves unknown fields),
    /// so the API server accepts it and prunes as it would upstream's.
    #[test]
    fn schemas_are_structural() {
        fn check(path: &str, node: &Value) {
            let object = node.as_object().unwrap_or_else(|| panic!("{path} is not an object"));
            assert!(object.contains_key("type"), "{path} has no type");
            if let Some(properties) = object.get("properties").and_then(Value::as_object) {
                for (name, child) in properties {
                    check(&format!("{path}.{name}"), child);
                }
            }
            if let Some(items) = object.get("items") {
                check(&format!("{path}[]"), items);
            }
        }
        check("application", &version_schema(&application_crd()));
        check("appproject", &version_schema(&app_project_crd()));
    }
}
