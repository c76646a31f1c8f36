//! The spec hash: how the sweep tells, from a page of listed objects and without a
//! read per object, whether an object still holds what the agent applied.
//!
//! Every object the agent applies carries two annotations: the hash of the content
//! the agent owns in it ([`owned_content`]: our labels, the resources finalizer, the
//! spec fields we set, a Secret's data) and the generation of the row it was built
//! from. The sweep hashes the same content of the live object: a different hash (or
//! none) means someone changed it behind the agent's back, or an older agent wrote
//! it; a different generation means the row moved on without the object. Only then
//! is the row enqueued, so a sweep of an unchanged instance enqueues nothing.
//!
//! The content is normalised (keys sorted, nulls and empty maps and lists dropped)
//! so that an API server that keeps or drops an empty `syncPolicy` reads the same.
//! Fields set by others (`status`, `operation`, annotations, labels not ours) are
//! left out: they change without the object drifting from its row.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::engine::ObjectKind;
use crate::names::{GENERATION_ANNOTATION, MANAGED_BY_LABEL, SPEC_HASH_ANNOTATION};

use super::objects::{SECRET_TYPE_LABEL, is_resources_finalizer};

/// The prefix of the labels that link an object to its row and tenant.
const OUR_LABEL_PREFIX: &str = "gitops.managed-gitops.redhat.com/";

/// The spec fields the agent sets, per kind.
fn owned_spec_fields(kind: ObjectKind) -> &'static [&'static str] {
    match kind {
        ObjectKind::Application => &["project", "source", "destination", "syncPolicy"],
        ObjectKind::Project => &["sourceRepos", "destinations", "clusterResourceWhitelist"],
        ObjectKind::Cluster | ObjectKind::Repository => &[],
    }
}

/// Drops nulls and empty maps and lists, recursively; maps come out key-sorted
/// (serde_json's map is ordered by key).
fn normalise(value: &Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::Object(map) => {
            let kept: Map<String, Value> =
                map.iter().filter_map(|(k, v)| normalise(v).map(|v| (k.clone(), v))).collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        Value::Array(items) => {
            let kept: Vec<Value> = items.iter().map(|v| normalise(v).unwrap_or(Value::Null)).collect();
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        other => Some(other.clone()),
    }
}

/// The part of `object` (as JSON) that the agent owns.
pub fn owned_content(kind: ObjectKind, object: &Value) -> Value {
    let labels: Map<String, Value> = object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter(|(k, _)| k.starts_with(OUR_LABEL_PREFIX) || *k == MANAGED_BY_LABEL || *k == SECRET_TYPE_LABEL)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let mut content = Map::new();
    content.insert("labels".into(), Value::Object(labels));
    match kind {
        ObjectKind::Application | ObjectKind::Project => {
            let spec = object.get("spec");
            let fields: Map<String, Value> = owned_spec_fields(kind)
                .iter()
                .filter_map(|field| spec.and_then(|s| s.get(*field)).map(|v| ((*field).to_owned(), v.clone())))
                .collect();
            content.insert("spec".into(), Value::Object(fields));
        }
        ObjectKind::Cluster | ObjectKind::Repository => {
            content.insert("data".into(), object.get("data").cloned().unwrap_or(Value::Null));
        }
    }
    if kind == ObjectKind::Application {
        let finalized = object
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().filter_map(Value::as_str).any(is_resources_finalizer));
        content.insert("resourcesFinalizer".into(), Value::Bool(finalized));
    }
    normalise(&Value::Object(content)).unwrap_or(Value::Null)
}

/// The hash of what the agent owns in `object`: hex SHA-256 of its normalised JSON.
pub fn spec_hash(kind: ObjectKind, object: &Value) -> String {
    let digest = Sha256::digest(owned_content(kind, object).to_string().as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The annotations `object` is applied with: its spec hash and the row's generation (if any).
pub fn annotations(kind: ObjectKind, object: &Value, generation: Option<i64>) -> Vec<(String, String)> {
    let mut annotations = vec![(SPEC_HASH_ANNOTATION.to_owned(), spec_hash(kind, object))];
    if let Some(generation) = generation {
        annotations.push((GENERATION_ANNOTATION.to_owned(), generation.to_string()));
    }
    annotations
}

/// Writes [`annotations`] into `object`.
pub fn stamp(kind: ObjectKind, object: &mut Value, generation: Option<i64>) {
    let stamped = annotations(kind, object, generation);
    let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    let annotations = metadata.entry("annotations").or_insert_with(|| Value::Object(Map::new()));
    if let Some(annotations) = annotations.as_object_mut() {
        for (key, value) in stamped {
            annotations.insert(key, Value::String(value));
        }
    }
}

/// What a live object says of itself: whether it differs from the hash it carries
/// (or carries none), and the row generation it was built from.
pub fn inspect(kind: ObjectKind, object: &Value) -> (bool, Option<i64>) {
    let annotation =
        |key: &str| object.pointer("/metadata/annotations").and_then(|a| a.get(key)).and_then(Value::as_str);
    let drifted = annotation(SPEC_HASH_ANNOTATION).is_none_or(|carried| carried != spec_hash(kind, object));
    (drifted, annotation(GENERATION_ANNOTATION).and_then(|g| g.parse().ok()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn app() -> Value {
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "a", "labels": {MANAGED_BY_LABEL: "gitops-agent", "gitops.managed-gitops.redhat.com/tenant-id": "1"},
                         "finalizers": ["resources-finalizer.argocd.argoproj.io"]},
            "spec": {"project": "p", "source": {"repoURL": "https://g.example.invalid/r", "path": "x"},
                     "destination": {"server": "https://s", "namespace": "n"}, "syncPolicy": {}},
        })
    }

    #[test]
    fn a_stamped_object_is_unchanged_until_an_owned_field_changes() {
        let mut object = app();
        stamp(ObjectKind::Application, &mut object, Some(3));
        assert_eq!(inspect(ObjectKind::Application, &object), (false, Some(3)));

        // What others write, and an API server dropping an empty map, change nothing.
        let mut live = object.clone();
        live["status"] = json!({"sync": {"status": "Synced"}});
        live["operation"] = json!({"sync": {}});
        live["metadata"]["annotations"]["argocd.argoproj.io/refresh"] = json!("normal");
        live["metadata"]["labels"]["someone/else"] = json!("x");
        live["metadata"]["resourceVersion"] = json!("42");
        live["spec"].as_object_mut().expect("spec").remove("syncPolicy");
        assert_eq!(inspect(ObjectKind::Application, &live), (false, Some(3)));

        let mut edited = object.clone();
        edited["spec"]["source"]["path"] = json!("tampered");
        assert!(inspect(ObjectKind::Application, &edited).0, "an edited spec");
        let mut unfinalized = object.clone();
        unfinalized["metadata"]["finalizers"] = json!([]);
        assert!(inspect(ObjectKind::Application, &unfinalized).0, "the resources finalizer removed");
        let mut relabelled = object;
        relabelled["metadata"]["labels"]["gitops.managed-gitops.redhat.com/tenant-id"] = json!("2");
        assert!(inspect(ObjectKind::Application, &relabelled).0, "one of our labels changed");
        assert!(inspect(ObjectKind::Application, &app()).0, "no hash: written by an older agent");
    }

    #[test]
    fn secret_data_is_owned() {
        let mut secret = json!({"metadata": {"name": "s", "labels": {SECRET_TYPE_LABEL: "cluster"}},
                                "type": "Opaque", "data": {"server": "aHR0cHM6Ly9z"}});
        stamp(ObjectKind::Cluster, &mut secret, Some(1));
        assert!(!inspect(ObjectKind::Cluster, &secret).0);
        secret["data"]["server"] = json!("b3RoZXI=");
        assert!(inspect(ObjectKind::Cluster, &secret).0);
    }
}
