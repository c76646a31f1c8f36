//! CustomResourceDefinitions (apiextensions.k8s.io/v1): defaulting and the
//! validation a CRD needs to be served, the status the apiextensions
//! controllers would write (`NamesAccepted`, `Established`, `acceptedNames`,
//! `storedVersions`), and the `ResourceInfo` of each served version, which the
//! registry serves from the moment the CRD is stored.

use std::sync::Arc;

use serde_json::{Value, json};

use super::errors::Cause;
use super::meta::{self, NameRule};
use super::resources::{CustomResource, ResourceInfo};
use super::schema::Structural;

/// Defaults kube-apiserver fills into a CRD spec.
pub fn apply_defaults(crd: &mut Value) {
    let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) else { return };
    if !spec.contains_key("conversion") {
        spec.insert("conversion".into(), json!({"strategy": "None"}));
    }
    if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) {
        let kind = names.get("kind").and_then(Value::as_str).unwrap_or("").to_owned();
        if !names.contains_key("singular") && !kind.is_empty() {
            names.insert("singular".into(), json!(kind.to_lowercase()));
        }
        if !names.contains_key("listKind") && !kind.is_empty() {
            names.insert("listKind".into(), json!(format!("{kind}List")));
        }
    }
}

/// The causes that make a CRD unservable (a subset of the real validation).
pub fn validate(crd: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let spec = crd.get("spec").cloned().unwrap_or(Value::Null);
    let s = |path: &str| spec.pointer(path).and_then(Value::as_str).unwrap_or("").to_owned();
    let group = s("/group");
    let plural = s("/names/plural");
    let kind = s("/names/kind");
    if group.is_empty() {
        causes.push(Cause::new("FieldValueRequired", "spec.group", "Required value"));
    } else if !group.contains('.') {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.group",
            format!("Invalid value: \"{group}\": should be a domain with at least one dot"),
        ));
    }
    if plural.is_empty() {
        causes.push(Cause::new("FieldValueRequired", "spec.names.plural", "Required value"));
    }
    if kind.is_empty() {
        causes.push(Cause::new("FieldValueRequired", "spec.names.kind", "Required value"));
    }
    let name = meta::name(crd);
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    match s("/scope").as_str() {
        "Namespaced" | "Cluster" => {}
        "" => causes.push(Cause::new("FieldValueRequired", "spec.scope", "Required value")),
        other => causes.push(Cause::new(
            "FieldValueNotSupported",
            "spec.scope",
            format!("Unsupported value: \"{other}\": supported values: \"Cluster\", \"Namespaced\""),
        )),
    }
    let versions = spec.get("versions").and_then(Value::as_array).cloned().unwrap_or_default();
    if versions.is_empty() {
        causes.push(Cause::new("FieldValueRequired", "spec.versions", "Required value"));
    } else {
        let storage = versions.iter().filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true)).count();
        if storage != 1 {
            causes.push(Cause::new(
                "FieldValueInvalid",
                "spec.versions",
                format!("Invalid value: []apiextensions.CustomResourceDefinitionVersion{{...}}: must have exactly one version marked as storage version (found {storage})"),
            ));
        }
        for (i, version) in versions.iter().enumerate() {
            if version.pointer("/schema/openAPIV3Schema").is_none() {
                causes.push(Cause::new(
                    "FieldValueRequired",
                    format!("spec.versions[{i}].schema.openAPIV3Schema"),
                    "Required value: schemas are required",
                ));
            }
        }
    }
    causes.extend(meta::validate_name(name, NameRule::Subdomain));
    causes
}

/// Writes the status the apiextensions controllers report for an accepted CRD.
pub fn set_status(crd: &mut Value, now: &str) {
    let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let storage = storage_version(crd);
    let mut stored: Vec<Value> =
        crd.pointer("/status/storedVersions").and_then(Value::as_array).cloned().unwrap_or_default();
    if let Some(storage) = storage
        && !stored.iter().any(|v| v.as_str() == Some(storage.as_str()))
    {
        stored.push(json!(storage));
    }
    let old_conditions = crd.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let since = |kind: &str| {
        old_conditions
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or(json!(now))
    };
    let mut conditions = vec![
        json!({"type": "NamesAccepted", "status": "True", "lastTransitionTime": since("NamesAccepted"),
               "reason": "NoConflicts", "message": "no conflicts found"}),
        json!({"type": "Established", "status": "True", "lastTransitionTime": since("Established"),
               "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}),
    ];
    if meta::is_deleting(crd) {
        conditions.push(json!({"type": "Terminating", "status": "True", "lastTransitionTime": since("Terminating"),
            "reason": "InstanceDeletionInProgress", "message": "CustomResource deletion is in progress"}));
    }
    crd["status"] = json!({"conditions": conditions, "acceptedNames": names, "storedVersions": stored});
}

fn storage_version(crd: &Value) -> Option<String> {
    crd.pointer("/spec/versions")?
        .as_array()?
        .iter()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .and_then(|v| v.get("name").and_then(Value::as_str))
        .map(str::to_owned)
}

/// One `ResourceInfo` per served version of `crd`.
pub fn served_resources(crd: &Value) -> Vec<ResourceInfo> {
    let Some(storage) = storage_version(crd) else { return Vec::new() };
    let spec = crd.get("spec").cloned().unwrap_or(Value::Null);
    let s = |path: &str| spec.pointer(path).and_then(Value::as_str).unwrap_or("").to_owned();
    let strings = |path: &str| -> Vec<String> {
        spec.pointer(path)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let versions = spec.get("versions").and_then(Value::as_array).cloned().unwrap_or_default();
    versions
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| {
            let version = v.get("name")?.as_str()?.to_owned();
            let schema = v.pointer("/schema/openAPIV3Schema").map(|s| Arc::new(Structural::from_json(s)));
            Some(ResourceInfo {
                group: s("/group"),
                version,
                plural: s("/names/plural"),
                singular: s("/names/singular"),
                kind: s("/names/kind"),
                list_kind: s("/names/listKind"),
                namespaced: s("/scope") == "Namespaced",
                short_names: strings("/names/shortNames"),
                categories: strings("/names/categories"),
                status_subresource: v.pointer("/subresources/status").is_some(),
                uses_generation: true,
                returns_deleted_object: false,
                deletecollection: true,
                name_rule: NameRule::Subdomain,
                extra_subresources: Vec::new(),
                custom: Some(CustomResource {
                    crd_name: meta::name(crd).to_owned(),
                    storage_version: storage.clone(),
                    schema,
                }),
                create_only: false,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_defaulted_crd_is_valid_and_served() {
        let mut crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced", "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [
                        {"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                         "schema": {"openAPIV3Schema": {"type": "object"}}},
                        {"name": "v1beta1", "served": false, "storage": false,
                         "schema": {"openAPIV3Schema": {"type": "object"}}}]}
        });
        apply_defaults(&mut crd);
        assert!(validate(&crd).is_empty());
        set_status(&mut crd, "2024-01-01T00:00:00Z");
        assert_eq!(crd.pointer("/status/acceptedNames/listKind"), Some(&json!("WidgetList")));
        assert_eq!(crd.pointer("/status/storedVersions"), Some(&json!(["v1"])));
        let served = served_resources(&crd);
        assert_eq!(served.len(), 1);
        assert!(served[0].status_subresource && served[0].namespaced);
    }
}
