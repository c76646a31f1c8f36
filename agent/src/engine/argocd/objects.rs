//! The Argo CD objects built from engine specs, and the operation state read back:
//! pure functions, unit-tested. Ordinary objects never carry `.operation` or
//! `.status`: those belong to sync requests and to Argo CD.
//!
//! Credentials are project-scoped: every cluster and repository Secret carries
//! `project: <one of the tenant's AppProjects>`, so an Application of another
//! project that names the same repository URL or API server never receives them.
//! Argo CD reads the `project` key of these Secrets since v2.4; older versions
//! ignore it and would share credentials by URL, so the service needs Argo CD ≥ 2.4.
//!
//! A tenant has more than one project when environments allow cluster-scoped
//! resources (see [`project`]). A cluster Secret belongs to one environment, so it
//! names that environment's project and nothing is shared. A repository Secret
//! serves one project only, so a repository credential becomes one Secret per
//! project of its tenant, each a copy naming its project (labelled with it, and
//! with the credential's id, so all copies go with the credential). Several
//! repository Secrets for one URL, one per project, need an Argo CD that picks
//! repository credentials by project as well as by URL (added in 2024,
//! argoproj/argo-cd#18388); two tenants naming one repository needed that already.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value, json};

use super::fingerprint;
use crate::engine::{
    ApplicationSpec, ClusterSpec, ObjectKind, ObservedOperation, OperationPhase, OperationView, ProjectSpec,
    RepositorySpec,
};

/// Argo CD's finalizer: prune what the Application deployed before it goes.
pub const RESOURCES_FINALIZER: &str = "resources-finalizer.argocd.argoproj.io";
/// `resources-finalizer.argocd.argoproj.io` and its `/background`, `/foreground`
/// forms: each makes Argo CD prune before the Application goes.
pub fn is_resources_finalizer(finalizer: &str) -> bool {
    finalizer == RESOURCES_FINALIZER
        || finalizer.strip_prefix(RESOURCES_FINALIZER).is_some_and(|rest| rest.starts_with('/'))
}

/// Label by which Argo CD recognises its Secrets.
pub const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";
/// The `operation.info` entry that carries a sync's correlation id.
pub const CORRELATION_INFO: &str = "correlation-id";
/// Who requests syncs, as `operation.initiatedBy.username`.
pub const INITIATED_BY: &str = "gitops-agent";

/// How an automated Application's failed syncs are retried, as the original
/// service asked Argo CD: without limit, 5 s doubling up to 3 minutes.
pub fn automated_retry() -> Value {
    json!({"limit": -1, "backoff": {"duration": "5s", "factor": 2, "maxDuration": "3m"}})
}

/// The Application, as applied (the finalizer is part of it from creation on),
/// stamped with its spec hash and row generation (`fingerprint`).
/// Automated ones get the original service's sync policy: prune, self-heal, an
/// empty source allowed (`allowEmpty`: a tenant may empty its directory), children
/// pruned in the background and [`automated_retry`].
pub fn application(spec: &ApplicationSpec, namespace: &str) -> Value {
    let mut sync_policy = Map::new();
    let mut options = Vec::new();
    if spec.automated {
        sync_policy.insert("automated".into(), json!({"prune": true, "selfHeal": true, "allowEmpty": true}));
        sync_policy.insert("retry".into(), automated_retry());
        options.push("PrunePropagationPolicy=background");
    }
    if spec.create_namespace {
        options.push("CreateNamespace=true");
    }
    if !options.is_empty() {
        sync_policy.insert("syncOptions".into(), json!(options));
    }
    let mut object = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": spec.name,
            "namespace": namespace,
            "labels": spec.labels,
            "finalizers": [RESOURCES_FINALIZER],
        },
        "spec": {
            "project": spec.project,
            "source": {"repoURL": spec.repo_url, "path": spec.path, "targetRevision": spec.target_revision},
            "destination": {"server": spec.server, "namespace": spec.namespace},
            "syncPolicy": sync_policy,
        },
    });
    fingerprint::stamp(ObjectKind::Application, &mut object, spec.generation);
    object
}

/// One of a tenant's AppProjects.
///
/// `clusterResourceWhitelist` is a property of a whole project, not of one
/// destination, so cluster-scoped resources are scoped by project: a tenant's main
/// project lists the destinations of its environments that do not allow them
/// (its own namespace on the home cluster among them) and whitelists nothing;
/// each environment with `clusterResources: true` gets a project of its own that
/// lists only that environment's destinations and whitelists every group and
/// kind (`*/*`). The environment's Applications and its cluster Secret name that
/// project; what the environment's credentials may do still limits what Argo CD
/// can create there.
pub fn project(spec: &ProjectSpec, namespace: &str) -> Value {
    let destinations: Vec<Value> =
        spec.destinations.iter().map(|(server, ns)| json!({"server": server, "namespace": ns})).collect();
    let whitelist = if spec.cluster_resources { json!([{"group": "*", "kind": "*"}]) } else { json!([]) };
    let mut object = json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AppProject",
        "metadata": {"name": spec.name, "namespace": namespace, "labels": spec.labels},
        "spec": {
            "sourceRepos": spec.source_repos,
            "destinations": destinations,
            "clusterResourceWhitelist": whitelist,
        },
    });
    // A project is built from several rows: it carries its hash, no generation.
    fingerprint::stamp(ObjectKind::Project, &mut object, None);
    object
}

fn secret(
    name: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    kind: ObjectKind,
    data: BTreeMap<String, String>,
    generation: Option<i64>,
) -> Secret {
    let mut labels = labels.clone();
    let secret_type = if kind == ObjectKind::Cluster { "cluster" } else { "repository" };
    labels.insert(SECRET_TYPE_LABEL.to_owned(), secret_type.to_owned());
    let mut secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v.into_bytes()))).collect()),
        ..Secret::default()
    };
    // Serialising a Secret cannot fail; were it to, the object carries no hash and
    // the sweep merely reconciles it again.
    let value = serde_json::to_value(&secret).unwrap_or(Value::Null);
    secret.metadata.annotations = Some(fingerprint::annotations(kind, &value, generation).into_iter().collect());
    secret
}

/// The cluster Secret. `config` is built from the allow-listed credential fields
/// only; nothing else a tenant supplied reaches Argo CD.
pub fn cluster_secret(spec: &ClusterSpec, namespace: &str) -> Secret {
    let credentials = &spec.credentials;
    let mut tls = Map::new();
    tls.insert("insecure".into(), Value::Bool(spec.insecure));
    if let Some(ca) = &credentials.certificate_authority_data {
        tls.insert("caData".into(), Value::String(ca.clone()));
    }
    if let (Some(cert), Some(key)) = (&credentials.client_certificate_data, &credentials.client_key_data) {
        tls.insert("certData".into(), Value::String(cert.clone()));
        tls.insert("keyData".into(), Value::String(key.clone()));
    }
    if let Some(server_name) = &credentials.tls_server_name {
        tls.insert("serverName".into(), Value::String(server_name.clone()));
    }
    let mut config = Map::new();
    if let Some(token) = &credentials.bearer_token {
        config.insert("bearerToken".into(), Value::String(token.clone()));
    }
    config.insert("tlsClientConfig".into(), Value::Object(tls));
    let mut data = BTreeMap::from([
        ("name".to_owned(), spec.display_name.clone()),
        ("server".to_owned(), spec.server.clone()),
        ("config".to_owned(), Value::Object(config).to_string()),
        ("clusterResources".to_owned(), spec.cluster_resources.to_string()),
        ("project".to_owned(), spec.project.clone()),
    ]);
    if !spec.namespaces.is_empty() {
        data.insert("namespaces".to_owned(), spec.namespaces.join(","));
    }
    secret(&spec.name, namespace, &spec.labels, ObjectKind::Cluster, data, spec.generation)
}

/// The repository Secret.
pub fn repository_secret(spec: &RepositorySpec, namespace: &str) -> Secret {
    let mut data = BTreeMap::from([
        ("url".to_owned(), spec.url.clone()),
        ("type".to_owned(), "git".to_owned()),
        ("project".to_owned(), spec.project.clone()),
    ]);
    let credentials = &spec.credentials;
    if let Some(key) = &credentials.ssh_private_key {
        data.insert("sshPrivateKey".to_owned(), key.clone());
    } else {
        if let Some(username) = &credentials.username {
            data.insert("username".to_owned(), username.clone());
        }
        if let Some(password) = &credentials.password {
            data.insert("password".to_owned(), password.clone());
        }
    }
    secret(&spec.name, namespace, &spec.labels, ObjectKind::Repository, data, spec.generation)
}

/// The `.operation` of a sync request, with the correlation id in `info`.
/// Argo CD's annotation asking for a refresh (compare with Git again) first.
pub const REFRESH_ANNOTATION: &str = "argocd.argoproj.io/refresh";

/// The merge patch that requests a sync of `revision`: a normal refresh first, as
/// the original service did, so the sync compares with what Git holds now.
pub fn sync_operation(revision: &str, correlation_id: &str) -> Value {
    json!({
        "metadata": {"annotations": {REFRESH_ANNOTATION: "normal"}},
        "operation": {
            "sync": {"revision": revision},
            "info": [{"name": CORRELATION_INFO, "value": correlation_id}],
            "initiatedBy": {"username": INITIATED_BY},
        }
    })
}

fn correlation_of(operation: &Value) -> Option<String> {
    operation.get("info")?.as_array()?.iter().find_map(|entry| {
        (entry.get("name")?.as_str()? == CORRELATION_INFO).then(|| entry.get("value")?.as_str().map(str::to_owned))?
    })
}

fn text(value: &Value, pointer: &str) -> Option<String> {
    value.pointer(pointer).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned)
}

/// Reads the requested operation and `status.operationState` of an Application.
pub fn operation_view(application: &Value) -> OperationView {
    let requested =
        application.get("operation").filter(|op| op.is_object()).map(|op| correlation_of(op).unwrap_or_default());
    let state = application.pointer("/status/operationState").filter(|s| s.is_object()).map(|state| {
        let phase = match state.get("phase").and_then(Value::as_str).unwrap_or("") {
            "Running" => OperationPhase::Running,
            "Terminating" => OperationPhase::Terminating,
            "Succeeded" => OperationPhase::Succeeded,
            "Failed" => OperationPhase::Failed,
            "Error" => OperationPhase::Error,
            _ => OperationPhase::Unknown,
        };
        ObservedOperation {
            correlation_id: state.get("operation").and_then(correlation_of),
            phase,
            synced_revision: text(state, "/syncResult/revision"),
            message: text(state, "/message"),
            started_at: text(state, "/startedAt"),
            finished_at: text(state, "/finishedAt"),
        }
    });
    OperationView { requested, state }
}

#[cfg(test)]
mod tests {
    use gitops_shared::db::credential::{ClusterCredentials, RepositoryCredentials};

    use super::*;

    fn app(automated: bool, create_namespace: bool) -> ApplicationSpec {
        ApplicationSpec {
            name: "gitops-x".into(),
            labels: BTreeMap::new(),
            project: "gitops-tenant-1".into(),
            repo_url: "https://git.example.invalid/a.git".into(),
            path: "p".into(),
            target_revision: "HEAD".into(),
            server: "https://kubernetes.default.svc".into(),
            namespace: "team-a".into(),
            automated,
            create_namespace,
            generation: Some(1),
        }
    }

    #[test]
    fn every_form_of_the_resources_finalizer_is_recognised() {
        assert!(is_resources_finalizer(RESOURCES_FINALIZER));
        assert!(is_resources_finalizer("resources-finalizer.argocd.argoproj.io/background"));
        assert!(!is_resources_finalizer("resources-finalizer.argocd.argoproj.io.other"));
        assert!(!is_resources_finalizer("example.invalid/keep"));
    }

    #[test]
    fn applications_never_carry_operation_or_status() {
        let manual = application(&app(false, false), "argocd");
        assert!(manual.get("operation").is_none() && manual.get("status").is_none());
        assert_eq!(manual["spec"]["syncPolicy"], json!({}));
        assert_eq!(manual["metadata"]["finalizers"], json!([RESOURCES_FINALIZER]));
        let automated = application(&app(true, true), "argocd");
        assert_eq!(
            automated["spec"]["syncPolicy"],
            json!({
                "automated": {"prune": true, "selfHeal": true, "allowEmpty": true},
                "retry": {"limit": -1, "backoff": {"duration": "5s", "factor": 2, "maxDuration": "3m"}},
                "syncOptions": ["PrunePropagationPolicy=background", "CreateNamespace=true"],
            })
        );
        let manual_in_new_namespace = application(&app(false, true), "argocd");
        assert_eq!(manual_in_new_namespace["spec"]["syncPolicy"], json!({"syncOptions": ["CreateNamespace=true"]}));
    }

    #[test]
    fn cluster_config_holds_allow_listed_fields_only() {
        let spec = ClusterSpec {
            name: "c".into(),
            labels: BTreeMap::new(),
            display_name: "d".into(),
            server: "https://c.example.invalid?managed-environment=1".into(),
            project: "p".into(),
            namespaces: vec!["a".into(), "b".into()],
            cluster_resources: false,
            insecure: true,
            credentials: ClusterCredentials { bearer_token: Some("t".into()), ..Default::default() },
            generation: Some(1),
        };
        let secret = cluster_secret(&spec, "argocd");
        let data = secret.data.expect("data");
        let config: Value = serde_json::from_slice(&data["config"].0).expect("json");
        assert_eq!(config, json!({"bearerToken": "t", "tlsClientConfig": {"insecure": true}}));
        assert_eq!(data["namespaces"].0, b"a,b");
        assert_eq!(data["project"].0, b"p");
        assert_eq!(secret.metadata.labels.expect("labels")[SECRET_TYPE_LABEL], "cluster");
    }

    #[test]
    fn repository_secret_prefers_ssh_key() {
        let spec = RepositorySpec {
            name: "r".into(),
            labels: BTreeMap::new(),
            project: "p".into(),
            url: "ssh://git.example.invalid/a".into(),
            credentials: RepositoryCredentials {
                ssh_private_key: Some("k".into()),
                password: Some("x".into()),
                ..Default::default()
            },
            generation: Some(1),
        };
        let data = repository_secret(&spec, "argocd").data.expect("data");
        assert!(data.contains_key("sshPrivateKey") && !data.contains_key("password"));
        assert_eq!(data["type"].0, b"git");
    }

    #[test]
    fn operation_state_is_read_with_its_correlation_id() {
        let mut app = sync_operation("v2", "abc");
        assert_eq!(app["metadata"]["annotations"][REFRESH_ANNOTATION], "normal", "a sync run refreshes first");
        app["status"] = json!({"operationState": {
            "phase": "Succeeded", "message": "ok", "finishedAt": "2024-01-01T00:00:00Z",
            "operation": app["operation"].clone(), "syncResult": {"revision": "deadbeef"},
        }});
        let view = operation_view(&app);
        assert_eq!(view.requested.as_deref(), Some("abc"));
        let state = view.state.expect("state");
        assert_eq!((state.correlation_id.as_deref(), state.phase), (Some("abc"), OperationPhase::Succeeded));
        assert_eq!(state.synced_revision.as_deref(), Some("deadbeef"));
    }
}
